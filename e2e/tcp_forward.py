#!/usr/bin/env python3
"""A plain TCP forwarder: listens on LISTEN_HOST:PORT and splices each connection to TARGET_HOST:PORT.

The supervisor runs one per endpoint-picker pod. The picker (llm-d's epp) listens on ":<port>" of every address,
so two pickers (two deployments, or two revisions in a rollout) would collide on 9002/9003/9090; the supervisor
starts it on free loopback ports instead and this forwards <podIP>:9002/9003/9090 to them, so clients (Envoy,
the readiness probe, the operator's scraper) reach the pod at its own address and port, as in a cluster.

    python -m e2e.tcp_forward 127.1.2.3:9002=127.0.0.1:41234 127.1.2.3:9003=127.0.0.1:41235 ...

SIGTERM closes the listeners and the connections (a pod's container stopping).
"""
from __future__ import annotations

import asyncio
import signal
import sys


def parse_mapping(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """'HOST:PORT=HOST:PORT' -> ((listen host, port), (target host, port)); ValueError on anything else."""
    try:
        listen, target = text.split("=", 1)
        lh, lp = listen.rsplit(":", 1)
        th, tp = target.rsplit(":", 1)
        out = (lh, int(lp)), (th, int(tp))
    except ValueError:
        raise ValueError(f"not HOST:PORT=HOST:PORT: {text!r}") from None
    if not all(0 < p < 65536 for p in (out[0][1], out[1][1])) or not lh or not th:
        raise ValueError(f"not HOST:PORT=HOST:PORT: {text!r}")
    return out


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()  # half-close: the other direction may still be sending (gRPC, HTTP/1 close)
        except (OSError, RuntimeError):
            writer.close()


async def _serve(listen: tuple[str, int], target: tuple[str, int]) -> asyncio.AbstractServer:
    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*target)
        except OSError:
            cw.close()  # the process behind is not listening (yet): the client sees the connection closed
            return
        try:
            await asyncio.gather(_pipe(cr, uw), _pipe(ur, cw))
        finally:
            for w in (cw, uw):
                w.close()
    return await asyncio.start_server(handle, *listen, reuse_address=True)


async def main_async(mappings: list[str]) -> None:
    pairs = [parse_mapping(m) for m in mappings]
    servers = [await _serve(listen, target) for listen, target in pairs]
    for (lh, lp), (th, tp) in pairs:
        print(f"forwarding {lh}:{lp} -> {th}:{tp}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Bind-both ZMQ forwarder between llm-d-inference-sim's KV-event publisher and vllm-router.

vLLM binds its KV-event PUB socket and subscribers connect; llm-d-inference-sim v0.10.2 *dials* its PUB
socket (it expects a binding indexer) and vllm-router 0.1.17 *connects* its SUB socket, so the two never
meet. This process binds an XSUB for the engine and an XPUB for the router and forwards frames as is.

    python -m v41flash_bench.routing.zmq_forward ENGINE_SIDE,ROUTER_SIDE [...]
e.g. tcp://127.0.0.1:5601,tcp://127.0.0.1:5701 (benchmark-only; never part of a deployment).
"""
from __future__ import annotations

import sys
import threading


def main(argv: list[str]) -> int:
    import zmq  # pyzmq (dev extra): only the routing benchmark needs it

    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    ctx = zmq.Context()

    def forward(engine_side: str, router_side: str) -> None:
        xsub = ctx.socket(zmq.XSUB)
        xsub.bind(engine_side)
        xpub = ctx.socket(zmq.XPUB)
        xpub.bind(router_side)
        zmq.proxy(xsub, xpub)  # returns only when the context terminates (process exit)

    threads = []
    for pair in argv:
        engine_side, router_side = pair.split(",", 1)
        t = threading.Thread(target=forward, args=(engine_side, router_side), daemon=True)
        t.start()
        threads.append(t)
    print("forwarding " + " ".join(argv), flush=True)
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

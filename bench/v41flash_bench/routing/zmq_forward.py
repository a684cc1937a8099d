"""Bind-both ZMQ forwarder between llm-d-inference-sim's KV-event publisher and vllm-router, which hands the
router the events in the shape a vLLM 0.33.0 engine publishes them.

vLLM binds its KV-event PUB socket and subscribers connect; llm-d-inference-sim v0.10.2 *dials* its PUB
socket (it expects a binding indexer) and vllm-router 0.1.17 *connects* its SUB socket, so the two never
meet. This process binds a SUB for the engine and a PUB for the router and passes every batch on, after two
changes without which vllm-router 0.1.17's kv_aware credits nothing (docs: the routing notes, "why kv_aware
credited 0"):

1. Topic. A static ``--kv-event-source`` subscribes with the empty topic and then keeps only messages whose
   topic frame *equals* it (``kv_index/subscriber.rs``: ZMQ's prefix match lets every topic through, the
   exact check drops them); there is no flag to name a topic. The simulator publishes on
   ``kv@<ip>@<model>``, so every batch was dropped before decoding. The forwarder republishes on ``''``.
2. Schema. The router's decoder requires the ``lora_id`` and ``lora_name`` keys in every BlockStored
   (``kv_index/decode.rs``: "missing KV event field: lora_id"); vLLM's msgspec encoder always writes them
   (as nil), the simulator's map format omits them when nil (``omitempty``). The forwarder adds them, nil.

Nothing else is touched: hashes, token ids, block size, parent hashes and sequence numbers pass as they are.

    python -m v41flash_bench.routing.zmq_forward ENGINE_SIDE,ROUTER_SIDE [...]
e.g. tcp://127.0.0.1:5601,tcp://127.0.0.1:5701 (benchmark-only; never part of a deployment).
"""
from __future__ import annotations

import sys
import threading
from typing import Any

ROUTER_TOPIC = b""  # what vllm-router 0.1.17 subscribes a static --kv-event-source with
VLLM_NIL_FIELDS = ("lora_id", "lora_name")  # BlockStored keys vLLM always writes and the router requires


def to_vllm_batch(payload: bytes) -> bytes:
    """A simulator batch (msgpack ``[ts, events, dp_rank]``, events as maps) with every BlockStored given the
    keys vLLM always writes; anything that is not such a batch passes unchanged."""
    import msgpack  # bench extra

    try:
        batch: Any = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return payload
    if not (isinstance(batch, list) and len(batch) >= 2 and isinstance(batch[1], list)):
        return payload
    changed = False
    for event in batch[1]:
        if isinstance(event, dict) and event.get("type") == "BlockStored":
            for key in VLLM_NIL_FIELDS:
                if key not in event:
                    event[key] = None
                    changed = True
    return msgpack.packb(batch, use_bin_type=True) if changed else payload


def to_router_frames(frames: list[bytes]) -> list[bytes]:
    """[topic, seq, payload] as the router's static source accepts it; other shapes pass unchanged (the router
    counts them as corrupt, as it would from an engine)."""
    if len(frames) != 3:
        return frames
    return [ROUTER_TOPIC, frames[1], to_vllm_batch(frames[2])]


def main(argv: list[str]) -> int:
    import zmq  # pyzmq (bench extra): only the routing benchmark needs it

    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    ctx = zmq.Context()

    def forward(engine_side: str, router_side: str) -> None:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.bind(engine_side)
        pub = ctx.socket(zmq.PUB)
        pub.bind(router_side)
        while True:
            pub.send_multipart(to_router_frames(sub.recv_multipart()))

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

"""The routing benchmark's KV-event forwarder (v41flash_bench/routing/zmq_forward.py): what it changes between
llm-d-inference-sim's publisher and vllm-router 0.1.17's static KV-event source, and what it leaves alone."""
import msgpack

from v41flash_bench.routing.zmq_forward import ROUTER_TOPIC, to_router_frames, to_vllm_batch


def sim_batch(events, rank=0):
    # llm-d-inference-sim v0.10.2's map format: [ts, [event maps], dp_rank]; lora_id/lora_name omitted when nil
    return msgpack.packb([1700000000.5, events, rank], use_bin_type=True)


STORED = {"type": "BlockStored", "block_hashes": [2**64 - 1, 7], "parent_block_hash": None,
          "token_ids": list(range(32)), "block_size": 16, "medium": "GPU"}


def test_topic_becomes_the_one_a_static_source_subscribes_with():
    seq = (41).to_bytes(8, "big")
    topic, out_seq, payload = to_router_frames([b"kv@127.0.0.1@m", seq, sim_batch([dict(STORED)])])
    assert topic == ROUTER_TOPIC == b"" and out_seq == seq


def test_block_stored_gets_vllms_nil_lora_keys_and_nothing_else_changes():
    ts, events, rank = msgpack.unpackb(to_vllm_batch(sim_batch([dict(STORED)], rank=3)), strict_map_key=False)
    assert (ts, rank) == (1700000000.5, 3)
    assert events == [{**STORED, "lora_id": None, "lora_name": None}]
    assert events[0]["block_hashes"][0] == 2**64 - 1  # uint64 hashes survive the round trip


def test_present_lora_keys_and_other_events_are_kept():
    stored = {**STORED, "lora_id": 5, "lora_name": "adapter"}
    removed = {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}
    payload = sim_batch([stored, removed, {"type": "AllBlocksCleared"}])
    assert to_vllm_batch(payload) == payload  # nothing to add: the very same bytes


def test_what_is_not_a_batch_passes_unchanged():
    for junk in (b"", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.0, "x"])):
        assert to_vllm_batch(junk) == junk
    frames = [b"topic", b"x"]  # not [topic, seq, payload]: the router counts it corrupt, as from an engine
    assert to_router_frames(frames) == frames

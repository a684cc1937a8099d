"""The benchmark record (one JSON object per measured point, a line of DIR/records.jsonl) and A/B comparison.

A record holds what seed 004 asks a record to keep, in four groups:

* ``target`` (who: deployment or URL, serving revision, address) and ``system`` (what serves: checkpoint and
  revision, runtime and image, GPU model and count, interconnect, precision and quantization, TP/EP/DP per role,
  the engines' exact arguments), with ``unknown`` naming what could not be read;
* ``workload`` (kind and parameters, the digest of the exact requests, arrival pattern and load, input and
  output token distributions) and ``method`` (warm-up, window, repeats, drain, seed), ``state`` warm or cold;
* ``figures``: the median over the repeats of every figure (success rate and errors, throughput in requests and
  tokens per second and per GPU, TTFT / ITL / e2e distributions, per-request decode speed, cache hits and misses
  apart), ``range`` the min and max of the headline figures, ``repeats`` each repeat's own figures;
* ``slo`` (targets and whether the point met them) and ``cost`` (tokens per dollar, $ per completed session).

A/B: two records compare only when their ``system``, ``workload`` (the same requests, digest for digest) and
``method`` differ in the one named variable and nothing else (``differences``, ``comparable``).
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

SCHEMA = "v41flash.io/bench-serve-record/v1"
RECORDS = "records.jsonl"
# The groups that must match between A and B (except the variable); target and figures may differ.
CONDITIONS = ("system", "workload", "method", "state")
RANGE_KEYS = ("throughput.requests_per_s", "throughput.output_tokens_per_s", "throughput.total_tokens_per_s",
              "latency.ttft_s.p50", "latency.ttft_s.p90", "latency.itl_s.p50", "latency.e2e_s.p50",
              "latency.e2e_s.p95", "latency.decode_tokens_per_s.p50", "requests.success_rate")


def _leaves(tree, prefix: str = "") -> Iterable[tuple[str, object]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], tree


def get(tree: dict, path: str):
    for k in path.split("."):
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree


def median_tree(trees: Sequence[dict]):
    """The trees' shape with each numeric leaf the median over the trees (others: the first tree's value)."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: median_tree([t.get(k) if isinstance(t, dict) else None for t in trees]) for k in first}
    nums = [t for t in trees if isinstance(t, (int, float)) and not isinstance(t, bool)]
    if nums and len(nums) == len(trees):
        return statistics.median(nums)
    return first


def ranges(trees: Sequence[dict], keys: Sequence[str] = RANGE_KEYS) -> dict:
    out = {}
    for k in keys:
        vals = [get(t, k) for t in trees]
        nums = [v for v in vals if isinstance(v, (int, float))]
        if nums:
            out[k] = [min(nums), max(nums)]
    return out


def write(path: Path, records: Iterable[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=False, default=str) + "\n")


def read(path: Path) -> list[dict]:
    p = Path(path)
    if p.is_dir():
        p = p / RECORDS
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            r = json.loads(line)
            if r.get("schema") != SCHEMA:
                raise ValueError(f"{p}:{n}: not a bench serve record (schema {r.get('schema')!r}, want {SCHEMA})")
            out.append(r)
    return out


def differences(a: dict, b: dict) -> list[str]:
    """Leaf paths under CONDITIONS where two records differ (a leaf only one side has counts too)."""
    la = dict(x for g in CONDITIONS for x in _leaves({g: a.get(g)}))
    lb = dict(x for g in CONDITIONS for x in _leaves({g: b.get(g)}))
    return sorted(k for k in la.keys() | lb.keys() if la.get(k) != lb.get(k))


def _covered(path: str, variable: str) -> bool:
    """A difference at ``path`` is the variable's when the variable names it, a group above it, or its last part
    (``--max-num-seqs`` covers system.roles.decode.args.--max-num-seqs)."""
    return path == variable or path.startswith(variable + ".") or path.rsplit(".", 1)[-1] == variable


# Measured, not chosen: replicas Ready and GPUs serving follow the load (the planner's), the token distributions
# follow what the endpoint answered in the window. (An engine change also changes the serving revision: identity.)
DERIVED = ("system.gpu_count", "system.roles.prefill.replicas_ready", "system.roles.decode.replicas_ready",
           "workload.input_tokens", "workload.output_tokens")


def comparable(a: dict, b: dict, variable: str) -> tuple[bool, list[str], list[str]]:
    """(ok, the differences the variable explains, the others). ok needs at least one explained difference
    (else there is no A/B) and no other; the workload's requests are compared digest for digest."""
    diffs = [d for d in differences(a, b) if not any(_covered(d, x) for x in DERIVED)]
    mine = [d for d in diffs if _covered(d, variable)]
    other = [d for d in diffs if not _covered(d, variable)]
    return bool(mine) and not other, mine, other


def pair(a_records: Sequence[dict], b_records: Sequence[dict]) -> list[tuple[dict, dict]]:
    """Records of A and B at the same load and state, in A's order."""
    key = lambda r: (r["state"], json.dumps(r["workload"]["load"], sort_keys=True))  # noqa: E731
    bs = {key(r): r for r in b_records}
    return [(r, bs[key(r)]) for r in a_records if key(r) in bs]

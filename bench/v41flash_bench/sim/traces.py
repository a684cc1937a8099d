"""Arrival shapes taken from public LLM-serving traces, for the suite's ``trace`` family.

A shape is a trace's request count per minute (``traces/arrival-shapes.json``; each entry names its
source, licence, attribution and the dataset commit it was derived from). The suite replays a shape's
*arrival rate* onto AgentX agent sessions: the live-session target follows the trace's requests per
second minute by minute, while prompts, outputs and think times stay the agentic workload this
deployment serves (the public traces hold 1–8k-token API calls, not 100k-token agent contexts).
``v41flash bench trace-shape FILE --name N > N.json`` derives an entry from a trace file (Azure LLM inference
CSV with a ``TIMESTAMP`` column, or Mooncake JSONL with ``timestamp``/``timestamp_ms`` in milliseconds); a
scenario's ``arrivals.trace`` takes a shipped name or such a file's path.
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np

SHAPES_FILE = Path(__file__).parent / "traces" / "arrival-shapes.json"
BIN_S = 60.0


@cache
def shapes() -> dict[str, dict]:
    """Every shipped shape by name: {"source" (URL at the dataset's commit), "licence", "attribution", "bin_s",
    "counts"}."""
    return json.loads(SHAPES_FILE.read_text(encoding="utf-8"))


def shape(name: str) -> dict:
    """A shipped shape by name, or the one entry of a JSON file ``trace-shape`` wrote (a path: a team's own
    traffic). Raises ValueError naming what it is not."""
    if name in shapes():
        return shapes()[name]
    p = Path(name)
    if p.suffix != ".json" or not p.is_file():
        raise ValueError(f"{name!r} is neither a shipped trace ({', '.join(sorted(shapes()))}) nor a .json file "
                         f"written by `v41flash bench trace-shape`")
    data = json.loads(p.read_text(encoding="utf-8"))
    entries = list(data.values()) if isinstance(data, dict) else []
    if len(entries) != 1 or not isinstance(entries[0], dict) or not entries[0].get("counts") \
            or float(entries[0].get("bin_s", 0)) <= 0 or min(entries[0]["counts"]) < 0:
        raise ValueError(f"{name}: expected one entry {{name: {{bin_s, counts, ...}}}} as `v41flash bench "
                         f"trace-shape` prints it")
    return entries[0]


def rate(name: str) -> np.ndarray:
    """Requests per second in each bin of the named shape."""
    s = shape(name)
    return np.asarray(s["counts"], dtype=float) / float(s["bin_s"])


def peak_to_mean(name: str) -> float:
    """The busiest minute's requests ÷ the mean minute's (Azure code 2023: 4.2, conversation: 1.5)."""
    r = rate(name)
    return float(r.max() / r.mean())


def span_s(name: str) -> float:
    s = shape(name)
    return len(s["counts"]) * float(s["bin_s"])


def level(name: str, offset_s: float, time_scale: float, duration_s: float):
    """The shape as a fraction of its peak over the played part: simulated time t plays trace time
    ``offset_s + t × time_scale`` (bin centres, linear between them); 1.0 at the played part's busiest
    minute. Raises if the played part runs past the trace's end."""
    r = rate(name)
    bin_s = float(shape(name)["bin_s"])
    end = offset_s + duration_s * time_scale
    if offset_s < 0 or end > len(r) * bin_s + 1e-6:
        raise ValueError(f"trace {name!r}: playing {offset_s:.0f}–{end:.0f}s runs past its {len(r) * bin_s:.0f}s")
    centres = (np.arange(len(r)) + 0.5) * bin_s
    played = (centres >= offset_s - bin_s) & (centres <= end + bin_s)
    peak = float(r[played].max())
    if peak <= 0:
        raise ValueError(f"trace {name!r}: no request between {offset_s:.0f}s and {end:.0f}s")

    def f(t):
        return np.interp(offset_s + np.asarray(t, dtype=float) * time_scale, centres, r) / peak

    return f


def timestamps(path: str | Path) -> np.ndarray:
    """Request times in seconds from the first, from an Azure LLM inference CSV or a Mooncake JSONL."""
    p = Path(path)
    if p.suffix == ".csv":
        with p.open(encoding="utf-8") as fh:
            ts = [dt.datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]).timestamp() for row in csv.DictReader(fh)]
    else:
        ts = []
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                ts.append(float(rec["timestamp_ms"] if "timestamp_ms" in rec else rec["timestamp"]) / 1000.0)
    if not ts:
        raise ValueError(f"{path}: no requests")
    a = np.sort(np.asarray(ts, dtype=float))
    return a - a[0]


def counts_per_bin(ts: np.ndarray, bin_s: float = BIN_S) -> list[int]:
    """Requests in each whole bin from the first request (a last, partial bin is dropped)."""
    n = int(ts[-1] // bin_s)
    return np.bincount((ts // bin_s).astype(int), minlength=n + 1)[:n].tolist()


def add_parser(sub) -> None:
    p = sub.add_parser("trace-shape", help="Print a trace file's requests per minute as an arrival-shapes.json entry.")
    p.add_argument("path", help="Azure LLM inference CSV (TIMESTAMP column) or Mooncake JSONL (timestamp in ms)")
    p.add_argument("--name", required=True)
    p.add_argument("--source", default="", help="where the file came from (URL and commit)")
    p.add_argument("--licence", default="")
    p.add_argument("--attribution", default="")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    counts = counts_per_bin(timestamps(args.path))
    if not counts or not any(counts):
        print(f"{args.path}: spans less than one whole {BIN_S:.0f}s bin with requests: no shape", file=sys.stderr)
        return 2
    print(json.dumps({args.name: {"source": args.source, "licence": args.licence, "attribution": args.attribution,
                                  "bin_s": BIN_S, "counts": counts}}, indent=1))
    return 0

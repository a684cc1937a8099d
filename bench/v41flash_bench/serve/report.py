"""What a run leaves beside records.jsonl: a table on stdout, points.csv / points.json (one row per record), and
two PNG plots: throughput per GPU against per-user speed (AgentX's chart: cached + input + output tokens per
second per GPU at the median per-request decode speed) and TTFT p90 against throughput. An A/B run adds
compare.json and its table."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from v41flash_bench.serve import records as R  # noqa: N812

COLUMNS = (
    ("label", None), ("state", "state"), ("load", None), ("success_rate", "figures.requests.success_rate"),
    ("requests_per_s", "figures.throughput.requests_per_s"),
    ("output_tok_s", "figures.throughput.output_tokens_per_s"),
    ("total_tok_s", "figures.throughput.total_tokens_per_s"),
    ("total_tok_s_per_gpu", "figures.per_gpu.total"), ("cached_tok_s_per_gpu", "figures.per_gpu.cached"),
    ("input_tok_s_per_gpu", "figures.per_gpu.input"), ("output_tok_s_per_gpu", "figures.per_gpu.output"),
    ("user_tok_s_p50", "figures.latency.decode_tokens_per_s.p50"),
    ("ttft_p50_s", "figures.latency.ttft_s.p50"), ("ttft_p90_s", "figures.latency.ttft_s.p90"),
    ("itl_p50_s", "figures.latency.itl_s.p50"), ("e2e_p50_s", "figures.latency.e2e_s.p50"),
    ("e2e_p95_s", "figures.latency.e2e_s.p95"), ("hit_rate", "figures.tokens.hit_rate"),
    ("ttft_p50_hit_s", "figures.cache.hit.ttft_s.p50"), ("ttft_p50_miss_s", "figures.cache.miss.ttft_s.p50"),
    ("slo_met", "slo.met"), ("tokens_per_usd", "cost.tokens_per_usd"),
    ("usd_per_session", "cost.usd_per_completed_session"),
)


def label(r: dict) -> str:
    t = r["target"]
    return t.get("deployment") or t.get("url", "")


def rows(records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        row = {}
        for name, path in COLUMNS:
            if name == "label":
                row[name] = label(r)
            elif name == "load":
                ld = r["workload"]["load"]
                row[name] = f"{ld['kind']}={ld['value']:g}"
            else:
                row[name] = R.get(r, path)
        out.append(row)
    return out


def table(records: list[dict]) -> str:
    show = ("label", "state", "load", "success_rate", "requests_per_s", "output_tok_s", "total_tok_s_per_gpu",
            "user_tok_s_p50", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "e2e_p95_s", "hit_rate", "slo_met",
            "usd_per_session")
    data = rows(records)

    def fmt(v):
        if isinstance(v, bool) or v is None:
            return "-" if v is None else str(v).lower()
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    cells = [[fmt(d[k]) for k in show] for d in data]
    widths = [max(len(k), *(len(c[i]) for c in cells)) if cells else len(k) for i, k in enumerate(show)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(show, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    return "\n".join(lines)


def write_tables(records: list[dict], out: Path) -> None:
    data = rows(records)
    with open(out / "points.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=[k for k, _ in COLUMNS])
        w.writeheader()
        w.writerows(data)
    (out / "points.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def plot(records: list[dict], out: Path) -> list[Path]:
    """The two charts, one line per target and state; points without the figure are left out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict]] = {}
    for r in records:
        series.setdefault(f"{label(r)} ({r['state']})", []).append(r)
    made = []
    charts = (
        ("throughput-per-gpu-vs-user-speed.png", "figures.latency.decode_tokens_per_s.p50", "figures.per_gpu.total",
         "per-user decode speed, p50 (tokens/s)", "cached + input + output tokens/s per GPU",
         "throughput per GPU vs per-user speed (AgentX's chart)"),
        ("ttft-p90-vs-throughput.png", "figures.throughput.total_tokens_per_s", "figures.latency.ttft_s.p90",
         "cached + input + output tokens/s", "TTFT p90 (s)", "TTFT p90 vs throughput"),
    )
    for name, xk, yk, xl, yl, title in charts:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        drawn = False
        for lab, rs in series.items():
            pts = [(R.get(r, xk), R.get(r, yk)) for r in rs]
            pts = [(x, y) for x, y in pts if x is not None and y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lab)
                drawn = True
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(title)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no points carry this figure (per-GPU figures need the GPU count)",
                    ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(out / name)
    return made

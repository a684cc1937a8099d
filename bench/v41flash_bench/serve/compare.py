"""A/B of two `bench serve` runs: point by point (same load and state), B against A, for one named variable.

A pair is refused, with the differences named, when anything but the variable differs in what the records say
about the system, the workload (the requests themselves, by digest) and the method: a comparison of two changes
cannot say which one did it (seed 004: change one variable at a time)."""
from __future__ import annotations

from v41flash_bench.serve import records as R  # noqa: N812

HEADLINE = ("figures.throughput.output_tokens_per_s", "figures.throughput.total_tokens_per_s",
            "figures.per_gpu.total", "figures.latency.ttft_s.p50", "figures.latency.ttft_s.p90",
            "figures.latency.itl_s.p50", "figures.latency.e2e_s.p95", "figures.requests.success_rate",
            "cost.tokens_per_usd", "cost.usd_per_completed_session")


def compare(a_records: list[dict], b_records: list[dict], variable: str) -> dict:
    pairs = R.pair(a_records, b_records)
    out = {"variable": variable, "points": [], "comparable": bool(pairs), "refused": []}
    if not pairs:
        out["refused"].append("no point of A has a point of B at the same load and state")
    for a, b in pairs:
        ok, mine, other = R.comparable(a, b, variable)
        point = {"load": a["workload"]["load"], "state": a["state"], "variable_differences":
                 {d: [R.get(a, d), R.get(b, d)] for d in mine}}
        if not ok:
            out["comparable"] = False
            why = (f"they differ in {len(other)} more: " + ", ".join(other[:12]) + (" ..." if len(other) > 12 else "")
                   if other else f"they do not differ in {variable!r}")
            out["refused"].append(f"{a['workload']['load']} ({a['state']}): {why}")
            point["other_differences"] = other
        else:
            point["figures"] = {k: {"a": R.get(a, k), "b": R.get(b, k),
                                    "b_over_a": (R.get(b, k) / R.get(a, k)) if isinstance(R.get(a, k), (int, float))
                                    and isinstance(R.get(b, k), (int, float)) and R.get(a, k) else None}
                                for k in HEADLINE}
        out["points"].append(point)
    return out


def format_compare(result: dict) -> str:
    lines = [f"A/B on {result['variable']!r}"]
    if not result["comparable"]:
        lines.append("REFUSED: " + "; ".join(result["refused"]))
        return "\n".join(lines)
    for p in result["points"]:
        ld = p["load"]
        lines.append(f"{ld['kind']} {ld['value']:g} ({p['state']}): " + ", ".join(
            f"{k} {v[0]!r} -> {v[1]!r}" for k, v in p["variable_differences"].items()))
        for k, v in p["figures"].items():
            if v["a"] is None and v["b"] is None:
                continue
            ratio = f"  x{v['b_over_a']:.3f}" if v["b_over_a"] is not None else ""
            lines.append(f"  {k.split('.', 1)[1]:<36} A {_n(v['a'])}  B {_n(v['b'])}{ratio}")
    return "\n".join(lines)


def _n(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)

"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _arrival_rate(arr_t, bin_s: float, duration: float) -> tuple[np.ndarray, np.ndarray]:
    edges = np.arange(0.0, duration + bin_s, bin_s)
    counts, _ = np.histogram(np.asarray(arr_t), bins=edges)
    return edges[:-1] / 60.0, counts / bin_s


def write_plots(out_dir: Path, sc, results: dict, duration: float) -> list[Path]:
    """One figure per policy (load, replicas per role, latency per minute) and one comparison."""
    paths = []
    slo = sc.slo
    pct = f"p{slo.ttft_percentile * 100:g}"
    for name, res in results.items():
        s = res.series
        t = np.asarray(s["t"]) / 60.0
        fig, ax = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
        x, rate = _arrival_rate(res.arr_t, 30.0, duration)
        ax[0].plot(x, rate, label="arrivals (req/s, 30 s bins)", color="tab:gray")
        ax0b = ax[0].twinx()
        ax0b.plot(t, s["prefill_waiting"], label="prefill waiting", color="tab:orange", lw=0.8)
        ax0b.plot(t, s["decode_running"], label="decode running", color="tab:blue", lw=0.8)
        ax[0].set_ylabel("req/s")
        ax0b.set_ylabel("requests")
        ax[0].legend(loc="upper left", fontsize=8)
        ax0b.legend(loc="upper right", fontsize=8)
        ax[0].set_title(f"{sc.name}: {name}")
        for role, color in (("prefill", "tab:orange"), ("decode", "tab:blue")):
            ready = np.asarray(s[f"{role}_ready"])
            starting = np.asarray(s[f"{role}_starting"])
            ax[1].step(t, ready, where="post", color=color, label=f"{role} ready")
            ax[1].step(t, ready + starting, where="post", color=color, ls="--", lw=0.8, label=f"{role} ready+starting")
        ax[1].set_ylabel("replicas")
        ax[1].legend(fontsize=8, ncol=2)
        w = res.score["minute_windows"]
        if w:
            wx = np.array([x["start"] for x in w]) / 60.0
            ax[2].plot(wx, [min(x["ttft"], 1e4) for x in w], marker=".", label=f"TTFT {pct} / minute")
            ax[2].plot(wx, [min(x["e2e_p95"], 1e4) for x in w], marker=".", label="e2e p95 / minute")
            ax[2].axhline(slo.ttft_s, color="tab:blue", ls=":", lw=1)
            ax[2].axhline(slo.e2e_p95_s, color="tab:orange", ls=":", lw=1)
            bad = [x["start"] / 60.0 for x in w if not (x["ttft_ok"] and x["e2e_ok"])]
            for b in bad:
                ax[2].axvspan(b, b + slo.window_s / 60.0, color="red", alpha=0.15, lw=0)
            ax[2].set_yscale("log")
        ax[2].set_ylabel("seconds")
        ax[2].set_xlabel("minutes")
        ax[2].legend(fontsize=8)
        for a in ax:
            a.axvline(sc.warmup_s / 60.0, color="k", lw=0.6, ls=":")
        fig.tight_layout()
        p = out_dir / f"{name}.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)

    fig, ax = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for name, res in results.items():
        s = res.series
        ax[0].step(np.asarray(s["t"]) / 60.0, s["gpus"], where="post", label=name)
        w = res.score["minute_windows"]
        if w:
            ax[1].plot([x["start"] / 60.0 for x in w], [min(x["ttft"], 1e4) for x in w], label=name, lw=0.9)
    ax[0].set_ylabel("GPUs (incl. starting, draining)")
    ax[0].legend(fontsize=8, ncol=3)
    ax[0].set_title(f"{sc.name}: all policies")
    ax[1].axhline(slo.ttft_s, color="k", ls=":", lw=1)
    ax[1].set_yscale("log")
    ax[1].set_ylabel(f"TTFT {pct} per minute (s)")
    ax[1].set_xlabel("minutes")
    fig.tight_layout()
    p = out_dir / "compare.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
    return paths

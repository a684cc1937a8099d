"""`bench forecastability`: what share of the load one horizon ahead the sessions live now account for."""
from __future__ import annotations

import json

import numpy as np
import pytest

from v41flash.cli.main import main
from v41flash_bench.sim.forecastability import summarize, visibility
from v41flash_bench.sim.suite import HELD_OUT_SEEDS, seeds_text


def sessions(starts, turns: int, spacing: float, first_id: int = 0):
    """Each session sends ``turns`` requests ``spacing`` seconds apart from its start."""
    arrive, root = [], []
    for i, s in enumerate(starts):
        arrive += [s + k * spacing for k in range(turns)]
        root += [first_id + i] * turns
    return np.array(arrive), np.array(root)


def test_load_from_sessions_already_running_is_fully_known_and_not_under_forecast():
    # 100 sessions all started in the first 10 s, each sending a request every 10 s for the whole run
    arrive, root = sessions(np.linspace(0, 10, 100), turns=200, spacing=10.0)
    v = visibility(arrive, root, horizon_s=300.0, start_s=120.0, end_s=1900.0)
    s = summarize(v)
    assert s["decisions"] == len(v.times) > 40
    assert s["known_share_median"] == s["known_share_p10"] == 1.0
    assert s["under_now"] == 0.0  # a flat rate: the future peak is the current rate (within the margin)
    assert np.allclose(v.now, 10.0, rtol=0.05)


def test_a_wave_of_new_sessions_is_unknown_before_it_starts():
    base = sessions(np.linspace(0, 10, 50), turns=200, spacing=10.0)
    wave = sessions(np.linspace(1000, 1010, 150), turns=100, spacing=10.0, first_id=1000)
    arrive, root = np.concatenate([base[0], wave[0]]), np.concatenate([base[1], wave[1]])
    v = visibility(arrive, root, horizon_s=300.0, start_s=120.0, end_s=1900.0)
    before = (v.times >= 800) & (v.times < 1000)  # the wave starts within the horizon, after t
    assert before.any()
    # the busiest future minute is the wave's: 150 of its 200 sessions had not started at t
    assert np.allclose(v.known[before], 0.25, atol=0.02)
    assert (v.future_peak[before] > 1.1 * v.now[before]).all()
    after = v.times >= 1030
    assert np.allclose(v.known[after], 1.0)


def test_the_session_projection_sees_a_wave_that_has_begun_before_its_load_has():
    # steady: sessions start at 1/s and live 300 s (60 turns 5 s apart): the projection stays at the rate
    rng = np.random.default_rng(0)
    starts = np.sort(rng.uniform(0, 3000, 3000))
    arrive, root = sessions(starts, turns=60, spacing=5.0)
    v = visibility(arrive, root, horizon_s=300.0, start_s=600.0, end_s=2700.0)
    assert np.median(v.sessions / v.now) == pytest.approx(1.0, abs=0.15)
    # then 10 new sessions a second for 60 s: the live sessions and the new-session rate show it at once
    wave = sessions(np.sort(rng.uniform(3000, 3060, 600)), turns=60, spacing=5.0, first_id=10_000)
    arrive2, root2 = np.concatenate([arrive, wave[0]]), np.concatenate([root, wave[1]])
    v2 = visibility(arrive2, root2, horizon_s=300.0, start_s=3030.0, end_s=3400.0)
    assert v2.sessions[0] > 1.5 * v2.now[0]


def test_cli_prints_the_tables_and_writes_the_report(tmp_path, capsys):
    assert main(["bench", "forecastability", "--seeds", "10", "--out", str(tmp_path), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "| tune-010-burst_short |" in out and "| burst_short | 1 |" in out
    report = json.loads((tmp_path / "report.json").read_text())
    row = report["scenarios"][0]
    assert row["family"] == "burst_short" and row["decisions"] > 0
    assert 0.0 <= row["known_share_p10"] <= row["known_share_median"] <= 1.0
    # the suite's held-out seeds, the unseen families' (sim/unseen.py) included
    assert report["held_out_seeds"] == seeds_text(HELD_OUT_SEEDS) == \
        "201-248,301-348,401-456,501-556,601-656,701-860,3001-3100"


def test_cli_refuses_bad_seeds(tmp_path, capsys):
    assert main(["bench", "forecastability", "--seeds", "x", "--out", str(tmp_path)]) == 2
    assert "--seeds" in capsys.readouterr().err

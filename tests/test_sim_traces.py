"""Arrival shapes from public traces (the suite's trace family): derivation, normalisation, refusal."""
from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from v41flash.cli.main import main
from v41flash_bench.sim import traces
from v41flash_bench.sim.workload import ArrivalSpec, _shape


def test_every_shipped_shape_names_its_source_licence_and_attribution():
    assert traces.shapes()
    for name, s in traces.shapes().items():
        assert s["source"].startswith("https://") and s["licence"] and s["attribution"], name
        assert s["bin_s"] == traces.BIN_S and len(s["counts"]) >= 50 and min(s["counts"]) >= 0, name
        assert max(s["counts"]) > 0


def test_counts_per_minute_from_an_azure_csv_and_a_mooncake_jsonl(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:17:03.9799600,10,1\n2023-11-16 18:17:04.0319600,10,1\n"
                   "2023-11-16 18:19:05.0000000,10,1\n2023-11-16 18:20:10.5000000,10,1\n")
    # 0 s, 0.05 s, 121 s, 186.5 s: minutes 0, 0, 2, 3 (the last, partial minute is dropped)
    assert traces.counts_per_bin(traces.timestamps(csv)) == [2, 0, 1]
    jl = tmp_path / "t.jsonl"
    jl.write_text("\n".join(json.dumps({"timestamp": ms, "input_length": 1}) for ms in (0, 59_000, 61_000, 130_000)))
    assert traces.counts_per_bin(traces.timestamps(jl)) == [2, 1]


def test_the_trace_shape_command_prints_an_entry(tmp_path, capsys):
    jl = tmp_path / "t.jsonl"
    jl.write_text("\n".join(json.dumps({"timestamp_ms": ms}) for ms in (0, 1_000, 70_000, 125_000)))
    assert main(["bench", "trace-shape", str(jl), "--name", "mine", "--licence", "CC0"]) == 0
    entry = json.loads(capsys.readouterr().out)["mine"]
    assert entry["counts"] == [2, 1] and entry["licence"] == "CC0" and entry["bin_s"] == 60.0


def test_the_trace_shape_command_refuses_a_trace_shorter_than_one_minute(tmp_path, capsys):
    jl = tmp_path / "t.jsonl"
    jl.write_text("\n".join(json.dumps({"timestamp": ms}) for ms in (0, 1_000, 30_000)))
    assert main(["bench", "trace-shape", str(jl), "--name", "short"]) == 2
    assert "less than one whole 60s bin" in capsys.readouterr().err


def test_level_is_the_played_part_relative_to_its_busiest_minute():
    name = "azure-code-2023"
    r = traces.rate(name)
    f = traces.level(name, offset_s=600.0, time_scale=1.0, duration_s=1200.0)
    played = f(np.arange(0.0, 1201.0, 1.0))
    assert played.max() == pytest.approx(1.0) and played.min() >= 0.0
    # at a bin centre the level is that minute's rate over the played part's peak
    centre = 630.0 - 600.0  # minute 10's centre is trace second 630
    assert float(f(centre)) == pytest.approx(r[10] / r[9:31].max())
    # time scale: simulated second t plays trace second offset + 2 t
    g = traces.level(name, offset_s=0.0, time_scale=2.0, duration_s=1200.0)
    assert float(g(315.0)) == pytest.approx(r[10] / r[:41].max())


def test_level_refuses_a_part_past_the_trace_end():
    with pytest.raises(ValueError, match="runs past"):
        traces.level("azure-conv-2023", offset_s=3000.0, time_scale=1.0, duration_s=2400.0)


def test_arrival_spec_names_a_shipped_trace_and_only_with_the_trace_pattern():
    with pytest.raises(ValidationError, match="arrivals.trace"):
        ArrivalSpec(pattern="trace", trace="nope")
    with pytest.raises(ValidationError, match="arrivals.trace"):
        ArrivalSpec(pattern="steady", trace="azure-code-2023")
    arr = ArrivalSpec(pattern="trace", trace="azure-conv-2023", trace_offset_s=120.0, trace_time_scale=1.0)
    f = _shape(arr, 2400.0, None)
    assert float(f(np.array([0.0]))[0]) == pytest.approx(traces.level("azure-conv-2023", 120.0, 1.0, 2400.0)(0.0))


def test_a_scenario_replays_a_teams_own_shape_from_the_file_trace_shape_wrote(tmp_path, capsys):
    from v41flash_bench.sim.scenario import load_scenario

    jl = tmp_path / "ours.jsonl"
    jl.write_text("\n".join(json.dumps({"timestamp": ms}) for ms in [*range(0, 60_000, 1000), 61_000, 125_000, 190_000]))
    assert main(["bench", "trace-shape", str(jl), "--name", "ours"]) == 0
    (tmp_path / "ours.json").write_text(capsys.readouterr().out)
    (tmp_path / "sc.yaml").write_text(
        "name: mine\ndurationS: 120\narrivals: {pattern: trace, trace: ours.json, peakRps: 5}\n")
    sc = load_scenario(tmp_path / "sc.yaml")
    assert sc.arrivals.trace == str(tmp_path / "ours.json")  # relative to the scenario file
    f = _shape(sc.arrivals, sc.duration_s, None)
    assert float(f(30.0)) == pytest.approx(1.0) and float(f(90.0)) == pytest.approx(1 / 60)
    with pytest.raises(ValueError, match="runs past"):
        traces.level(str(tmp_path / "ours.json"), 0.0, 1.0, 200.0)
    (tmp_path / "bad.json").write_text('{"a": {"bin_s": 60}, "b": {}}')
    with pytest.raises(ValidationError, match="expected one entry"):
        ArrivalSpec(pattern="trace", trace=str(tmp_path / "bad.json"))
    with pytest.raises(ValidationError, match="neither a shipped trace"):
        ArrivalSpec(pattern="trace", trace=str(tmp_path / "missing.json"))

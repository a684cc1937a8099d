"""`make test`'s runner (e2e/make_test.py): every e2e module in exactly one shard, and any failing phase (a pytest exit
5 included) fails the run."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from e2e import make_test as M

REPO = Path(__file__).resolve().parents[1]


def test_every_e2e_module_runs_in_exactly_one_shard():
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "e2e").glob("test_*.py"))
    for n in (1, 2, 3, len(modules) + 2):
        shards = M.shard_modules(modules, n)
        dealt = [m for s in shards for m in s]
        assert sorted(dealt) == modules and len(dealt) == len(set(dealt)), n
        assert len(shards) == min(n, len(modules))


def test_shards_are_dealt_by_measured_seconds_and_a_new_module_is_dealt_too():
    seconds = {"a.py": 100, "b.py": 60, "c.py": 50, "d.py": 10}
    assert M.shard_modules(["a.py", "b.py", "c.py", "d.py", "new.py"], 2, seconds, default=30) == [
        ["a.py", "new.py"], ["b.py", "c.py", "d.py"]]


def test_the_first_shard_uses_the_default_state_so_make_down_stops_it(monkeypatch, tmp_path):
    monkeypatch.setenv("V41F_STATE", str(tmp_path / "st"))
    assert M.shard_state(1) == tmp_path / "st" and M.shard_state(2) == tmp_path / "st-shard2"


def _fake_pytest(tmp_path: Path, exits: dict[str, int]) -> Path:
    """A stand-in for .venv/bin/pytest that exits with exits[<suite>] (the suite read from its arguments)."""
    script = tmp_path / "pytest"
    script.write_text("#!/bin/sh\n"
                      f'case "$*" in *" tests"*) echo unit; exit {exits["unit"]};; esac\n'
                      f'echo e2e "$*"; exit {exits["e2e"]}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize("exits,rc", [
    ({"unit": 0, "e2e": 0}, 0),
    ({"unit": 5, "e2e": 0}, 1),  # no unit test collected: a failure
    ({"unit": 0, "e2e": 5}, 1),
    ({"unit": 1, "e2e": 0}, 1),
    ({"unit": 0, "e2e": 2}, 1),  # interrupted
])
def test_any_failing_suite_fails_the_run(tmp_path, monkeypatch, capsys, exits, rc):
    monkeypatch.setattr(M, "PYTEST", _fake_pytest(tmp_path, exits))
    monkeypatch.setattr(M, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(M, "build_tools", lambda components: 0)
    monkeypatch.setattr(M, "wait_cluster_up", lambda state, suite: None)
    assert M.main(["--shards", "2"]) == rc
    out = capsys.readouterr().out
    assert "phase times" in out and "tools " in out and "unit " in out and "e2e " in out and "total " in out
    assert "[unit] unit" in out and "[e2e 1] e2e" in out and "[e2e 2] e2e" in out


def test_a_tool_that_fails_to_build_fails_the_run_and_runs_no_suite(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(M, "PYTEST", _fake_pytest(tmp_path, {"unit": 0, "e2e": 0}))
    monkeypatch.setattr(M, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(M, "build_tools", lambda components: 1)
    assert M.main([]) == 1
    out = capsys.readouterr().out
    assert "[unit]" not in out and "[e2e" not in out and "FAILED: tools" in out


def test_every_tool_a_unit_test_requires_is_built_before_the_unit_suite():
    """A unit test that needs a built tool (prereq.require_tool, its build command naming the component) fails under
    CI when the tool is missing; `make test` builds only UNIT_TOOLS before the unit suite starts, so on a cold cache
    a component left out of it fails the run (inference-sim did, 2026-12-07; kwok before it)."""
    import re
    unit_tools = set(re.search(r"^UNIT_TOOLS := (.*)$", (REPO / "Makefile").read_text(), re.M).group(1).split())
    needed = {m for p in (REPO / "tests").glob("*.py")  # the build command each require_tool call quotes
              for m in re.findall(r"[\"']bash e2e/build-tools\.sh ([a-z][a-z0-9-]*)[\"']", p.read_text())}
    assert needed and {"helm", "inference-sim"} <= needed, needed  # the scan finds what it looks for
    assert needed <= unit_tools, sorted(needed - unit_tools)

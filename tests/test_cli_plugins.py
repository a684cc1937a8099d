"""Evaluation commands (`bench ...`, `profile build`) reach the `v41flash` CLI as plugins (entry points of
cli/main.PLUGIN_GROUP), so the product never imports the evaluation package; without it (the operator image) each
is still listed and says how to install the bench extra."""
from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from v41flash.cli.main import PLUGIN_GROUP, build_parser, main


def test_the_evaluation_commands_are_plugins():
    plugins = {ep.name: ep.value for ep in metadata.entry_points(group=PLUGIN_GROUP)}
    assert plugins == {"bench": "v41flash_bench.cli:register", "profile.build": "v41flash_bench.profiles.cli:register"}
    parser = build_parser()
    for argv in (["bench", "autoscale", "--help"], ["profile", "build", "--help"]):
        with pytest.raises(SystemExit) as done:
            parser.parse_args(argv)
        assert done.value.code == 0


@pytest.mark.parametrize("argv", [["bench", "autoscale", "--scenario", "x.yaml"],
                                  ["profile", "build", "--from", "r.json"], ["profile", "build"]])
def test_without_the_evaluation_package_a_command_says_how_to_install_it(argv):
    # a fresh interpreter in which v41flash_bench is not found, as in the image (its entry points are still there)
    code = ("import sys\n"
            "class Absent:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'v41flash_bench':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Absent())\n"
            "from v41flash.cli.main import main\n"
            f"sys.exit(main({argv!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    command = "v41flash bench" if argv[0] == "bench" else "v41flash profile build"
    assert f"{command} needs the evaluation package (the bench extra): pip install 'v41flash[bench]'" in done.stderr


def test_a_missing_module_inside_the_product_is_not_taken_for_a_missing_extra(monkeypatch):
    broken = metadata.EntryPoint("bench", "v41flash.cli.no_such_module:register", PLUGIN_GROUP)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [broken] if group == PLUGIN_GROUP else [])
    with pytest.raises(ModuleNotFoundError):
        main(["bench"])

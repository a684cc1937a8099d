"""The invalid-CR corpus (tests/invalid/*.yaml): each file names the field its problem must cite and
whether the apiserver refuses it at admission ('refused') or only the operator can tell ('stalled').
Used by the offline tests (tests/test_api.py) and by the e2e admission tests on a real apiserver."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

INVALID_DIR = Path(__file__).resolve().parents[1] / "tests" / "invalid"


@dataclass(frozen=True)
class InvalidCase:
    name: str
    path: Path
    field: str
    admission: str  # refused | stalled

    def doc(self) -> dict:
        return yaml.safe_load(self.path.read_text())


def invalid_cases() -> list[InvalidCase]:
    cases = []
    for path in sorted(INVALID_DIR.glob("*.yaml")):
        text = path.read_text()
        field = re.search(r"^# field: (\S+)$", text, re.M).group(1)
        admission = re.search(r"^# admission: (refused|stalled)$", text, re.M).group(1)
        cases.append(InvalidCase(path.stem, path, field, admission))
    return cases

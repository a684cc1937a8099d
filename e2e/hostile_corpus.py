"""The hostile corpus (tests/hostile/*.yaml, issue 12): specs an attacker or a careless user would write.

Each file says `# expect: refused` with the `# field:` its problem must name and whether the apiserver
refuses it at admission (`# admission: refused`) or only the operator can tell (`stalled`), or
`# expect: harmless` with the `# check:` (in tests/test_hostile.py) that renders it and proves the result
harmless. Used offline (tests/test_hostile.py) and at admission by e2e (e2e/test_security.py)."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

HOSTILE_DIR = Path(__file__).resolve().parents[1] / "tests" / "hostile"


@dataclass(frozen=True)
class HostileCase:
    name: str
    path: Path
    expect: str  # refused | harmless
    field: str = ""
    admission: str = ""
    check: str = ""

    def doc(self) -> dict:
        # one case nests 3,000 levels: more than the YAML/JSON readers' default recursion allows
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20000))
        try:
            return yaml.load(self.path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        finally:
            sys.setrecursionlimit(limit)


def _tag(text: str, key: str) -> str:
    m = re.search(rf"^# {key}: (\S+)$", text, re.M)
    return m.group(1) if m else ""


def hostile_cases() -> list[HostileCase]:
    out = []
    for path in sorted(HOSTILE_DIR.glob("*.yaml")):
        head = "\n".join(path.read_text().splitlines()[:6])
        out.append(HostileCase(path.stem, path, _tag(head, "expect"), _tag(head, "field"), _tag(head, "admission"),
                               _tag(head, "check")))
    return out

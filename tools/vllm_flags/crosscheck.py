"""Cross-check: run vLLM 0.33.0's REAL `vllm serve` parser on what the operator renders and on the
test corpora, and compare with the snapshot-based `check_serve_args`.

Runs in the same scratch venv as dump.py (see docs/decisions/2026-11-30-vllm-flag-snapshot.md); it imports
`v41flash.vllm` from operator/ (stdlib-only) and the test corpora from tests/test_vllm_flags.py. The
rendered corpus is the whole catalog: shapes x roles x options, GPU x shape x role x agent feature set,
and every AgentX preset point per role.

    /tmp/vllm-flags-venv/bin/python tools/vllm_flags/crosscheck.py

Prints one line per disagreement and a summary table; exits 1 if the real parser rejects a rendered
command or a recipe line, or accepts a case check_serve_args rejects without a documented reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path
from unittest.mock import MagicMock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dump  # noqa: E402  (same directory: the parser built exactly as for the snapshot)

# check_serve_args is stricter than argparse on purpose here (see flags.py); the real parser
# accepts these, or rejects them only later in EngineArgs.create_engine_config.
STRICTER_BY_DESIGN = (
    "repeats",  # argparse keeps the last value silently
    "unknown key 'num_spec_tokens' for SpeculativeConfig",  # a dict until create_speculative_config
    "unexpected positional argument",  # argparse: "unrecognized arguments" -> also rejected, kept
    "is not an int",  # pydantic's lax mode coerces the JSON string "16" to 16
)


def real_parse(parser, argv: list[str]) -> str | None:
    """None when vLLM's parser accepts argv, else its error message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(list(argv))
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue() else "exit"
    except Exception as exc:  # a config's pydantic validation raising outside argparse
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def build_kv_transfer(parser, argv: list[str]) -> str | None:
    """The KV connector configs vLLM builds from a parsed argv: --kv-transfer-config, and one per
    MultiConnector child (as MultiConnector does); None when all construct, else the error."""
    from vllm.config.kv_transfer import KVTransferConfig

    try:
        kv = parser.parse_args(list(argv)).kv_transfer_config
        if kv is None:
            return None
        if not isinstance(kv, KVTransferConfig):
            kv = KVTransferConfig(**kv)
        for child in kv.kv_connector_extra_config.get("connectors", []):
            KVTransferConfig(**{"engine_id": kv.engine_id, **child})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def load_test_corpora() -> tuple[dict[str, list[str]], list[tuple[list[str], str]], str]:
    sys.modules.setdefault("pytest", MagicMock())  # the module only decorates with pytest.mark
    spec = importlib.util.spec_from_file_location("test_vllm_flags", ROOT / "tests/test_vllm_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    recipe = {**module.RECIPE_COMMANDS, "accepted spellings": [module.MODEL, *module.ACCEPTED]}
    return recipe, module.BAD, module.MODEL


def rendered_commands() -> dict[str, list[str]]:
    from v41flash.vllm.args import build_replica, expand_k8s_vars
    from v41flash.vllm.catalog import feature_configs, preset_configs, reference_configs

    out = {}
    for name, cfg in {**reference_configs(), **feature_configs(), **preset_configs()}.items():
        replica = build_replica(cfg)
        out[f"{name} leader"] = expand_k8s_vars(replica.leader.args, {"LWS_LEADER_ADDRESS": "l.svc"})
        for index in range(1, cfg.nodes_per_replica):
            env = {"LWS_LEADER_ADDRESS": "l.svc", "LWS_WORKER_INDEX": str(index)}
            out[f"{name} worker{index}"] = expand_k8s_vars(replica.worker.args, env)
    return out


def main() -> int:
    dump.install_base_mocks()
    parser = dump.build_serve_parser()
    from v41flash.vllm.flags import check_serve_args

    recipe, bad, model = load_test_corpora()
    failures: list[str] = []
    counts = {"rendered": 0, "recipe": 0, "bad": 0, "bad_stricter": 0}
    for group, cases in (("rendered", rendered_commands()), ("recipe", recipe)):
        for name, argv in cases.items():
            counts[group] += 1
            real = real_parse(parser, argv)
            if real is not None or check_serve_args(argv):
                failures.append(f"{group} {name}: real parser: {real}; check: {check_serve_args(argv)}")
            elif group == "rendered" and (kv_error := build_kv_transfer(parser, argv)):
                failures.append(f"rendered {name}: KVTransferConfig: {kv_error}")
    for tail, expected in bad:
        argv = [model, *tail]
        counts["bad"] += 1
        real = real_parse(parser, argv)
        if real is None:
            if any(s in expected for s in STRICTER_BY_DESIGN) or any(
                s in p for p in check_serve_args(argv) for s in STRICTER_BY_DESIGN
            ):
                counts["bad_stricter"] += 1
                continue
            failures.append(f"bad {tail}: real parser ACCEPTS it, check_serve_args says {expected!r}")
    for line in failures:
        print("DISAGREE", line)
    print(f"{'corpus':<10} {'cases':>6}  result")
    print(f"{'rendered':<10} {counts['rendered']:>6}  real parser accepts all: {not any(f.startswith('rendered') for f in failures)}"
          f" (and every KVTransferConfig, MultiConnector children included, constructs)")
    print(f"{'recipe+ok':<10} {counts['recipe']:>6}  real parser accepts all: {not any(f.startswith('recipe') for f in failures)}")
    print(f"{'bad':<10} {counts['bad']:>6}  real parser rejects {counts['bad'] - counts['bad_stricter']}, "
          f"{counts['bad_stricter']} stricter-by-design (duplicates / later-stage checks)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

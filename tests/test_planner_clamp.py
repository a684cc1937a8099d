"""Step 6, clamp (planner/clamp.py): bounds, then the GPU budget."""
from __future__ import annotations

from v41flash.planner.act import Verdict
from v41flash.planner.clamp import Claim, clamp
from v41flash.planner.datatypes import RoleBounds


def claim(role, desired, current, bounds=RoleBounds(1, 20), need=None):
    action = "scale_up" if desired > current else "scale_down" if desired < current else "hold"
    return Claim(role, Verdict(desired, action, "why"), current, bounds, 4, need if need is not None else float(desired))


def test_clamp_applies_bounds_and_says_so():
    out = clamp((claim("prefill", 7, 2, RoleBounds(1, 4)), claim("decode", 1, 1, RoleBounds(2, 8))), None)
    p, d = out.verdicts
    assert (p.desired, p.action, p.clamped) == (4, "scale_up", "max replicas 4 (wanted 7)")
    assert p.why == "why; clamped to max replicas 4 (wanted 7)"
    assert (d.desired, d.action, d.clamped) == (2, "scale_up", "min replicas 2 (wanted 1)")
    assert out.notes == ()


def test_clamp_leaves_a_role_without_autoscaling_as_it_is():
    off = claim("prefill", 3, 3, RoleBounds(5, 8, autoscale=False))
    assert clamp((off,), None).verdicts == (off.verdict,)


def test_the_gpu_budget_goes_replica_by_replica_to_the_role_under_most_pressure():
    out = clamp((claim("prefill", 7, 2, need=6.5), claim("decode", 2, 1, need=1.8)), 28)
    p, d = out.verdicts
    assert (p.desired + d.desired) * 4 == 28 and d.desired == 2 and p.desired == 5
    assert p.clamped == "GPU budget 28 (model wanted 7 prefill replicas, got 5)" and d.clamped is None
    assert p.why.endswith("; clamped by GPU budget 28 (model wanted 7 prefill replicas, got 5)")
    # room for one more replica: the role furthest below its need (6.5 on 2 vs 1.8 on 1) gets it
    p, d = clamp((claim("prefill", 7, 2, need=6.5), claim("decode", 2, 1, need=1.8)), 16).verdicts
    assert (p.desired, d.desired) == (3, 1) and d.clamped == "GPU budget 16 (model wanted 2 decode replicas, got 1)"


def test_the_gpu_budget_never_scales_down_what_already_runs():
    out = clamp((claim("prefill", 7, 6), claim("decode", 3, 3)), 16)
    assert [v.desired for v in out.verdicts] == [6, 3] and out.verdicts[0].action == "hold"
    assert out.notes == ("current replicas already use 36 GPUs > budget 16; no scale-up",)

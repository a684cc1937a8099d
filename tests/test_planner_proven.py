"""Proven capacity (caps.proven_cap): P/D prefill's scale-up stops at the replicas per unit of prompt work that
were seen to hold the TTFT target, while it holds; a breach at a proven ratio withdraws the proof."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner_sim import PROFILE, SLO, truth
from test_planner import T, decide, observe
from v41flash.controller.autoscale import durable_state
from v41flash.figures import RouterFigures
from v41flash.planner.datatypes import PlannerConfig, PlannerState

# a queueing model far more pessimistic than the crafted world: it asks for 7 prefill replicas where 3 hold
PESSIMIST = PlannerConfig().with_knobs(service_cv2=30.0)


def run(windows, config=PESSIMIST, state=PlannerState()):
    """Decide on each observation in turn (30 s apart); returns the decisions."""
    out = []
    for i, obs in enumerate(windows):
        d = decide(obs, state, now=T + 30 * i, config=config)
        state = d.state
        out.append(d)
    return out


def test_three_windows_that_held_cap_the_models_scale_up():
    assert truth(10, 3, 2)["ttft"] <= PESSIMIST.act.proven_ttft_margin * SLO.ttft_s  # the world holds it with room
    ds = run([observe(10, prefill=3, decode=2)] * 4)
    # no proof yet: the model's need, however pessimistic, is what the planner asks
    assert ds[0].prefill.desired == ds[1].prefill.desired == 8 and ds[0].prefill.needed > 7
    assert "proven capacity" not in ds[0].prefill.reason
    # the third window that held is the proof: 3 replicas did this work, so 3 is where scale-up stops
    assert ds[2].prefill.desired == 3 and ds[2].prefill.action == "hold"
    assert "(proven capacity: 3 held this work's TTFT before)" in ds[2].prefill.reason
    assert ds[2].prefill.needed == ds[0].prefill.needed  # the model's own need is still reported
    assert len(ds[3].state.prefill.proven) == 4


def test_the_cap_scales_with_the_prompt_work_of_the_demand():
    assert truth(15, 4, 2)["ttft"] <= PESSIMIST.act.proven_ttft_margin * SLO.ttft_s
    ds = run([observe(10, prefill=3, decode=2)] * 3 + [observe(15, prefill=4, decode=2)])
    # 1.5× the requests of the same mix: 1.5 × 3 proven replicas, rounded up (the model asks for more still)
    assert ds[-1].prefill.needed > 7
    assert ds[-1].prefill.desired == 5 and "(proven capacity: 5 held" in ds[-1].prefill.reason


def test_windows_too_close_to_the_target_prove_nothing():
    edge = PESSIMIST.act.proven_ttft_margin * SLO.ttft_s * 1.05  # held the SLO, but without the margin
    obs = observe(10, prefill=3, decode=2, pw={"ttft_s": edge})
    ds = run([obs] * 4)
    assert all(not d.prefill.slo_breached for d in ds)
    assert all("proven capacity" not in d.prefill.reason for d in ds)
    assert ds[-1].state.prefill.proven == ()


def test_a_breach_at_a_proven_ratio_withdraws_the_proof():
    held = observe(10, prefill=3, decode=2)
    breach = observe(10, prefill=3, decode=2, pw={"ttft_s": SLO.ttft_s * 1.5})
    ds = run([held] * 3 + [breach, held])
    assert ds[2].state.prefill.proven and "proven capacity" in ds[2].prefill.reason
    # breached at the same replicas per work: the proofs at or below that ratio go, the model scales up
    assert ds[3].prefill.slo_breached and ds[3].state.prefill.proven == ()
    assert ds[3].prefill.desired > 3 and "proven capacity" not in ds[3].prefill.reason
    # one good window after is not yet a proof again
    assert "proven capacity" not in ds[4].prefill.reason and len(ds[4].state.prefill.proven) == 1


def test_no_cap_while_the_slo_is_breached():
    # proofs from a lighter load; now a breach at fewer replicas per work (more demand on the same fleet)
    held = observe(10, prefill=3, decode=2)
    hot = observe(30, prefill=3, decode=2)
    assert truth(30, 3, 2)["ttft"] > SLO.ttft_s
    ds = run([held] * 3 + [hot], config=PESSIMIST.with_knobs(breach_step_ratio=0.0))
    assert ds[3].prefill.slo_breached
    assert "proven capacity" not in ds[3].prefill.reason and ds[3].prefill.desired > 9
    assert ds[3].state.prefill.proven == ds[2].state.prefill.proven  # its ratio was below every proof


def test_windows_after_a_scale_down_prove_nothing():
    state = PlannerState()
    down = state.with_role("prefill", replace(state.prefill, last_action="scale_down", last_scale_time=T - 60))
    obs = observe(10, prefill=3, decode=2)
    assert len(run([obs], state=state)[0].state.prefill.proven) == 1
    # within down_breach_window_s of a scale-down: its moved sessions re-prefill, the removed replica served
    assert run([obs], state=down)[0].state.prefill.proven == ()


def test_old_proofs_expire():
    cfg = PESSIMIST.with_knobs(proven_history_s=60.0)
    ds = run([observe(10, prefill=3, decode=2)] * 5, config=cfg)
    assert all(len(d.state.prefill.proven) <= 2 for d in ds)  # 30 s apart, 60 s kept: never three
    assert all("proven capacity" not in d.prefill.reason for d in ds)


def test_zero_windows_turns_it_off():
    ds = run([observe(10, prefill=3, decode=2)] * 4, config=PESSIMIST.with_knobs(proven_min_windows=0))
    assert all(d.prefill.desired == 8 for d in ds) and ds[-1].state.prefill.proven == ()


def test_the_proofs_live_in_memory_not_in_status():
    ds = run([observe(10, prefill=3, decode=2)] * 3)
    state = ds[-1].state
    assert len(state.prefill.proven) == 3
    assert PlannerState.from_dict(state.to_dict()) == state  # round-trips where the planner keeps state
    assert "proven" not in durable_state(state)["prefill"]  # an operator restart rebuilds them (no cap meanwhile)


@pytest.mark.parametrize("rate", [6.0, 10.0, 14.0])
def test_the_scale_up_cap_never_lowers_what_already_runs(rate):
    # proofs at 3 replicas; the fleet now runs 5 and the pessimistic model asks for more: hold 5, no scale-down
    ds = run([observe(10, prefill=3, decode=2)] * 3 + [observe(rate, prefill=5, decode=2)])
    assert ds[-1].prefill.desired >= 5


def _with_new_sessions(obs, share):
    """The session proxy's figures: ``share`` of the arrivals are new sessions (no completed requests counted)."""
    return replace(obs, router=RouterFigures(start=T - 60, end=T, arrival_rate=10.0, new_session_rate=10.0 * share))


def test_a_wave_of_new_sessions_is_not_covered_by_proofs_made_without_one():
    calm = _with_new_sessions(observe(10, prefill=3, decode=2), 0.02)
    wave = _with_new_sessions(observe(10, prefill=3, decode=2), 0.20)  # 10× the new sessions: whole prompts
    ds = run([calm] * 3 + [wave, calm])
    assert "proven capacity: 3" in ds[2].prefill.reason
    assert "proven capacity" not in ds[3].prefill.reason and ds[3].prefill.desired == 8  # the model's need
    assert "proven capacity: 3" in ds[4].prefill.reason  # the calm proofs hold again for a calm window
    # a share within the slack (0.02 × 1.25 + 0.01) is covered; slack 0 turns the gate off
    near = _with_new_sessions(observe(10, prefill=3, decode=2), 0.035)
    assert "proven capacity: 3" in run([calm] * 3 + [near])[3].prefill.reason
    assert "proven capacity: 3" in run([calm] * 3 + [wave], config=PESSIMIST.with_knobs(proven_share_slack=0.0)
                                       )[3].prefill.reason
    # proofs made during a wave cover calmer windows
    assert "proven capacity: 3" in run([wave] * 3 + [calm])[3].prefill.reason


def test_a_fleet_above_what_was_proven_comes_down_to_it():
    # proofs at 3 replicas; the fleet runs 8, which the pessimistic model calls fit (it would ask for 8 at once)
    held = observe(10, prefill=3, decode=2)
    big = [observe(10, prefill=8, decode=2, t=T + 30 * i) for i in range(3, 27)]
    ds = run([held] * 3 + big)
    downs = [d for d in ds if d.prefill.action == "scale_down"]
    assert downs, [d.prefill.reason for d in ds[-3:]]
    first = downs[0]
    # through every scale-down guard: after the full stabilization window; 8 is over ×1.5 the proven 4 (3 × margin),
    # so a quarter of the 8 go at once (act.overshoot_down)
    assert first.prefill.desired == 6 and "scale-down to the proven capacity (3.0 × margin)" in first.prefill.reason
    assert first.prefill.decided_by == "overshoot_down"
    assert ds.index(first) * 30 >= PESSIMIST.act.scale_down_stabilization_s
    # without it the model's own need holds the fleet
    off = run([held] * 3 + big, config=PESSIMIST.with_knobs(proven_down=False))
    assert all(d.prefill.action != "scale_down" for d in off)


def test_no_proven_scale_down_in_a_breach():
    held = observe(10, prefill=3, decode=2)
    hot = [observe(10, prefill=8, decode=2, t=T + 30 * i, pw={"ttft_s": SLO.ttft_s * 1.2}) for i in range(3, 27)]
    ds = run([held] * 3 + hot)
    assert all(d.prefill.action != "scale_down" and "proven capacity" not in d.prefill.reason for d in ds[3:])

"""Graceful scale-down: which pods go and their deletion-cost annotations (drain timing: test_render_timing.py)."""
from __future__ import annotations

from v41flash.planner.drain import POD_DELETION_COST, PodLoad, deletion_cost_annotations, pods_to_remove

PODS = [
    PodLoad("a", running=12, created=100),
    PodLoad("b", running=2, waiting=1, created=200),
    PodLoad("c", running=3, created=300),
    PodLoad("d", running=0, ready=False, created=400),
    PodLoad("e", running=3, created=50),
]


def test_least_loaded_are_removed_not_ready_first_and_newest_on_ties():
    assert pods_to_remove(PODS, 1) == ("d",)
    # b, c and e all carry 3 requests: the newest (coldest prefix cache) goes first
    assert pods_to_remove(PODS, 2) == ("d", "c")
    assert pods_to_remove(PODS, 3) == ("d", "c", "b")
    assert pods_to_remove(PODS, 0) == ()
    assert pods_to_remove(PODS, 9) == ("d", "c", "b", "e", "a")


def test_annotations_only_for_changes():
    patches = deletion_cost_annotations(PODS, ("d", "b"))
    assert patches == {"d": {POD_DELETION_COST: "-2"}, "b": {POD_DELETION_COST: "-1"}}
    # already annotated as wanted: nothing to write; a stale candidate is reset to 0
    pods = [PodLoad("d", deletion_cost=-2), PodLoad("b", deletion_cost=-1), PodLoad("x", deletion_cost=-5), PodLoad("y", deletion_cost=7)]
    assert deletion_cost_annotations(pods, ("d", "b")) == {"x": {POD_DELETION_COST: "0"}}


"""The hang watchdog, pure: per engine pod, when it last made progress, from its own /metrics.

Progress is any of the engine's work counters moving: tokens generated, prompt tokens, requests finished, engine
steps (``vllm:iteration_tokens_total``'s count, where the engine exports it: it moves inside a long chunked prefill
too). A pod is *hung* when it has requests running (or does not answer its /metrics within the scrape deadline: the
process lives, nothing comes) and none of those counters moved for ``hang_s`` seconds. An idle pod is never hung, and
a refused connection is not a hang (the process is gone: the kubelet restarts it), so both reset the clock.

The longest legitimate pause is the longest a running engine goes without any counter moving: without the step
counter, one whole prefill of the longest prompt (DeepSeek-V4.1-Flash at 262,144 tokens: about 9 s on a B200 DEP2
prefill engine by the shipped capacity profile, more on slower GPUs); the default of 30 s leaves that three times over.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..metrics.window import PodSnapshot
from ..vllm.metric_names import GEN_TOKENS, ITERATION_TOKENS, PROMPT_TOKENS, RUNNING, SUCCESS

TIMED_OUT = "timeout"  # how metrics/scrape.py starts the error of a scrape that got no whole page in time


@dataclass(frozen=True)
class Progress:
    """What the watchdog keeps per pod between scrapes."""
    work: float  # the sum of the work counters at the last scrape that answered
    since: float  # unix seconds: the last scrape that saw progress (or saw the pod idle, or first saw it)
    running: float = 0.0  # requests running at the last scrape that answered


@dataclass(frozen=True)
class Hung:
    pod: str
    role: str
    stalled_s: float
    running: float
    answered: bool  # its /metrics still answers (a stuck collective) or not (a frozen process)

    def message(self) -> str:
        how = "its /metrics answers" if self.answered else "its /metrics does not answer"
        return (f"{self.role} pod {self.pod} made no progress for {self.stalled_s:.0f} s with "
                f"{self.running:g} requests running ({how})")


def work_done(snapshot: PodSnapshot) -> tuple[float, float]:
    """(work counters summed over the pod's engines, requests running)."""
    work = running = 0.0
    for em in snapshot.engines.values():
        work += sum(em.counters.get(name, 0.0) for name in (GEN_TOKENS, PROMPT_TOKENS, SUCCESS))
        steps = em.histograms.get(ITERATION_TOKENS)
        work += steps.count if steps is not None else 0.0
        running += em.gauges.get(RUNNING, 0.0)
    return work, running


def watch(previous: Mapping[str, Progress], snapshots: Iterable[PodSnapshot], hang_s: float
          ) -> tuple[dict[str, Progress], list[Hung]]:
    """One scrape's step: the progress kept per pod (pods not scraped are forgotten) and the pods hung now."""
    kept: dict[str, Progress] = {}
    hung: list[Hung] = []
    for s in snapshots:
        before = previous.get(s.pod)
        if not s.ok:
            if before is None or not s.error.startswith(TIMED_OUT):
                continue  # refused, HTTP error, no vllm series: not a hang (the kubelet or the scraper's business)
            kept[s.pod] = before  # it lives and does not answer: the clock runs on
            stalled = s.time - before.since
            if stalled >= hang_s:
                hung.append(Hung(s.pod, s.role, stalled, before.running, answered=False))
            continue
        work, running = work_done(s)
        if before is None or work != before.work or running <= 0:
            kept[s.pod] = Progress(work, s.time, running)  # progress, idle, or first seen
            continue
        kept[s.pod] = Progress(work, before.since, running)
        if s.time - before.since >= hang_s:
            hung.append(Hung(s.pod, s.role, s.time - before.since, running, answered=True))
    return kept, hung

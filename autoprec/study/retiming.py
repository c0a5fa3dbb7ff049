"""The front re-timed: its plans and the fastest others within the limit, each beside all-FP32 in
interleaved rounds (on one worker's device each, spread over the study's workers), so the choice
does not rest on one lucky or unlucky trial; membership decided again on the re-timed numbers."""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import replace
from functools import partial
from typing import Any, Callable, Sequence

import optuna

from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Plan
from autoprec.record.trial import Paired, Retiming, TrialRecord
from autoprec.study.coordination import (
    SharedSteps,
    StepFailure,
    each_result,
)
from autoprec.study.reading import finished_records, record, uniform_trials

log = logging.getLogger("autoprec")


# why a plan was not re-timed where the study has no all-FP32 plan (an --override without fp32)
NO_FP32 = "no all-FP32 trial to re-time it beside"


def pareto_front(study: optuna.Study) -> list[TrialRecord]:
    """Optuna's Pareto front (feasible trials only when --max-loss is set), one trial per plan."""
    front, seen = [], set()
    for trial in sorted(study.best_trials, key=lambda t: t.values[0]):
        r = record(trial)
        if r is not None and r.plan.key() not in seen:
            seen.add(r.plan.key())
            front.append(r)
    return front


def retime(records: Sequence[TrialRecord], fp32: TrialRecord | None,
           time_paired: Callable[[Plan, Plan, int, float | None], Paired],
           rounds: int = 3, shared: SharedSteps | None = None) -> Retiming:
    """Time each plan again beside the all-FP32 plan (``fp32``), one plan at a time, in interleaved
    rounds (``time_paired``: :meth:`autoprec.measure.measurement.Measurer.time_paired`), so the
    choice does not rest on one lucky or unlucky trial, and memory does not grow with the plans
    re-timed. The all-FP32 plan's re-timed figure is every round it ran beside them. A plan whose
    re-timing fails (a crash, the memory or time limit) keeps its trial's timing, and is said in
    ``failed``. With ``shared``, the study's workers re-time the plans side by side, each plan
    beside all-FP32 on one worker's device, each plan once."""
    if fp32 is None:
        return Retiming({}, failed=tuple({"trial": r.number, "error": NO_FP32} for r in records))
    # the plans at the least loss first: a later one slower than one of them in two rounds needs no third
    others = sorted((r for r in records if r.plan.key() != fp32.plan.key()),
                    key=lambda r: (r.loss if math.isfinite(r.loss) else math.inf, r.latency_ms))
    timed_here: dict[int, dict[str, Any]] = {}
    steps = [(f"{fp32.number}:{r.number}:{rounds}",
              partial(_paired_rounds, time_paired, fp32.plan, r, rounds, timed_here, others))
             for r in others]
    found = shared.spread(steps) if shared is not None else {step: each_result(compute) for step, compute in steps}
    timed_by = shared.workers_of([step for step, _ in steps]) if shared is not None else set()
    if len(timed_by) > 1:
        log.info(f"re-timing: {len(steps)} plan(s) re-timed by {len(timed_by)} workers of the "
                 "study (or its earlier runs), each beside all-FP32 on its own device; each "
                 "plan's rounds are read against its own all-FP32's")
        found = _on_one_scale(found)
    trials, reference, failed, builds, apart = {}, [], [], 0, False
    for candidate, (step, _) in zip(others, steps):
        paired = found[step]
        if isinstance(paired, StepFailure):
            failed.append({"trial": candidate.number, "error": paired.text})
            continue
        trials[candidate.number] = replace(candidate, retimed_ms=tuple(paired["candidate"]))
        reference += paired["reference"]
        builds, apart = builds + paired["builds"], apart or paired["apart"]
    if reference:
        trials[fp32.number] = replace(fp32, retimed_ms=tuple(reference))
    return Retiming(trials, builds, apart, tuple(failed))


def _on_one_scale(found: dict[str, Any]) -> dict[str, Any]:
    """Re-timings from several devices, each plan's rounds (and its all-FP32's) rescaled so that its
    all-FP32 median is the median of all of them: what each pairing measured is the plan against
    all-FP32 on one device, and a device 3 % slower than another would otherwise decide the
    front."""
    timed = {step: paired for step, paired in found.items() if not isinstance(paired, StepFailure)}
    if not timed:
        return found
    pooled = statistics.median(ms for paired in timed.values() for ms in paired["reference"])
    rescaled = {}
    for step, paired in timed.items():
        factor = pooled / statistics.median(paired["reference"])
        rescaled[step] = {**paired, "candidate": [ms * factor for ms in paired["candidate"]],
                          "reference": [ms * factor for ms in paired["reference"]]}
    return {**found, **rescaled}


def _paired_rounds(time_paired: Callable[[Plan, Plan, int, float | None], Paired], fp32: Plan,
                   candidate: TrialRecord, rounds: int, timed_here: dict[int, dict[str, Any]],
                   others: Sequence[TrialRecord]) -> dict[str, Any]:
    """One plan re-timed beside all-FP32: each round's median, as the study stores it (and kept in
    ``timed_here``, by trial number, for the plans re-timed after it)."""
    try:
        paired = time_paired(fp32, candidate.plan, rounds, _dominated_ms(candidate, timed_here, others))
    except (AutoprecError, RuntimeError, ValueError) as exc:
        raise StepFailure(f"{type(exc).__name__}: {exc}"[:1000]) from None
    found = {"candidate": [t.median_ms for t in paired.candidate],
             "reference": [t.median_ms for t in paired.reference],
             "builds": paired.builds, "apart": paired.apart}
    timed_here[candidate.number] = found
    return found


def _dominated_ms(candidate: TrialRecord, timed_here: dict[int, dict[str, Any]],
                  others: Sequence[TrialRecord]) -> float | None:
    """The latency past which ``candidate`` is dominated: the re-timed median of a plan at no more
    loss that this worker re-timed before it, or of all-FP32's rounds beside them (the least of
    those); None where none was."""
    ahead = [statistics.median(found["candidate"]) for r in others
             if (found := timed_here.get(r.number)) and r.loss <= candidate.loss]
    fp32 = [ms for found in timed_here.values() for ms in found["reference"]]
    ahead += [statistics.median(fp32)] if fp32 else []
    return min(ahead, default=None)


# Final re-timing of the front: enough rounds for a max/min comparison to mean something (two where a
# third could not change what the re-timing decides: measurement.enough_rounds).
RETIME_ROUNDS = 3


# Besides the front, this many of the fastest plans within --max-loss are re-timed: a coarse loss (a
# task metric on a few items) ties many plans at one value, and the front keeps one per loss value,
# chosen on a single trial's timing.
RETIME_FEASIBLE = 3


def retimed_front(
    study: optuna.Study, time_paired: Callable[[Plan, Plan, int, float | None], Paired],
    rounds: int = RETIME_ROUNDS,
    max_loss: float | None = None, shared: SharedSteps | None = None,
) -> tuple[list[TrialRecord], Retiming]:
    """The Pareto front, fastest first, after it and the ``RETIME_FEASIBLE`` fastest other plans
    within ``max_loss`` were timed again beside the all-FP32 plan in ``rounds`` interleaved rounds
    (see :func:`retime`; with ``shared``, spread over the study's workers); and the re-timing.

    Membership is decided again on the re-timed numbers: a member that the re-timing shows slower
    than another re-timed plan at no less loss (the all-FP32 plan included) is dominated, and
    leaves the front, and the all-FP32 plan is on it when nothing re-timed dominates it: the front
    shown is a front in the numbers shown, never empty."""
    front = pareto_front(study)
    finished = finished_records(study)
    fp32 = uniform_trials(finished).get("fp32")
    on_front = {r.plan.key() for r in front}
    feasible = sorted(
        (
            r
            for r in finished
            if max_loss is not None and r.loss <= max_loss and r.plan.key() not in on_front and r.duplicate_of is None
        ),
        key=lambda r: r.latency_ms,
    )
    extra, seen = [], set(on_front)
    for r in feasible:
        if r.plan.key() not in seen and len(extra) < RETIME_FEASIBLE:
            seen.add(r.plan.key())
            extra.append(r)
    candidates = [*front, *extra, *([fp32] if fp32 else [])]
    retiming = retime(list({r.number: r for r in candidates}.values()), fp32, time_paired, rounds,
                      shared)
    shown, plans = [], set()
    # one trial per plan: the front's, the fastest feasible others, the all-FP32 plan
    for r in candidates:
        if r.plan.key() not in plans:
            plans.add(r.plan.key())
            shown.append(retiming.trials.get(r.number, r))
    # the all-FP32 plan rejoins the front when the re-timing shows nothing faster at its (zero) loss
    kept = [r for r in shown if not any(_dominates(other, r) for other in shown)]
    return sorted(kept, key=lambda r: r.latency_ms), retiming


def _dominates(a: TrialRecord, b: TrialRecord) -> bool:
    """``a`` is at least as fast and as accurate as ``b``, and better in one (different plans
    only)."""
    if a.plan.key() == b.plan.key():
        return False
    return a.latency_ms <= b.latency_ms and a.loss <= b.loss and (a.latency_ms < b.latency_ms or a.loss < b.loss)

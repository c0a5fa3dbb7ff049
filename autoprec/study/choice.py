"""The shipped plan's choice: the fastest plan within the limit (the knee without one), judged on the held-out
batches, timed with its rivals beside all-FP32 and the given model, and shipped only where it is faster than
all-FP32 beyond timing noise."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, Sequence

from autoprec.core.errors import AutoprecError, first_line
from autoprec.core.plan import Plan, Precision
from autoprec.core.stored import StoredModel
from autoprec.measure import speedup
from autoprec.measure.confirmation import HeldOut, HeldOutJudge
from autoprec.measure.measurement import Measurer
from autoprec.measure.speedup import Claim, Steadiness
from autoprec.study.optimize import RETIME_ROUNDS, TrialRecord, uniform_trials

log = logging.getLogger("autoprec")


class FinalTiming(Protocol):
    """The final timing of the chosen plan and its rivals (``contenders``, the chosen one first) beside all-FP32 and
    the given model, until their speed-ups are known (:mod:`autoprec.measure.speedup`): its rounds, or None where it
    did not time them (the speed-up then stands on the re-timing's rounds, as where the timing fails)."""

    def __call__(self, measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord], seconds: float,
                 apart: bool) -> speedup.Rounds | None: ...


def timed_until_known(measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord], seconds: float,
                      apart: bool) -> speedup.Rounds:
    """The final timing a search runs: the measurer times the plans in blocks of interleaved rounds, every model's
    session built anew for each block, until their speed-ups' intervals are narrow or ``seconds`` pass."""
    chosen = contenders[0]
    beside = f" and trial(s) {', '.join(str(r.number) for r in contenders[1:])}, which the re-timing could not " \
        "tell from it," if len(contenders) > 1 else ""
    log.info(
        f"timing the chosen plan (trial {chosen.number}){beside} beside all-FP32 and the given model until the "
        f"speed-ups are known ({speedup.CONFIDENCE:.0%} interval within {speedup.NARROW:.0%}; every model's session "
        f"built anew for each of {speedup.MIN_BLOCKS} or more blocks of rounds, then up to {seconds:g} s)"
    )
    return measurer.time_compared(fp32.plan, [r.plan for r in contenders], seconds, apart)


def not_timed(measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord], seconds: float,
              apart: bool) -> None:
    """No final timing: the chosen plan ships with the speed-up the re-timing's rounds give it (a search in a
    hurry, and the tests that are not about the final timing)."""
    return None


# Re-timed plans this close to the chosen one's latency (a fraction of it) are its rivals in the final timing.
RIVAL_BAND = 0.15
RIVALS = 3


def rivals(trials: Sequence[TrialRecord], chosen: TrialRecord, fp32: TrialRecord,
           max_loss: float | None) -> list[TrialRecord]:
    """Re-timed plans within --max-loss whose latency lies within RIVAL_BAND of the chosen one's (at most
    RIVALS, fastest first): a few interleaved rounds cannot rank plans that close, so the final timing, which
    runs them in the same rounds until their speed-ups are known, does. None without a limit (the knee is
    chosen by loss as much as by speed)."""
    if max_loss is None:
        return []
    seen = {chosen.plan.key(), fp32.plan.key()}
    close = []
    for t in sorted(trials, key=lambda r: r.latency_ms):
        if (t.retimed_ms and t.plan.key() not in seen and t.loss <= max_loss
                and t.latency_ms <= chosen.latency_ms * (1 + RIVAL_BAND)):
            seen.add(t.plan.key())
            close.append(t)
    return close[:RIVALS]


def choose(front: Sequence[TrialRecord], max_loss: float | None) -> TrialRecord | None:
    """Fastest plan within --max-loss; without a limit, the knee of the front.

    The knee is the front member closest to the ideal point once latency and loss are scaled
    to [0, 1] over the front.
    """
    if not front:
        return None
    if max_loss is not None:
        feasible = [r for r in front if r.loss <= max_loss]
        if feasible:
            return min(feasible, key=lambda r: r.latency_ms)
    finite = [r for r in front if math.isfinite(r.loss)]  # an overflowing or unjudged plan is never the answer
    if not finite:
        return None
    lats = [r.latency_ms for r in finite]
    losses = [r.loss for r in finite]

    def scaled(v: float, lo: float, hi: float) -> float:
        return (v - lo) / (hi - lo) if hi > lo else 0.0

    return min(
        finite,
        key=lambda r: math.hypot(scaled(r.latency_ms, min(lats), max(lats)), scaled(r.loss, min(losses), max(losses))),
    )


# Plans judged on the calibration batches, at most, while looking for the fastest that holds the limit there.
HELD_OUT_TRIES = 8


class Holding:
    """Which plans hold --max-loss on the calibration batches too (:mod:`autoprec.measure.confirmation`), each
    judged once, when first asked; every plan holds where there is no judge or no limit."""

    def __init__(self, judge: HeldOutJudge | None, lower: Callable[[Plan], StoredModel], max_loss: float | None):
        self.judge, self.lower, self.max_loss = judge, lower, max_loss
        self.batches = len(judge.batches) if judge is not None else 0
        self.losses: dict[int, float] = {}

    def __call__(self, trial: TrialRecord) -> bool:
        if self.max_loss is None or not self.judged(trial):
            return True
        return self.losses[trial.number] <= self.max_loss

    def judged(self, trial: TrialRecord) -> bool:
        """Whether ``trial`` has its loss on the calibration batches, judged now if need be (all-FP32 needs none)."""
        if self.judge is None or trial.plan.counts()[Precision.FP32.value] == len(trial.plan.precisions):
            return False
        if trial.number not in self.losses:
            try:
                self.losses[trial.number] = loss = self.judge.loss(self.lower(trial.plan))
            except Exception as exc:  # noqa: BLE001 - ONNX Runtime's CPU may not run the FP32 model or an engine's
                # form on the calibration batches: said, and no plan judged
                log.warning(f"the plans could not be judged on the calibration batches (trial {trial.number}: "
                            f"{first_line(exc)})")
                self.judge = None
                return False
            if self.max_loss is not None and not loss <= self.max_loss:
                log.warning(f"trial {trial.number} is within --max-loss {self.max_loss:g} on the evaluation batches, "
                            f"but loses {loss:.3g} on the {self.batches} calibration batches, which judged no trial: "
                            "not chosen")
        return True

    def first(self, chosen: TrialRecord | None, trials: Sequence[TrialRecord]) -> TrialRecord | None:
        """``chosen``, or where it does not hold the limit on the calibration batches, the next fastest re-timed plan
        within it that does (all-FP32 at the latest, which holds it by definition)."""
        if chosen is None or self(chosen):
            return chosen
        others = sorted((t for t in trials if t.retimed_ms and t.loss <= self.max_loss and t.duplicate_of is None
                         and t.number != chosen.number), key=lambda t: t.latency_ms)
        return next((t for t in others[:HELD_OUT_TRIES] if self(t)), uniform_trials(trials).get("fp32", chosen))

    def without_failed(self, trials: Sequence[TrialRecord]) -> list[TrialRecord]:
        return [t for t in trials if t.number not in self.losses or self(t)]

    def record(self) -> HeldOut | None:
        return HeldOut(self.batches, self.max_loss, dict(self.losses)) if self.losses else None


@dataclass(frozen=True)
class NotShipped:
    """The fastest plan within the limit, left out of best/ for want of a gain beyond timing noise."""

    trial: int
    claim: Claim
    why: str


@dataclass(frozen=True)
class Rival:
    """A plan the final timing ran beside the chosen one (the re-timing could not tell them apart), and its
    speed-up over all-FP32 in the same rounds."""

    trial: int
    claim: Claim


@dataclass(frozen=True)
class Versus:
    """The chosen plan's speed-ups: over all-FP32 (trial ``fp32_trial``) and over the given model as it is, of
    which ``preparation`` is autoprec's FP32 folding alone; the plan not shipped, if one was not; and the
    rivals it was timed against and outran."""

    fp32: Claim | None = None
    fp32_trial: int | None = None
    source: Claim | None = None
    preparation: Claim | None = None
    not_shipped: NotShipped | None = None
    rivals: tuple[Rival, ...] = ()
    steadiness: Steadiness | None = None  # the machine during the final timing (None: an older result)

    def rivals_said(self) -> str | None:
        """``trial 2 1.38× (1.35–1.41, 95 %), trial 9 …``: what the rivals ran at in the chosen plan's rounds."""
        return ", ".join(f"trial {r.trial} {r.claim.text()}" for r in self.rivals) or None

    def to_json(self) -> dict[str, Any]:
        source = None
        if self.source is not None:
            source = {**self.source.to_json(), "preparation": self.preparation.to_json() if self.preparation else None}
        unproven = self.not_shipped
        return {
            "chosen_vs_fp32": {"fp32_trial": self.fp32_trial, **self.fp32.to_json()} if self.fp32 else None,
            "chosen_vs_source": source,
            "not_shipped": {"trial": unproven.trial, **unproven.claim.to_json(), "why": unproven.why}
            if unproven else None,
            "final_rivals": [{"trial": r.trial, **r.claim.to_json()} for r in self.rivals],
            "final_timing": self.steadiness.to_json() if self.steadiness else None,
        }

    @classmethod
    def from_json(cls, pareto: dict[str, Any]) -> Versus:
        fp32, source, unproven = (pareto.get(k) for k in ("chosen_vs_fp32", "chosen_vs_source", "not_shipped"))
        return cls(
            Claim.from_json(fp32) if fp32 else None,
            fp32["fp32_trial"] if fp32 else None,
            Claim.from_json(source) if source else None,
            Claim.from_json(source["preparation"]) if source and source.get("preparation") else None,
            NotShipped(unproven["trial"], Claim.from_json(unproven), unproven["why"]) if unproven else None,
            tuple(Rival(r["trial"], Claim.from_json(r)) for r in pareto.get("final_rivals") or ()),
            Steadiness.from_json(pareto.get("final_timing")),
        )


def compare_chosen(measurer: Measurer, trials: Sequence[TrialRecord], chosen: TrialRecord | None,
                    max_loss: float | None, seconds: float, ship_within_noise: bool, apart: bool, holding: Holding,
                    final_timing: FinalTiming) -> tuple[TrialRecord | None, Versus]:
    """The chosen plan, and the rivals the re-timing could not tell from it (:func:`rivals`), timed beside
    all-FP32 and the given model until their speed-ups are known (see :mod:`autoprec.measure.speedup`): the
    fastest of them in those rounds is the plan to ship (all-FP32 where it is not faster beyond timing noise,
    unless ``--ship-within-noise``), with pareto.json's ``chosen_vs_fp32`` / ``chosen_vs_source``."""
    fp32 = uniform_trials(trials).get("fp32")
    if chosen is None or fp32 is None:
        return chosen, Versus()
    contenders = [chosen, *(r for r in rivals(holding.without_failed(trials), chosen, fp32, max_loss)
                            if holding(r))]
    try:
        rounds = final_timing(measurer, fp32, contenders, seconds, apart)
        if rounds is None:
            return chosen, Versus()
        winner, over_fp32 = speedup.fastest(rounds, len(contenders))
        found = speedup.compared(rounds, winner)
    except (AutoprecError, RuntimeError, ValueError) as exc:
        log.warning(f"the final timing failed ({exc}): the speed-up stands on the re-timing's {RETIME_ROUNDS} rounds")
        return chosen, Versus()
    steadiness = rounds.steadiness()
    if said := steadiness.said():
        log.warning(said)
    named = {speedup.contender(i): r for i, r in enumerate(contenders)}
    if named[winner] is not chosen:
        log.info(f"trial {named[winner].number} ran faster than trial {chosen.number} in the same rounds "
                 f"({over_fp32[winner].label()} against {over_fp32['chosen'].label()} over all-FP32): it is the choice")
        chosen = named[winner]
    rivals_found = tuple(Rival(named[n].number, Claim.measured(c)) for n, c in over_fp32.items() if n != winner)
    chosen, versus = shipped(chosen, fp32, found, rivals_found, ship_within_noise)
    return chosen, replace(versus, steadiness=steadiness)


def shipped(chosen: TrialRecord, fp32: TrialRecord, found: dict, rivals_found: tuple[Rival, ...],
             ship_within_noise: bool) -> tuple[TrialRecord, Versus]:
    """The chosen plan, or all-FP32 where the chosen one is not faster beyond timing noise; and what it is said to
    gain."""
    versus_fp32, versus_source, preparation = (
        found[("fp32", "chosen")],
        found.get(("source", "chosen")),
        found.get(("source", "fp32")),
    )
    not_shipped = None
    if chosen.plan.key() != fp32.plan.key() and not versus_fp32.beyond_timing_noise and not ship_within_noise:
        unknown = "" if versus_fp32.narrow else (
            f"; the final timing could not narrow it in {versus_fp32.rounds} rounds ({versus_fp32.blocks} sessions): "
            f"{speedup.ADVICE}")
        not_shipped = NotShipped(chosen.number, Claim.measured(versus_fp32), (
            f"not faster than all-FP32 beyond timing noise ({versus_fp32.label()}): best/ holds the all-FP32 plan "
            f"(--ship-within-noise ships it anyway){unknown}"))
        log.warning(f"trial {chosen.number}: {not_shipped.why}")
        chosen, versus_source = fp32, preparation
    shipped_fp32 = chosen.plan.key() == fp32.plan.key()
    return chosen, Versus(
        None if shipped_fp32 else Claim.measured(versus_fp32), None if shipped_fp32 else fp32.number,
        Claim.measured(versus_source) if versus_source else None,
        Claim.measured(preparation) if versus_source and preparation else None, not_shipped, rivals_found)

"""The shipped plan's choice: the fastest plan within the limit (the knee without one), judged on
the held-out batches, timed with its rivals beside all-FP32 and the given model, and shipped only
where it is faster than all-FP32 beyond timing noise."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from autoprec.core import atomic, untrusted
from autoprec.core.errors import AutoprecError, first_line
from autoprec.core.fields import Fields
from autoprec.core.plan import Plan, Precision
from autoprec.core.stored import StoredModel
from autoprec.measure import speedup
from autoprec.measure.confirmation import HeldOutJudge
from autoprec.measure.measurement import Measurer
from autoprec.record import verdict
from autoprec.record.trial import TrialRecord
from autoprec.record.verdict import Choice, HeldOut, NotShipped, Rival, Speedup, Steadiness, Versus
from autoprec.study.coordination import SharedInputs, StudyLocks
from autoprec.study.reading import uniform_trials
from autoprec.study.retiming import RETIME_ROUNDS

log = logging.getLogger("autoprec")


# The final timing's seconds by default (after its MIN_BLOCKS): this share of what the search spent
# measuring (the sensitivity pass and the trials), within FINAL_SECONDS: a check that costs what the
# answer cost to find, not a fixed 20 s that made a short search on a small model half fixed cost.
FINAL_SHARE = 0.1
FINAL_SECONDS = (2.0, 20.0)


@dataclass(frozen=True)
class ShipRule:
    """What the choice is held to: the loss limit (None: the knee of the front), the final timing's
    seconds, and whether a plan not faster than all-FP32 beyond timing noise ships anyway
    (``--ship-within-noise``)."""

    max_loss: float | None
    seconds: float
    within_noise: bool = False

    @staticmethod
    def final_seconds(stages: Mapping[str, float]) -> float:
        """The final timing's seconds where none are given: FINAL_SHARE of the search's ``stages``
        that measured."""
        measuring = stages.get("sensitivity", 0.0) + stages.get("trials", 0.0)
        return min(max(FINAL_SHARE * measuring, FINAL_SECONDS[0]), FINAL_SECONDS[1])


def chosen_once(shared: SharedInputs, locks: StudyLocks, worker: str, path: Path,
                trials: Sequence[TrialRecord],
                choose: Callable[[], Choice]) -> Choice:
    """``choose()``, by the first of the study's workers to get here; the others wait and read its
    choice (``path`` holds it), so that the held-out judging and the final timing run once, alone on
    one device, however many workers the study has, and each worker's result ships the same plan."""
    with shared.once(locks, f"choice:{len(trials)}", [path], worker) as fetched:
        if not fetched:
            choice = choose()
            atomic.write_json(path, choice.to_json())
            return choice
    log.info(f"the plan to ship was chosen and timed by another worker of the study ({path.name} "
             "in its artifacts)")
    return Choice.from_json(Fields(untrusted.read_json(path, f"the study's choice {path}"), path),
                            trials)


def choose_shipped(front: Sequence[TrialRecord], trials: Sequence[TrialRecord],
                   held_out: HeldOutJudging,
                   measurer: Measurer, final_timing: FinalTiming, rule: ShipRule,
                   apart: bool = False) -> Choice:
    """The plan to ship, in four steps: the fastest plan on the re-timed ``front`` within the limit
    (the knee without one); the first of those that holds the limit on the held-out batches too;
    timed with its rivals beside all-FP32 and the given model (``final_timing``; ``apart``: one
    engine alive at a time), the fastest there; shipped only where it is faster than all-FP32 beyond
    timing noise (else all-FP32, unless ``rule.within_noise``). Without a final timing, the speed-up
    stands on the re-timing's rounds; all-FP32 chosen with no rival is not timed (nothing to decide)."""
    chosen = held_out.first_holding(fastest_within(front, rule.max_loss), trials)
    fp32 = uniform_trials(trials).get("fp32")
    versus = Versus()
    if chosen is not None and fp32 is not None:
        contenders = [chosen, *held_out.holding_rivals(chosen, fp32, trials)]
        if [c.plan.key() for c in contenders] == [fp32.plan.key()]:
            log.info(f"the choice is all-FP32 (trial {chosen.number}) and no plan contends with it: no "
                     "final timing (it would decide nothing; all-FP32's speed over the given model "
                     "is not measured)")
        elif (timed := timed_with_rivals(measurer, final_timing, fp32, contenders, rule.seconds,
                                         apart)) is not None:
            chosen, versus = shipped_or_fp32(timed, fp32, rule.within_noise)
    if chosen is not None:
        held_out.judge(chosen)  # (the knee, chosen without a limit: its loss there for the record)
    # all-FP32 (no proven gain), a rival
    if chosen is not None and chosen.number not in {t.number for t in front}:
        front = sorted([*front, chosen], key=lambda r: r.latency_ms)
    return Choice(chosen, versus, list(front), held_out.record())


def fastest_within(front: Sequence[TrialRecord], max_loss: float | None) -> TrialRecord | None:
    """Fastest plan within --max-loss (None when no plan is within it: not even all-FP32 on this
    engine, whose own FP32 may differ from the reference's); without a limit, the knee of the front.

    The knee is the front member closest to the ideal point once latency and loss are scaled
    to [0, 1] over the front.
    """
    if not front:
        return None
    if max_loss is not None:
        feasible = [r for r in front if r.loss <= max_loss]
        return min(feasible, key=lambda r: r.latency_ms) if feasible else None
    # an overflowing or unjudged plan is never the answer
    finite = [r for r in front if math.isfinite(r.loss)]
    if not finite:
        return None
    lats = [r.latency_ms for r in finite]
    losses = [r.loss for r in finite]

    def scaled(v: float, lo: float, hi: float) -> float:
        return (v - lo) / (hi - lo) if hi > lo else 0.0

    return min(
        finite,
        key=lambda r: math.hypot(scaled(r.latency_ms, min(lats), max(lats)),
                                 scaled(r.loss, min(losses), max(losses))),
    )


# Plans judged on the calibration batches, at most, while looking for the fastest that holds the
# limit there.
HELD_OUT_TRIES = 8


class HeldOutJudging:
    """Which plans hold --max-loss on the calibration batches too
    (:mod:`autoprec.measure.confirmation`), each judged once (:meth:`judge`); every plan holds where
    there is no judge, no limit, or the judge ``failed``."""

    def __init__(self, judge: HeldOutJudge | None, lower: Callable[[Plan], StoredModel],
                 max_loss: float | None):
        self.held_out_judge, self.lower, self.max_loss = judge, lower, max_loss
        self.batches = len(judge.batches) if judge is not None else 0
        self.losses: dict[int, float] = {}
        self.failed = False  # ONNX Runtime's CPU could not run a plan there: no plan is held to it

    def judge(self, trial: TrialRecord) -> None:
        """Judges ``trial`` on the calibration batches, unless it was (all-FP32 needs none)."""
        if (self.held_out_judge is None or self.failed or trial.number in self.losses
                or trial.plan.counts()[Precision.FP32.value] == len(trial.plan.precisions)):
            return
        try:
            self.losses[trial.number] = loss = self.held_out_judge.loss(self.lower(trial.plan))
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's CPU may not run the FP32 model or an engine's
            # form on the calibration batches: said, and no plan judged
            log.warning("the plans could not be judged on the calibration batches (trial "
                        f"{trial.number}: {first_line(exc)})")
            self.failed = True
            return
        if self.max_loss is not None and not loss <= self.max_loss:
            log.warning(f"trial {trial.number} is within --max-loss {self.max_loss:g} on the "
                        f"evaluation batches, but loses {loss:.3g} on the {self.batches} "
                        "calibration batches, which judged no trial: not chosen")

    def holds(self, trial: TrialRecord) -> bool:
        """Whether ``trial`` holds the limit on the calibration batches, as far as it was judged
        there."""
        if self.max_loss is None or self.failed or trial.number not in self.losses:
            return True
        return self.losses[trial.number] <= self.max_loss

    def first_holding(self, chosen: TrialRecord | None, trials: Sequence[TrialRecord]) -> TrialRecord | None:
        """``chosen``, or where it does not hold the limit on the calibration batches, the next
        fastest re-timed plan within it that does (all-FP32 at the latest, which holds it by
        definition)."""
        if chosen is None or self.max_loss is None:
            return chosen
        others = sorted((t for t in trials if t.retimed_ms and t.loss <= self.max_loss and t.duplicate_of is None
                         and t.number != chosen.number), key=lambda t: t.latency_ms)
        for trial in [chosen, *others[:HELD_OUT_TRIES]]:
            self.judge(trial)
            if self.holds(trial):
                return trial
        return uniform_trials(trials).get("fp32", chosen)

    def holding_rivals(self, chosen: TrialRecord, fp32: TrialRecord,
                       trials: Sequence[TrialRecord]) -> list[TrialRecord]:
        """The chosen plan's :func:`rivals` that hold the limit on the calibration batches too."""
        found = []
        for rival in rivals([t for t in trials if self.holds(t)], chosen, fp32, self.max_loss):
            self.judge(rival)
            if self.holds(rival):
                found.append(rival)
        return found

    def record(self) -> HeldOut | None:
        return HeldOut(self.batches, self.max_loss, dict(self.losses)) if self.losses else None


# Re-timed plans this close to the chosen one's latency (a fraction of it) are its rivals in the
# final timing.
RIVAL_BAND = 0.15
RIVALS = 3


def rivals(trials: Sequence[TrialRecord], chosen: TrialRecord, fp32: TrialRecord,
           max_loss: float | None) -> list[TrialRecord]:
    """Re-timed plans within --max-loss whose latency lies within RIVAL_BAND of the chosen one's (at
    most RIVALS, fastest first): a few interleaved rounds cannot rank plans that close, so the final
    timing, which runs them in the same rounds until their speed-ups are known, does. None without a
    limit (the knee is chosen by loss as much as by speed)."""
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


class FinalTiming(Protocol):
    """The final timing of the chosen plan and its rivals (``contenders``, the chosen one first)
    beside all-FP32 and the given model, until their speed-ups are known
    (:mod:`autoprec.measure.speedup`): its rounds, or None where it did not time them (the speed-up
    then stands on the re-timing's rounds, as where the timing fails)."""

    def __call__(self, measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord],
                 seconds: float,
                 apart: bool) -> verdict.Rounds | None: ...


def timed_until_known(measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord],
                      seconds: float,
                      apart: bool) -> verdict.Rounds:
    """The final timing a search runs: the measurer times the plans in blocks of interleaved rounds,
    every model's session built anew for each block, until their speed-ups' intervals are narrow or
    ``seconds`` pass."""
    chosen = contenders[0]
    beside = f" and trial(s) {', '.join(str(r.number) for r in contenders[1:])}, which the re-timing could not " \
        "tell from it," if len(contenders) > 1 else ""
    log.info(
        f"timing the chosen plan (trial {chosen.number}){beside} beside all-FP32 and the given "
        f"model until the speed-ups are known ({verdict.CONFIDENCE:.0%} interval within "
        f"{verdict.NARROW:.0%}, or each plan's {verdict.DECIDED_CONFIDENCE:.1%} interval above or "
        f"below 1, or it ran no faster than all-FP32; every model's session built anew for each "
        f"of {speedup.MIN_BLOCKS} or more blocks of rounds, then up to {seconds:.3g} s)"
    )
    return measurer.time_compared(fp32.plan, [r.plan for r in contenders], seconds, apart)


def not_timed(measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord],
              seconds: float,
              apart: bool) -> None:
    """No final timing: the chosen plan ships with the speed-up the re-timing's rounds give it (a
    search in a hurry, and the tests that are not about the final timing)."""
    return None


@dataclass(frozen=True)
class FinalRounds:
    """What the final timing found: the fastest contender in its rounds, its speed-ups over all-FP32
    and the given model (and all-FP32's over the given model), the others' over all-FP32, and how
    steady the machine was."""

    fastest: TrialRecord
    found: dict[tuple[str, str], Speedup]
    rivals: tuple[Rival, ...]
    steadiness: Steadiness


def timed_with_rivals(measurer: Measurer, final_timing: FinalTiming, fp32: TrialRecord,
                      contenders: Sequence[TrialRecord], seconds: float, apart: bool) -> FinalRounds | None:
    """The ``contenders`` (the chosen plan first, then the rivals the re-timing could not tell from
    it) timed beside all-FP32 and the given model until their speed-ups are known (see
    :mod:`autoprec.measure.speedup`); None where the final timing did not run or failed."""
    try:
        rounds = final_timing(measurer, fp32, contenders, seconds, apart)
        if rounds is None:
            return None
        winner, over_fp32 = speedup.fastest(rounds, len(contenders))
        found = speedup.compared(rounds, winner)
    except (AutoprecError, RuntimeError, ValueError) as exc:
        log.warning(f"the final timing failed ({exc}): the speed-up stands on the re-timing's "
                    f"{RETIME_ROUNDS} rounds")
        return None
    steadiness = rounds.steadiness()
    if said := steadiness.said():
        log.warning(said)
    named = {speedup.contender(i): r for i, r in enumerate(contenders)}
    chosen = contenders[0]
    if named[winner] is not chosen:
        log.info(f"trial {named[winner].number} ran faster than trial {chosen.number} in the same "
                 f"rounds ({over_fp32[winner].text()} against {over_fp32['chosen'].text()} over "
                 "all-FP32): it is the choice")
    others = tuple(Rival(named[n].number, c) for n, c in over_fp32.items() if n != winner)
    return FinalRounds(named[winner], found, others, steadiness)


def shipped_or_fp32(timed: FinalRounds, fp32: TrialRecord, within_noise: bool) -> tuple[TrialRecord, Versus]:
    """The fastest plan of the final timing, or all-FP32 where it is not faster beyond timing noise
    (unless ``within_noise``); and what the plan shipped is said to gain, with pareto.json's
    ``chosen_vs_fp32`` / ``chosen_vs_source``."""
    chosen, found = timed.fastest, timed.found
    versus_fp32, versus_source, preparation = (
        found[("fp32", "chosen")],
        found.get(("source", "chosen")),
        found.get(("source", "fp32")),
    )
    not_shipped = None
    if chosen.plan.key() != fp32.plan.key() and not versus_fp32.beyond_timing_noise and not within_noise:
        spent = f"{versus_fp32.rounds} rounds ({versus_fp32.blocks} sessions)"
        if versus_fp32.narrow:
            unknown = ""
        elif versus_fp32.no_faster:
            unknown = f"; it ran no faster in the final timing's {spent}, which stopped there"
        else:
            unknown = f"; the final timing could not narrow it in {spent}: {verdict.ADVICE}"
        not_shipped = NotShipped(chosen.number, versus_fp32, (
            f"not faster than all-FP32 beyond timing noise ({versus_fp32.text()}): best/ holds the "
            f"all-FP32 plan (--ship-within-noise ships it anyway){unknown}"))
        log.warning(f"trial {chosen.number}: {not_shipped.why}")
        chosen, versus_source = fp32, preparation
    shipped_fp32 = chosen.plan.key() == fp32.plan.key()
    return chosen, Versus(
        None if shipped_fp32 else versus_fp32, None if shipped_fp32 else fp32.number, versus_source,
        preparation if versus_source else None, not_shipped, timed.rivals, timed.steadiness)



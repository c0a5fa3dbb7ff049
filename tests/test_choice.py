"""The shipped plan's choice (:mod:`autoprec.study.choice`), step by step, on hand-made trials and fake final
timings: the fastest plan within the limit, judged on the held-out batches, timed with its rivals, shipped only
where it is faster than all-FP32 beyond timing noise."""

from __future__ import annotations

import numpy as np
import pytest

from autoprec.core.plan import Plan
from autoprec.core.timing import Timing
from autoprec.measure.speedup import contender
from autoprec.record.trial import Measurement, TrialRecord
from autoprec.record.verdict import Rounds, Versus
from autoprec.study.choice import (
    HeldOutJudging,
    ShipRule,
    choose_shipped,
    fastest_within,
    not_timed,
)

LIMIT = ShipRule(max_loss=0.01, seconds=1.0)


def _trial(number: int, a: str, b: str, ms: float, loss: float) -> TrialRecord:
    """A re-timed trial of a two-unit plan (units a and b at precisions ``a`` and ``b``)."""
    return TrialRecord(number, Plan.from_mapping({"a": a, "b": b}), Measurement(Timing(ms, ms, ms, 10, 3), {}, loss, {}),
                       True, retimed_ms=(ms, ms, ms))


FP32 = _trial(0, "fp32", "fp32", 10.0, 0.0)
INT8 = _trial(1, "int8", "int8", 5.0, 0.005)  # the fastest within the limit
MIXED = _trial(2, "int8", "fp16", 5.5, 0.006)  # within 15 % of it: its rival
TRIALS = [FP32, INT8, MIXED]
FRONT = [INT8, FP32]


def _final(ms: dict[str, float], spread: float = 0.01, rounds: int = 12) -> Rounds:
    """A final timing's rounds (two a block) in which each model runs at its ``ms``, with ``spread`` of noise."""
    return Rounds({name: tuple(Timing(v, v, v, 10, 3)
                               for v in value * (1 + spread * np.random.default_rng(seed).normal(size=rounds)))
                   for seed, (name, value) in enumerate(ms.items())}, tuple(i // 2 for i in range(rounds)))


class _Timing:
    """A fake final timing: each contender at its ``ms`` (by trial number), all-FP32 and the given model at 10 ms;
    it keeps the contenders it was asked to time."""

    def __init__(self, ms: dict[int, float], spread: float = 0.01):
        self.ms, self.spread, self.asked = ms, spread, []

    def __call__(self, measurer, fp32, contenders, seconds, apart):
        self.asked.append([t.number for t in contenders])
        return _final({"fp32": 10.0, "source": 10.0, **{contender(i): self.ms[t.number] for i, t in enumerate(contenders)}},
                      self.spread)


class _HeldOutJudge:
    """A fake judge on the calibration batches: each plan's loss there, by its key."""

    batches = (None,) * 4

    def __init__(self, losses: dict[int, float]):
        self.losses = {t.plan.key(): losses[t.number] for t in TRIALS if t.number in losses}
        self.judged: list = []

    def loss(self, plan: Plan) -> float:
        self.judged.append(plan.key())
        return self.losses[plan.key()]


def _judging(losses: dict[int, float] | None = None, max_loss: float | None = LIMIT.max_loss) -> HeldOutJudging:
    judge = _HeldOutJudge(losses) if losses is not None else None
    return HeldOutJudging(judge, lambda plan: plan, max_loss)


def test_the_fastest_plan_within_the_limit_and_the_knee_without_one():
    assert fastest_within(FRONT, 0.01) is INT8
    assert fastest_within(FRONT, 0.001) is FP32  # only all-FP32 holds it
    lossy = _trial(3, "int8", "int8", 2.0, 0.5)
    assert fastest_within([lossy, INT8, FP32], None) is INT8  # the knee: near the fastest, near the most accurate
    assert fastest_within([], 0.01) is None


def test_the_fastest_of_the_chosen_plan_and_its_rivals_in_the_final_rounds_is_shipped():
    timing = _Timing({INT8.number: 5.0, MIXED.number: 3.0})
    choice = choose_shipped(FRONT, TRIALS, _judging(), None, timing, LIMIT)
    assert timing.asked == [[INT8.number, MIXED.number]]
    assert choice.shipped is MIXED and choice.versus.fp32.speedup == pytest.approx(10 / 3, rel=0.03)
    assert [r.trial for r in choice.versus.rivals] == [INT8.number]
    assert choice.versus.rivals[0].claim.speedup == pytest.approx(2.0, rel=0.03)
    assert choice.versus.fp32_trial == FP32.number and choice.versus.not_shipped is None
    assert MIXED in choice.front and choice.front == sorted(choice.front, key=lambda t: t.latency_ms)


def test_a_plan_not_faster_than_all_fp32_beyond_noise_ships_all_fp32():
    timing = _Timing({INT8.number: 10.0, MIXED.number: 10.0}, spread=0.03)
    choice = choose_shipped(FRONT, TRIALS, _judging(), None, timing, LIMIT)
    assert choice.shipped is FP32 and choice.versus.fp32 is None and choice.versus.fp32_trial is None
    unproven = choice.versus.not_shipped
    assert unproven is not None and unproven.trial in (INT8.number, MIXED.number)
    assert unproven.claim.beyond_timing_noise is False and "best/ holds the all-FP32 plan" in unproven.why
    assert FP32 in choice.front


def test_ship_within_noise_ships_the_plan_anyway():
    timing = _Timing({INT8.number: 10.0, MIXED.number: 10.0}, spread=0.03)
    rule = ShipRule(LIMIT.max_loss, LIMIT.seconds, within_noise=True)
    choice = choose_shipped(FRONT, TRIALS, _judging(), None, timing, rule)
    assert choice.shipped in (INT8, MIXED) and choice.versus.not_shipped is None
    assert choice.versus.fp32 is not None and choice.versus.fp32.beyond_timing_noise is False


def test_a_rival_past_the_limit_on_the_held_out_batches_is_not_timed():
    timing = _Timing({INT8.number: 5.0, MIXED.number: 3.0})
    choice = choose_shipped(FRONT, TRIALS, _judging({INT8.number: 0.004, MIXED.number: 0.5}), None, timing, LIMIT)
    assert timing.asked == [[INT8.number]] and choice.shipped is INT8 and choice.versus.rivals == ()
    assert choice.held_out is not None and choice.held_out.failed() == {MIXED.number: 0.5}


def test_a_chosen_plan_past_the_limit_on_the_held_out_batches_gives_way_to_the_next_that_holds_it():
    choice = choose_shipped(FRONT, TRIALS, _judging({INT8.number: 0.5, MIXED.number: 0.004}), None, not_timed, LIMIT)
    assert choice.shipped is MIXED and MIXED in choice.front
    assert choice.held_out.losses == {INT8.number: 0.5, MIXED.number: 0.004}
    judging = _judging({INT8.number: 0.5, MIXED.number: 0.5})
    assert choose_shipped(FRONT, TRIALS, judging, None, not_timed, LIMIT).shipped is FP32  # which holds it always


def test_asking_whether_a_plan_holds_judges_nothing():
    judging = _judging({INT8.number: 0.5})
    assert judging.holds(INT8) and judging.record() is None  # not judged yet: nothing known against it
    judging.judge(INT8)
    judging.judge(INT8)
    assert not judging.holds(INT8) and judging.held_out_judge.judged == [INT8.plan.key()]  # judged once
    judging.judge(FP32)  # all-FP32 needs no judging
    assert judging.record().losses == {INT8.number: 0.5}


def test_a_judge_that_cannot_run_holds_no_plan_to_the_held_out_batches():
    judging = _judging({INT8.number: 0.5})  # MIXED's loss unknown to it: the judge raises
    judging.judge(INT8)
    judging.judge(MIXED)
    assert judging.failed and judging.holds(INT8) and judging.holds(MIXED)


def test_without_a_final_timing_the_choice_ships_as_chosen_with_no_claim_of_its_own():
    choice = choose_shipped(FRONT, TRIALS, _judging({INT8.number: 0.004}), None, not_timed, LIMIT)
    assert choice.shipped is INT8 and choice.versus == Versus() and choice.held_out.losses == {INT8.number: 0.004}


def test_a_final_timing_that_fails_leaves_the_choice_as_it_was():
    def failing(measurer, fp32, contenders, seconds, apart):
        raise RuntimeError("out of memory")

    choice = choose_shipped(FRONT, TRIALS, _judging(), None, failing, LIMIT)
    assert choice.shipped is INT8 and choice.versus == Versus()


def test_the_knee_is_judged_on_the_held_out_batches_for_the_record():
    rule = ShipRule(None, 1.0)
    choice = choose_shipped(FRONT, TRIALS, _judging({INT8.number: 0.5}, max_loss=None), None, not_timed, rule)
    assert choice.shipped is INT8 and choice.held_out.losses == {INT8.number: 0.5}

"""A speed-up with its confidence interval, from models timed in interleaved rounds until it is known.

Each round times every model once (each a :class:`~autoprec.backends.base.Timing`: a median of runs),
one after another, so drift (a busy neighbour, clocks) hits all of a round alike. A round's ratio is
the reference's median over the candidate's; the speed-up is the geometric mean of the rounds' ratios,
and its interval the percentile bootstrap of that mean over the rounds (paired: a round is resampled
whole). Rounds go on until every interval asked for is narrow enough or the time runs out.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from autoprec.analysis.data import Batch
from autoprec.backends.base import Backend, Timing
from autoprec.core.stored import StoredModel

CONFIDENCE = 0.95
RESAMPLES = 4000
MIN_ROUNDS = 6  # fewer: the bootstrap's interval of so few ratios is too narrow to trust
MAX_ROUNDS = 60
NARROW = 0.04  # an interval is known when high / low - 1 is at most this
METHOD = f"paired percentile bootstrap ({RESAMPLES} resamples) of the geometric mean of per-round ratios"


@dataclass(frozen=True)
class Speedup:
    """``speedup`` × the reference's speed, ``low``–``high`` at ``confidence``, from ``rounds`` paired rounds."""

    speedup: float
    low: float
    high: float
    confidence: float
    rounds: int

    @property
    def beyond_timing_noise(self) -> bool:
        """Faster beyond noise: the whole interval lies above 1."""
        return self.low > 1.0

    @property
    def narrow(self) -> bool:
        return self.high / self.low - 1.0 <= NARROW

    def to_json(self) -> dict[str, Any]:
        return {"speedup": self.speedup, "low": self.low, "high": self.high, "confidence": self.confidence,
                "rounds": self.rounds, "beyond_timing_noise": self.beyond_timing_noise, "method": METHOD}

    def label(self) -> str:
        return interval_text(self.speedup, self.low, self.high, self.confidence)


def ratio_text(value: float) -> str:
    """A ratio to two decimals, or to as many more as tell it from 1: whether a speed-up is beyond timing noise
    is which side of 1 its interval's bound lies on, so a bound of 1.0002 is said so, never "1.00"."""
    for digits in range(2, 9):
        said = f"{value:.{digits}f}"
        if value == 1.0 or float(said) != 1.0:
            break
    return said


def interval_text(ratio: float, low: float, high: float, confidence: float) -> str:
    """``1.10× (1.0002–1.18, 95 %)``: a speed-up with its interval (see :func:`ratio_text`)."""
    return f"{ratio_text(ratio)}× ({ratio_text(low)}–{ratio_text(high)}, {100 * confidence:.0f} %)"


def speedup(reference: Sequence[float], candidate: Sequence[float], confidence: float = CONFIDENCE) -> Speedup:
    """The candidate's speed-up over the reference from paired rounds' milliseconds (see the module docstring).
    The bootstrap's draws are seeded: the same rounds give the same interval."""
    ratios = np.log(np.asarray(reference, float) / np.asarray(candidate, float))
    draws = np.random.default_rng(0).integers(0, len(ratios), (RESAMPLES, len(ratios)))
    means = ratios[draws].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Speedup(math.exp(ratios.mean()), math.exp(low), math.exp(high), confidence, len(ratios))


def time_until_known(
    backend: Backend,
    models: Mapping[str, StoredModel],
    batch: Batch,
    pairs: Sequence[tuple[str, str]],
    seconds: float,
    apart: bool = False,
) -> dict[str, tuple[Timing, ...]]:
    """``models`` timed in interleaved rounds until the speed-up of each (reference, candidate) name pair is
    :attr:`Speedup.narrow`, ``seconds`` pass, or MAX_ROUNDS; MIN_ROUNDS at least. All alive at once, or
    (``apart``: engines too large to keep several) each built anew for its turn in every round."""
    timings: dict[str, list[Timing]] = {name: [] for name in models}
    with contextlib.ExitStack() as stack:
        kept = {} if apart else {name: stack.enter_context(backend.prepare(model)) for name, model in models.items()}
        for runner in kept.values():
            runner.run(batch)  # first run: allocations and kernel selection stay out of the rounds
        started = time.monotonic()
        while True:
            for name in in_turn(list(models), len(timings[next(iter(models))])):
                timings[name].append(kept[name].time(batch) if kept else _timed_alone(backend, models[name], batch))
            rounds = len(timings[next(iter(models))])
            if rounds >= MAX_ROUNDS or (rounds >= MIN_ROUNDS and (time.monotonic() - started > seconds or all(
                    speedup(_ms(timings[a]), _ms(timings[b])).narrow for a, b in pairs))):
                return {name: tuple(found) for name, found in timings.items()}


def in_turn(names: Sequence[str], round_: int) -> list[str]:
    """The order of one round: each round starts one later, so that no model is always timed in the same place,
    after the same other (a cache or clock state one leaves behind favours the next alike in every round)."""
    shift = round_ % max(1, len(names))
    return [*names[shift:], *names[:shift]]


def _timed_alone(backend: Backend, model: StoredModel, batch: Batch) -> Timing:
    with backend.prepare(model) as runner:
        runner.run(batch)
        return runner.time(batch)


COMPARED = (("fp32", "chosen"), ("source", "chosen"), ("source", "fp32"))  # (reference, candidate)


def contender(index: int) -> str:
    """The name of the ``index``-th plan timed in a final timing: the chosen one first, then its rivals."""
    return "chosen" if index == 0 else f"rival {index}"


def compared(timings: Mapping[str, Sequence[Timing]], winner: str = "chosen") -> dict[tuple[str, str], Speedup]:
    """Each COMPARED pair's speed-up from :func:`time_compared`'s rounds, ``winner``'s rounds as the chosen plan's."""
    named = {**timings, "chosen": timings[winner]}
    return {(a, b): speedup(_ms(named[a]), _ms(named[b])) for a, b in COMPARED if a in named and b in named}


def fastest(timings: Mapping[str, Sequence[Timing]], contenders: int) -> tuple[str, dict[str, Speedup]]:
    """The contender with the largest speed-up over all-FP32 in the same rounds, and each contender's."""
    found = {contender(i): speedup(_ms(timings["fp32"]), _ms(timings[contender(i)])) for i in range(contenders)}
    return max(found, key=lambda name: found[name].speedup), found


def _ms(timings: Sequence[Timing]) -> list[float]:
    return [t.median_ms for t in timings]

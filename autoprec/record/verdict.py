"""What the timing and the checks decided, and the rule each decision follows, in one place: a
speed-up with its confidence interval from interleaved rounds (whether it is beyond timing noise:
the interval above 1), how steady the machine was while it was timed, the plans judged again on
held-out data, and the chosen plan's claims against all-FP32 and the given model (:class:`Versus`).

A speed-up stands on paired rounds run in *blocks* (ROUNDS_PER_BLOCK rounds, BUSY_ROUNDS_PER_BLOCK on a
busy machine): each block builds
every model's session (engine) anew, so what differs between two sessions of one graph (memory
placement, thread pools, kernels chosen at creation: 1–3 % on a quiet CPU, 10–70 % on a 2-core VM) is
sampled too. Interference only ever adds time, so a block's
figure for a model is what it cannot fake: the session's fastest runs (the lowest p10 of its rounds
in the block); a block's ratio is the log of the reference's over the candidate's, the speed-up the
geometric mean over blocks, its interval Student's t over the blocks' ratios. Where all-FP32's
fastest runs moved between blocks (a load on for whole blocks), the blocks are split into the
lighter and the heavier half and the interval covers each half's as well as the whole's, so that it
holds at either load; the result says so. (How the rounds are run: :mod:`autoprec.measure.speedup`.)
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from autoprec.core.fields import Fields
from autoprec.core.plan import Plan
from autoprec.core.timing import Timing
from autoprec.record.trial import ROUNDING, EngineInfo, Measurement, TrialRecord

CONFIDENCE = 0.95

# A block's rounds: one where the machine is quiet. Sessions of one graph differ more (10-70 % on a
# 2-core VM) than one session's rounds do, so a second round cost as much as the first and narrowed
# less than the next block's sessions (benchmarks/a_over_a.py: a plan against itself 0 of 50 faster
# either way; a 1.15x gain found 10 of 10 instead of 8 of 10, in 2.3 s instead of 3.8 s). Where
# other processes used more than BUSY cores while the first round ran, a hog may have hit one
# model's turn whole: two, so that each session's fastest runs stand on two turns (a simulated hog
# on and off: a 1.5x gain found in 84 of 100 with two, 34 with one); two also once all-FP32's level
# moved between blocks (autoprec.measure.speedup). Recorded results of two read.
ROUNDS_PER_BLOCK = 1
BUSY_ROUNDS_PER_BLOCK = 2
BUSY = 0.2  # cores

NARROW = 0.04  # an interval is known when high / low - 1 is at most this

# A final timing stops early once each plan's interval at this stricter confidence lies on one side
# of 1 (the decision made): looking after every block and stopping at the first look that decides
# would otherwise make a plan timed against itself "faster" more often than the stated 95 % allow
# (at 0.99: 3.8 % instead of 2.7 % in tests/test_speedup.py's simulation; at 0.999 as often as
# without the early stop).
DECIDED_CONFIDENCE = 0.999

LOAD_MOVED = 0.5  # cores: other processes' use of the machine moving more than this between blocks

LEVEL_MOVED = 0.10  # all-FP32's fastest runs moving more than this between blocks

METHOD = (f"sessions built anew for every block of {ROUNDS_PER_BLOCK} interleaved round ("
          f"{BUSY_ROUNDS_PER_BLOCK} where other processes kept more than {BUSY} cores busy, or "
          "all-FP32's level had moved); "
          "each session's fastest runs (the lowest p10 of its rounds in the block), which load "
          "cannot make faster; Student's t interval over the blocks' log ratios (where the "
          "machine's load moved: also over the lighter and the heavier half of the blocks, the "
          "interval covering all three)")

def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, else the normal quantile's
    Cornish–Fisher expansion (within 1e-3 from 3 on; NumPy has no t distribution and SciPy is no
    dependency)."""
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3 + g4 / dof**4

@dataclass(frozen=True)
class Speedup:
    """A speed-up over a reference as a result states it: the ratio; its interval ``low``–``high``
    at ``confidence`` where a final timing measured one, from ``rounds`` paired rounds in ``blocks``
    sessions (None: it stands on the re-timing's rounds, or an older result's method had no
    sessions); whether it beats timing noise (None: not re-timed); ``unsteady``: the machine's load
    moved while it was timed (the interval then holds for the lighter and the heavier half of the
    blocks alike)."""

    speedup: float
    beyond_timing_noise: bool | None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None
    rounds: int | None = None
    retimed: bool = False
    blocks: int | None = None
    unsteady: bool = False
    method: str = METHOD  # how the interval was found, in words (an older result's: as it was then)

    @classmethod
    def with_interval(cls, ratio: float, low: float, high: float, confidence: float, rounds: int,
                      blocks: int | None = None, unsteady: bool = False) -> Speedup:
        """What a final timing measured: beyond timing noise where the whole interval lies above
        1."""
        return cls(ratio, low > 1.0, low, high, confidence, rounds, True, blocks, unsteady)

    @classmethod
    def from_retiming(cls, ratio: float, rounds: Sequence[float], other_rounds: Sequence[float]) -> Speedup:
        """A bare ratio, with the re-timing's verdict (see :func:`faster_beyond_noise`) where both
        plans were re-timed."""
        return cls(ratio, faster_beyond_noise(rounds, other_rounds),
                   retimed=bool(rounds and other_rounds))

    @property
    def narrow(self) -> bool:
        """Known: an interval no wider than NARROW."""
        return self.low is not None and self.low > 0 and self.high / self.low - 1.0 <= NARROW

    @property
    def no_faster(self) -> bool:
        """The candidate ran no faster than the reference: it ships only beyond timing noise, which
        more rounds would first have to turn its ratio round for (a final timing stops there)."""
        return self.speedup <= 1.0

    @classmethod
    def from_json(cls, f: Fields) -> Speedup:
        """A speed-up as written (checked): its interval where the final timing measured one."""
        def number(key: str) -> float | None:
            found = f.get(key)
            return None if found is None or found.value is None else float(found.number())

        def optional(key: str, read: Any) -> Any:
            found = f.get(key)
            return None if found is None or found.value is None else read(found)

        beyond = f["beyond_timing_noise"]
        rounds = optional("rounds", Fields.integer)
        found = cls(float(f["speedup"].number()), None if beyond.value is None else beyond.flag(),
                    number("low"),
                    number("high"), number("confidence"), rounds,
                    bool(optional("retimed", Fields.flag) or rounds),
                    optional("blocks", Fields.integer),
                    bool(optional("unsteady", Fields.flag)),
                    optional("method", Fields.text) or METHOD)
        found._check(f)
        return found

    def _check(self, f: Fields) -> None:
        """It can be true as written: a ratio above 0 inside its own interval, 'beyond timing noise'
        exactly where that interval lies above 1 (the rule :meth:`with_interval` decides by)."""
        where, ratio = f.path, self.speedup
        if not (math.isfinite(ratio) and ratio > 0):
            f.refuse(f"{where}.speedup is {ratio:g}, not a ratio above 0")
        if self.low is None:
            return
        low, high = self.low, self.high if self.high is not None else math.inf
        if not (0 < low <= high < math.inf and low <= ratio * (1 + ROUNDING) and ratio <= high * (1 + ROUNDING)):
            f.refuse(f"{where}: speed-up {ratio:g} outside its own interval {low:g}–{high:g}")
        if self.confidence is not None and not 0 < self.confidence < 1:
            f.refuse(f"{where}.confidence is {self.confidence!r}, not a share between 0 and 1")
        if self.rounds is not None and self.rounds < 1:
            f.refuse(f"{where}.rounds is {self.rounds}, not at least 1")
        if self.beyond_timing_noise is not None and self.beyond_timing_noise != (low > 1):
            f.refuse(f"{where}.beyond_timing_noise is {self.beyond_timing_noise} for the interval "
                     f"{low:g}–{high:g}")

    def to_json(self) -> dict[str, Any]:
        interval = {} if self.low is None else {"low": self.low, "high": self.high,
                                                "confidence": self.confidence,
                                                "rounds": self.rounds, "blocks": self.blocks,
                                                "unsteady": self.unsteady, "method": self.method}
        return {"speedup": self.speedup, **interval,
                "beyond_timing_noise": self.beyond_timing_noise,
                "retimed": self.retimed}

    def text(self) -> str:
        """``1.10× (1.0002–1.18, 95 %)``, or the bare ratio where no interval was measured (see
        :func:`ratio_text`)."""
        if self.low is None:
            return f"{ratio_text(self.speedup)}×"
        return (f"{ratio_text(self.speedup)}× ({ratio_text(self.low)}–{ratio_text(self.high)}, "
                f"{100 * self.confidence:.0f} %)")

    def verdict(self, short: bool = False) -> str:
        """What it says on timing noise."""
        if self.beyond_timing_noise is None:
            return "not re-timed" if short else "not re-timed: no verdict on timing noise"
        if self.beyond_timing_noise:
            return "beyond timing noise"
        return "within timing noise" if short else "WITHIN timing noise: no real gain measured"

    def how(self) -> str:
        """How it was timed, for the terminal's line."""
        if self.rounds and self.blocks:
            return f", {self.rounds} interleaved rounds in {self.blocks} sessions each"
        if self.rounds:
            return f", {self.rounds} interleaved rounds"
        return ", re-timed in interleaved rounds" if self.retimed else ""

def ratio_text(value: float) -> str:
    """A ratio to two decimals, or to as many more as tell it from 1: whether a speed-up is beyond
    timing noise is which side of 1 its interval's bound lies on, so a bound of 1.0002 is said so,
    never "1.00"."""
    for digits in range(2, 9):
        said = f"{value:.{digits}f}"
        if value == 1.0 or float(said) != 1.0:
            break
    return said

def speedup(reference: Sequence[float], candidate: Sequence[float],
            blocks: Sequence[int] | None = None,
            confidence: float = CONFIDENCE, unsteady: bool = False,
            loads: Sequence[float] | None = None) -> Speedup:
    """The candidate's speed-up over the reference from paired rounds' milliseconds (each round's
    fast runs: its p10), ``blocks`` naming the session block of each round (None: every round a
    block of its own): per block, the log of each model's fastest round in it; where ``unsteady``,
    the interval also covers the lighter and the heavier half of the blocks, split by ``loads`` (one
    per block) or else by the pair's own level in each block (the mean of both logs: a split by the
    reference's level alone would sort the ratios themselves); see the module docstring."""
    reference, candidate = np.log(np.asarray(reference, float)), np.log(np.asarray(candidate, float))
    blocks = list(range(len(reference))) if blocks is None else list(blocks)
    members = [[i for i, b in enumerate(blocks) if b == block] for block in dict.fromkeys(blocks)]
    fastest = np.array([(reference[i].min(), candidate[i].min()) for i in members])
    per_block = fastest[:, 0] - fastest[:, 1]
    centre = float(per_block.mean())
    low, high = t_interval(per_block, confidence)
    if unsteady:
        level = np.asarray(loads, float) if loads is not None else fastest.mean(axis=1)
        order = np.argsort(level, kind="stable")
        for half in (order[: len(order) // 2], order[len(order) // 2:]):
            part_low, part_high = t_interval(per_block[half], confidence)
            low, high = min(low, part_low), max(high, part_high)
    # (sessions far apart, two blocks to a half: a 99.9 % interval's log width can pass a float's)
    top = math.exp(high) if high < 709 else math.inf
    return Speedup.with_interval(math.exp(centre), math.exp(low), top, confidence, len(blocks),
                                 len(per_block), bool(unsteady))

def t_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """Student's t interval of the mean of ``values`` (unbounded for fewer than two)."""
    if len(values) < 2:
        return -math.inf, math.inf
    half = t_quantile(1 - (1 - confidence) / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()) - half, float(values.mean()) + half

@dataclass(frozen=True)
class Rounds:
    """What a final timing measured: each model's timing per round, the block (sessions) each round
    ran in, and per block the cores other processes used (None: not known here)."""

    timings: Mapping[str, tuple[Timing, ...]]
    blocks: tuple[int, ...]
    load: tuple[float | None, ...] = ()

    def ms(self, name: str) -> list[float]:
        return [t.median_ms for t in self.timings[name]]

    def fast_ms(self, name: str) -> list[float]:
        """Each round's fast runs (its p10): what a speed-up stands on (see the module docstring).
        """
        return [t.p10_ms for t in self.timings[name]]

    @property
    def count(self) -> int:
        return len(self.blocks)

    def steadiness(self, reference: str = "fp32") -> Steadiness:
        known = [v for v in self.load if v is not None]
        levels = [min(m for m, b in zip(self.fast_ms(reference), self.blocks) if b == block)
                  for block in dict.fromkeys(self.blocks)] if reference in self.timings else []
        return Steadiness((float(min(known)), float(max(known))) if known else None,
                          float(max(levels) / min(levels) - 1) if len(levels) > 1 else 0.0,
                          os.cpu_count() or 1)

    def speedup(self, reference: str, candidate: str, confidence: float = CONFIDENCE) -> Speedup:
        steadiness = self.steadiness()
        loads = self.load if steadiness.load_moved and all(v is not None for v in self.load) else None
        return speedup(self.fast_ms(reference), self.fast_ms(candidate), self.blocks, confidence,
                       unsteady=steadiness.moved, loads=loads)

    def decided(self, reference: str, candidate: str) -> bool:
        """Whether the candidate is known faster or slower than the reference: its interval at
        DECIDED_CONFIDENCE lies wholly above or below 1."""
        found = self.speedup(reference, candidate, DECIDED_CONFIDENCE)
        return found.low is not None and (found.low > 1.0 or found.high < 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"timings": {name: [t.to_json() for t in found] for name, found in self.timings.items()},
                "blocks": list(self.blocks), "load": list(self.load)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rounds:
        return cls({name: tuple(Timing.from_json(t) for t in found) for name, found in data["timings"].items()},
                   tuple(data["blocks"]), tuple(data.get("load") or ()))

@dataclass(frozen=True)
class Steadiness:
    """How steady the machine was during a final timing: the range of cores other processes used per
    block, and how far all-FP32's fastest runs moved between blocks (a fraction)."""

    others: tuple[float, float] | None
    level_moved: float
    cores: int

    @property
    def load_moved(self) -> bool:
        return self.others is not None and self.others[1] - self.others[0] > LOAD_MOVED

    @property
    def moved(self) -> bool:
        """All-FP32's fastest runs moved between blocks: a load that changes the speed-ups
        themselves (a load that comes and goes within blocks, leaving each session quiet runs, does
        not)."""
        return self.level_moved > LEVEL_MOVED

    @property
    def busy(self) -> bool:
        return self.others is not None and self.others[1] > LOAD_MOVED

    def to_json(self) -> dict[str, Any]:
        return {"others_cores": list(self.others) if self.others else None,
                "fp32_level_moved": self.level_moved,
                "cores": self.cores, "moved": self.moved}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Steadiness | None:
        if not data:
            return None
        others = data.get("others_cores")
        return cls(tuple(others) if others else None, float(data["fp32_level_moved"]),
                   int(data["cores"]))

    def said(self) -> str | None:
        """A sentence where the load or all-FP32's level moved, or the machine was busy: what the
        figures hold for, and what to do for steadier ones."""
        load = (f"other processes used {self.others[0]:.1f}–{self.others[1]:.1f} of this machine's "
                f"{self.cores} cores"
                if self.others else "")
        level = f"all-FP32's latency moved {100 * self.level_moved:.0f} % between sessions"
        if self.moved and self.others is not None and not self.busy:
            # on an H200 with nothing else running, all-FP32's fresh CUDA sessions moved 13 %
            return (f"all-FP32's sessions ran {100 * self.level_moved:.0f} % apart during the final timing "
                    f"while other processes used at most {self.others[1]:.1f} of this machine's "
                    f"{self.cores} cores: the sessions themselves differ (the kernels each chose, the "
                    "device's clocks); each interval holds for the faster and the slower half of the "
                    "sessions alike, over more of them (--retime-seconds gives it longer)")
        if self.moved:
            what = "; ".join(filter(None, [load, level]))
            return (f"the machine's load moved during the final timing ({what}): each interval "
                    f"holds for the lighter and the heavier half of the sessions alike; {ADVICE}")
        if self.busy or self.load_moved:
            return (f"the machine was busy during the final timing ({load}; {level}): the "
                    "speed-ups stand on each session's fastest runs, which that load cannot make "
                    "faster")
        return None

ADVICE = ("for steadier figures time on a quieter machine, fix the threads (--threads N, fewer "
          "than the cores), or give the final timing longer (--retime-seconds)")

def faster_beyond_noise(rounds: Sequence[float], other_rounds: Sequence[float]) -> bool | None:
    """Whether a plan is faster than another beyond timing noise: every one of its interleaved
    re-timing rounds beats every round of the other. None where either was not re-timed: a trial's
    own timings, taken at another moment than the other's, never decide it."""
    if rounds and other_rounds:
        return max(rounds) < min(other_rounds)
    return None

ENGINE = "onnxruntime CPUExecutionProvider"

HELD_OUT_ADVICE = ("the evaluation batches are too few to hold the limit on other data: more data "
                   "(--data) judges plans "
          "better")

@dataclass(frozen=True)
class HeldOut:
    """Each judged plan's loss on ``batches`` calibration batches (by trial), against --max-loss
    (None: no limit)."""

    batches: int
    max_loss: float | None
    losses: dict[int, float]

    def holds(self, trial: int) -> bool:
        return self.max_loss is None or self.losses[trial] <= self.max_loss

    def failed(self) -> dict[int, float]:
        return {trial: loss for trial, loss in self.losses.items() if not self.holds(trial)}

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "max_loss": self.max_loss, "engine": ENGINE,
                "judged": [{"trial": trial, "loss": loss} for trial, loss in self.losses.items()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldOut:
        max_loss = data["max_loss"]
        return cls(data["batches"], float(max_loss) if max_loss is not None else None,
                   {j["trial"]: float(j["loss"]) for j in data["judged"]})

@dataclass(frozen=True)
class NotShipped:
    """The fastest plan within the limit, left out of best/ for want of a gain beyond timing
    noise."""

    trial: int
    claim: Speedup
    why: str

@dataclass(frozen=True)
class Rival:
    """A plan the final timing ran beside the chosen one (the re-timing could not tell them apart),
    and its speed-up over all-FP32 in the same rounds."""

    trial: int
    claim: Speedup

@dataclass(frozen=True)
class Versus:
    """The chosen plan's speed-ups: over all-FP32 (trial ``fp32_trial``) and over the given model as
    it is, of which ``preparation`` is autoprec's FP32 folding alone; the plan not shipped, if one
    was not; and the rivals it was timed against and outran."""

    fp32: Speedup | None = None
    fp32_trial: int | None = None
    source: Speedup | None = None
    preparation: Speedup | None = None
    not_shipped: NotShipped | None = None
    rivals: tuple[Rival, ...] = ()
    # the machine during the final timing (None: an older result)
    steadiness: Steadiness | None = None

    def rivals_said(self) -> str | None:
        """``trial 2 1.38× (1.35–1.41, 95 %), trial 9 …``: what the rivals ran at in the chosen
        plan's rounds."""
        return ", ".join(f"trial {r.trial} {r.claim.text()}" for r in self.rivals) or None

    def to_json(self) -> dict[str, Any]:
        source = None
        if self.source is not None:
            source = {**self.source.to_json(),
                      "preparation": self.preparation.to_json() if self.preparation else None}
        unproven = self.not_shipped
        return {
            "chosen_vs_fp32": {"fp32_trial": self.fp32_trial, **self.fp32.to_json()} if self.fp32 else None,
            "chosen_vs_source": source,
            "not_shipped": {"trial": unproven.trial, **unproven.claim.to_json(),
                            "why": unproven.why}
            if unproven else None,
            "final_rivals": [{"trial": r.trial, **r.claim.to_json()} for r in self.rivals],
            "final_timing": self.steadiness.to_json() if self.steadiness else None,
        }

    @classmethod
    def from_json(cls, pareto: Fields) -> Versus:
        """From pareto.json's top level (checked; an older result lacks the keys added since:
        none)."""
        fp32, source, unproven, rivals, timing = (
            found.nullable() if (found := pareto.get(k)) is not None else None
            for k in ("chosen_vs_fp32", "chosen_vs_source", "not_shipped", "final_rivals",
                      "final_timing"))
        pareto["chosen_vs_fp32"]
        preparation = source.get("preparation") if source else None
        return cls(
            Speedup.from_json(fp32) if fp32 else None,
            fp32["fp32_trial"].integer() if fp32 else None,
            Speedup.from_json(source) if source else None,
            Speedup.from_json(preparation) if preparation and preparation.nullable() else None,
            _not_shipped(unproven) if unproven else None,
            tuple(Rival(r["trial"].integer(), Speedup.from_json(r)) for r in rivals.items()) if rivals else (),
            _steadiness(timing),
        )

@dataclass(frozen=True)
class Choice:
    """The plan best/ ships (None: nothing was measured), what it is said to gain, the front with it
    on, and the plans judged on the held-out batches."""

    shipped: TrialRecord | None
    versus: Versus
    front: list[TrialRecord]
    held_out: HeldOut | None

    def to_json(self) -> dict[str, Any]:
        """The choice by trial numbers (the study holds the trials): what a study's other workers
        read."""
        return {"shipped": self.shipped.number if self.shipped else None,
                "front": [t.number for t in self.front],
                "held_out": self.held_out.to_json() if self.held_out else None,
                **self.versus.to_json()}

    @classmethod
    def from_json(cls, found: Fields, trials: Sequence[TrialRecord]) -> Choice:
        """The choice as :meth:`to_json` wrote it, its trials found among ``trials`` (checked)."""
        by_number = {t.number: t for t in trials}

        def trial(f: Fields) -> TrialRecord:
            if f.integer() not in by_number:
                f.refuse(f"{f.path} names trial {f.value}, which the study does not hold")
            return by_number[f.integer()]

        shipped, held_out = found["shipped"].nullable(), found["held_out"].nullable()
        return cls(trial(shipped) if shipped else None, Versus.from_json(found),
                   [trial(f) for f in found["front"].items()],
                   HeldOut.from_json(held_out.value) if held_out else None)


def _not_shipped(f: Fields) -> NotShipped:
    claim = Speedup.from_json(f)
    if claim.beyond_timing_noise:
        f.refuse("not_shipped says its plan was faster beyond timing noise, which ships a plan")
    return NotShipped(f["trial"].integer(), claim, f["why"].text())


def _steadiness(f: Fields | None) -> Steadiness | None:
    if f is None:
        return None
    if (others := f["others_cores"].nullable()) is not None:
        others.numbers()
    f["fp32_level_moved"].number(), f["cores"].integer(), f["moved"].flag()
    return Steadiness.from_json(f.value)


@dataclass(frozen=True)
class CheckResult:
    """What ``check`` found: the plan checked (``checked``, in words; its ``trial`` where a
    result's) on ``model`` and ``engine``, its loss by ``metric`` (``loss_said``: the metric, with
    what it reads on the outputs it is blind to) against ``max_loss``, its latency against
    ``latency_budget_ms``, the regressions past them (``failures``), and the figure the search
    recorded where this is the search's own judging (``recorded_loss``)."""

    failures: tuple[str, ...]
    checked: str
    trial: int | None
    model: str
    engine: EngineInfo
    metric: str
    loss_said: str
    max_loss: float
    latency_budget_ms: float | None
    recorded_loss: float | None
    measurement: Measurement
    plan: Plan

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed, "failures": list(self.failures), "checked": self.checked,
            "trial": self.trial,
            "model": self.model, "engine": self.engine.to_json(), "metric": self.metric,
            "loss_said": self.loss_said,
            "max_loss": self.max_loss, "latency_budget_ms": self.latency_budget_ms,
            "recorded_loss": self.recorded_loss, "measurement": self.measurement.to_json(),
            "plan": self.plan.to_json(),
        }

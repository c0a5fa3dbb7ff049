"""A speed-up with its confidence interval, from models timed in interleaved rounds until it is
known.

Each round times every model once (each a :class:`~autoprec.core.timing.Timing`: runs after
warm-up), one after another, so drift (a busy neighbour, clocks) hits all of a round alike. Rounds
run in *blocks*: each block builds every model's session (engine) anew, so what differs between two
sessions of one graph (memory placement, thread pools, kernels chosen at creation: 1–3 % on a CPU)
is sampled too, not frozen into every round. Interference only ever adds time, so a block's figure
for a model is what it cannot fake: the session's fastest runs (the lowest p10 of its rounds in the
block); a block's ratio is the log of the reference's over the candidate's, the speed-up the
geometric mean over blocks, its interval Student's t over the blocks' ratios. Medians would let a
neighbour that ran during one model's turn and not the other's make or hide a gain (a held-out
detector's 1.6× INT8 gain read 0.83–3.02 on a loaded 2-core machine). Timed against itself, a plan
so measured is "beyond timing noise" no more often than the interval's level says
(benchmarks/a_over_a.py measures how often, and its power on a 1.5× gain, with a CPU hog switching
on and off beside it and without).

The machine's load is watched while it runs (what other processes used of its cores, per block). A
load that comes and goes within a block leaves some quiet runs to each session, and the fastest runs
hold; where all-FP32's fastest runs themselves moved between blocks (a load on for whole blocks), a
plan's speed-up may depend on when it was timed (a hog slows an INT8 plan and FP32 unalike): the
blocks are split into the lighter and the heavier half (by that load, else by the pair's own level
in the block) and the interval covers each half's t-interval as well as the whole's, so that it
holds at either load; the result says so.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from autoprec.analysis.data import Workload
from autoprec.backends.base import Backend
from autoprec.core.fields import Fields
from autoprec.core.stored import StoredModel
from autoprec.core.timing import Timing
from autoprec.measure.workload import time_work, warm_up

CONFIDENCE = 0.95
ROUNDS_PER_BLOCK = 2
MIN_BLOCKS = 6  # fewer: a t-interval over so few sessions is too wide to find a few per cent
MAX_BLOCKS = 30
NARROW = 0.04  # an interval is known when high / low - 1 is at most this
LOAD_MOVED = 0.5  # cores: other processes' use of the machine moving more than this between blocks
LEVEL_MOVED = 0.10  # all-FP32's fastest runs moving more than this between blocks
METHOD = (f"sessions built anew for every block of {ROUNDS_PER_BLOCK} interleaved rounds; "
          "each session's fastest runs (the lowest p10 of its rounds in the block), which load "
          "cannot make faster; Student's t interval over the blocks' log ratios (where the "
          "machine's load moved: also over the lighter and the heavier half of the blocks, the "
          "interval covering all three)")


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, else the normal quantile's Cornish–Fisher
    expansion (within 1e-3 from 3 on; NumPy has no t distribution and SciPy is no dependency)."""
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
    """A speed-up over a reference as a result states it: the ratio; its interval ``low``–``high`` at
    ``confidence`` where a final timing measured one, from ``rounds`` paired rounds in ``blocks`` sessions (None:
    it stands on the re-timing's rounds, or an older result's method had no sessions); whether it beats timing
    noise (None: not re-timed); ``unsteady``: the machine's load moved while it was timed (the interval then holds
    for the lighter and the heavier half of the blocks alike)."""

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
        """What a final timing measured: beyond timing noise where the whole interval lies above 1."""
        return cls(ratio, low > 1.0, low, high, confidence, rounds, True, blocks, unsteady)

    @classmethod
    def from_retiming(cls, ratio: float, rounds: Sequence[float], other_rounds: Sequence[float]) -> Speedup:
        """A bare ratio, with the re-timing's verdict (see :func:`faster_beyond_noise`) where both plans were
        re-timed."""
        return cls(ratio, faster_beyond_noise(rounds, other_rounds), retimed=bool(rounds and other_rounds))

    @property
    def narrow(self) -> bool:
        """Known: an interval no wider than NARROW."""
        return self.low is not None and self.high / self.low - 1.0 <= NARROW

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
        return cls(float(f["speedup"].number()), None if beyond.value is None else beyond.flag(), number("low"),
                   number("high"), number("confidence"), rounds,
                   bool(optional("retimed", Fields.flag) or rounds), optional("blocks", Fields.integer),
                   bool(optional("unsteady", Fields.flag)), optional("method", Fields.text) or METHOD)

    def to_json(self) -> dict[str, Any]:
        interval = {} if self.low is None else {"low": self.low, "high": self.high, "confidence": self.confidence,
                                                "rounds": self.rounds, "blocks": self.blocks,
                                                "unsteady": self.unsteady, "method": self.method}
        return {"speedup": self.speedup, **interval, "beyond_timing_noise": self.beyond_timing_noise,
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
    """A ratio to two decimals, or to as many more as tell it from 1: whether a speed-up is beyond timing noise
    is which side of 1 its interval's bound lies on, so a bound of 1.0002 is said so, never "1.00"."""
    for digits in range(2, 9):
        said = f"{value:.{digits}f}"
        if value == 1.0 or float(said) != 1.0:
            break
    return said


def speedup(reference: Sequence[float], candidate: Sequence[float], blocks: Sequence[int] | None = None,
            confidence: float = CONFIDENCE, unsteady: bool = False, loads: Sequence[float] | None = None) -> Speedup:
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
    return Speedup.with_interval(math.exp(centre), math.exp(low), math.exp(high), confidence, len(blocks),
                                 len(per_block), bool(unsteady))


def t_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """Student's t interval of the mean of ``values`` (unbounded for fewer than two)."""
    if len(values) < 2:
        return -math.inf, math.inf
    half = t_quantile(1 - (1 - confidence) / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()) - half, float(values.mean()) + half


class LoadProbe:
    """What other processes used of this machine's cores while a block ran: the CPU time every other process spent
    (``/proc/<pid>/stat``) over the wall time. (Not the machine's busy time less this process's: ONNX Runtime's
    threads spin while they wait, so on a busy machine this process seems to take the cores the others share.)
    None where the system does not say (not Linux)."""

    def __init__(self):
        self.started: tuple[float, float] | None = None

    @staticmethod
    def _read() -> tuple[float, float] | None:
        own = os.getpid()
        try:
            pids = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != own]
        except OSError:
            return None
        ticks = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime (the 14th and 15th of the whole line)
            except (OSError, ValueError, IndexError):
                continue  # a process that ended meanwhile
        return ticks / os.sysconf("SC_CLK_TCK"), time.monotonic()

    def start(self) -> None:
        self.started = self._read()

    def others(self) -> float | None:
        """Cores other processes kept busy since :meth:`start`."""
        ended = self._read()
        if self.started is None or ended is None or ended[1] <= self.started[1]:
            return None
        return max(0.0, (ended[0] - self.started[0]) / (ended[1] - self.started[1]))


@dataclass(frozen=True)
class Rounds:
    """What a final timing measured: each model's timing per round, the block (sessions) each round ran in, and per
    block the cores other processes used (None: not known here)."""

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
                          float(max(levels) / min(levels) - 1) if len(levels) > 1 else 0.0, os.cpu_count() or 1)

    def speedup(self, reference: str, candidate: str) -> Speedup:
        steadiness = self.steadiness()
        loads = self.load if steadiness.load_moved and all(v is not None for v in self.load) else None
        return speedup(self.fast_ms(reference), self.fast_ms(candidate), self.blocks,
                       unsteady=steadiness.moved, loads=loads)

    def to_json(self) -> dict[str, Any]:
        return {"timings": {name: [t.to_json() for t in found] for name, found in self.timings.items()},
                "blocks": list(self.blocks), "load": list(self.load)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rounds:
        return cls({name: tuple(Timing.from_json(t) for t in found) for name, found in data["timings"].items()},
                   tuple(data["blocks"]), tuple(data.get("load") or ()))


@dataclass(frozen=True)
class Steadiness:
    """How steady the machine was during a final timing: the range of cores other processes used per block, and
    how far all-FP32's fastest runs moved between blocks (a fraction)."""

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
        return {"others_cores": list(self.others) if self.others else None, "fp32_level_moved": self.level_moved,
                "cores": self.cores, "moved": self.moved}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Steadiness | None:
        if not data:
            return None
        others = data.get("others_cores")
        return cls(tuple(others) if others else None, float(data["fp32_level_moved"]), int(data["cores"]))

    def said(self) -> str | None:
        """A sentence where the load or all-FP32's level moved, or the machine was busy: what the figures hold
        for, and what to do for steadier ones."""
        load = (f"other processes used {self.others[0]:.1f}–{self.others[1]:.1f} of this machine's {self.cores} cores"
                if self.others else "")
        level = f"all-FP32's latency moved {100 * self.level_moved:.0f} % between sessions"
        if self.moved:
            what = "; ".join(filter(None, [load, level]))
            return (f"the machine's load moved during the final timing ({what}): each interval holds for the "
                    f"lighter and the heavier half of the sessions alike; {ADVICE}")
        if self.busy or self.load_moved:
            return (f"the machine was busy during the final timing ({load}; {level}): the "
                    "speed-ups stand on each session's fastest runs, which that load cannot make "
                    "faster")
        return None


ADVICE = ("for steadier figures time on a quieter machine, fix the threads (--threads N, fewer than the cores), or "
          "give the final timing longer (--retime-seconds)")


def time_until_known(
    backend: Backend,
    models: Mapping[str, StoredModel],
    work: Workload,
    pairs: Sequence[tuple[str, str]],
    seconds: float,
    apart: bool = False,
) -> Rounds:
    """``models`` timed in blocks of interleaved rounds, every model's session built anew for each block, until
    the speed-up of each (reference, candidate) name pair is :attr:`Speedup.narrow` or ``seconds`` pass (after
    MIN_BLOCKS at least, however long those take: a slow model is known by its rounds, not by a clock), or
    MAX_BLOCKS. Engines too large to keep several (``apart``) are each built anew for their turn in every round:
    every round is a block."""
    timings: dict[str, list[Timing]] = {name: [] for name in models}
    blocks: list[int] = []
    load: list[float | None] = []
    started = time.monotonic()
    probe = LoadProbe()
    for block in range(MAX_BLOCKS):
        probe.start()
        _time_block(backend, models, work, timings, blocks, block, apart)
        load.append(probe.others())
        found = Rounds({k: tuple(v) for k, v in timings.items()}, tuple(blocks), tuple(load))
        if block + 1 >= MIN_BLOCKS and (time.monotonic() - started > seconds
                                        or all(found.speedup(a, b).narrow for a, b in pairs)):
            return found
    return found


def _time_block(backend: Backend, models: Mapping[str, StoredModel], work: Workload, timings: dict[str, list[Timing]],
                blocks: list[int], block: int, apart: bool) -> None:
    """One block: every model's session built (in this block's order), run once, then timed in interleaved
    rounds."""
    with contextlib.ExitStack() as stack:
        kept = {}
        if not apart:
            for name in in_turn(list(models), block):
                kept[name] = stack.enter_context(backend.runner(models[name]))
                warm_up(kept[name], work)  # first run: allocations and kernel selection stay out of the rounds
        for _ in range(1 if apart else ROUNDS_PER_BLOCK):
            for name in in_turn(list(models), len(blocks)):
                timings[name].append(time_work(kept[name], work)[0] if kept else _timed_alone(backend, models[name], work))
            blocks.append(block)


def in_turn(names: Sequence[str], round_: int) -> list[str]:
    """The order of one round: each round starts one later, so that no model is always timed in the same place,
    after the same other (a cache or clock state one leaves behind favours the next alike in every round)."""
    shift = round_ % max(1, len(names))
    return [*names[shift:], *names[:shift]]


def _timed_alone(backend: Backend, model: StoredModel, work: Workload) -> Timing:
    with backend.runner(model) as runner:
        warm_up(runner, work)
        return time_work(runner, work)[0]


COMPARED = (("fp32", "chosen"), ("source", "chosen"), ("source", "fp32"))  # (reference, candidate)


def contender(index: int) -> str:
    """The name of the ``index``-th plan timed in a final timing: the chosen one first, then its rivals."""
    return "chosen" if index == 0 else f"rival {index}"


def compared(rounds: Rounds, winner: str = "chosen") -> dict[tuple[str, str], Speedup]:
    """Each COMPARED pair's speed-up from :func:`time_until_known`'s rounds, ``winner``'s rounds as the chosen
    plan's."""
    named = Rounds({**rounds.timings, "chosen": rounds.timings[winner]}, rounds.blocks, rounds.load)
    return {(a, b): named.speedup(a, b) for a, b in COMPARED if a in named.timings and b in named.timings}


def fastest(rounds: Rounds, contenders: int) -> tuple[str, dict[str, Speedup]]:
    """The contender with the largest speed-up over all-FP32 in the same rounds, and each contender's."""
    found = {contender(i): rounds.speedup("fp32", contender(i)) for i in range(contenders)}
    return max(found, key=lambda name: found[name].speedup), found


def faster_beyond_noise(rounds: Sequence[float], other_rounds: Sequence[float]) -> bool | None:
    """Whether a plan is faster than another beyond timing noise: every one of its interleaved re-timing
    rounds beats every round of the other. None where either was not re-timed: a trial's own timings,
    taken at another moment than the other's, never decide it."""
    if rounds and other_rounds:
        return max(rounds) < min(other_rounds)
    return None

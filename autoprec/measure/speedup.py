"""Models timed in interleaved rounds until their speed-ups are known (the statistics and the
verdict: :mod:`autoprec.record.verdict`).

Each round times every model once (each a :class:`~autoprec.core.timing.Timing`: runs after
warm-up), one after another, so drift (a busy neighbour, clocks) hits all of a round alike; each
block (of one round, two on a busy machine: see verdict.ROUNDS_PER_BLOCK) builds every model's
session anew. The machine's load is watched while it runs (what
other processes used of its cores, per block), so that a verdict can hold at either load
(benchmarks/a_over_a.py measures how often a plan timed against itself is called faster, and its
power on a 1.5× gain, with a CPU hog switching on and off beside it and without).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Mapping, Sequence

from autoprec.analysis.data import Workload
from autoprec.backends.base import Backend
from autoprec.core.stored import StoredModel
from autoprec.core.timing import TURN, Timing
from autoprec.measure.workload import time_work, warm_up
from autoprec.record.verdict import BUSY, BUSY_ROUNDS_PER_BLOCK, ROUNDS_PER_BLOCK, Rounds, Speedup

# fewer: a t-interval over two sessions (t = 12.7) decides nothing short of a 2x gain
MIN_BLOCKS = 3
# An interval is called known by its width from this many blocks on: stopping on width alone at
# three blocks stops most where the blocks agree by chance, and a plan timed against itself is
# called faster more often.
NARROW_BLOCKS = 6
# Where all-FP32's level moved, the interval covers each half of the blocks on its own: halves of four
# blocks of one round (t = 3.18), or of three of two rounds (a busy machine's blocks, and every block
# once the level is seen to move), not three of one (t = 4.30: a magika plan's 6-block interval was
# 1.04-2.60 where two rounds a block gave 1.17-1.98).
MOVED_BLOCKS = 8
MAX_BLOCKS = 30


class LoadProbe:
    """What other processes used of this machine's cores while a block ran: the CPU time every other
    process spent (``/proc/<pid>/stat``) over the wall time. (Not the machine's busy time less this
    process's: ONNX Runtime's threads spin while they wait, so on a busy machine this process seems
    to take the cores the others share.) None where the system does not say (not Linux)."""

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
                # utime, stime (the 14th and 15th of the whole line)
                ticks += int(fields[11]) + int(fields[12])
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


def time_until_known(
    backend: Backend,
    models: Mapping[str, StoredModel],
    work: Workload,
    pairs: Sequence[tuple[str, str]],
    seconds: float,
    apart: bool = False,
    deciding: Sequence[tuple[str, str]] = (),
) -> Rounds:
    """``models`` timed in blocks of interleaved rounds, every model's session built anew for each
    block, until the speed-up of each (reference, candidate) name pair is :attr:`Speedup.narrow`,
    each ``deciding`` pair is :meth:`Rounds.decided` or :attr:`Speedup.no_faster` (what the choice
    rests on is known; the other pairs are claims stated with the interval they have), or
    ``seconds`` pass (after MIN_BLOCKS at least, however long those take: a slow model is known by
    its rounds, not by a clock), or MAX_BLOCKS. Engines too large to keep several (``apart``) are
    each built anew for their turn in every round: every round is a block."""
    timings: dict[str, list[Timing]] = {name: [] for name in models}
    blocks: list[int] = []
    load: list[float | None] = []
    started = time.monotonic()
    probe = LoadProbe()
    found = Rounds({name: () for name in models}, ())
    for block in range(MAX_BLOCKS):
        probe.start()
        _time_block(backend, models, work, timings, blocks, block, apart, probe, found.steadiness().moved)
        load.append(probe.others())
        found = Rounds({k: tuple(v) for k, v in timings.items()}, tuple(blocks), tuple(load))
        timed_out = block + 1 >= MIN_BLOCKS and time.monotonic() - started > seconds
        if known(found, pairs, deciding) or (timed_out and bounded(found, pairs)):
            return found
    return found


def bounded(found: Rounds, pairs: Sequence[tuple[str, str]]) -> bool:
    """Whether every pair's interval can say something: finite ends, and where the machine's load
    moved (the interval then covers the lighter and the heavier half of the blocks, each on its own)
    MOVED_BLOCKS blocks, or NARROW_BLOCKS with two rounds a block on the whole: halves of two blocks
    (t = 12.7) left a ViT-base's 1.37x INT8 plan at 0.68-2.39, not shipped."""
    if found.steadiness().moved:
        two_rounds_each = found.count >= NARROW_BLOCKS * BUSY_ROUNDS_PER_BLOCK
        if len(set(found.blocks)) < (NARROW_BLOCKS if two_rounds_each else MOVED_BLOCKS):
            return False
    return all(0 < s.low and math.isfinite(s.high) for s in (found.speedup(a, b) for a, b in pairs))


def known(found: Rounds, pairs: Sequence[tuple[str, str]], deciding: Sequence[tuple[str, str]] = ()) -> bool:
    """Whether the timing may stop: MIN_BLOCKS run, and each ``deciding`` pair
    :meth:`Rounds.decided`, or each decided or :attr:`Speedup.no_faster` with every interval
    :func:`bounded` (a plan that saves nothing on this machine, INT8 on a CPU without fast INT8
    kernels, costs MIN_BLOCKS blocks where the machine is steady), or (from NARROW_BLOCKS on) every
    pair's interval :attr:`Speedup.narrow`."""
    blocks = len(set(found.blocks))
    if blocks < MIN_BLOCKS:
        return False
    # nothing compared (the chosen plan is all-FP32, and there is no given model to time it beside)
    if not pairs:
        return True
    if deciding:
        decided = [found.decided(a, b) for a, b in deciding]
        if all(decided):
            return True
        settled = all(d or found.speedup(a, b).no_faster for d, (a, b) in zip(decided, deciding))
        if settled and bounded(found, pairs):
            return True
    return blocks >= NARROW_BLOCKS and all(found.speedup(a, b).narrow for a, b in pairs)


def _time_block(backend: Backend, models: Mapping[str, StoredModel], work: Workload,
                timings: dict[str, list[Timing]],
                blocks: list[int], block: int, apart: bool, probe: LoadProbe, moved: bool) -> None:
    """One block: every model's session built (in this block's order), run once, then timed in
    interleaved rounds: ROUNDS_PER_BLOCK, or BUSY_ROUNDS_PER_BLOCK where ``probe`` (started with the
    block) saw other processes keep the machine busy (or cannot say), or where all-FP32's level has
    ``moved`` between the blocks before (each session's fastest runs then stand on two turns)."""
    with contextlib.ExitStack() as stack:
        kept = {}
        if not apart:
            for name in in_turn(list(models), block):
                kept[name] = stack.enter_context(backend.runner(models[name]))
                # first run: allocations and kernel selection stay out of the rounds
                warm_up(kept[name], work)
        for turn in range(1 if apart else BUSY_ROUNDS_PER_BLOCK):
            if turn >= ROUNDS_PER_BLOCK and not moved and not _busy(probe):
                break
            for name in in_turn(list(models), len(blocks)):
                timings[name].append(time_work(kept[name], work, TURN)[0] if kept
                                     else _timed_alone(backend, models[name], work))
            blocks.append(block)


def _busy(probe: LoadProbe) -> bool:
    others = probe.others()
    return others is None or others > BUSY


def in_turn(names: Sequence[str], round_: int) -> list[str]:
    """The order of one round: each round starts one later, so that no model is always timed in the
    same place, after the same other (a cache or clock state one leaves behind favours the next
    alike in every round)."""
    shift = round_ % max(1, len(names))
    return [*names[shift:], *names[:shift]]


def _timed_alone(backend: Backend, model: StoredModel, work: Workload) -> Timing:
    with backend.runner(model) as runner:
        warm_up(runner, work)
        return time_work(runner, work, TURN)[0]


COMPARED = (("fp32", "chosen"), ("source", "chosen"), ("source", "fp32"))  # (reference, candidate)


def contender(index: int) -> str:
    """The name of the ``index``-th plan timed in a final timing: the chosen one first, then its
    rivals."""
    return "chosen" if index == 0 else f"rival {index}"


def compared(rounds: Rounds, winner: str = "chosen") -> dict[tuple[str, str], Speedup]:
    """Each COMPARED pair's speed-up from :func:`time_until_known`'s rounds, ``winner``'s rounds as
    the chosen plan's."""
    named = Rounds({**rounds.timings, "chosen": rounds.timings[winner]}, rounds.blocks, rounds.load)
    return {(a, b): named.speedup(a, b) for a, b in COMPARED if a in named.timings and b in named.timings}


def fastest(rounds: Rounds, contenders: int) -> tuple[str, dict[str, Speedup]]:
    """The contender with the largest speed-up over all-FP32 in the same rounds, and each
    contender's."""
    found = {contender(i): rounds.speedup("fp32", contender(i)) for i in range(contenders)}
    return max(found, key=lambda name: found[name].speedup), found



"""A latency and the clock that measures one: the median of repeated runs after warm-up, the spread
kept. Every engine's runner returns a Timing (autoprec.backends.base.Runner.time); every comparison
of speeds reads them."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Latency of one batch: median of repeated runs after warm-up, with the spread kept."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    warmup: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how far one run may stray from the median."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "spread": self.spread}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timing:
        return cls(data["median_ms"], data["p10_ms"], data["p90_ms"], data["runs"], data["warmup"])


@dataclass(frozen=True)
class Runs:
    """How long one timing runs: ``warmup`` runs, then ``min_runs`` and ``min_seconds`` of runs at
    least."""

    warmup: int = 3
    min_seconds: float = 0.2
    min_runs: int = 3


# A trial's timing: its plan's one session.
TRIAL = Runs()
# A turn of the re-timing and the final timing: its session was warmed when it was built, so one run
# warms it again after the other models' turns. As long as a trial's: their speed-ups stand on each
# turn's fastest runs, and on a VM whose core is taken away for a stretch, a turn of 0.1 s could fall
# wholly inside one (magika's quick start: all-FP32's fastest runs moved 150-370 % between sessions
# instead of 3-131 %, and its INT8 plan went unshipped in 5 of 6 searches; docs/benchmarks.md).
TURN = Runs(warmup=1)
# A turn of the re-timing: half a final timing's. Two of a plan's rounds that disagree by more than 3 % get a third
# (autoprec.measure.measurement.enough_rounds), whose median outvotes a turn that fell in a slow stretch; the final
# timing, which decides what ships and states its gain, keeps TURN.
RETIME_TURN = Runs(warmup=1, min_seconds=TURN.min_seconds / 2)
TIME_CALLS = (f"median of >= {TRIAL.min_runs} runs and >= {TRIAL.min_seconds:g} s after {TRIAL.warmup} warm-up "
              f"runs ({TURN.warmup} in the re-timing's and the final timing's turns, their sessions warmed when built, "
              f">= {RETIME_TURN.min_seconds:g} s in the re-timing's; "
              f"none for a call of {TRIAL.min_seconds / TRIAL.min_runs * 1e3:.0f} ms or more, whose first run is timed)")


def time_calls(call: Callable[[], object], runs: Runs = TRIAL, max_runs: int = 500) -> Timing:
    """Wall-clock a synchronous call: warm-up, then at least ``runs.min_runs`` and ``runs.min_seconds``
    of runs: a fast call runs hundreds of times, a slow one ``min_runs`` (ten runs of a 150 ms model
    made every round of a final timing 1.5 s, and its re-timing and final timing a minute each).
    A call that takes a run's share of ``min_seconds`` or more is not warmed up: its first run, on a
    session that has run before, is timed with the rest (a 160 ms model's turn was four runs for three
    timed; the figures stand on a timing's fastest runs and its median)."""
    samples: list[float] = []
    warmed, started = 0, None
    while warmed < runs.warmup:
        t0 = time.perf_counter()
        call()
        took = time.perf_counter() - t0
        if took * runs.min_runs >= runs.min_seconds:
            samples, started = [took * 1e3], t0
            break
        warmed += 1
    started = time.perf_counter() if started is None else started
    while len(samples) < max_runs and (len(samples) < runs.min_runs or time.perf_counter() - started < runs.min_seconds):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e3)
    arr = np.asarray(samples)
    return Timing(
        float(np.median(arr)), float(np.percentile(arr, 10)), float(np.percentile(arr, 90)),
        len(samples), warmed
    )


class Stages(dict):
    """Seconds of each stage of a search (pareto.json's ``search.stage_seconds``): where its wall
    clock went, so a slow search, or the part of several workers' searches that does not shrink with
    them, shows which stage it is."""

    @contextlib.contextmanager
    def timed(self, stage: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self[stage] = round(self.get(stage, 0.0) + time.monotonic() - started, 2)

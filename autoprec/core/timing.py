"""A latency and the clock that measures one: the median of repeated runs after warm-up, the spread kept. Every
engine's runner returns a Timing (autoprec.backends.base.Runner.time); every comparison of speeds reads them."""

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


TIME_CALLS = ("median of >= 10 runs and >= 0.2 s after 3 warm-up runs (a call slower than 1/3 s: "
              "of 3 runs)")

SLOW_CALL_S = 1 / 3  # a call this slow is timed over SLOW_RUNS runs: its runs vary little against their length
SLOW_RUNS = 3


def time_calls(
    call: Callable[[], object], warmup: int = 3, min_runs: int = 10, min_seconds: float = 0.2, max_runs: int = 500
) -> Timing:
    """Wall-clock a synchronous call: warm-up, then at least ``min_runs`` and ``min_seconds`` of runs; a call slower
    than SLOW_CALL_S as many warm-up runs as pass SLOW_CALL_S each, and SLOW_RUNS runs (ten runs of a second-long
    model would make every timing ten seconds, and a final timing of six models in blocks of rounds minutes)."""
    warmed, t0 = 0, time.perf_counter()
    while warmed < warmup:
        call()
        warmed += 1
        if time.perf_counter() - t0 > warmed * SLOW_CALL_S:
            break
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_runs and (len(samples) < min_runs or time.perf_counter() - started < min_seconds):
        if len(samples) >= SLOW_RUNS and min(samples) > SLOW_CALL_S * 1e3:
            break
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e3)
    arr = np.asarray(samples)
    return Timing(
        float(np.median(arr)), float(np.percentile(arr, 10)), float(np.percentile(arr, 90)), len(samples), warmed
    )


class Stages(dict):
    """Seconds of each stage of a search (pareto.json's ``search.stage_seconds``): where its wall clock went, so a
    slow search, or the part of several workers' searches that does not shrink with them, shows which stage it is."""

    @contextlib.contextmanager
    def timed(self, stage: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self[stage] = round(self.get(stage, 0.0) + time.monotonic() - started, 2)

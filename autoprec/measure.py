"""One candidate, measured: build it on the engine, run the evaluation set, time it, compare."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import onnx

from autoprec.accuracy import LossFunction, Outputs, compare, loss_from_metrics
from autoprec.backends.base import Backend, Timing
from autoprec.data import Batch

# A latency whose p10-p90 range exceeds this fraction of its median is re-timed, then flagged.
MAX_TIMING_SPREAD = 0.25
RETIMES = 2


@dataclass(frozen=True)
class Measurement:
    latency: Timing
    metrics: dict[str, dict[str, float]]
    loss: float
    seconds: dict[str, float]  # where the trial's wall time went
    retimes: int = 0

    @property
    def unstable(self) -> bool:
        """The latency stayed too spread to trust after re-timing: shown as such, not hidden."""
        return self.latency.spread > MAX_TIMING_SPREAD

    def to_json(self) -> dict[str, Any]:
        return {
            "latency": self.latency.to_json(),
            "metrics": self.metrics,
            "loss": self.loss,
            "seconds": self.seconds,
            "retimes": self.retimes,
            "latency_unstable": self.unstable,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(Timing.from_json(data["latency"]), data["metrics"], data["loss"], data.get("seconds", {}), data.get("retimes", 0))


def measure(
    backend: Backend,
    model: onnx.ModelProto,
    batches: Sequence[Batch],
    reference: Outputs,
    metric: str,
    loss_function: LossFunction | None = None,
) -> Measurement:
    """Latency on the first evaluation batch; accuracy on all of them, against the FP32 reference."""
    seconds = {}
    t0 = time.perf_counter()
    with backend.prepare(model) as runner:
        seconds["build"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        outputs = [runner.run(batch) for batch in batches]
        seconds["evaluate"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        latency, retimes = runner.time(batches[0]), 0
        while latency.spread > MAX_TIMING_SPREAD and retimes < RETIMES:  # noisy neighbour: try again
            retimes += 1
            latency = min(latency, runner.time(batches[0]), key=lambda t: t.spread)
        seconds["time"] = time.perf_counter() - t0
    metrics = compare(reference, outputs)
    if any(m.get("nonfinite") for m in metrics.values()):
        loss = math.inf
    elif loss_function is not None:
        loss = float(loss_function(reference, outputs))
        if math.isnan(loss):
            loss = math.inf
    else:
        loss = loss_from_metrics(metrics, metric)
    return Measurement(latency, metrics, loss, seconds, retimes)


def time_interleaved(backend: Backend, models: Sequence[onnx.ModelProto], batch: Batch, rounds: int) -> list[list[Timing] | None]:
    """Build each model once, then time them in turn, ``rounds`` times, so drift (a busy neighbour,
    clocks) hits all alike. A model that fails to build or run gets None; the others go on."""
    with contextlib.ExitStack() as stack:
        runners = []
        for model in models:
            try:
                runner = stack.enter_context(backend.prepare(model))
                runner.run(batch)  # first run: allocations and kernel selection stay out of the rounds
                runners.append(runner)
            except Exception:  # noqa: BLE001 - engines raise their own types; this model is left out
                runners.append(None)
        timings: list[list[Timing] | None] = [[] if r is not None else None for r in runners]
        for _ in range(rounds):
            for i, runner in enumerate(runners):
                if timings[i] is not None:
                    try:
                        timings[i].append(runner.time(batch))
                    except Exception:  # noqa: BLE001
                        timings[i] = None
    return timings

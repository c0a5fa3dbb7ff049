"""One candidate, measured: build it on the engine, run the evaluation set, time it, compare."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import onnx

from autoprec.accuracy import LossFunction, Outputs, compare, loss_from_metrics
from autoprec.backends.base import Backend, Timing
from autoprec.data import Batch


@dataclass(frozen=True)
class Measurement:
    latency: Timing
    metrics: dict[str, dict[str, float]]
    loss: float
    seconds: dict[str, float]  # where the trial's wall time went

    def to_json(self) -> dict[str, Any]:
        return {"latency": self.latency.to_json(), "metrics": self.metrics, "loss": self.loss, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(Timing.from_json(data["latency"]), data["metrics"], data["loss"], data.get("seconds", {}))


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
        latency = runner.time(batches[0])
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
    return Measurement(latency, metrics, loss, seconds)

"""The shipped plan judged once more, on the calibration batches: data that set its ranges but judged no
trial. The search keeps the fastest of many plans the evaluation batches found within the limit, so the one
it keeps tends to have done better there than it does on other data; with few items (a box, a word, a
class is a large step of a task metric) that gap can pass the limit. Its loss on the calibration batches,
run by ONNX Runtime on the CPU like the deployment checks, says how large it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from autoprec.analysis.data import Batch
from autoprec.analysis.preparation import cpu_session
from autoprec.core.stored import StoredModel
from autoprec.measure.accuracy import Judge, Metric

CONFIRMING_BATCHES = 16  # at most this many calibration batches (ONNX Runtime CPU runs each twice)
ADVICE = ("it was kept as the fastest of the plans within the limit on the evaluation batches, which are too few "
          "to hold the limit on other data: give more data (--data), or a lower --max-loss")


@dataclass(frozen=True)
class HeldOut:
    """The shipped plan's loss on ``batches`` calibration batches, against --max-loss (None: no limit)."""

    trial: int
    loss: float
    batches: int
    max_loss: float | None

    @property
    def past_limit(self) -> bool:
        return self.max_loss is not None and not self.loss <= self.max_loss

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "loss": self.loss, "batches": self.batches, "max_loss": self.max_loss,
                "engine": "onnxruntime CPUExecutionProvider"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldOut:
        max_loss = data["max_loss"]
        return cls(data["trial"], float(data["loss"]), data["batches"],
                   float(max_loss) if max_loss is not None else None)


def held_out(trial: int, fp32: StoredModel, shipped: StoredModel, batches: Sequence[Batch],
             labels: Sequence[Batch] | None, metric: Metric, max_loss: float | None) -> HeldOut:
    """``shipped`` against the FP32 model on the calibration ``batches`` (their ``labels`` where the metric
    reads labels), judged as every trial was."""
    batches = batches[:CONFIRMING_BATCHES]
    reference, candidate = (_outputs(model, batches) for model in (fp32, shipped))
    judge = Judge(metric, reference, tuple(labels[: len(batches)]) if labels else None)
    return HeldOut(trial, judge.loss(judge.metrics(candidate), candidate), len(batches), max_loss)


def _outputs(model: StoredModel, batches: Sequence[Batch]) -> list[dict]:
    session = cpu_session(model)
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return [dict(zip(names, session.run(names, {k: v for k, v in b.items() if k in wanted}))) for b in batches]

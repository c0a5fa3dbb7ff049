"""Plans judged once more, on the calibration batches: data that set their ranges but judged no
trial.

The search keeps the fastest of many plans the evaluation batches found within --max-loss, so the
one it keeps tends to have done better there than it does on other data; with few items (a box, a
word, a class is a large step of a task metric) that gap can pass the limit. A plan is shipped only
where it holds the limit on the calibration batches too, run by ONNX Runtime on the CPU (like the
deployment checks) and judged as every trial was."""

from __future__ import annotations

from functools import cached_property
from typing import Sequence

from autoprec.analysis.data import Batch, Dataset
from autoprec.analysis.decoder import find_decoder
from autoprec.analysis.preparation import cpu_runs, cpu_session
from autoprec.analysis.shapes import declared_inputs, output_specs
from autoprec.core.stored import StoredModel
from autoprec.measure.accuracy import Judge, Metric
from autoprec.measure.deployment import session_outputs
from autoprec.measure.shaped import GENERATION, judge_of

# at most this many calibration batches (ONNX Runtime CPU runs each once per plan)
CONFIRMING_BATCHES = 16


class HeldOutJudge:
    """Judges models on the calibration batches against the FP32 model's outputs there, with the
    search's metric and the batches' labels (at every shape the search judged, a decoder's
    generation from their prompts). The FP32 model runs there once, when the first plan is judged: a
    search that ships all-FP32 never runs it."""

    def __init__(self, fp32: StoredModel, dataset: Dataset, metric: Metric):
        self.fp32, self.metric, self.dataset = fp32, metric, dataset
        self.batches = tuple(dataset.calibration[:CONFIRMING_BATCHES])
        labels = dataset.calibration_labels
        self.labels = tuple(labels[: len(self.batches)]) if labels else None

    @cached_property
    def judge(self) -> Judge:
        dataset, model = self.dataset, self.fp32.proto
        at = dataset.calibration_at[: len(self.batches)]
        prompts = [b for b, i in zip(self.batches, at) if dataset.points[i].name == "prefill"]
        decoder = find_decoder(declared_inputs(model), output_specs(model))
        # (the FP32 model's session kept only where generation runs it again)
        generates = self.metric.name == GENERATION and bool(prompts)
        return judge_of(self.metric, _outputs(self.fp32, self.batches), self.labels, dataset, at,
                        decoder,
                        cpu_runs(self.fp32) if generates else None, prompts)

    def loss(self, model: StoredModel) -> float:
        """``model``'s loss on the batches; the FP32 model's outputs there made first, so that its
        session is gone before the plan's is made (a 2 GB model's weights are not held twice)."""
        judge = self.judge
        session = cpu_session(model)
        outputs = [session_outputs(session, batch) for batch in self.batches]
        generated = judge.generation_metrics(lambda feeds: session_outputs(session, feeds))
        return judge.loss({**judge.metrics(outputs), **generated}, outputs)


def _outputs(model: StoredModel, batches: Sequence[Batch]) -> list[dict]:
    session = cpu_session(model)
    return [session_outputs(session, batch) for batch in batches]


def held_out_judge(fp32: StoredModel, dataset: Dataset, metric: Metric) -> HeldOutJudge | None:
    """The judge of plans on the calibration batches (beside the ``fp32`` model's outputs there);
    None for a user's metric (its code runs in the measuring worker only), or where one batch both
    calibrated and judged."""
    if metric.user_function is not None or not dataset.calibration_apart:
        return None
    return HeldOutJudge(fp32, dataset, metric)

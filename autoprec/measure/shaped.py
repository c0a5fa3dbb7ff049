"""A plan judged at every shape a deployment runs (:mod:`autoprec.analysis.shape_points`): one judge
per point on that point's batches, the plan's loss the worst of theirs; for a decoder, also what its
users see: greedy generation from the data's prompts, with the plan's own KV cache fed back
(``--metric generation``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from autoprec.analysis.data import Batch, Dataset
from autoprec.analysis.decoder import Decoder, Generated, Run, generate, stacked
from autoprec.core.errors import AutoprecError
from autoprec.core.similarity import row_cosines, similarity_sums
from autoprec.measure.accuracy import SIMILARITY_METRICS, Judge, Labels, Metric, Outputs
from autoprec.record.facts import ShapePoint
from autoprec.record.trial import SHAPED
from autoprec.tasks import task_named
from autoprec.tasks.generation import NAME as GENERATION

# the share of generated tokens as FP32's, before the first that is not
AGREEMENT = task_named(GENERATION).key
GENERATED_STEPS = 16  # tokens generated from each prompt (its prefill, then decode steps)
PROMPTS = 8  # prompts generated from, at most (rows of the first prefill batches)


def cosine_loss(reference: np.ndarray, candidate: np.ndarray) -> float:
    """1 − the mean cosine of rows (the last axis): of each position's logits."""
    ref = np.asarray(reference).reshape(-1, np.shape(reference)[-1])
    cand = np.asarray(candidate).reshape(-1, np.shape(candidate)[-1])
    sums = similarity_sums(ref, cand)
    if sums is None:
        return math.inf
    return max(0.0, float(1.0 - row_cosines(ref, cand, sums).mean()))


@dataclass(frozen=True)
class GenerationJudge:
    """Greedy generation of GENERATED_STEPS tokens from ``prompts`` (prefill batches), against
    FP32's."""

    decoder: Decoder
    prompts: tuple[Batch, ...]
    reference: tuple[Generated, ...]

    @classmethod
    def of(cls, decoder: Decoder, prompts: Sequence[Batch], fp32: Run) -> GenerationJudge:
        """Up to PROMPTS rows of ``prompts`` stacked into one batch (along the batch axis, 0 in
        every decoder export): one run per generated token, whatever the data's batch."""
        chosen, rows = [], 0
        for prompt in prompts:
            if rows >= PROMPTS or any(np.shape(v) != np.shape(prompts[0][k]) for k, v in prompt.items()):
                break
            chosen.append(prompt)
            rows += len(prompt[decoder.tokens])
        prompt = stacked(decoder, chosen)
        return cls(decoder, (prompt,), (generate(fp32, decoder, prompt, GENERATED_STEPS),))

    def metrics(self, run: Run) -> dict[str, float]:
        """The share of generated tokens that agree with FP32's before the first that does not,
        where rows first diverge (their mean step), and 1 − cosine of the logits at prefill and at
        the decode steps before it."""
        agreeing, total, prefill, decode = 0, 0, [], []
        for prompt, fp32 in zip(self.prompts, self.reference):
            mine = generate(run, self.decoder, prompt, GENERATED_STEPS)
            same = np.cumprod(mine.tokens == fp32.tokens, axis=1)
            agreeing, total = agreeing + int(same.sum()), total + same.size
            prefill.append(cosine_loss(fp32.logits[0], mine.logits[0]))
            kept = [(f, m) for step, (f, m) in enumerate(zip(fp32.logits, mine.logits)) if step and same[:, step - 1].all()]
            decode += [cosine_loss(f, m) for f, m in kept]
        return {AGREEMENT: agreeing / max(total, 1), "prefill_logits_loss": max(prefill),
                "decode_logits_loss": max(decode, default=0.0), "steps": float(GENERATED_STEPS)}

    @staticmethod
    def loss(metrics: Mapping[str, float]) -> float:
        return max(1.0 - metrics[AGREEMENT], metrics["prefill_logits_loss"],
                   metrics["decode_logits_loss"])


@dataclass
class ShapedJudge(Judge):
    """A judge per point on its own batches (``at``: each evaluation batch's point); the loss the
    worst point's. Metrics of point 0 (the data as given) keep their outputs' names, the others' are
    ``NAME @ POINT``."""

    points: tuple[ShapePoint, ...] = ()
    at: tuple[int, ...] = ()
    logits: str | None = None  # a decoder's logits: what --metric generation judges at each point
    generation: GenerationJudge | None = None
    _judges: dict[int, Judge] = field(default_factory=dict, repr=False)

    def at_point(self, name: str) -> tuple[Judge, list[int]]:
        """The judge of the point ``name`` alone, on its own batches, and which evaluation batches
        those are."""
        point = next(i for i, p in enumerate(self.points) if p.name == name)
        return self._judge(point), [i for i, at in enumerate(self.at) if at == point]

    def _judge(self, point: int) -> Judge:
        if point not in self._judges:
            where = [i for i, at in enumerate(self.at) if at == point]
            labels = [self.labels[i] for i in where] if self.labels else None
            labels = labels if labels and all(labels) else None
            metric = self.metric
            if metric.name == GENERATION or (metric.against_labels and labels is None):
                metric = replace(metric,
                                 name="cosine" if metric.name == GENERATION else metric.task)
            self._judges[point] = Judge(metric, [self._per_token(self.reference[i]) for i in where], labels)
        return self._judges[point]

    def _split(self, outputs: Outputs) -> dict[int, list]:
        """A leading run of the evaluation batches' outputs, by point."""
        found: dict[int, list] = {}
        for at, output in zip(self.at, outputs):
            found.setdefault(at, []).append(self._per_token(output))
        return found

    def _per_token(self, output: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """A decoder's logits a row per token ([batch, tokens, vocab] as [batch·tokens, vocab]):
        each token's distribution judged on its own, as generation reads it (a prompt's logits
        taken whole would let its many near-alike positions hide one that is not)."""
        logits = output.get(self.logits) if self.logits else None
        if logits is None or np.ndim(logits) < 3:
            return output
        return {**output, self.logits: np.reshape(logits, (-1, np.shape(logits)[-1]))}

    def _suffix(self, point: int) -> str:
        return "" if point == 0 else f"{SHAPED}{self.points[point].name}"

    def metrics(self, outputs: Outputs) -> dict[str, dict[str, float]]:
        merged = {}
        for point, own in self._split(outputs).items():
            suffix = self._suffix(point)
            merged.update({name + suffix: found for name, found in self._judge(point).metrics(own).items()})
        return merged

    def generation_metrics(self, run: Run) -> dict[str, dict[str, float]]:
        return {GENERATION: self.generation.metrics(run)} if self.generation is not None else {}

    @property
    def runs_the_model(self) -> bool:
        return self.generation is not None

    def losses(self, metrics: Mapping[str, Mapping[str, float]], outputs: Outputs) -> dict[str, float]:
        """The constraint's loss at each point (of those ``outputs`` reach), and of the generation
        where measured."""
        found = {}
        for point, own in self._split(outputs).items():
            suffix, judge = self._suffix(point), self._judge(point)
            mine = {name: metrics[name + suffix] for name in judge.reference[0] if name + suffix in metrics}
            found[self.points[point].name] = judge.loss(self._answer(mine), own)
        if self.metric.name == GENERATION and GENERATION in metrics:
            found[GENERATION] = GenerationJudge.loss(metrics[GENERATION])
        return found

    def _answer(self, metrics: Mapping[str, Mapping[str, float]]) -> Mapping[str, Mapping[str, float]]:
        """Of a decoder's outputs, what a similarity judges: its logits. The KV cache it also
        returns is its state, whose error the decode points' logits show; averaged in, near-exact
        cache tensors would hide the logits' loss (a cosine limit of 0.01 held at 0.0035 by a plan
        whose logits were 0.009 off). --metric generation judges each point so too (its cosine)."""
        if self.metric.name in (*SIMILARITY_METRICS, GENERATION) and self.logits in metrics:
            return {self.logits: metrics[self.logits]}
        return metrics

    def loss(self, metrics: Mapping[str, Mapping[str, float]], outputs: Outputs) -> float:
        if any(m.get("nonfinite") for m in metrics.values()):
            return math.inf
        return max(self.losses(metrics, outputs).values())

    def limit_said(self, max_loss: float | None) -> str | None:
        return self._judge(0).limit_said(max_loss)

    def for_ranking(self) -> Judge:
        ranking = self._judge(0).for_ranking()
        if ranking.metric.name == self.metric.name:
            return self
        return ShapedJudge(ranking.metric, self.reference, self.labels, points=self.points,
                           at=self.at,
                           logits=self.logits)


def judge_of(metric: Metric, reference: Outputs, labels: Labels | None, dataset: Dataset,
             at: Sequence[int],
             decoder: Decoder | None, fp32: Run | None, prompts: Sequence[Batch] = ()) -> Judge:
    """The judge of a search: a :class:`ShapedJudge` where the data holds several shapes (``at``:
    each batch's point), else the plain one. ``--metric generation`` needs a decoder (and ``fp32``,
    its runs, to generate from ``prompts``: the prefill batches)."""
    if metric.name == GENERATION and decoder is None:
        raise AutoprecError(f"--metric {GENERATION}: the model is not a decoder with a KV cache; "
                            f"{task_named(GENERATION).needs}")
    if not dataset.points:
        return Judge(metric, reference, labels)
    generation = None
    if metric.name == GENERATION and fp32 is not None and prompts:
        generation = GenerationJudge.of(decoder, prompts, fp32)
    return ShapedJudge(metric, reference, labels, points=dataset.points, at=tuple(at),
                       logits=decoder.logits if decoder is not None else None,
                       generation=generation)


def by_shape(judge: Judge, metrics: Mapping[str, Mapping[str, float]], outputs: Outputs) -> dict[str, Any]:
    """Each point's loss (and the generation's) where ``judge`` judges several; else nothing."""
    if not isinstance(judge, ShapedJudge):
        return {}
    return judge.losses(metrics, outputs)

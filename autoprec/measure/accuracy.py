"""Accuracy against the FP32 model's own outputs, and against ground truth where the data has it.

Every output gets cosine similarity, relative L2 error, max abs error and SNR (dB); outputs whose
shape says what they decide get task metrics too: top-1 agreement (class scores, per position for
sequences), CTC text (character error rate), YOLO boxes (mAP@0.5), embeddings (nearest-neighbour
agreement). ``--metric`` names the one that constrains the search; all are recorded for every trial.
A candidate whose outputs hold NaN or Inf has infinite loss: overflow is never averaged away.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import math
import sys
import threading
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from autoprec.core import untrusted
from autoprec.core.errors import AutoprecError, MetricError, first_line
from autoprec.measure import gfl, regions, tasks
from autoprec.measure.labels import class_scores, doubtful, scores_classes, unscored

log = logging.getLogger("autoprec")

Outputs = Sequence[Mapping[str, np.ndarray]]
Labels = Sequence[Mapping[str, np.ndarray]]  # per evaluation batch: "labels", "text" and/or "boxes"
LossFunction = Callable[[Outputs, Outputs], float]

SIMILARITY_METRICS = ("cosine", "rel_l2", "max_abs")
TASK_METRICS = ("top1", "ctc-text", "detection", "embedding", "text-regions", "segmentation")
# metric -> the label array it reads
LABELLED = {"top1": "labels", "ctc-text": "text", "detection": "boxes", "text-regions": "boxes", "segmentation": "masks"}
# A decoder's greedy generation against FP32's (autoprec.measure.shaped): its own judge, at every shape it runs.
GENERATION_METRICS = ("generation",)
AUTO = "auto"  # the model's own default: generation for a decoder with a KV cache, else cosine (app.resolve)
BUILTIN_METRICS = (AUTO, *SIMILARITY_METRICS, *TASK_METRICS, *GENERATION_METRICS,
                   *(f"{m}@labels" for m in LABELLED))
# An output with this many values per item or fewer: cosine sees (almost) nothing of it.
NARROW_OUTPUT = 4
# A --metric module still importing after this many seconds is said (autoprec waits on its code).
IMPORT_NOTICE_SECONDS = 10.0
# Decisions the constraint may change before a similarity-constrained search says so.
DECISION_CHANGE_LIMIT = 0.01


@dataclass(frozen=True)
class HeadOptions:
    """How to decode an output's decisions where its shape does not say (command-line options)."""

    blank: int = 0  # --ctc-blank
    charset: tuple[str, ...] | None = None  # the recognizer's dictionary (--ctc-charset, or the model's metadata)
    layout: str | None = None  # --det-layout: yolov8 | yolov5 (inferred for channels-first heads)
    conf: float = 0.25  # --det-conf
    iou: float = 0.45  # --det-iou (NMS)
    output: str | None = None  # --task-output: the output the task metrics read
    db_thresh: float = regions.DB_THRESHOLD  # --db-thresh: text-regions' pixel threshold
    db_box_thresh: float = regions.DB_BOX_THRESHOLD  # --db-box-thresh: a region's mean probability to keep it
    image: tuple[int, int] | None = None  # the model's image input (H, W), from the data: where PicoDet's anchors lie

    def to_json(self) -> dict[str, Any]:
        charset = hashlib.sha256("\n".join(self.charset).encode()).hexdigest()[:12] if self.charset else None
        return {"blank": self.blank, "charset": charset, "layout": self.layout, "conf": self.conf, "iou": self.iou,
                "output": self.output, "db_thresh": self.db_thresh, "db_box_thresh": self.db_box_thresh,
                "image": list(self.image) if self.image else None}


@dataclass(frozen=True)
class Metric:
    """The accuracy constraint (``name``: built-in, ``TASK@labels``, or ``module:function``) and the task
    metrics computed beside it (the constraint's own, those the data's labels or a zoo entry call for)."""

    name: str = "cosine"
    tasks: tuple[str, ...] = ()
    options: HeadOptions = field(default_factory=HeadOptions)

    @property
    def task(self) -> str:
        """The task metric the constraint reads (``top1`` for ``top1@labels``), or the name itself."""
        return self.name.removesuffix("@labels")

    @property
    def against_labels(self) -> bool:
        return self.name.endswith("@labels")

    @property
    def user_function(self) -> LossFunction | None:
        return None if self.name in BUILTIN_METRICS else _import_function(self.name)

    def describe(self) -> str:
        """What decides the loss, for identities and cache keys: a change here makes other numbers."""
        beside = sorted(set(self.tasks) - {self.task})
        if not beside and self.options == HeadOptions():
            return self.name
        return " ".join([self.name, *beside, repr(sorted(self.options.to_json().items()))])

    def to_json(self) -> dict[str, Any]:
        return {"tasks": sorted(set(self.tasks) | ({self.task} & set(TASK_METRICS))), "options": self.options.to_json()}


def resolve_metric(spec: str, tasks_beside: Sequence[str] = (), options: HeadOptions | None = None) -> Metric:
    """A built-in metric name, ``TASK@labels``, or ``module:function`` imported from the current
    directory or sys.path.

    The user function runs with full privileges: it is user code, exactly like a plugin.
    It receives (reference_outputs, candidate_outputs), each a list of {output name: array} per
    evaluation batch, and returns a float loss (lower is better).
    """
    metric = Metric(
        spec,
        tuple(dict.fromkeys(t for t in (spec.removesuffix("@labels"), *tasks_beside) if t in TASK_METRICS)),
        options or HeadOptions(),
    )
    if spec not in BUILTIN_METRICS:
        module_name, sep, func_name = spec.partition(":")
        if not sep or not module_name or not func_name:
            raise AutoprecError(f"unknown --metric {spec!r}; use {', '.join(BUILTIN_METRICS)} or module:function")
        metric.user_function  # noqa: B018 - imported now, so a bad module is named before anything runs
    if metric.options.layout is not None and metric.options.layout not in tasks.DETECTION_LAYOUTS:
        raise AutoprecError(f"--det-layout {metric.options.layout!r}: choose {' or '.join(tasks.DETECTION_LAYOUTS)}")
    return metric


@lru_cache(maxsize=None)
def _import_function(spec: str) -> LossFunction:
    module_name, _, func_name = spec.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    _refuse_distrusted(spec, module_name)
    notice = threading.Timer(IMPORT_NOTICE_SECONDS, log.warning, (
        f"--metric {spec}: importing {module_name} has taken {IMPORT_NOTICE_SECONDS:g} s; autoprec "
        "waits on it (Ctrl-C ends it)",))
    notice.daemon = True
    notice.start()
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise AutoprecError(f"--metric {spec}: cannot import it ({exc}); check the module is on the path") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed as it was imported (a syntax error, its own code)
        raise AutoprecError(
            f"--metric {spec}: importing {module_name} raised {type(exc).__name__}: {exc}; fix the module"
        ) from None
    finally:
        notice.cancel()
    if not callable(func):
        raise AutoprecError(f"--metric {spec}: {func_name} is not a function")
    return func


def _refuse_distrusted(spec: str, module_name: str) -> None:
    """A metric module that a result folder read in this process would provide is refused, before
    any of its code runs (see :func:`autoprec.core.untrusted.distrust`)."""
    for origin in untrusted.module_origins(module_name):
        if (folder := untrusted.distrusted(origin)) is not None:
            raise AutoprecError(f"--metric {spec}: {module_name} would be imported from {origin}, "
                                f"inside {folder}, a result autoprec reads as input and never runs "
                                "code from; keep your metric's module outside it (in your working "
                                "folder or on PYTHONPATH)")


# --- per output: similarity, then what the output decides ---------------------------------------------


def _looks_like_ctc(arr: np.ndarray) -> bool:
    """(N, T, C) per-step probabilities (each step sums to 1): what a CTC recognizer's softmax gives."""
    if not (arr.dtype.kind == "f" and arr.ndim == 3 and arr.shape[1] >= 2 and arr.shape[2] >= 3):
        return False
    return bool(arr.min() >= 0 and np.allclose(arr.sum(-1), 1.0, atol=1e-3))


def narrow(arr: np.ndarray) -> bool:
    """A handful of values per item (a score, a probability, a box): cosine per item cannot see it change."""
    return arr.ndim == 0 or arr.size // max(1, len(arr)) <= NARROW_OUTPUT


def output_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Similarity metrics for one output over all batches (arrays stacked along the batch axis), and
    top-1 agreement when it looks like class scores."""
    if reference.dtype.kind in "iubOUS":  # class ids, counts, masks, strings: a value is right or wrong, not near
        same = reference.reshape(len(reference), -1) == candidate.reshape(len(candidate), -1)
        return {"equal": float(same.mean()) if same.size else 1.0, "nonfinite": 0.0}
    ref = reference.astype(np.float64).reshape(len(reference), -1)
    cand = candidate.astype(np.float64).reshape(len(candidate), -1)
    metrics: dict[str, float] = {}
    if not np.isfinite(cand).all():
        metrics.update(cosine=-math.inf, rel_l2=math.inf, max_abs=math.inf, snr_db=-math.inf, nonfinite=1.0)
        if class_scores(reference):
            metrics["top1"] = 0.0
        return metrics
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    dots = (ref * cand).sum(axis=1)
    # Two all-zero items agree perfectly; one zero and one not do not.
    same = np.all(ref == cand, axis=1)
    cosines = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(same, 1.0, 0.0))
    noise = float(((cand - ref) ** 2).sum())
    signal = float((ref**2).sum())
    metrics["cosine"] = float(cosines.mean())
    metrics["rel_l2"] = math.sqrt(noise / signal) if signal > 0 else (0.0 if noise == 0 else math.inf)
    metrics["max_abs"] = float(np.abs(cand - ref).max()) if ref.size else 0.0
    metrics["snr_db"] = (
        10 * math.log10(signal / noise) if noise > 0 and signal > 0 else (math.inf if noise == 0 else -math.inf)
    )
    metrics["nonfinite"] = 0.0
    if class_scores(reference):
        metrics["top1"] = float((reference.argmax(-1) == candidate.argmax(-1)).mean())
    if narrow(reference):
        metrics["narrow"] = 1.0
    return metrics


def compare(reference: Outputs, candidate: Outputs) -> dict[str, dict[str, float]]:
    """Per output name, every label-free metric over every evaluation batch (what :class:`Judge` gives
    for the default metric)."""
    return Judge(Metric(), reference).metrics(candidate)


def loss_from_metrics(metrics: Mapping[str, Mapping[str, float]], metric: str, outputs: str = "") -> float:
    """The label-free scalar losses (lower is better, 0 = identical to FP32), averaged over the outputs
    they apply to. ``cosine`` reads the relative L2 error of narrow outputs, where cosine is blind."""
    per_output = list(metrics.values())
    if any(m.get("nonfinite") for m in per_output):
        return math.inf
    if metric in SIMILARITY_METRICS:  # integer outputs: the share of values that differ
        if metric == "cosine":
            values = [1.0 - m["equal"] if "equal" in m else m["rel_l2"] if m.get("narrow") else 1.0 - m["cosine"]
                      for m in per_output]
        else:
            values = [1.0 - m["equal"] if "equal" in m else m[metric] for m in per_output]
        return max(0.0, float(np.mean(values)))  # (1 - cosine rounds to -2e-16 on equal outputs)
    key, to_loss = {"top1": ("top1", lambda v: 1.0 - v), "ctc-text": ("cer", lambda v: v),
                    "detection": ("map50", lambda v: 1.0 - v), "embedding": ("embedding_loss", lambda v: v),
                    "text-regions": ("region_f", lambda v: 1.0 - v), "segmentation": ("miou", lambda v: 1.0 - v)}[metric]
    values = [m[key] for m in per_output if key in m]
    if not values:
        raise AutoprecError(f"--metric {metric}: no model output it applies to; {HOW_TO[metric]}"
                            + (f"; the model's outputs: {outputs}" if outputs else ""))
    return float(np.mean([to_loss(v) for v in values]))


SELF_AGREEMENT = 1e-6  # the most a metric may score FP32's outputs against themselves (rounding)
HOW_TO = {
    "top1": "it needs class scores shaped N×C or N×T×C: choose cosine or rel_l2",
    "ctc-text": "it needs per-step class scores shaped N×T×C (name the output with --task-output)",
    "detection": "it needs a YOLO head shaped N×(4+classes)×boxes or N×boxes×(5+classes) (--task-output, --det-layout)",
    "embedding": "it needs embeddings shaped N×D or N×T×D (--task-output)",
    "text-regions": "it needs a DBNet probability map shaped N×1×H×W or N×H×W, values in [0, 1] (--task-output)",
    "segmentation": "it needs per-pixel class scores N×C×H×W or class ids N×H×W (--task-output)",
}


@dataclass
class Judge:
    """Scores a candidate's outputs against the FP32 reference outputs and the labels (one mapping per
    evaluation batch, or None), for any leading run of the evaluation batches (screening uses a quarter)."""

    metric: Metric
    reference: Outputs
    labels: Labels | None = None
    _fp32: dict[int, dict] = field(default_factory=dict, repr=False)
    _fp32_checked: bool = field(default=False, repr=False)  # a user's function scored FP32 against itself
    _fp32_regions: dict[tuple[str, int], list] = field(default_factory=dict, repr=False)  # decoded once, not per plan

    def check(self) -> dict[str, dict[str, float]]:
        """Refuse, in one line, a constraint that cannot be computed here (a head it cannot decode, labels
        missing); return the FP32 model's own label scores (empty without labels)."""
        if self.metric.against_labels:
            wanted = LABELLED[self.metric.task]
            if not self.labels or wanted not in self.labels[0]:
                raise AutoprecError(
                    f"--metric {self.metric.name}: the data holds no {wanted!r} array; add one to the .npz beside the "
                    f"inputs ({LABEL_FORMS[wanted]}), or use --metric {self.metric.task} (agreement with FP32)")
            if wanted == "text" and self.metric.options.charset is None:
                raise AutoprecError(
                    f"--metric {self.metric.name}: ground-truth text needs the head's characters; the model "
                    "has no 'character' metadata: give --ctc-charset FILE (one character per line, "
                    "PaddleOCR's dictionary order)"
                )
        if self.metric.against_labels:
            self._labels_score()
        if self.metric.user_function is None:  # user code runs in the measuring worker only, as every candidate's
            self._agrees_with_itself()
        return self.fp32_scores(len(self.reference))

    def _labels_score(self) -> None:
        """The constraint's labels score FP32 on some output, to a number; else one line saying what of the labels
        is wrong (their shape, classes the output does not have, no item labelled in the evaluation batches)."""
        key, wanted = LABEL_KEYS[self.metric.task], LABELLED[self.metric.task]
        scored = [m[key] for m in self.fp32_scores(len(self.reference)).values() if key in m]
        if not scored:
            raise AutoprecError(f"--metric {self.metric.name}: " + unscored(
                wanted, self.labels[0], self.reference[0], self.metric.options.output, LABEL_FORMS[wanted]))
        if all(math.isnan(v) for v in scored):
            raise AutoprecError(f"--metric {self.metric.name}: the data's {wanted!r} array labels no item of the "
                                f"{len(self.reference)} evaluation batch(es) (negative: not labelled); label them, "
                                f"or use --metric {self.metric.task} (agreement with FP32)")

    def doubts(self) -> list[str]:
        """Where FP32's own score against the labels says they may not be this model's (see
        :func:`autoprec.measure.labels.doubtful`)."""
        return doubtful(self.fp32_scores(len(self.reference)), self.reference[0]) if self.labels else []

    def _agrees_with_itself(self) -> None:
        """FP32's outputs must score 0 against themselves; a metric that does not decodes something else
        (a head of another layout, the wrong output) and would judge every plan by that."""
        own = self.loss(self._own(len(self.reference)), self.reference)
        if own > SELF_AGREEMENT:
            hint = HOW_TO.get(self.metric.task, "check --task-output")
            raise AutoprecError(
                f"--metric {self.metric.name}: the FP32 model's outputs score loss {own:.3g} against themselves, not "
                f"0: the metric does not decode this model's outputs ({hint}); or use --metric cosine")

    def for_ranking(self) -> Judge:
        """The judge the sensitivity pass ranks units with: the constraint where it is continuous (a
        similarity, the user's function), else cosine. A task metric on a quarter of the evaluation set
        is coarse: most one-unit plans change no decision there, and a ranking of ties orders nothing."""
        if self.metric.name in SIMILARITY_METRICS or self.metric.user_function is not None:
            return self
        return Judge(Metric("cosine", self.metric.tasks, self.metric.options), self.reference, self.labels)

    def notes(self) -> list[str]:
        """Outputs the constraint would be blind to, and what reads them instead."""
        if self.metric.name not in SIMILARITY_METRICS:
            return []
        notes = [
            f"output {name!r} holds integers ({value.dtype}): its share of the loss is the share of its values "
            "that differ from FP32's (equal)"
            for name, value in self.reference[0].items()
            if value.dtype.kind in "iub"
        ]
        if self.metric.name == "cosine":
            notes += [f"output {name!r} has {value.size // max(1, len(np.atleast_1d(value)))} value(s) per item: cosine "
                      "cannot see it "
                      "change, so its share of the loss is its relative L2 error (rel_l2)"
                      for name, value in self.reference[0].items() if narrow(value) and value.dtype.kind == "f"]
        return notes

    def said(self) -> str:
        """What the constraint's figure is, in words every verb shows it in: the metric's name, with what it reads
        instead on the outputs it is blind to (``cosine (as rel_l2 on 'y': 2 values per item)``)."""
        if self.metric.name not in SIMILARITY_METRICS:
            return self.metric.name
        instead = [f"share of differing values on {name!r}" for name, value in self.reference[0].items()
                   if value.dtype.kind in "iub"]
        if self.metric.name == "cosine":
            instead += [f"rel_l2 on {name!r}: {value.size // max(1, len(np.atleast_1d(value)))} value(s) per item"
                        for name, value in self.reference[0].items() if narrow(value) and value.dtype.kind == "f"]
        return self.metric.name + (f" (as {'; '.join(instead)})" if instead else "")

    def decisions(self) -> int | None:
        """How many decisions the constraint counts where it counts them (``top1``: the top-1 decisions of the one
        output it scores, over the evaluation batches; ``top1@labels``: its labelled items), so a loss is a
        whole number of them over this; None for a metric that counts none (or over several outputs)."""
        if self.metric.task != "top1" or self.metric.user_function is not None:
            return None
        key = "top1_labels" if self.metric.against_labels else "top1"
        scored = [name for name, values in self._own(len(self.reference)).items() if key in values]
        if len(scored) != 1:
            return None
        shape = np.shape(np.concatenate([np.atleast_1d(r[scored[0]]) for r in self.reference]))
        if not self.metric.against_labels:
            return int(np.prod(shape[:-1]))
        truth = _stacked(self.labels)["labels"]
        return int((truth >= 0).sum())

    def limit_said(self, max_loss: float | None) -> str | None:
        """What ``--max-loss`` allows in decisions where the constraint counts them (12 items, top1
        at 0.01: none; 6 boxes in 2 classes, detection at 0.01: none, each costs 0.17–0.5)."""
        if max_loss is not None and (boxes := self._boxes()) is not None:
            return boxes_said(boxes, max_loss, self.metric.name)
        count = self.decisions()
        if count is None or not count or max_loss is None:
            return None
        allowed, one = math.floor(max_loss * count + 1e-9), 1.0 / count
        what = "fewer correct answers than FP32's" if self.metric.against_labels else "changed top-1 decision(s)"
        said = (f"--max-loss {max_loss:g} with --metric {self.metric.name} over {count} evaluation decision(s) "
                f"allows {allowed} {what}: each is a loss of {one:.3g}")
        if allowed == 0:
            said += f"; give --max-loss {one:.3g} or more to allow one, or more evaluation data"
        return said

    def generation_metrics(self, run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
                           ) -> dict[str, dict[str, float]]:
        """What this judge measures by running the model itself (a decoder's generation: see
        :class:`autoprec.measure.shaped.ShapedJudge`), by the name it records it under; nothing here."""
        return {}

    def _boxes(self) -> list[np.ndarray] | None:
        """The boxes a detection constraint scores against, over the evaluation batches: FP32's
        (decoded as every plan's are) or the data's; None for another metric, a PicoDet head or
        several outputs."""
        if (self.metric.task != "detection" or self._picodet
                or self.metric.user_function is not None):
            return None
        if self.metric.against_labels:
            return tasks.padded_boxes(_stacked(self.labels)["boxes"]) if self.labels else None
        heads = [name for name, value in self.reference[0].items()
                 if self._applies("detection", name, value)]
        if len(heads) != 1:
            return None
        ref = np.concatenate([r[heads[0]] for r in self.reference])
        options = self.metric.options
        layout = options.layout or _inferred_layout(heads[0], ref)
        return tasks.as_truths(tasks.yolo_detections(ref, layout, options.conf, options.iou))

    def loss_of(self, outputs: Outputs) -> float:
        """The constraint's scalar for outputs of the first ``len(outputs)`` evaluation batches."""
        return self.loss(self.metrics(outputs), outputs)

    def metrics(self, outputs: Outputs) -> dict[str, dict[str, float]]:
        reference = self.reference[: len(outputs)]
        labels = _stacked(self.labels[: len(outputs)]) if self.labels else {}
        metrics, stacked = {}, ({}, {})
        for name in reference[0]:
            refs, cands = [np.atleast_1d(r[name]) for r in reference], [np.atleast_1d(c[name]) for c in outputs]
            if self._time_major(name, refs[0]):  # (T, 1, C) per batch: a CTC head that keeps time first
                refs, cands = [a.transpose(1, 0, 2) for a in refs], [a.transpose(1, 0, 2) for a in cands]
            ref, cand = np.concatenate(refs), np.concatenate(cands)
            stacked[0][name], stacked[1][name] = ref, cand
            metrics[name] = values = output_metrics(ref, cand)
            if not values.get("nonfinite"):
                values.update(self._decisions(name, ref, cand, labels))
            if self._applies("detection", name, ref) or self._applies("embedding", name, ref):
                values.pop("top1", None)  # boxes or vectors, not class scores: an argmax over them decides nothing
        if self._picodet and not any(m.get("nonfinite") for m in metrics.values()):
            head = self._gfl_head
            for name in (*head.scores, *head.boxes):
                metrics[name].pop("top1", None)  # per anchor: not a decision
            metrics[head.scores[0]].update(self._picodet_decisions(*stacked, labels))
        return metrics

    @property
    def _picodet(self) -> bool:
        return "detection" in self.metric.tasks and self.metric.options.layout == "picodet"

    @cached_property
    def _gfl_head(self) -> gfl.Head:
        shapes = {name: np.shape(value) for name, value in self.reference[0].items()}
        return gfl.find_head(shapes, self.metric.options.image)

    def _picodet_decisions(self, ref: Mapping[str, np.ndarray], cand: Mapping[str, np.ndarray],
                           labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        """A PicoDet head's boxes (every output of it at once) against FP32's; scores outside [0, 1] are logits."""
        head, options = self._gfl_head, self.metric.options
        logits = not all(regions.probabilities(ref[n]) for n in head.scores)
        ref_boxes, cand_boxes = (gfl.detections(o, head, options.conf, options.iou, logits) for o in (ref, cand))
        return _box_decisions(ref_boxes, cand_boxes, labels)

    def _time_major(self, name: str, first: np.ndarray) -> bool:
        """A per-batch (T > 1, 1, C) output that CTC reads: time first, the batch of one second."""
        return (first.ndim == 3 and first.shape[1] == 1 and first.shape[0] > 1
                and self._applies("ctc-text", name, first.transpose(1, 0, 2)))

    def _own(self, batches: int) -> dict[str, dict[str, float]]:
        """Every metric of the FP32 outputs against themselves on the first ``batches`` batches, computed once."""
        if batches not in self._fp32:
            self._fp32[batches] = self.metrics(self.reference[:batches])
        return self._fp32[batches]

    def fp32_scores(self, batches: int) -> dict[str, dict[str, float]]:
        """The FP32 model's own scores against the labels on the first ``batches`` batches."""
        scores = {n: {k: v for k, v in m.items() if k.endswith("_labels")} for n, m in self._own(batches).items()}
        return {n: m for n, m in scores.items() if m}

    def loss(self, metrics: Mapping[str, Mapping[str, float]], outputs: Outputs) -> float:
        """The constraint's scalar: lower is better, 0 = as good as FP32; unbounded for non-finite outputs."""
        if any(m.get("nonfinite") for m in metrics.values()):
            return math.inf
        function = self.metric.user_function
        if function is not None:
            return self._user_function_loss(function, outputs)
        if not self.metric.against_labels:
            shapes = ", ".join(f"{name} {list(np.shape(v))} {np.asarray(v).dtype}" for name, v in self.reference[0].items())
            return loss_from_metrics(metrics, self.metric.name, shapes)
        key = LABEL_KEYS[self.metric.task]
        fp32 = self.fp32_scores(len(outputs))
        drops = [(m[key] - fp32[n][key]) if key == "cer_labels" else (fp32[n][key] - m[key])
                 for n, m in metrics.items() if key in m and key in fp32.get(n, {})]
        if not drops:
            raise AutoprecError(
                f"--metric {self.metric.name}: no output scored against the labels; {HOW_TO[self.metric.task]}"
            )
        return float(np.mean(drops))

    def _user_function_loss(self, function: LossFunction, outputs: Outputs) -> float:
        """A ``module:function`` loss: on FP32's own outputs first (once), a finite number; on every plan's (their
        outputs finite: non-finite ones are infinite loss before it is asked), a number of 0 or more. Anything
        else is the function's fault, not one plan's: a MetricError, which stops the search naming it."""
        if not self._fp32_checked:
            own = self._user_loss(function, self.reference[: len(outputs)])
            if not math.isfinite(own):
                raise MetricError(f"--metric {self.metric.name}: returned {own} for the FP32 outputs against "
                                  "themselves; a loss is a finite number (0: as good as FP32): fix the function")
            self._fp32_checked = True
        loss = self._user_loss(function, outputs)
        if math.isnan(loss) or loss < -SELF_AGREEMENT:
            raise MetricError(f"--metric {self.metric.name}: returned {loss:.3g} for a plan; a loss is 0 or more "
                              "(0: as good as FP32, larger: worse), never NaN: fix the function")
        return max(loss, 0.0)

    def _user_loss(self, function: LossFunction, outputs: Outputs) -> float:
        """The user's function on read-only views of the FP32 outputs and ``outputs`` (a function that changed them
        in place would change every later measurement), as a float; else a MetricError naming it."""
        try:
            with contextlib.redirect_stdout(sys.stderr):  # what it prints is not autoprec's output (--json)
                value = function(_read_only(self.reference[: len(outputs)]), _read_only(outputs))
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - the user's code
            said = first_line(exc, 200, empty="")
            hint = " (the arrays it is given are read-only: copy one before changing it)" if "read-only" in said else ""
            raise MetricError(f"--metric {self.metric.name}: raised {type(exc).__name__}: {said}; fix the "
                              f"function{hint}") from None
        try:
            return float(np.asarray(value).item())
        except (TypeError, ValueError):
            raise MetricError(f"--metric {self.metric.name}: returned {type(value).__name__} {str(value)[:60]!r}, not "
                              "one number; return a float (lower is better, 0: as good as FP32)") from None

    def _applies(self, task: str, name: str, ref: np.ndarray) -> bool:
        if self.metric.options.output is not None and name != self.metric.options.output:
            return False
        if task == "ctc-text":
            if ref.ndim == 2 and ref.dtype.kind in "iu":  # class ids: the head took the argmax itself
                return "ctc-text" in self.metric.tasks
            return ref.ndim == 3 and ref.dtype.kind == "f" and ("ctc-text" in self.metric.tasks or _looks_like_ctc(ref))
        if task == "detection":  # a PicoDet head is read from all its outputs at once (metrics)
            return "detection" in self.metric.tasks and ref.ndim == 3 and ref.dtype.kind == "f" and not self._picodet
        if task == "text-regions":
            return "text-regions" in self.metric.tasks and regions.probability_maps(ref) is not None
        if task == "segmentation":
            return "segmentation" in self.metric.tasks and regions.class_map(ref) is not None
        return "embedding" in self.metric.tasks and ref.ndim in (2, 3) and ref.dtype.kind == "f"

    def _decisions(
        self, name: str, ref: np.ndarray, cand: np.ndarray, labels: Mapping[str, np.ndarray]
    ) -> dict[str, float]:
        options, found = self.metric.options, {}
        truth = labels.get("labels")
        if (truth is not None and class_scores(ref) and scores_classes(truth, ref)
                and (options.output in (None, name))):
            scored = truth >= 0
            found["top1_labels"] = float((cand.argmax(-1) == truth)[scored].mean()) if scored.any() else math.nan
        if self._applies("ctc-text", name, ref):
            ref_ids, cand_ids = tasks.greedy_ctc(ref, options.blank), tasks.greedy_ctc(cand, options.blank)
            found["cer"] = tasks.character_error_rate(cand_ids, ref_ids)
            if "text" in labels and options.charset is not None:
                charset = tasks.class_characters(
                    options.charset, ref.shape[2] if ref.ndim == 3 else None, options.blank
                )
                if charset is None:
                    raise AutoprecError(
                        f"--ctc-charset: {len(options.charset)} characters do not fit output {name!r} with "
                        f"{ref.shape[2] if ref.ndim == 3 else 'its'} classes (every class in order, or PaddleOCR's "
                        "order: blank, the dictionary, a space when there is room); give the model's own dictionary")
                found["cer_labels"] = tasks.character_error_rate(
                    [tasks.ctc_text(ids, charset).strip() for ids in cand_ids], [str(t).strip() for t in labels["text"]]
                )
        if self._applies("detection", name, ref):
            layout = options.layout or _inferred_layout(name, ref)
            ref_boxes = tasks.yolo_detections(ref, layout, options.conf, options.iou)
            cand_boxes = tasks.yolo_detections(cand, layout, options.conf, options.iou)
            found.update(_box_decisions(ref_boxes, cand_boxes, labels))
        found.update(self._region_decisions(name, ref, cand, labels))
        if self._applies("embedding", name, ref):
            ref_emb, cand_emb = tasks.pooled(ref), tasks.pooled(cand)
            found["embedding_cosine"] = float((tasks.unit_rows(ref_emb) * tasks.unit_rows(cand_emb)).sum(1).mean())
            found["embedding_loss"] = 1.0 - found["embedding_cosine"]
            if len(ref_emb) >= 3:  # with two items, each one's neighbour is the other: nothing to agree on
                same = tasks.nearest_neighbours(ref_emb) == tasks.nearest_neighbours(cand_emb)
                found["nn_agreement"] = float(same.mean())
                found["embedding_loss"] = max(found["embedding_loss"], 1.0 - found["nn_agreement"])
        return found

    def _text_regions(self, output: np.ndarray) -> list[np.ndarray]:
        """Each image's text regions, decoded with the metric's thresholds."""
        options = self.metric.options
        return [regions.text_regions(m, options.db_thresh, options.db_box_thresh) for m in regions.maps(output)]

    def _region_decisions(
        self, name: str, ref: np.ndarray, cand: np.ndarray, labels: Mapping[str, np.ndarray]
    ) -> dict[str, float]:
        """Text regions (a DBNet map binarised as PaddleOCR does) and per-pixel classes, against FP32's."""
        found = {}
        if self._applies("text-regions", name, ref):
            key = (name, len(ref))
            if key not in self._fp32_regions:
                self._fp32_regions[key] = self._text_regions(ref)
            fp32, mine = self._fp32_regions[key], self._text_regions(cand)
            found["region_f"] = regions.region_f_score(mine, fp32)
            found["region_count_change"] = (sum(map(len, mine)) - sum(map(len, fp32))) / max(1, sum(map(len, fp32)))
            if "boxes" in labels:
                truth = [b[:, 1:5] for b in tasks.padded_boxes(labels["boxes"])]
                found["region_f_labels"] = regions.region_f_score(mine, truth)
        if self._applies("segmentation", name, ref):
            ref_ids, cand_ids = regions.class_map(ref), regions.class_map(cand)
            found["pixel_agreement"] = float((ref_ids == cand_ids).mean())
            found["miou"] = float(np.mean([regions.mean_iou(c, r) for c, r in zip(cand_ids, ref_ids)]))
            truth = labels.get("masks")
            if truth is not None and truth.shape == cand_ids.shape:
                found["miou_labels"] = float(np.mean([regions.mean_iou(c, t) for c, t in zip(cand_ids, truth)]))
        return found


LABEL_KEYS = {"top1": "top1_labels", "ctc-text": "cer_labels", "detection": "map50_labels",
              "text-regions": "region_f_labels", "segmentation": "miou_labels"}
LABEL_FORMS = {
    "labels": "integer class per item, shaped N or N×T; negative = not labelled",
    "text": "one string per item",
    "boxes": "N×M×5 rows of class, x1, y1, x2, y2 in input pixels; a negative class pads",
    "masks": "N×H×W integer class per pixel, as the output's map; negative = not labelled",
}


def boxes_said(truths: list[np.ndarray], max_loss: float, metric: str) -> str:
    """What ``--max-loss`` allows in boxes, each lost or moved box costing its class's share of
    mAP@0.5."""
    costs = tasks.box_costs(truths)  # one per class
    count, classes = sum(len(t) for t in truths), len(costs)
    whose = "the data's" if metric.endswith("@labels") else "FP32's"
    if not costs:
        return (f"--max-loss {max_loss:g} with --metric {metric}: {whose} boxes on the evaluation "
                "batches are none")
    most, least = (math.floor(max_loss / c + 1e-9) for c in (costs[0], costs[-1]))
    allowed = ("no box" if most == 0 else f"{least}–{most} box(es)" if least != most
               else f"{most} box(es)")
    span = f"{costs[0]:.3g}" if costs[0] == costs[-1] else f"{costs[0]:.3g}–{costs[-1]:.3g}"
    said = (f"--max-loss {max_loss:g} with --metric {metric} over {whose} {count} box(es) in "
            f"{classes} class(es) on the evaluation batches allows {allowed} lost or moved off its "
            f"place: each is a loss of {span} (1 / (classes × that class's boxes))")
    if most == 0:
        said += f"; give --max-loss {costs[0]:.3g} or more to allow one, or more evaluation data"
    return said


def _box_decisions(ref_boxes: list[np.ndarray], cand_boxes: list[np.ndarray],
                   labels: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Detections against FP32's (mAP@0.5, the change in their count) and against the data's boxes."""
    count = sum(len(b) for b in ref_boxes)
    found = {"map50": tasks.mean_average_precision(cand_boxes, tasks.as_truths(ref_boxes)),
             "box_count_change": (sum(len(b) for b in cand_boxes) - count) / max(1, count)}
    if "boxes" in labels:
        found["map50_labels"] = tasks.mean_average_precision(cand_boxes, tasks.padded_boxes(labels["boxes"]))
    return found


def _read_only(batches: Outputs) -> list[dict[str, np.ndarray]]:
    """Each batch's arrays as views that cannot be written, in lists and mappings of their own."""
    views = []
    for batch in batches:
        views.append({})
        for name, value in batch.items():
            view = np.asarray(value).view()
            view.flags.writeable = False
            views[-1][name] = view
    return views


def _stacked(labels: Labels) -> dict[str, np.ndarray]:
    return {key: np.concatenate([batch[key] for batch in labels]) for key in labels[0]}


def _inferred_layout(name: str, ref: np.ndarray) -> str:
    """Channels first (N × 4+classes × boxes) is YOLOv8's; channels last is ambiguous (objectness or not)."""
    if ref.shape[1] < ref.shape[2]:
        return "yolov8"
    raise AutoprecError(
        f"--metric detection: output {name!r} is {'×'.join(map(str, ref.shape))}, boxes first: YOLOv5 or decoded YOLOX "
        "(objectness in column 5), YOLOX's raw head (boxes still per grid cell), or a transposed YOLOv8 (no objectness)? "
        "give --det-layout yolov5, yolox or yolov8"
    )


def decision_changes(metric: Metric, metrics: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Where a plan chosen on a similarity changes more than 1 % of the model's decisions, in words."""
    if metric.name not in SIMILARITY_METRICS:
        return []
    found = []
    for name, m in metrics.items():
        for key, changed, what in (("top1", 1 - m.get("top1", 1.0), "top-1 decisions"),
                                   ("cer", m.get("cer", 0.0), "decoded characters (CER)"),
                                   ("map50", 1 - m.get("map50", 1.0), "detections (1 - mAP@0.5)"),
                                   ("nn_agreement", 1 - m.get("nn_agreement", 1.0), "nearest neighbours")):
            if changed > DECISION_CHANGE_LIMIT:
                found.append(
                    f"output {name!r}: {changed:.1%} of its {what} differ from FP32's (--metric {_task_of[key]} "
                    "constrains them)"
                )
    return found


_task_of = {"top1": "top1", "cer": "ctc-text", "map50": "detection", "nn_agreement": "embedding"}

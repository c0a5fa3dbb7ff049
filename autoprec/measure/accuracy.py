"""Accuracy against the FP32 model's own outputs, and against ground truth where the data has it.

Every output gets cosine similarity, relative L2 error, max abs error and SNR (dB); outputs whose
shape says what they decide get task metrics too: top-1 agreement (class scores, per position for
sequences), CTC text (character error rate), YOLO boxes (mAP@0.5), embeddings (nearest-neighbour
agreement). ``--metric`` names the one that constrains the search; all are recorded for every trial.
A candidate whose outputs hold NaN or Inf has infinite loss: overflow is never averaged away.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import sys
import threading
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from autoprec.core import untrusted
from autoprec.core.errors import AutoprecError, MetricError, first_line
from autoprec.core.similarity import row_cosines, similarity_sums
from autoprec.tasks import (
    DETECTION_LAYOUTS,
    LABEL_FORMS,
    TASKS,
    HeadOptions,
    Limit,
    Reading,
    Task,
    doubtful,
    task_named,
)
from autoprec.tasks.generation import NAME as GENERATION
from autoprec.tasks.labels import unscored

log = logging.getLogger("autoprec")

Outputs = Sequence[Mapping[str, np.ndarray]]
# per evaluation batch: the label arrays (see autoprec.tasks.LABEL_FORMS)
Labels = Sequence[Mapping[str, np.ndarray]]
LossFunction = Callable[[Outputs, Outputs], float]

SIMILARITY_METRICS = ("cosine", "rel_l2", "max_abs")
# The tasks a metric may name (a decoder's generation has its own judge: autoprec.measure.shaped)
TASK_METRICS = tuple(t.name for t in TASKS if t.name != GENERATION)
# the model's own default: generation for a decoder with a KV cache, else cosine (app.resolve)
AUTO = "auto"
BUILTIN_METRICS = (AUTO, *SIMILARITY_METRICS, *TASK_METRICS, GENERATION,
                   *(f"{t.name}@labels" for t in TASKS if t.labels))
# An output with this many values per item or fewer: cosine sees (almost) nothing of it.
NARROW_OUTPUT = 4
# A --metric module still importing after this many seconds is said (autoprec waits on its code).
IMPORT_NOTICE_SECONDS = 10.0
# Decisions the constraint may change before a similarity-constrained search says so.
DECISION_CHANGE_LIMIT = 0.01


@dataclass(frozen=True)
class Metric:
    """The accuracy constraint (``name``: built-in, ``TASK@labels``, or ``module:function``) and the
    task metrics computed beside it (the constraint's own, those the data's labels or a zoo entry
    call for)."""

    name: str = "cosine"
    tasks: tuple[str, ...] = ()
    options: HeadOptions = field(default_factory=HeadOptions)

    @property
    def task(self) -> str:
        """The task metric the constraint reads (``top1`` for ``top1@labels``), or the name
        itself."""
        return self.name.removesuffix("@labels")

    @property
    def against_labels(self) -> bool:
        return self.name.endswith("@labels")

    @property
    def user_function(self) -> LossFunction | None:
        return None if self.name in BUILTIN_METRICS else _import_function(self.name)

    def describe(self) -> str:
        """What decides the loss, for identities and cache keys: a change here makes other
        numbers."""
        beside = sorted(set(self.tasks) - {self.task})
        if not beside and self.options == HeadOptions():
            return self.name
        return " ".join([self.name, *beside, repr(sorted(self.options.to_json().items()))])

    @property
    def task_metrics(self) -> list[str]:
        """Every task metric computed: those beside it, and its own where it is one."""
        return sorted(set(self.tasks) | ({self.task} & set(TASK_METRICS)))


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
            raise AutoprecError(f"unknown --metric {spec!r}; use {', '.join(BUILTIN_METRICS)} or "
                                "module:function")
        metric.user_function  # noqa: B018 - imported now, so a bad module is named before anything runs
    if metric.options.layout is not None and metric.options.layout not in DETECTION_LAYOUTS:
        raise AutoprecError(f"--det-layout {metric.options.layout!r}: choose "
                            f"{' or '.join(DETECTION_LAYOUTS)}")
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
        raise AutoprecError(f"--metric {spec}: cannot import it ({exc}); check the module is on "
                            "the path") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed as it was imported (a syntax error, its own code)
        raise AutoprecError(
            f"--metric {spec}: importing {module_name} raised {type(exc).__name__}: {exc}; fix the "
            "module"
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


def narrow(arr: np.ndarray) -> bool:
    """A handful of values per item (a score, a probability, a box): cosine per item cannot see it
    change."""
    return arr.ndim == 0 or arr.size // max(1, len(arr)) <= NARROW_OUTPUT


def output_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Similarity metrics for one output over all batches (arrays stacked along the batch axis);
    what it decides is the tasks' (:class:`Judge`)."""
    # class ids, counts, masks, strings: a value is right or wrong, not near
    if reference.dtype.kind in "iubOUS":
        same = reference.reshape(len(reference), -1) == candidate.reshape(len(candidate), -1)
        return {"equal": float(same.mean()) if same.size else 1.0, "nonfinite": 0.0}
    # an output empty at this shape (a merged decoder's unused branch): nothing differs
    if not reference.size:
        same = reference.shape == candidate.shape
        return {"cosine": 1.0 if same else 0.0, "rel_l2": 0.0 if same else math.inf, "max_abs": 0.0,
                "snr_db": math.inf if same else -math.inf, "nonfinite": 0.0}
    ref = reference.reshape(len(reference), -1)
    cand = candidate.reshape(len(candidate), -1)
    sums = similarity_sums(ref, cand)
    if sums is None:
        return {"cosine": -math.inf, "rel_l2": math.inf, "max_abs": math.inf, "snr_db": -math.inf,
                "nonfinite": 1.0}
    ref_squares, _, _, noise, max_abs = sums
    signal = float(ref_squares.sum())
    metrics: dict[str, float] = {}
    metrics["cosine"] = float(row_cosines(ref, cand, sums).mean())
    metrics["rel_l2"] = math.sqrt(noise / signal) if signal > 0 else (0.0 if noise == 0 else math.inf)
    metrics["max_abs"] = max_abs
    metrics["snr_db"] = (
        10 * math.log10(signal / noise) if noise > 0 and signal > 0 else (math.inf if noise == 0 else -math.inf)
    )
    metrics["nonfinite"] = 0.0
    if narrow(reference):
        metrics["narrow"] = 1.0
    return metrics


def compare(reference: Outputs, candidate: Outputs) -> dict[str, dict[str, float]]:
    """Per output name, every label-free metric over every evaluation batch (what :class:`Judge`
    gives for the default metric)."""
    return Judge(Metric(), reference).metrics(candidate)


def loss_from_metrics(metrics: Mapping[str, Mapping[str, float]], metric: str, outputs: str = "") -> float:
    """The label-free scalar losses (lower is better, 0 = identical to FP32), averaged over the
    outputs they apply to. ``cosine`` reads the relative L2 error of narrow outputs, where cosine is
    blind."""
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
    task = task_named(metric)
    values = [m[task.key] for m in per_output if task.key in m]
    if not values:
        raise AutoprecError(f"--metric {metric}: no model output it applies to; {task.needs}"
                            + (f"; the model's outputs: {outputs}" if outputs else ""))
    return float(np.mean([task.loss(v) for v in values]))


SELF_AGREEMENT = 1e-6  # the most a metric may score FP32's outputs against themselves (rounding)


@dataclass
class Judge:
    """Scores a candidate's outputs against the FP32 reference outputs and the labels (one mapping
    per evaluation batch, or None), for any leading run of the evaluation batches (screening uses a
    quarter): the similarities of every output, and what each task reads of it
    (:mod:`autoprec.tasks`)."""

    metric: Metric
    reference: Outputs
    labels: Labels | None = None
    _fp32: dict[int, dict] = field(default_factory=dict, repr=False)
    # a user's function scored FP32 against itself
    _fp32_checked: bool = field(default=False, repr=False)

    @cached_property
    def _reading(self) -> Reading:
        """How the tasks read outputs here; it keeps FP32's decodes (text regions, a PicoDet head)
        across plans."""
        shapes = {name: tuple(np.shape(value)) for name, value in self.reference[0].items()}
        return Reading(self.metric.options, frozenset(self.metric.tasks), shapes)

    @property
    def _task(self) -> Task | None:
        """The task the constraint reads (None: a similarity or the user's function)."""
        return task_named(self.metric.task) if self.metric.user_function is None else None

    def check(self) -> dict[str, dict[str, float]]:
        """Refuse, in one line, a constraint that cannot be computed here (a head it cannot decode,
        labels missing); return the FP32 model's own label scores (empty without labels)."""
        task = self._task
        if self.metric.against_labels:
            wanted = task.labels
            if not self.labels or wanted not in self.labels[0]:
                raise AutoprecError(
                    f"--metric {self.metric.name}: the data holds no {wanted!r} array; add one to "
                    f"the .npz beside the inputs ({LABEL_FORMS[wanted]}), or use --metric "
                    f"{task.name} (agreement with FP32)")
        if task is not None and (refused := task.refused(self._reading, self.metric.name,
                                                         self.metric.against_labels)):
            raise AutoprecError(f"--metric {self.metric.name}: {refused}")
        if self.metric.against_labels:
            self._labels_score()
        # user code runs in the measuring worker only, as every candidate's
        if self.metric.user_function is None:
            self._agrees_with_itself()
        return self.fp32_scores(len(self.reference))

    def _labels_score(self) -> None:
        """The constraint's labels score FP32 on some output, to a number; else one line saying what
        of the labels is wrong (their shape, classes the output does not have, no item labelled in
        the evaluation batches)."""
        task = self._task
        key, wanted = task.label_key, task.labels
        scored = [m[key] for m in self.fp32_scores(len(self.reference)).values() if key in m]
        if not scored:
            raise AutoprecError(f"--metric {self.metric.name}: " + unscored(
                wanted, self.labels[0], self.reference[0], self.metric.options.output,
                LABEL_FORMS[wanted]))
        if all(math.isnan(v) for v in scored):
            raise AutoprecError(f"--metric {self.metric.name}: the data's {wanted!r} array labels "
                                f"no item of the {len(self.reference)} evaluation batch(es) "
                                "(negative: not labelled); label them, or use --metric "
                                f"{task.name} (agreement with FP32)")

    def doubts(self) -> list[str]:
        """Where FP32's own score against the labels says they may not be this model's (see
        :func:`autoprec.tasks.labels.doubtful`)."""
        return doubtful(self.fp32_scores(len(self.reference)), self.reference[0]) if self.labels else []

    def _agrees_with_itself(self) -> None:
        """FP32's outputs must score 0 against themselves; a metric that does not decodes something
        else (a head of another layout, the wrong output) and would judge every plan by that."""
        own = self.loss(self._own(len(self.reference)), self.reference)
        if own > SELF_AGREEMENT:
            hint = self._task.needs if self._task is not None else "check --task-output"
            raise AutoprecError(
                f"--metric {self.metric.name}: the FP32 model's outputs score loss {own:.3g} "
                "against themselves, not 0: the metric does not decode this model's outputs "
                f"({hint}); or use --metric cosine")

    def for_ranking(self) -> Judge:
        """The judge the sensitivity pass ranks units with: the constraint where it is continuous (a
        similarity, the user's function), else cosine. A task metric on a quarter of the evaluation
        set is coarse: most one-unit plans change no decision there, and a ranking of ties orders
        nothing."""
        if self.metric.name in SIMILARITY_METRICS or self.metric.user_function is not None:
            return self
        return Judge(Metric("cosine", self.metric.tasks, self.metric.options), self.reference,
                     self.labels)

    def notes(self) -> list[str]:
        """Outputs the constraint would be blind to, and what reads them instead."""
        if self.metric.name not in SIMILARITY_METRICS:
            return []
        notes = [
            f"output {name!r} holds integers ({value.dtype}): its share of the loss is the share "
            "of its values that differ from FP32's (equal)"
            for name, value in self.reference[0].items()
            if value.dtype.kind in "iub"
        ]
        if self.metric.name == "cosine":
            notes += [f"output {name!r} has {_per_item(value)} value(s) per item: cosine cannot "
                      "see it change, so its share of the loss is its relative L2 error (rel_l2)"
                      for name, value in self.reference[0].items() if narrow(value) and value.dtype.kind == "f"]
        return notes

    def said(self) -> str:
        """What the constraint's figure is, in words every verb shows it in: the metric's name, with
        what it reads instead on the outputs it is blind to (``cosine (as rel_l2 on 'y': 2 values
        per item)``)."""
        if self.metric.name not in SIMILARITY_METRICS:
            return self.metric.name
        instead = [f"share of differing values on {name!r}" for name, value in self.reference[0].items()
                   if value.dtype.kind in "iub"]
        if self.metric.name == "cosine":
            instead += [f"rel_l2 on {name!r}: {_per_item(value)} value(s) per item"
                        for name, value in self.reference[0].items() if narrow(value) and value.dtype.kind == "f"]
        return self.metric.name + (f" (as {'; '.join(instead)})" if instead else "")

    def limit_said(self, max_loss: float | None) -> str | None:
        """What ``--max-loss`` allows in decisions where the constraint counts them (12 items, top1
        at 0.01: none; 6 boxes in 2 classes, detection at 0.01: none, each costs 0.17–0.5)."""
        task = self._task
        if task is None or max_loss is None:
            return None
        count = len(self.reference)
        references = {name: np.concatenate([np.atleast_1d(r[name]) for r in self.reference])
                      for name in self.reference[0]}
        limit = Limit(self.metric.name, self.metric.against_labels, max_loss, references,
                      _stacked(self.labels) if self.labels else {}, self._own(count))
        return task.limit_said(self._reading, limit)

    def generation_metrics(self, run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
                           ) -> dict[str, dict[str, float]]:
        """What this judge measures by running the model itself (a decoder's generation: see
        :class:`autoprec.measure.shaped.ShapedJudge`), by the name it records it under; nothing
        here."""
        return {}

    @property
    def runs_the_model(self) -> bool:
        """Whether :meth:`generation_metrics` runs the model itself (then it judges a whole model,
        not only outputs)."""
        return False

    def loss_of(self, outputs: Outputs) -> float:
        """The constraint's scalar for outputs of the first ``len(outputs)`` evaluation batches."""
        return self.loss(self.metrics(outputs), outputs)

    def metrics(self, outputs: Outputs) -> dict[str, dict[str, float]]:
        """Every output's similarities and what every task that applies reads of it, over
        ``outputs`` (the first ``len(outputs)`` evaluation batches)."""
        reading, reference = self._reading, self.reference[: len(outputs)]
        labels = _stacked(self.labels[: len(outputs)]) if self.labels else {}
        metrics, refs, cands = {}, {}, {}
        for name in reference[0]:
            ref, cand = _read(reading, name, [r[name] for r in reference],
                              [c[name] for c in outputs])
            refs[name], cands[name] = ref, cand
            metrics[name] = _output_metrics(reading, name, ref, cand, labels)
        if not any(m.get("nonfinite") for m in metrics.values()):
            for task in TASKS:  # a head spread over several outputs, read at once
                for name, found in task.scored_together(reading, refs, cands, labels).items():
                    _yielded(metrics[name])
                    metrics[name].update(found)
        return metrics

    def _own(self, batches: int) -> dict[str, dict[str, float]]:
        """Every metric of the FP32 outputs against themselves on the first ``batches`` batches,
        computed once."""
        if batches not in self._fp32:
            self._fp32[batches] = self.metrics(self.reference[:batches])
        return self._fp32[batches]

    def fp32_scores(self, batches: int) -> dict[str, dict[str, float]]:
        """The FP32 model's own scores against the labels on the first ``batches`` batches."""
        scores = {n: {k: v for k, v in m.items() if k.endswith("_labels")} for n, m in self._own(batches).items()}
        return {n: m for n, m in scores.items() if m}

    def loss(self, metrics: Mapping[str, Mapping[str, float]], outputs: Outputs) -> float:
        """The constraint's scalar: lower is better, 0 = as good as FP32; unbounded for non-finite
        outputs."""
        if any(m.get("nonfinite") for m in metrics.values()):
            return math.inf
        function = self.metric.user_function
        if function is not None:
            return self._user_function_loss(function, outputs)
        if not self.metric.against_labels:
            shapes = ", ".join(f"{name} {list(np.shape(v))} {np.asarray(v).dtype}" for name, v in self.reference[0].items())
            return loss_from_metrics(metrics, self.metric.name, shapes)
        task = self._task
        key, fp32 = task.label_key, self.fp32_scores(len(outputs))
        drops = [task.label_drop(fp32[n][key], m[key]) for n, m in metrics.items() if key in m and key in fp32.get(n, {})]
        if not drops:
            raise AutoprecError(f"--metric {self.metric.name}: no output scored against the "
                                f"labels; {task.needs}")
        return float(np.mean(drops))

    def _user_function_loss(self, function: LossFunction, outputs: Outputs) -> float:
        """A ``module:function`` loss: on FP32's own outputs first (once), a finite number; on every
        plan's (their outputs finite: non-finite ones are infinite loss before it is asked), a
        number of 0 or more. Anything else is the function's fault, not one plan's: a MetricError,
        which stops the search naming it."""
        if not self._fp32_checked:
            own = self._user_loss(function, self.reference[: len(outputs)])
            if not math.isfinite(own):
                raise MetricError(f"--metric {self.metric.name}: returned {own} for the FP32 "
                                  "outputs against themselves; a loss is a finite number (0: as "
                                  "good as FP32): fix the function")
            self._fp32_checked = True
        loss = self._user_loss(function, outputs)
        if math.isnan(loss) or loss < -SELF_AGREEMENT:
            raise MetricError(f"--metric {self.metric.name}: returned {loss:.3g} for a plan; a "
                              "loss is 0 or more (0: as good as FP32, larger: worse), never NaN: "
                              "fix the function")
        return max(loss, 0.0)

    def _user_loss(self, function: LossFunction, outputs: Outputs) -> float:
        """The user's function on read-only views of the FP32 outputs and ``outputs`` (a function
        that changed them in place would change every later measurement), as a float; else a
        MetricError naming it."""
        try:
            # what it prints is not autoprec's output (--json)
            with contextlib.redirect_stdout(sys.stderr):
                value = function(_read_only(self.reference[: len(outputs)]), _read_only(outputs))
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - the user's code
            said = first_line(exc, 200, empty="")
            hint = " (the arrays it is given are read-only: copy one before changing it)" if "read-only" in said else ""
            raise MetricError(f"--metric {self.metric.name}: raised {type(exc).__name__}: {said}; "
                              f"fix the function{hint}") from None
        try:
            return float(np.asarray(value).item())
        except (TypeError, ValueError):
            raise MetricError(f"--metric {self.metric.name}: returned {type(value).__name__} "
                              f"{str(value)[:60]!r}, not one number; return a float (lower is "
                              "better, 0: as good as FP32)") from None

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


def decision_changes(metric: Metric, metrics: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Where a plan chosen on a similarity changes more than 1 % of the model's decisions, in
    words."""
    if metric.name not in SIMILARITY_METRICS:
        return []
    found = []
    for name, m in metrics.items():
        for task in TASKS:
            changed = task.changed(m)
            if changed is not None and changed > DECISION_CHANGE_LIMIT:
                found.append(f"output {name!r}: {changed:.1%} of its {task.changes[1]} differ from "
                             f"FP32's (--metric {task.name} constrains them)")
    return found


def _read(reading: Reading, name: str, refs: list, cands: list) -> tuple[np.ndarray, np.ndarray]:
    """An output's batches stacked along the batch axis, FP32's and the plan's, in the order a task
    reads them (a CTC head that keeps time first: transposed)."""
    refs, cands = [np.atleast_1d(r) for r in refs], [np.atleast_1d(c) for c in cands]
    axes = next((found for t in TASKS if (found := t.transposed(reading, name, refs[0])) is not None), None)
    if axes is not None:
        refs, cands = [a.transpose(axes) for a in refs], [a.transpose(axes) for a in cands]
    return np.concatenate(refs), np.concatenate(cands)


def _output_metrics(reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
                    labels: Mapping[str, np.ndarray]) -> dict[str, float]:
    """One output's similarities, then what each task that reads it scores (a task that claims it as
    boxes or vectors takes it from those that read any class scores)."""
    values = output_metrics(ref, cand)
    finite = not values.get("nonfinite")
    for task in TASKS:
        if task.applies(reading, name, ref):
            values.update(task.scored(reading, name, ref, cand, labels) if finite else task.when_nonfinite(name, ref))
    if any(task.claims(reading, name, ref) for task in TASKS):
        _yielded(values)
    return values


def _yielded(values: dict[str, float]) -> None:
    """``values`` without the keys of tasks that read any class scores (an argmax over boxes decides
    nothing)."""
    for task in TASKS:
        for key in task.yields:
            values.pop(key, None)


def _per_item(value: np.ndarray) -> int:
    return value.size // max(1, len(np.atleast_1d(value)))

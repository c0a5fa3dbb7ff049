"""What a verb is asked, resolved: the model (a path or zoo:NAME) and its data, the result folder,
the metric and its judge, the space the engine searches, the repeated blocks decided together."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from autoprec.analysis.baseline import Baseline
from autoprec.analysis.data import Dataset
from autoprec.analysis.decoder import find_decoder
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.preparation import cpu_runs
from autoprec.analysis.shapes import declared_inputs, output_specs
from autoprec.app.judge_specs import JudgeSpec
from autoprec.backends import Backend
from autoprec.core import untrusted
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Precision
from autoprec.core.search_space import SearchSpace, parse_precisions
from autoprec.measure.accuracy import AUTO, BUILTIN_METRICS, Judge, Metric, resolve_metric
from autoprec.measure.shaped import GENERATED_STEPS, GENERATION, judge_of
from autoprec.tasks import implied_by

log = logging.getLogger("autoprec")


def result_dir(out: str | os.PathLike | None, default_name: str) -> Path:
    """``--out``, or ``autoprec_out/<default_name>``: never the working directory or a folder above
    it (an empty ``--out``, or a model file named ``...onnx`` whose stem is ``..``, is not taken for
    one)."""
    if out is not None:
        if not str(out).strip():
            raise AutoprecError("--out '': empty; give a folder for the results, e.g. --out "
                                "results/model")
        return Path(out)
    name = "".join(c if c.isprintable() and c not in "/\\%{}" else "_" for c in default_name).strip()
    return Path("autoprec_out") / (name if name.strip(".") else "model")


def check_out_dir(out: Path) -> Path | None:
    """``out`` made where missing and checked to be writable; the topmost folder this made (None:
    ``out`` was there), which a run refused before its first trial removes again
    (:func:`remove_made`)."""
    if out.exists() and not out.is_dir():
        raise AutoprecError(f"--out {out}: a file, not a folder; give a folder for the results "
                            "(made where missing)")
    made = next((folder for folder in reversed([out, *out.parents]) if not folder.exists()), None)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".autoprec-write-test"
        os.close(untrusted.fresh_file(probe))  # (a link planted there is removed, never followed)
        probe.unlink()
    except OSError as exc:
        remove_made(made)
        raise AutoprecError(f"--out {out}: cannot write there ({exc.strerror}); choose a writable "
                            "folder") from None
    return made


def remove_made(made: Path | None) -> None:
    """The folder a refused run made for its results (and what it wrote there) removed: a refusal
    leaves no folder behind, and never touches one that was there before it."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def removed_if_refused(made: Path | None) -> Iterator[None]:
    """The body, and where it is refused (an AutoprecError), :func:`remove_made` of ``made`` before
    the refusal."""
    try:
        yield
    except AutoprecError:
        remove_made(made)
        raise


def resolve_model(
    model: str | os.PathLike, data: str | os.PathLike | None,
    shapes: Mapping[str, Sequence[int]] | None
) -> tuple[Path, str | os.PathLike | None, Mapping[str, Sequence[int]] | None, str]:
    """A model path, or ``zoo:NAME`` fetched with its own sample data and input shapes (unless
    given)."""
    if str(model).startswith("zoo:"):
        from autoprec import zoo

        fetched = zoo.fetch(str(model))
        log.info(f"zoo:{fetched.name}: {fetched.model} (licence: {fetched.notice})")
        return fetched.model, data if data is not None else fetched.data, shapes or fetched.shapes, fetched.name
    return Path(model), data, shapes, Path(model).stem


def wanted_metric(judge: JudgeSpec, model: str | os.PathLike) -> Metric:
    """The metric ``judge`` names, with the task metric a zoo ``model`` declares computed beside it
    (and its head's layout, unless --det-layout gave one); resolved (a module:function imported)
    before any work, so a bad one is named first."""
    head = judge.head
    if str(model).startswith("zoo:") and head.layout is None:
        from autoprec import zoo

        head = replace(head, layout=zoo.entry(str(model)).layout)
    return resolve_metric(judge.metric, declared_tasks(model), head)


def recorded_judge(judge: JudgeSpec, where: str | os.PathLike) -> JudgeSpec:
    """The judge a result (at ``where``) recorded, to re-measure with: a ``module:function`` there
    is code the result names, which runs only where this command names it too (--metric), never on a
    record's word."""
    if judge.metric in BUILTIN_METRICS:
        return judge
    raise AutoprecError(f"{where}: its search was judged by --metric {judge.metric}, code that is "
                        f"run only when you name it: give --metric {judge.metric} (code you trust, "
                        "from your own folder), or a built-in --metric such as cosine")


def declared_tasks(model: str | os.PathLike) -> tuple[str, ...]:
    """The task metric a zoo entry declares for its model (computed beside any --metric)."""
    if str(model).startswith("zoo:"):
        from autoprec import zoo

        task = zoo.entry(str(model)).task
        return (task,) if task else ()
    return ()


def metric_for(metric: Metric, info: ModelInfo, dataset: Dataset) -> Metric:
    """The metric as this model and data call for it: the tasks the data's labels imply (text: CTC,
    boxes: detection), and the model's own CTC dictionary (RapidOCR's ``character`` metadata) where
    ground-truth text needs one and --ctc-charset gave none."""
    outputs = [o.name for o in info.outputs]
    if metric.options.output is not None and metric.options.output not in outputs:
        raise AutoprecError(f"--task-output {metric.options.output}: the model has no such output; "
                            f"its outputs are: {', '.join(outputs)}")
    labels = dataset.labels[0] if dataset.labels else {}
    implied = implied_by(labels)
    metric = replace(metric, tasks=tuple(dict.fromkeys((*metric.tasks, *implied))))
    if metric.name == AUTO:
        # judged as a decoder (its phases ran)
        phased = any(p.name == "prefill" for p in dataset.points)
        decoder = find_decoder(declared_inputs(info.model), output_specs(info.model)) if phased else None
        metric = replace(metric, name=GENERATION if decoder is not None else "cosine")
        if decoder is not None:
            log.info("--metric generation (a decoder's default): greedy generation of "
                     f"{GENERATED_STEPS} tokens from the data's prompts against FP32's, and the "
                     "logits at every shape judged")
    if metric.options.layout == "picodet":
        metric = replace(metric, options=replace(metric.options, image=image_size(dataset)))
    if "text" in labels and metric.options.charset is None and "character" in info.metadata:
        metric = replace(
            metric,
            options=replace(metric.options, charset=tuple(info.metadata["character"].splitlines()))
        )
    return metric


def image_size(dataset: Dataset) -> tuple[int, int] | None:
    """H, W of the model's image input (N×C×H×W, C ≤ 4, or N×H×W×C) in the data; the largest where
    several."""
    sizes = [tuple(int(d) for d in (shape[2:] if shape[1] <= 4 else shape[1:3]))
             for shape in (np.shape(v) for v in dataset.evaluation[0].values()) if len(shape) == 4]
    return max(sizes, key=lambda hw: hw[0] * hw[1], default=None)


def judge_for(metric: Metric, baseline: Baseline, max_loss: float | None = None) -> tuple[Judge, dict]:
    """The judge of every candidate, checked on the FP32 outputs (a head it cannot decode, labels it
    lacks: one line, now); with what the result records of it (FP32 against the labels, notes, what
    ``max_loss`` allows where the metric counts decisions)."""
    judge = search_judge(metric, baseline)
    fp32 = judge.check()
    notes = judge.notes()
    for line in notes:
        log.info(line)
    doubts = judge.doubts()
    for line in doubts:
        log.warning(line)
    if fp32:
        log.info("FP32 against the data's labels: " + "; ".join(
            f"{name} {', '.join(f'{k} {v:.4g}' for k, v in values.items())}" for name, values in fp32.items()))
    if limit := judge.limit_said(max_loss):
        (log.warning if limit.endswith("more evaluation data") else log.info)(limit)
    tasks = {"tasks": metric.task_metrics, "options": metric.options.to_json()}
    return judge, {"metric_tasks": tasks, "fp32_on_labels": fp32, "metric_notes": [*notes, *doubts],
                   "limit_in_decisions": limit}


def search_judge(metric: Metric, baseline: Baseline) -> Judge:
    """The judge of a search's plans on its evaluation batches: at every shape the data holds, a
    decoder's generation from its prefill batches where the metric is ``generation``."""
    dataset, info = baseline.dataset, baseline.info
    decoder = find_decoder(declared_inputs(info.model), output_specs(info.model))
    prompts = [b for b, at in zip(dataset.evaluation, dataset.evaluation_at) if dataset.points[at].name == "prefill"]
    fp32 = cpu_runs(info.stored) if metric.name == GENERATION and prompts else None
    return judge_of(metric, baseline.reference, dataset.labels, dataset, dataset.evaluation_at,
                    decoder, fp32, prompts)


def engine_space(
    space: SearchSpace, engine: Backend, precisions: Sequence[str] | None
) -> tuple[SearchSpace, list[str], dict[str, str]]:
    """The space narrowed to ``precisions``, or to what ``engine`` runs faster than FP32; says what
    was left out and why."""
    if precisions is None:
        keep = [p for p in Precision if p not in engine.slow_precisions and p is not Precision.INT4]
        left_out = {p.value: why for p, why in engine.slow_precisions.items()}
        for p, why in left_out.items():
            log.info(f"{engine.name}: {p} left out of the search ({why}); include it with "
                     "--precisions int8,fp16,fp32")
        if any(Precision.INT4 in allowed for allowed in space.units.values()):
            left_out[Precision.INT4.value] = "weight-only, searched when asked for: --precisions int4,int8,fp16,fp32"
        if Precision.INT8 in keep:
            space = space.without(Precision.INT8, engine.float_int8_ops)
    else:
        keep = list(parse_precisions(list(precisions), "--precisions"))
        if set(keep) == {Precision.FP32}:
            raise AutoprecError("--precisions fp32: with FP32 alone there is no choice to search; "
                                "add int8 and/or fp16 (e.g. --precisions fp16,fp32)")
        left_out = {p.value: "not in --precisions" for p in Precision if p not in keep and p is not Precision.FP32}
        for p in keep:
            if p in engine.slow_precisions:
                log.warning(f"{engine.name}: {p} searched as asked, but "
                            f"{engine.slow_precisions[p]}")
    searched = [p.value for p in Precision if p in keep or p is Precision.FP32]
    space = space.restricted(keep).with_pinned(engine.float32_ops)
    if engine.sensitive_ops_fp32 and space.sensitive:
        left_out["sensitive ops"] = f"kept FP32: {engine.sensitive_ops_fp32}"
        # and so are neutral ops out of FP16's range: between units, this engine's FP16 has no
        # regions
        space = replace(space.with_pinned(set(space.sensitive) - set(space.units)), out_of_range=())
    return space, searched, left_out


def repeats_decided(info: ModelInfo, tie: bool) -> ModelInfo:
    """``info`` with the units of repeated patterns decided together (``tie``, said once), or each
    on its own."""
    if not tie:
        return info.untied()
    tied = len(info.searchable_units) - len(info.dimensions)
    if tied:
        patterns = sum(1 for u in info.dimensions if len(info.members(u.name)) > 1)
        log.info(f"{tied + patterns} unit(s) of {patterns} repeated pattern(s) are decided "
                 f"together: {len(info.dimensions)} dimension(s) for {len(info.searchable_units)} "
                 "searched unit(s) (--separate-repeats decides each on its own)")
    return info

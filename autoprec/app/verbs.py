"""The verbs that start from a saved plan or result: diagnose, ranges, check, export, status."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Mapping, Sequence

import optuna

from autoprec.analysis.calibrate import CALIBRATION_METHODS, ActivationRanges, calibrate
from autoprec.analysis.model import ModelInfo
from autoprec.app.prepare import (
    PlanContext,
    judge_for,
    metric_for,
    plan_context,
    prepare,
    recreate,
    resolve_model,
    result_dir,
    wanted_metric,
)
from autoprec.app.specs import EngineSpec, InputSpec, JudgeSpec
from autoprec.backends import get_backend
from autoprec.core import atomic, stored
from autoprec.core.errors import AutoprecError, StudyError
from autoprec.core.search_space import load_search_space
from autoprec.core.stored import StoredModel
from autoprec.export.tensorrt import BuildSpec
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.deployment import CHECKED_BATCHES, Lower, deploy
from autoprec.measure.measurement import measure
from autoprec.results.files import (
    json_safe,
    read_result_dir,
)
from autoprec.study.coordination import (
    StudyLocks,
    check_storage,
    redacted,
    without_password,
)

log = logging.getLogger("autoprec")


def diagnose_plan(
    target: str | os.PathLike,
    plan: str | os.PathLike | None = None,
    trial: int | None = None,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    engine: EngineSpec | None = None,
    batches: int = 4,
    out: str | os.PathLike | None = None,
) -> tuple[list, Path]:
    """Layer-wise error of a plan; writes diagnosis.json and error_by_layer.png (see autoprec.measure.diagnosis)."""
    from autoprec.measure.diagnosis import diagnose
    from autoprec.results.plots import plot_errors

    context = plan_context(target, plan, trial, data, shapes)
    prepared, found, model_path = context.prepared, context.plan, context.prepared.info.path
    engine = _engine(engine or context.config.engine)
    rows = diagnose(prepared.info, engine, prepared.ranges, found, list(prepared.dataset.evaluation)[:batches])
    out_dir = Path(target) if out is None and Path(target).is_dir() else result_dir(out, model_path.stem)
    label = f"trial {trial}" if trial is not None else "plan"
    atomic.write_json(out_dir / "diagnosis.json", json_safe({
        "model": str(model_path), "engine": engine.info().to_json(), "plan": found.to_json(),
        "batches": min(batches, len(prepared.dataset.evaluation)), "units": [r.to_json() for r in rows],
    }))
    counts = found.counts()
    title = f"{model_path.name} · {label} ({counts['int8']} int8 / {counts['fp16']} fp16) · {engine.info().label()}"
    plot_errors(rows, title, out_dir / "error_by_layer.png")
    return rows, out_dir


def activation_report(inputs: InputSpec, entropy: bool = False) -> list[dict]:
    """Per-tensor activation statistics from calibration (see autoprec.measure.diagnosis.activation_ranges):
    of a model, or of a result directory's search as it calibrated (its model, data, shapes, normalisation)."""
    from autoprec.measure.diagnosis import FAST_METHODS, activation_ranges

    methods = CALIBRATION_METHODS if entropy else FAST_METHODS
    if Path(inputs.model).is_dir():
        info, ranges = _searched_ranges(inputs)
        return activation_ranges(info, ranges, methods)
    model_path, data, shapes, _ = resolve_model(inputs.model, inputs.data, inputs.shapes)
    prepared = prepare(model_path, load_search_space(), data, shapes, 0, inputs.image_mean, inputs.image_std,
                       constants=inputs.constants)
    return activation_ranges(prepared.info, prepared.ranges, methods)


def _searched_ranges(inputs: InputSpec) -> tuple[ModelInfo, ActivationRanges]:
    """A result's model and calibration ranges as its search had them (calibrated on its data where it searched
    no INT8); only --data (evaluation data) and --shape (checked against the search's) may be given."""
    default = InputSpec(inputs.model)
    given = [name for name in ("min_shapes", "max_shapes", "constants", "image_mean", "image_std")
             if (getattr(inputs, name) or None) != (getattr(default, name) or None)]
    if given:
        raise AutoprecError(f"{inputs.model}: a result's ranges come from its search's own inputs ({', '.join(given)} "
                            "given); give only --data or --shape with it, or the model itself with any input options")
    result = read_result_dir(inputs.model)
    prepared = recreate(result, inputs.data, inputs.shapes)
    ranges = prepared.ranges or calibrate(prepared.info, prepared.dataset.calibration, prepared.dataset.fingerprint(),
                                          result.out_dir / "cache")
    return prepared.info, ranges


def check_plan(
    target: str | os.PathLike,
    plan: str | os.PathLike | None = None,
    *,
    judge: JudgeSpec | None = None,
    engine: EngineSpec | None = None,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    latency_budget_ms: float | None = None,
) -> dict:
    """Re-measure a saved plan; ``passed`` is False when accuracy or latency regress past the limits. The
    judge and engine default to those the search recorded (a bare plan: cosine on ort-cpu)."""
    if judge is not None:
        judge.checked()  # a limit given is refused before the plan's analysis is re-created
    if plan is None and Path(target).is_dir():  # the chosen plan: what ships is the file best/ holds
        read_result_dir(target).check_shipped()
    context = plan_context(target, plan, None, data, shapes)
    judge, engine_spec = judge or context.config.judge, engine or context.config.engine
    if judge.max_loss is None:
        raise AutoprecError(f"check {target}: no loss limit; give --max-loss (the search had none)")
    max_loss = judge.max_loss
    prepared, found, model_path = context.prepared, context.plan, context.prepared.info.path
    wanted = wanted_metric(judge, context.config.inputs.model)
    engine = _engine(engine_spec)
    metric = metric_for(wanted, prepared.info, prepared.dataset)
    judge_of, _ = judge_for(metric, prepared)
    result = measure(engine, engine.lower(prepared.info, found, prepared.ranges), prepared.dataset.evaluation, judge_of)
    failures = []
    if not result.loss <= max_loss:
        failures.append(f"accuracy loss {result.loss:.4g} > --max-loss {max_loss:g}")
    if latency_budget_ms is not None and result.latency.median_ms > latency_budget_ms:
        failures.append(f"latency {result.latency.median_ms:.4g} ms > --latency-budget {latency_budget_ms:g} ms")
    return {
        "passed": not failures, "failures": failures, "model": str(model_path), "engine": engine.info().to_json(),
        "metric": metric.name, "max_loss": max_loss, "latency_budget_ms": latency_budget_ms,
        "measurement": result.to_json(), "plan": found.to_json(),
    }


def _engine(spec: EngineSpec):
    return get_backend(spec.backend, spec.device, None, spec.threads)


def lowered_for_export(result_dir: str | os.PathLike,
                       trial: int | None = None) -> tuple[StoredModel, str, str, int]:
    """The measured model of a result's chosen plan (best/model.onnx) or of --trial N (lowered again), with
    the note that says which, the model's stem and the trial's number."""
    result = read_result_dir(result_dir)
    stem, engine = result.model_path.stem, result.engine
    if trial is None:
        if result.best_plan is None:
            raise AutoprecError(f"{result_dir}: no chosen plan to export; pass --trial N")
        number = result.best_plan[1]
        note = f"autoprec: trial {number} (chosen), measured on {engine.engine} {engine.provider}"
        return stored.load(result.shipped_model()), note, stem, number
    context = plan_context(result_dir, trial=trial)
    form = QDQForm(engine.qdq_form)
    model, _ = deployed(context, lambda graph: lower_plan(graph, context.plan, context.prepared.ranges, form))
    return model, f"autoprec: trial {trial}, measured on {engine.engine} {engine.provider}", stem, trial


def deployed(context: PlanContext, lower: Lower) -> tuple[StoredModel, ModelInfo]:
    """A result's plan as exports ship it (see :func:`autoprec.measure.deployment.deploy`), and the model
    information of the graph it was lowered onto."""
    info = context.prepared.info
    deployment = deploy(info, lower, None, context.prepared.dataset.evaluation[:CHECKED_BATCHES])
    if deployment.fixed_because:
        log.warning(f"the export has the measured, fixed input shapes: {deployment.fixed_because}")
        return deployment.model, info
    for check in deployment.checks:
        if not check.passed:
            log.warning(f"at the profile's {check.point} shape: "
                        f"{check.error or 'the exported model gives outputs of other shapes than the given model'}")
    return deployment.model, info.for_deployment()


def tensorrt_build_spec(result_dir: str | os.PathLike, trial: int | None = None) -> BuildSpec:
    """A result's chosen plan (or --trial N) with what a TensorRT build of it needs: the plan in
    TensorRT's Q/DQ form, its units, calibrated ranges, and the measured figures."""
    from autoprec.backends.tensorrt import (
        stamp_plan,  # the TensorRT backend module only where TensorRT is meant
    )

    result = read_result_dir(result_dir)
    context = plan_context(result_dir, trial=trial)
    prepared, plan, model_path = context.prepared, context.plan, context.prepared.info.path
    model, info = deployed(context, lambda graph: stamp_plan(lower_plan(graph, plan, prepared.ranges, QDQForm.TENSORRT),
                                                             graph, plan))
    return BuildSpec(
        name=model_path.stem,
        original_model=model_path,
        model=model,
        plan=plan,
        info=info,
        ranges=prepared.ranges,
        trial=result.shown_trial(context.trial),
        fp32_trial=result.uniform_trial("fp32"),
        engine=result.engine,
        metric=context.config.judge.metric,
        max_loss=context.config.judge.max_loss,
        drift=result.facts.drift_said,
        versus=result.versus if context.trial == result.chosen_number else None,
        samples=tuple(prepared.dataset.evaluation[:CHECKED_BATCHES]),
    )


def study_status(storage: str, study_name: str) -> dict:
    """A (shared) study as its storage holds it (see :func:`autoprec.study.status.study_status`). Reads
    only: a missing SQLite file is refused, not created."""
    from autoprec.study.status import study_status as status_of

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_storage(storage, existing=True)
    locks = StudyLocks(storage, study_name)
    try:
        # not while a worker creates the schema; a study no worker ever locked has none being made
        with locks.hold("identity") if locks.ever_held else contextlib.nullcontext():
            study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise StudyError(
            f"no study {study_name!r} in {redacted(storage)}; see the --study-name a search printed"
        ) from None
    except AutoprecError:
        raise
    except Exception as exc:  # SQLAlchemy and Optuna raise many types for a bad URL
        first = without_password((str(exc).strip().splitlines() or [""])[0], storage)
        raise StudyError(f"--storage {redacted(storage)}: cannot be opened ({type(exc).__name__}: {first})") from None
    return status_of(study)


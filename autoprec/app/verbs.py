"""The verbs that start from a saved plan or result: diagnose, ranges, check, export, status."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import optuna

from autoprec.analysis.baseline import Baseline, load_baseline
from autoprec.analysis.calibrate import (
    CALIBRATION_METHODS,
    ActivationRanges,
    calibrate,
    every_node_tensors,
)
from autoprec.analysis.model_info import ModelInfo
from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.recorded import PlanContext, plan_context, recreate
from autoprec.app.resolve import (
    judge_for,
    metric_for,
    recorded_judge,
    resolve_model,
    result_dir,
    wanted_metric,
)
from autoprec.app.specs import EngineSpec, InputSpec, ProfileSpec
from autoprec.backends import backend_class, get_backend
from autoprec.core import atomic, stored
from autoprec.core.errors import AutoprecError, StudyError, first_line
from autoprec.core.profile import ShapeProfile
from autoprec.core.search_space import load_search_space
from autoprec.core.stored import StoredModel
from autoprec.export.tensorrt import BuildSpec
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.deployment import CHECKED_BATCHES, Lower, deploy, judged_runs, widened_runs
from autoprec.measure.measurement import accuracy_by_shape, measure, screening_batches
from autoprec.measure.shaped import GENERATION
from autoprec.record.facts import PointCheck
from autoprec.record.per_unit import ActivationRow, UnitError
from autoprec.record.verdict import CheckResult
from autoprec.results.files import (
    json_safe,
    read_result_dir,
)
from autoprec.study.coordination import (
    StudyLocks,
    check_storage,
    redacted,
    storage_hint,
    without_password,
)

log = logging.getLogger("autoprec")


@dataclass(frozen=True)
class Diagnosis:
    """What ``diagnose`` found: per unit (see :class:`autoprec.measure.diagnosis.UnitError`), each
    one's ``alone_loss`` by the judge the search's sensitivity pass ranks with (``alone_said``: its
    metric, in words); the plan's own loss by the search's metric on every evaluation batch
    (``loss_said``), and the figure the search recorded for it where this is the same judging (None
    otherwise)."""

    rows: list[UnitError]
    out_dir: Path
    named: str  # which plan
    batches: int  # evaluation batches the units were diagnosed on
    alone_said: str
    loss: float
    loss_said: str
    evaluation_batches: int
    recorded_loss: float | None
    # the judged shape the units were diagnosed at (the plan's worst); None: the data's one
    shape: str | None = None


def diagnose_plan(
    target: str | os.PathLike,
    plan: str | os.PathLike | None = None,
    trial: int | None = None,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    engine: EngineSpec | None = None,
    batches: int | None = None,
    out: str | os.PathLike | None = None,
    judge: JudgeSpec | None = None,
) -> Diagnosis:
    """Layer-wise error of a plan; writes diagnosis.json and error_by_layer.png (see
    autoprec.measure.diagnosis). The model's loss with one unit reduced is judged as the search's
    sensitivity pass judges it, on as many evaluation batches (``batches``, default a quarter of
    them), so a unit's figure is the one sensitivity.json holds; the plan's own loss by the search's
    metric on them all, the figure the search recorded."""
    from autoprec.measure.diagnosis import diagnose
    from autoprec.results.plots import plot_errors

    context = plan_context(target, plan, trial, data, shapes)
    baseline, found, model_path = context.baseline, context.plan, context.baseline.info.path
    engine_spec = engine or context.config.engine
    engine_ = _engine(engine_spec)
    judging = judge or recorded_judge(context.config.judge, target)
    wanted = wanted_metric(judging, context.config.inputs.model)
    judge_of, _ = judge_for(metric_for(wanted, baseline.info, baseline.dataset), baseline)
    ranking = judge_of.for_ranking()
    evaluation = list(baseline.dataset.evaluation)
    loss, losses = accuracy_by_shape(engine_, engine_.lower(baseline.info, found, baseline.ranges),
                                     evaluation,
                                     judge_of)
    # where the plan is worst
    shape = max((p for p in losses if p != GENERATION), key=losses.get, default=None)
    if shape is not None:  # the units at that shape alone, on its own batches
        ranking, at = ranking.at_point(shape)
        evaluation = [evaluation[i] for i in at]
    used = evaluation[:batches or screening_batches(len(evaluation))]
    rows = diagnose(baseline.info, engine_, baseline.ranges, found, used, ranking.loss_of)
    out_dir = Path(target) if out is None and Path(target).is_dir() else result_dir(out, model_path.stem)
    same = context.same_judging(judging, engine_spec, data)
    diagnosis = Diagnosis(rows, out_dir, context.named, len(used), ranking.said(), loss,
                          judge_of.said(),
                          len(baseline.dataset.evaluation), context.recorded_loss if same else None,
                          shape)
    atomic.write_json(out_dir / "diagnosis.json", json_safe({
        "model": str(model_path), "engine": engine_.info().to_json(), "plan": found.to_json(),
        "named": context.named,
        "batches": diagnosis.batches, "alone_loss": diagnosis.alone_said,
        "units": [r.to_json() for r in rows],
        "shape": diagnosis.shape, "loss": {"value": loss, "metric": diagnosis.loss_said,
                                           "batches": diagnosis.evaluation_batches,
                                           "recorded": diagnosis.recorded_loss},
    }))
    counts = found.counts()
    label = f"trial {context.trial}" if context.trial is not None else "plan"
    title = f"{model_path.name} · {label} ({counts['int8']} int8 / {counts['fp16']} fp16) · {engine_.info().label()}"
    plot_errors(rows, title, out_dir / "error_by_layer.png", f"model loss ({diagnosis.alone_said})")
    return diagnosis


def activation_report(inputs: InputSpec, entropy: bool = False) -> list[ActivationRow]:
    """Per-tensor activation statistics from calibration (see
    autoprec.measure.diagnosis.activation_ranges): of a model, or of a result directory's search as
    it calibrated (its model, data, shapes, normalisation)."""
    from autoprec.measure.diagnosis import FAST_METHODS, activation_ranges

    methods = CALIBRATION_METHODS if entropy else FAST_METHODS
    if Path(inputs.model).is_dir():
        info, ranges = _searched_ranges(inputs)
        return activation_ranges(info, ranges, methods)
    model_path, data, shapes, _ = resolve_model(inputs.model, inputs.data, inputs.shapes)
    baseline = load_baseline(model_path, load_search_space(), data, shapes, 0, inputs.image,
                             constants=inputs.constants)
    return activation_ranges(baseline.info, baseline.ranges, methods)


def _searched_ranges(inputs: InputSpec) -> tuple[ModelInfo, ActivationRanges]:
    """A result's model and calibration ranges as its search had them (calibrated on its data where
    it searched no INT8); only --data (evaluation data) and --shape (checked against the search's)
    may be given."""
    default = InputSpec(inputs.model)
    given = [name for name in ("min_shapes", "max_shapes", "constants", "image_mean", "image_std",
                               "image_order",
                               "image_scale", "image_resize")
             if (getattr(inputs, name) or None) != (getattr(default, name) or None)]
    if given:
        raise AutoprecError(f"{inputs.model}: a result's ranges come from its search's own inputs "
                            f"({', '.join(given)} given); give only --data or --shape with it, or "
                            "the model itself with any input options")
    result = read_result_dir(inputs.model)
    baseline = recreate(result, inputs.data, inputs.shapes)
    ranges = baseline.ranges or calibrate(baseline.info, baseline.dataset.calibration,
                                          baseline.dataset.fingerprint(),
                                          result.out_dir / "cache")
    return baseline.info, ranges


def check_plan(
    target: str | os.PathLike,
    plan: str | os.PathLike | None = None,
    *,
    judge: JudgeSpec | None = None,
    engine: EngineSpec | None = None,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    latency_budget_ms: float | None = None,
) -> CheckResult:
    """Re-measure a saved plan; ``passed`` is False when accuracy or latency regress past the
    limits. The judge and engine default to those the search recorded (a bare plan: cosine on
    ort-cpu)."""
    if judge is not None:
        judge.checked()  # a limit given is refused before the plan's analysis is re-created
    shipped = None
    # the chosen plan: what ships is the file best/ holds
    if plan is None and Path(target).is_dir():
        result_files = read_result_dir(target)
        result_files.check_shipped()
        shipped = result_files.shipped_model()
    context = plan_context(target, plan, None, data, shapes)
    judge = judge or recorded_judge(context.config.judge, target)
    engine_spec = engine or context.config.engine
    if judge.max_loss is None:
        raise AutoprecError(f"check {target}: no loss limit; give --max-loss (the search had none)")
    max_loss = judge.max_loss
    baseline, found, model_path = context.baseline, context.plan, context.baseline.info.path
    wanted = wanted_metric(judge, context.config.inputs.model)
    engine = _engine(engine_spec)
    metric = metric_for(wanted, baseline.info, baseline.dataset)
    judge_of, _ = judge_for(metric, baseline)
    # best/model.onnx itself where the search's engine checks it (what ships is what is measured: a
    # best/ replaced with its recorded sha256 edited alike passes no check); on another engine, the
    # plan lowered for that one
    same_engine = shipped is not None and engine_spec.backend == context.config.engine.backend
    model = stored.load(shipped) if same_engine else engine.lower(baseline.info, found, baseline.ranges)
    result = measure(engine, model, baseline.dataset.evaluation, judge_of,
                     work=baseline.dataset.workload)
    failures = []
    if not result.loss <= max_loss:
        failures.append(f"accuracy loss {result.loss:.4g} > --max-loss {max_loss:g}")
    if latency_budget_ms is not None and result.latency.median_ms > latency_budget_ms:
        failures.append(f"latency {result.latency.median_ms:.4g} ms > --latency-budget "
                        f"{latency_budget_ms:g} ms")
    return CheckResult(
        tuple(failures), context.named, context.trial, str(model_path), engine.info(), metric.name,
        judge_of.said(),
        max_loss, latency_budget_ms,
        context.recorded_loss if context.same_judging(judge, engine_spec, data) else None,
        result, found)


def _engine(spec: EngineSpec):
    return get_backend(spec.backend, spec.device, None, spec.threads)


@dataclass(frozen=True)
class ForExport:
    """A result's plan as an export ships it: the model, the note that says which plan it is, the
    model's stem and the trial's number, the deployment profile it is written for and its checks
    against the given model there (:class:`autoprec.measure.deployment.PointCheck`; none where best/
    recorded none)."""

    model: StoredModel
    note: str
    stem: str
    trial: int
    profile: ShapeProfile
    checks: tuple[PointCheck, ...]


def lowered_for_export(result_dir: str | os.PathLike, trial: int | None = None,
                       profile: ProfileSpec | None = None) -> ForExport:
    """The measured model of a result's chosen plan (best/model.onnx, with the checks best/
    recorded) or of --trial N, or of either on a widened profile (``profile``: lowered again and
    checked at its points)."""
    result = read_result_dir(result_dir)
    stem, engine = result.model_path.stem, result.engine
    if trial is None and result.best_plan is None:
        raise AutoprecError(f"{result_dir}: no chosen plan to export; pass --trial N")
    if trial is None and not (profile and profile.widens):
        number = result.best_plan[1]
        note = f"autoprec: trial {number} (chosen), measured on {engine.engine} {engine.provider}"
        checks = result.shipped_as.checks if result.shipped_as else ()
        return ForExport(stored.load(result.shipped_model()), note, stem, number, result.profile,
                         checks)
    context = plan_context(result_dir, trial=trial, profile=profile)
    # the measuring engine's own forms (ort-cuda: TensorRT's Q/DQ but MatMulNBits)
    forms = QDQForm(engine.qdq_form), backend_class(engine.backend).int4_form
    model, info, checks = deployed(context,
                                   lambda graph: lower_plan(graph, context.plan,
                                                            context.baseline.ranges, *forms))
    chosen = " (chosen)" if context.trial == result.chosen_number else ""
    return ForExport(model, f"autoprec: trial {context.trial}{chosen}, measured on {engine.engine} "
                            f"{engine.provider}",
                     stem, context.trial, info.shape_profile, checks)


def deployed(context: PlanContext, lower: Lower) -> tuple[StoredModel, ModelInfo,
                                                          tuple[PointCheck, ...]]:
    """A result's plan as exports ship it (see :func:`autoprec.measure.deployment.deploy`), the
    model information of the graph it was lowered onto, and its checks against the given model at
    each point of the profile."""
    info = context.baseline.info
    dataset = context.baseline.dataset
    judged = judged_runs(dataset)
    samples = dataset.main_evaluation[:CHECKED_BATCHES]
    deployment = deploy(info, lower, None, samples, (),
                        [*judged, *widened_runs(info.shape_profile, samples, judged)] if judged else ())
    if deployment.fixed_because:
        log.warning(f"the export has the measured, fixed input shapes: {deployment.fixed_because}")
        return deployment.model, info, deployment.checks
    for check in deployment.checks:
        if not check.passed:
            log.warning(f"at the profile's {check.point} shape: "
                        f"{check.error or 'the exported model gives outputs of other shapes than the given model'}")
    return deployment.model, info.for_deployment(), deployment.checks


def tensorrt_build_spec(result_dir: str | os.PathLike, trial: int | None = None,
                        profile: ProfileSpec | None = None, every_node: bool = False) -> BuildSpec:
    """A result's chosen plan (or --trial N) with what a TensorRT build of it needs: the plan in
    TensorRT's Q/DQ form, its units, calibrated ranges (``every_node``: of every node's output in a
    unit too, for TensorRT 10's calibration cache), the measured figures, and the deployment profile
    (``profile``: the search's widened) with the plan's checks against the given model across it."""
    from autoprec.backends.tensorrt import (
        stamp_plan,  # the TensorRT backend module only where TensorRT is meant
    )

    result = read_result_dir(result_dir)
    context = plan_context(result_dir, trial=trial, profile=profile)
    baseline, plan, model_path = context.baseline, context.plan, context.baseline.info.path
    model, info, checks = deployed(context, lambda graph: stamp_plan(
        lower_plan(graph, plan, baseline.ranges, QDQForm.TENSORRT), graph, plan))
    steadiness = result.versus.steadiness
    ranges = baseline.ranges
    if every_node and ranges is not None:
        ranges = _every_node_ranges(baseline, Path(result_dir) / "cache")
    return BuildSpec(
        name=model_path.stem,
        original_model=model_path,
        model=model,
        plan=plan,
        info=info,
        ranges=ranges,
        trial=result.shown_trial(context.trial),
        fp32_trial=result.uniform_trial("fp32"),
        engine=result.engine,
        metric=context.config.judge.metric,
        max_loss=context.config.judge.max_loss,
        drift="; ".join(filter(None,
                               [result.facts.drift_said, steadiness.said() if steadiness else None])) or None,
        versus=result.versus if context.trial == result.chosen_number else None,
        samples=tuple(baseline.dataset.main_evaluation[:CHECKED_BATCHES]),
        checks=checks,
    )


def _every_node_ranges(baseline: Baseline, cache: Path) -> ActivationRanges:
    """The search's ranges, and those of every other node output in a unit, calibrated now on the
    search's calibration batches (the search histograms only the tensors its lowerings quantize)."""
    dataset, searched = baseline.dataset, baseline.ranges.tensors
    missing = [t for t in every_node_tensors(baseline.info) if t not in searched]
    if not missing:
        return baseline.ranges
    more = calibrate(baseline.info, dataset.calibration, dataset.fingerprint(), cache, missing)
    return ActivationRanges({**more.tensors, **searched})


def study_status(storage: str, study_name: str) -> dict:
    """A (shared) study as its storage holds it (see :func:`autoprec.study.status.study_status`).
    Reads only: a missing SQLite file is refused, not created."""
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
        first = without_password(first_line(exc, None, empty=""), storage)
        said = f"{type(exc).__name__}: {first}"
        said = f"cannot be opened ({said}); {storage_hint(first)}"
        raise StudyError(f"--storage {redacted(storage)}: {said}") from None
    return status_of(study)


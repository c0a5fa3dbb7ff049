"""What a verb starts from: the model and data analysed, calibrated and referenced once, or a result re-created
as it was searched."""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from autoprec.analysis.calibrate import (
    CALIBRATION_METHODS,
    FP16_SAFE_MAX,
    ActivationRanges,
    calibrate,
    calibration_cache,
    out_of_range_nodes,
)
from autoprec.analysis.data import (
    Dataset,
    RandomDataWarning,
    build_dataset,
    item_shapes,
    scalar_values,
)
from autoprec.analysis.footprint import check_fits
from autoprec.analysis.images import ImageOptions
from autoprec.analysis.model import ModelInfo, analyse, declared_inputs, load_onnx, model_sha256
from autoprec.analysis.reference import reference_cache, reference_outputs, units_run
from autoprec.app.config import SearchConfig
from autoprec.app.specs import EngineSpec, InputSpec, JudgeSpec, ProfileSpec
from autoprec.backends import Backend
from autoprec.core.errors import AutoprecError, ModelError
from autoprec.core.plan import Plan, Precision
from autoprec.core.search_space import SearchSpace, load_search_space, parse_precisions
from autoprec.measure.accuracy import Judge, Metric, resolve_metric
from autoprec.results.files import (
    HowMeasured,
    ResultFiles,
    load_json,
    read_plan_file,
    read_result_dir,
)

log = logging.getLogger("autoprec")


def result_dir(out: str | os.PathLike | None, default_name: str) -> Path:
    """``--out``, or ``autoprec_out/<default_name>``: never the working directory or a folder above it
    (an empty ``--out``, or a model file named ``...onnx`` whose stem is ``..``, is not taken for one)."""
    if out is not None:
        if not str(out).strip():
            raise AutoprecError("--out '': empty; give a folder for the results, e.g. --out results/model")
        return Path(out)
    name = "".join(c if c.isprintable() and c not in "/\\%{}" else "_" for c in default_name).strip()
    return Path("autoprec_out") / (name if name.strip(".") else "model")


def check_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".autoprec-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise AutoprecError(f"--out {out}: cannot write there ({exc.strerror}); choose a writable folder") from None


def resolve_model(
    model: str | os.PathLike, data: str | os.PathLike | None, shapes: Mapping[str, Sequence[int]] | None
) -> tuple[Path, str | os.PathLike | None, Mapping[str, Sequence[int]] | None, str]:
    """A model path, or ``zoo:NAME`` fetched with its own sample data and input shapes (unless given)."""
    if str(model).startswith("zoo:"):
        from autoprec import zoo

        fetched = zoo.fetch(str(model))
        log.info(f"zoo:{fetched.name}: {fetched.model} (licence: {fetched.notice})")
        return fetched.model, data if data is not None else fetched.data, shapes or fetched.shapes, fetched.name
    return Path(model), data, shapes, Path(model).stem


def wanted_metric(judge: JudgeSpec, model: str | os.PathLike) -> Metric:
    """The metric ``judge`` names, with the task metric a zoo ``model`` declares computed beside it (and its
    head's layout, unless --det-layout gave one); resolved (a module:function imported) before any work, so a
    bad one is named first."""
    head = judge.head
    if str(model).startswith("zoo:") and head.layout is None:
        from autoprec import zoo

        head = replace(head, layout=zoo.entry(str(model)).layout)
    return resolve_metric(judge.metric, declared_tasks(model), head)


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
        raise AutoprecError(f"--task-output {metric.options.output}: the model has no such output; its outputs are: "
                            f"{', '.join(outputs)}")
    labels = dataset.labels[0] if dataset.labels else {}
    implied = [task for key, task in (("text", "ctc-text"), ("boxes", "detection"), ("masks", "segmentation"))
               if key in labels]
    metric = replace(metric, tasks=tuple(dict.fromkeys((*metric.tasks, *implied))))
    if metric.options.layout == "picodet":
        metric = replace(metric, options=replace(metric.options, image=image_size(dataset)))
    if "text" in labels and metric.options.charset is None and "character" in info.metadata:
        metric = replace(
            metric, options=replace(metric.options, charset=tuple(info.metadata["character"].splitlines()))
        )
    return metric


def image_size(dataset: Dataset) -> tuple[int, int] | None:
    """H, W of the model's image input (N×C×H×W, C ≤ 4, or N×H×W×C) in the data; the largest where several."""
    sizes = [tuple(int(d) for d in (shape[2:] if shape[1] <= 4 else shape[1:3]))
             for shape in (np.shape(v) for v in dataset.evaluation[0].values()) if len(shape) == 4]
    return max(sizes, key=lambda hw: hw[0] * hw[1], default=None)


def judge_for(metric: Metric, prepared: Prepared, max_loss: float | None = None) -> tuple[Judge, dict]:
    """The judge of every candidate, checked on the FP32 outputs (a head it cannot decode, labels it
    lacks: one line, now); with what the result records of it (FP32 against the labels, notes, what
    ``max_loss`` allows where the metric counts decisions)."""
    judge = Judge(metric, prepared.reference, prepared.dataset.labels)
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
    return judge, {"metric_tasks": metric.to_json(), "fp32_on_labels": fp32, "metric_notes": [*notes, *doubts],
                   "limit_in_decisions": limit}


@dataclass(frozen=True)
class Prepared:
    """What every trial of a search shares: computed once (and cached on disk when a cache is given)."""

    info: ModelInfo
    dataset: Dataset
    ranges: ActivationRanges | None  # None when no unit may take INT8
    reference: list[dict]
    seconds: dict[str, float]


def load_inputs(
    model_path: Path,
    space: SearchSpace,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    image: ImageOptions = ImageOptions(),
    constants: Mapping[str, float] | None = None,
    out_of_range: Sequence[str] | None = None,
    cache: Path | None = None,
    raw: onnx.ModelProto | None = None,
    bounds: tuple[Mapping[str, Sequence[int]], Mapping[str, Sequence[int]]] | None = None,
) -> tuple[ModelInfo, Dataset, dict[str, float]]:
    """Analyse the model (``raw``: its graph, if the caller loaded it; ``bounds``: its deployment profile's
    min and max shapes, ``--shape`` its opt), load and split the data (the seconds each took). Where FP16 is
    searched, neutral ops out of FP16's range on the calibration data become units
    (``out_of_range``: the ones a search recorded, instead of measuring them again; else measured once per
    model and data and kept in ``cache``)."""
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    raw = raw if raw is not None else load_onnx(model_path)
    given = {k: tuple(v) for k, v in (shapes or {}).items()}
    fed = [i for i in declared_inputs(raw) if i.name not in (constants or {})]  # --const inputs need no data
    low, high = bounds or ({}, {})
    info = analyse(model_path, space, given, item_shapes(data, fed) if data is not None else None, model=raw,
                   constants={**scalar_values(data, fed), **(constants or {})}, cache=cache,
                   min_shapes={k: tuple(v) for k, v in low.items()}, max_shapes={k: tuple(v) for k, v in high.items()})
    seconds["analyse"] = time.monotonic() - t0
    check_fits(info.shape_profile, {i.name: np.dtype(i.dtype).itemsize for i in info.inputs}, info.model,
               info.stored.weight_bytes())
    for line in info.notes:
        log.info(line)
    log.info(
        f"{model_path.name}: {len(info.units)} precision units ({len(info.searchable_units)} searched), "
        f"inputs {', '.join(f'{i.name} {list(i.shape)}' for i in info.inputs)}"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RandomDataWarning)
        dataset = build_dataset(
            data, info.inputs, seed=seed, image=image, constants=constants
        )
    for w in caught:
        log.warning(str(w.message))
    log.info(
        f"data: {dataset.source} — {len(dataset.calibration)} calibration / {len(dataset.evaluation)} evaluation batch(es)"
    )
    if Precision.FP16 in space.out_of_range:
        t0 = time.monotonic()
        found = (out_of_range_nodes(info, dataset.calibration, dataset.fingerprint(), cache) if out_of_range is None
                 else list(out_of_range))
        if found:
            info = info.with_out_of_range(space, found, (
                f"{len(found)} precision-neutral op(s) reach {FP16_SAFE_MAX:g} or more on the calibration data "
                f"(e.g. {found[0]}): units of their own, FP32 unless the search finds FP16 harmless there"))
            log.info(info.notes[-1])
        seconds["analyse"] += time.monotonic() - t0
    return info, dataset, seconds


def shared_files(info: ModelInfo, dataset: Dataset, cache: Path) -> list[Path]:
    """The files :func:`prepare_reference` leaves in ``cache``: what workers of one study share."""
    fingerprint = dataset.fingerprint()
    calibration = [calibration_cache(info, fingerprint, cache)] if needs_calibration(info) else []
    return [*calibration, reference_cache(info, fingerprint, cache)]


def needs_calibration(info: ModelInfo) -> bool:
    return any(Precision.INT8 in u.allowed for u in info.searchable_units)


def prepare_reference(
    info: ModelInfo, dataset: Dataset, seconds: dict[str, float], cache: Path | None = None
) -> Prepared:
    """Compute the FP32 reference and calibrate (when a unit may take INT8); read from ``cache`` when there."""
    seconds = dict(seconds)
    fingerprint = dataset.fingerprint()
    t0 = time.monotonic()
    reference = reference_outputs(info, dataset.evaluation, fingerprint, cache)
    seconds["reference"] = time.monotonic() - t0
    _check_finite(info, reference)
    t0 = time.monotonic()
    info = pin_idle(info, dataset)
    ranges = calibrate(info, dataset.calibration, fingerprint, cache) if needs_calibration(info) else None
    seconds["calibrate"] = time.monotonic() - t0
    info = ranged(info, ranges)
    where = f"; cached in {cache}" if cache else ""
    ready = (
        "calibration ranges and FP32 reference"
        if ranges is not None
        else "FP32 reference (no INT8 searched: no calibration)"
    )
    log.info(f"{ready} ready ({seconds['calibrate'] + seconds['reference']:.1f} s{where})")
    return Prepared(info, dataset, ranges, reference, seconds)


def pin_idle(info: ModelInfo, dataset: Dataset) -> ModelInfo:
    """``info`` with units the data never runs (in an If branch it does not take) pinned to FP32:
    their precision would go unmeasured, so it is left as the model came."""
    ran = units_run(info, (*dataset.calibration, *dataset.evaluation))
    idle = [u.name for u in info.searchable_units if u.name not in ran]
    if not idle:
        return info
    note = (f"{len(idle)} unit(s) never run on the data (e.g. {idle[0]}, in an If branch it does not take or a loop "
            "it does not enter): kept FP32, since no measurement could see their precision")
    log.info(note)
    return info.without([p for p in Precision if p is not Precision.FP32], idle, note)


def ranged(info: ModelInfo, ranges: ActivationRanges | None) -> ModelInfo:
    """``info`` without INT8 for units the calibration batches never run (in an If branch only the
    evaluation batches take): there is no range to quantize them by."""
    if ranges is None:
        return info
    unseen = [u.name for u in info.searchable_units if Precision.INT8 in u.allowed
              and not all(t in ranges.tensors for t in u.activations)]
    if not unseen:
        return info
    note = (f"{len(unseen)} unit(s) never run on the calibration batches (e.g. {unseen[0]}, in an If branch only the "
            "evaluation batches take): INT8 left out for them, with no range to quantize by")
    log.info(note)
    return info.without((Precision.INT8,), unseen, note)


def _check_finite(info: ModelInfo, reference: list[dict]) -> None:
    """An FP32 output that is already NaN or Inf makes every candidate's loss infinite: say so, now."""
    for i, outputs in enumerate(reference):
        for name, value in outputs.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise ModelError(
                    f"{info.path}: the FP32 model's own output {name} is NaN or Inf on evaluation batch {i} of the "
                    "data, so no candidate's accuracy can be measured; check the data and its scaling "
                    "(--image-mean/--image-std), or the model"
                )


def prepare(
    model_path: Path,
    space: SearchSpace,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    image: ImageOptions = ImageOptions(),
    cache: Path | None = None,
    constants: Mapping[str, float] | None = None,
) -> Prepared:
    """Analyse the model, load and split the data, calibrate, compute the FP32 reference."""
    return prepare_reference(*load_inputs(model_path, space, data, shapes, seed, image, constants, cache=cache), cache)


def load_plan_document(path: str | os.PathLike) -> dict:
    """A plan file as JSON: best/plan.json of a result (the plan under ``plan``, the search's record beside
    it), or a bare plan."""
    try:
        document = load_json(Path(path))
    except (OSError, ValueError) as exc:
        raise AutoprecError(f"--plan {path}: not a readable plan ({exc}); give best/plan.json of a search") from None
    if not isinstance(document, dict):
        raise AutoprecError(f"--plan {path}: not a readable plan (not a JSON object); give best/plan.json of a search")
    return document


def load_plan(path: str | os.PathLike) -> Plan:
    """A plan file: best/plan.json of a result, or a bare plan ({"precisions": ..., "calibration": ...})."""
    return plan_in(load_plan_document(path), path)


def plan_in(document: dict, path: str | os.PathLike) -> Plan:
    """The plan of a plan file's JSON (see :func:`load_plan`), or one line saying why it is none."""
    try:
        plan = document.get("plan", document)
        if not isinstance(plan.get("precisions"), dict) or not isinstance(plan.get("calibration", ""), str):
            raise ValueError('expected {"precisions": {unit: int8|fp16|fp32}, "calibration": method}')
        return Plan.from_json(plan)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AutoprecError(f"--plan {path}: not a readable plan ({exc}); give best/plan.json of a search") from None


def _fits(plan: Plan, info: ModelInfo, where: str) -> Plan:
    """``plan`` when it names only the model's units, each at a precision the unit may take, and a
    calibration method autoprec has; else one line saying which."""
    units = {u.name: u for u in info.units}
    unknown = [name for name in plan.as_dict() if name not in units]
    if unknown:
        raise AutoprecError(f"{where}: names unit(s) {', '.join(unknown[:3])} that {info.path.name} does not have; "
                            f"give a plan made for this model (its units: {', '.join(list(units)[:3])}, …)")
    refused = [f"{n} {p}" for n, p in plan.as_dict().items() if p not in units[n].allowed]
    if refused:
        raise AutoprecError(f"{where}: puts {', '.join(refused[:3])}, which the search space does not allow there")
    if plan.calibration not in CALIBRATION_METHODS:
        raise AutoprecError(f"{where}: calibration {plan.calibration!r} is not one of {', '.join(CALIBRATION_METHODS)}")
    return plan


@dataclass(frozen=True)
class PlanContext:
    """A plan with the analysis it was measured with: re-created from a result's record, or MODEL + --plan."""

    plan: Plan
    prepared: Prepared
    config: SearchConfig  # the spec groups the search recorded (a bare plan: the defaults, on the model given)
    trial: int | None = None  # the result's trial the plan is, where it is one
    named: str = "the plan"  # which plan it is, for the lines that state what was checked or diagnosed
    recorded_loss: float | None = None  # its loss as the search recorded it (by its metric, on its engine and data)

    def same_judging(self, judge: JudgeSpec, engine: EngineSpec, data: str | os.PathLike | None) -> bool:
        """Whether a loss measured with ``judge`` on ``engine`` and ``data`` is the figure the search recorded."""
        recorded = self.config
        return (self.recorded_loss is not None and data is None and engine.backend == recorded.engine.backend
                and replace(judge, max_loss=None) == replace(recorded.judge, max_loss=None))


def recreate(result: ResultFiles, data: str | os.PathLike | None = None,
             shapes: Mapping[str, Sequence[int]] | None = None, profile: ProfileSpec | None = None) -> Prepared:
    """The analysis a search measured with, exactly: its model (checked against the recorded sha256,
    external data included), search space and overrides, input shapes, data split (seed) and
    normalisation, and its calibration ranges. ``data`` replaces the evaluation data only: the
    INT8 scales stay those the search calibrated; ``profile`` widens the deployment profile (the measured
    shapes stay). Anything that differs is refused with one line."""
    measured = result.how_measured()
    path, recorded_shapes, fingerprint = measured.model_path, measured.shapes, measured.data_fingerprint
    space = SearchSpace.from_json(measured.search_space)
    if shapes and {k: tuple(v) for k, v in shapes.items()} != {
        k: recorded_shapes[k] for k in shapes if k in recorded_shapes
    }:
        raise AutoprecError(f"--shape: {result.out_dir} was searched at "
                            + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in recorded_shapes.items())
                            + "; its plans are measured at those shapes (search again for others)")
    cache = result.out_dir / "cache"
    raw = load_onnx(path)  # a missing or broken model: its own message; a changed one is refused before any copy of it
    found = model_sha256(path)
    if found != measured.model_sha256:
        raise AutoprecError(f"{path}: not the model {result.out_dir} was searched with (sha256 {found[:12]}…, "
                            f"recorded {measured.model_sha256[:12]}…; its weights or external data changed): restore "
                            "that model or search again")
    deployed = (profile or ProfileSpec()).applied(measured.profile or result.profile)
    bounds = (deployed.at("min"), deployed.at("max"))
    recorded_data = measured.data_path
    info, dataset, seconds = load_inputs(path, space, data if data is not None else recorded_data, recorded_shapes,
                                         measured.seed, measured.image, measured.constants,
                                         measured.out_of_range, cache, raw, bounds)
    same_data = dataset.fingerprint() == fingerprint
    if data is None and not same_data:
        raise AutoprecError(f"{recorded_data or 'the random data'}: not the data {result.out_dir} was searched with "
                            "(its content changed): restore it, or pass --data to evaluate on other data")
    calibration_file = measured.calibration_file  # None: no INT8 was searched
    ranges = None
    if calibration_file is not None:
        stored = result.out_dir / calibration_file
        if stored.is_file():
            try:
                ranges = ActivationRanges.load(stored)
            except (OSError, ValueError, KeyError) as exc:
                raise AutoprecError(f"{stored}: the search's calibration cannot be read ({exc}); delete it to "
                                    "calibrate again from the search's data") from None
        elif same_data:
            ranges = calibrate(info, dataset.calibration, fingerprint, cache)
        else:
            raise AutoprecError(f"{stored}: the search's calibration is gone, and --data is not the search's data: "
                                "run without --data (it is calibrated again from the search's data) or search again")
    reference = reference_outputs(info, dataset.evaluation, dataset.fingerprint(), cache)
    return Prepared(ranged(pin_idle(info, dataset), ranges), dataset, ranges, reference, seconds)


def recorded_config(target: str | os.PathLike, plan: str | os.PathLike | None = None) -> SearchConfig | None:
    """The spec groups a search recorded: a result directory's, or (MODEL + --plan) those in the header of a
    result's best/plan.json. None for a bare plan."""
    if Path(target).is_dir():
        return config_of(read_result_dir(target).how_measured())
    document = load_plan_document(plan) if plan is not None else {}
    if "search" not in document or "model" not in document:
        return None
    return config_of(read_plan_file(Path(plan), document).how_measured())


def config_of(measured: HowMeasured) -> SearchConfig:
    """The spec groups a result recorded; for a result written before they were recorded, what its record
    says of them."""
    if measured.spec is not None:
        return SearchConfig.from_json(measured.spec)
    return SearchConfig(InputSpec(str(measured.model_path)), EngineSpec(measured.backend),
                        JudgeSpec(measured.metric, measured.max_loss))


def plan_context(
    target: str | os.PathLike, plan: str | os.PathLike | None = None, trial: int | None = None,
    data: str | os.PathLike | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
    profile: ProfileSpec | None = None,
) -> PlanContext:
    """A result directory (its chosen plan, --trial N, or --plan) re-created as it was searched
    (:func:`recreate`); MODEL + a result's best/plan.json, re-created from the record in its header; or
    MODEL + a bare plan, analysed with the default space on ``data``."""
    target = Path(target)
    if not target.is_dir():
        if plan is None:
            raise AutoprecError(f"{target}: give --plan PLAN.json (or a result directory instead of the model)")
        document = load_plan_document(plan)
        if "search" in document and "model" in document:  # a result's best/plan.json: its search's analysis
            return _from_plan_file(target, Path(plan), document, data, shapes)
        prepared = prepare(target, load_search_space(), data, shapes)
        return PlanContext(_fits(plan_in(document, plan), prepared.info, f"--plan {plan}"), prepared,
                           SearchConfig(InputSpec(target)), named=f"the plan in {plan}")
    result = read_result_dir(target)
    if trial is not None:
        chosen, number, named = result.plan_of(trial), trial, f"trial {trial} of {target}"
        if chosen is None:
            raise AutoprecError(f"--trial {trial}: {target} has no finished trial {trial}; see autoprec show {target}")
    elif plan is not None:
        chosen, number, named = load_plan(plan), None, f"the plan in {plan}"
    elif result.best_plan is not None:
        chosen, number = result.best_plan
        named = f"trial {number} of {target}, the chosen plan (best/plan.json)"
    else:
        raise AutoprecError(f"{target}: no chosen plan; pass --trial N (see autoprec show {target})")
    prepared = recreate(result, data, shapes, profile)
    where = f"--plan {plan}" if plan is not None else str(target)
    shown = result.shown_trial(number)
    return PlanContext(_fits(chosen, prepared.info, where), prepared, config_of(result.how_measured()), number, named,
                       shown.loss if shown else None)


def _from_plan_file(model: Path, plan: Path, document: dict, data, shapes) -> PlanContext:
    """MODEL + a result's best/plan.json: the analysis its search recorded (space, shapes, data split,
    calibration in the result folder beside it), on MODEL (checked to be the searched model)."""
    result = read_plan_file(plan, document, model)
    prepared = recreate(result, data, shapes)
    chosen, number = result.best_plan
    return PlanContext(_fits(chosen, prepared.info, f"--plan {plan}"), prepared, config_of(result.how_measured()),
                       number, f"trial {number} in {plan}, as its search recorded it", _loss_in(document))


def _loss_in(document: dict) -> float | None:
    """A plan file's recorded loss (``accuracy_loss``); None where it has none it can be read as."""
    try:
        return float(document["accuracy_loss"])
    except (KeyError, TypeError, ValueError):
        return None


def engine_space(
    space: SearchSpace, engine: Backend, precisions: Sequence[str] | None
) -> tuple[SearchSpace, list[str], dict[str, str]]:
    """The space narrowed to ``precisions``, or to what ``engine`` runs faster than FP32; says what was left out and why."""
    if precisions is None:
        keep = [p for p in Precision if p not in engine.slow_precisions]
        left_out = {p.value: why for p, why in engine.slow_precisions.items()}
        for p, why in left_out.items():
            log.info(f"{engine.name}: {p} left out of the search ({why}); include it with --precisions int8,fp16,fp32")
        if Precision.INT8 in keep:
            space = space.without(Precision.INT8, engine.float_int8_ops)
    else:
        keep = list(parse_precisions(list(precisions), "--precisions"))
        left_out = {p.value: "not in --precisions" for p in Precision if p not in keep and p is not Precision.FP32}
        for p in keep:
            if p in engine.slow_precisions:
                log.warning(f"{engine.name}: {p} searched as asked, but {engine.slow_precisions[p]}")
    searched = [p.value for p in Precision if p in keep or p is Precision.FP32]
    space = space.restricted(keep).with_pinned(engine.float32_ops)
    if engine.sensitive_ops_fp32 and space.sensitive:
        left_out["sensitive ops"] = f"kept FP32: {engine.sensitive_ops_fp32}"
        # and so are neutral ops out of FP16's range: between units, this engine's FP16 has no regions
        space = replace(space.with_pinned(set(space.sensitive) - set(space.units)), out_of_range=())
    return space, searched, left_out


def repeats_decided(info: ModelInfo, tie: bool) -> ModelInfo:
    """``info`` with the units of repeated patterns decided together (``tie``, said once), or each on its own."""
    if not tie:
        return info.untied()
    tied = len(info.searchable_units) - len(info.dimensions)
    if tied:
        patterns = sum(1 for u in info.dimensions if len(info.members(u.name)) > 1)
        log.info(f"{tied + patterns} unit(s) of {patterns} repeated pattern(s) are decided together: "
                 f"{len(info.dimensions)} dimension(s) for {len(info.searchable_units)} searched unit(s) "
                 "(--separate-repeats decides each on its own)")
    return info

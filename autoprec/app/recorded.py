"""A plan re-created as it was searched: a result's record read back into its spec groups and its
analysis, or MODEL + a plan file."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from autoprec.analysis.baseline import Baseline, load_baseline, load_inputs, pin_idle, ranged
from autoprec.analysis.calibrate import CALIBRATION_METHODS, ActivationRanges, calibrate
from autoprec.analysis.model import load_onnx, model_sha256
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.reference import reference_outputs
from autoprec.app.config import SearchConfig
from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.specs import EngineSpec, InputSpec, ProfileSpec
from autoprec.core import untrusted
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Plan
from autoprec.core.search_space import SearchSpace, load_search_space
from autoprec.lower.int4 import keep_kernels
from autoprec.results.files import HowMeasured, ResultFiles, read_plan_file, read_result_dir

PLAN_BYTES = 256 << 20  # the most a plan file may hold (one of 100,000 units: about 20 MB)


def load_plan_document(path: str | os.PathLike) -> dict:
    """A plan file as JSON: best/plan.json of a result (the plan under ``plan``, the search's record
    beside it), or a bare plan."""
    try:
        document = untrusted.read_json(Path(path), "a plan file", PLAN_BYTES, given=True)
    except (OSError, ValueError) as exc:
        raise AutoprecError(f"--plan {path}: not a readable plan ({exc}); give best/plan.json of a "
                            "search") from None
    if not isinstance(document, dict):
        raise AutoprecError(f"--plan {path}: not a readable plan (not a JSON object); give "
                            "best/plan.json of a search")
    return document


def load_plan(path: str | os.PathLike) -> Plan:
    """A plan file: best/plan.json of a result, or a bare plan ({"precisions": ..., "calibration":
    ...})."""
    return plan_in(load_plan_document(path), path)


def plan_in(document: dict, path: str | os.PathLike) -> Plan:
    """The plan of a plan file's JSON (see :func:`load_plan`), or one line saying why it is none."""
    try:
        plan = document.get("plan", document)
        if not isinstance(plan.get("precisions"), dict) or not isinstance(plan.get("calibration", ""), str):
            raise ValueError('expected {"precisions": {unit: int8|fp16|fp32}, "calibration": '
                             'method}')
        return Plan.from_json(plan)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AutoprecError(f"--plan {path}: not a readable plan ({exc}); give best/plan.json of a "
                            "search") from None


def _fits(plan: Plan, info: ModelInfo, where: str) -> Plan:
    """``plan`` when it names only the model's units, each at a precision the unit may take, and a
    calibration method autoprec has; else one line saying which."""
    units = {u.name: u for u in info.units}
    unknown = [name for name in plan.as_dict() if name not in units]
    if unknown:
        raise AutoprecError(f"{where}: names unit(s) {', '.join(unknown[:3])} that "
                            f"{info.path.name} does not have; give a plan made for this model (its "
                            f"units: {', '.join(list(units)[:3])}, …)")
    refused = [f"{n} {p}" for n, p in plan.as_dict().items() if p not in units[n].allowed]
    if refused:
        raise AutoprecError(f"{where}: puts {', '.join(refused[:3])}, which the search space does "
                            "not allow there")
    if plan.calibration not in CALIBRATION_METHODS:
        raise AutoprecError(f"{where}: calibration {plan.calibration!r} is not one of "
                            f"{', '.join(CALIBRATION_METHODS)}")
    return plan


@dataclass(frozen=True)
class PlanContext:
    """A plan with the analysis it was measured with: re-created from a result's record, or MODEL +
    --plan."""

    plan: Plan
    baseline: Baseline
    # the spec groups the search recorded (a bare plan: the defaults, on the model given)
    config: SearchConfig
    trial: int | None = None  # the result's trial the plan is, where it is one
    # which plan it is, for the lines that state what was checked or diagnosed
    named: str = "the plan"
    # its loss as the search recorded it (by its metric, on its engine and data)
    recorded_loss: float | None = None

    def same_judging(self, judge: JudgeSpec, engine: EngineSpec, data: str | os.PathLike | None) -> bool:
        """Whether a loss measured with ``judge`` on ``engine`` and ``data`` is the figure the
        search recorded."""
        recorded = self.config
        return (self.recorded_loss is not None and data is None and engine.backend == recorded.engine.backend
                and replace(judge, max_loss=None) == replace(recorded.judge, max_loss=None))


def recreate(result: ResultFiles, data: str | os.PathLike | None = None,
             shapes: Mapping[str, Sequence[int]] | None = None, profile: ProfileSpec | None = None) -> Baseline:
    """The analysis a search measured with, exactly: its model (checked against the recorded sha256,
    external data included), search space and overrides, input shapes, data split (seed) and
    normalisation, and its calibration ranges. ``data`` replaces the evaluation data only: the INT8
    scales stay those the search calibrated; ``profile`` widens the deployment profile (the measured
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
    # a missing or broken model: its own message; a changed one is refused before any copy of it
    raw = load_onnx(path)
    found = model_sha256(path)
    if found != measured.model_sha256:
        raise AutoprecError(f"{path}: not the model {result.out_dir} was searched with (sha256 "
                            f"{found[:12]}…, recorded {measured.model_sha256[:12]}…; its weights "
                            "or external data changed): restore that model or search again")
    deployed = (profile or ProfileSpec()).applied(measured.profile or result.profile)
    # a search that judged several shapes: the same points, made the same way
    judged = bool(measured.judged_shapes)
    asked = config_of(measured).inputs
    bounds = (asked.min_shapes or {}, asked.max_shapes or {}) if judged else (deployed.at("min"), deployed.at("max"))
    recorded_data = measured.data_path
    info, dataset, seconds = load_inputs(path, space, data if data is not None else recorded_data,
                                         recorded_shapes,
                                         measured.seed, measured.image, measured.constants,
                                         measured.out_of_range, cache, raw, bounds,
                                         {p.name: p.runs for p in measured.judged_shapes or ()},
                                         judged,
                                         {k: tuple(v) for k, v in (asked.dims or {}).items()} if judged else None)
    if judged:
        # widened where asked; the judged points stay the search's
        info = replace(info, profile=deployed)
    if measured.int4_kernels is not None:  # the kernel the search measured, for every lowering here
        keep_kernels(info.stored.folder, measured.int4_kernels)
    same_data = dataset.fingerprint() == fingerprint
    if data is None and not same_data:
        raise AutoprecError(f"{recorded_data or 'the random data'}: not the data {result.out_dir} "
                            "was searched with (its content changed): restore it, or pass --data "
                            "to evaluate on other data")
    calibration_file = measured.calibration_file  # None: no INT8 was searched
    ranges = None
    if calibration_file is not None:
        stored = result.out_dir / calibration_file
        if stored.is_file():
            try:
                ranges = ActivationRanges.load(stored)
            except (OSError, ValueError, KeyError) as exc:
                raise AutoprecError(f"{stored}: the search's calibration cannot be read ({exc}); "
                                    "delete it to calibrate again from the search's "
                                    "data") from None
        elif same_data:
            ranges = calibrate(info, dataset.calibration, fingerprint, cache)
        else:
            raise AutoprecError(f"{stored}: the search's calibration is gone, and --data is not "
                                "the search's data: run without --data (it is calibrated again "
                                "from the search's data) or search again")
    # FP32's outputs computed afresh, never read from the result's cache: what check and diagnose
    # judge against is the given model's own output, whatever a received result's cache/ holds
    reference = reference_outputs(info, dataset.evaluation, dataset.fingerprint())
    return Baseline(ranged(pin_idle(info, dataset), ranges), dataset, ranges, reference, seconds)


def recorded_config(target: str | os.PathLike, plan: str | os.PathLike | None = None) -> SearchConfig | None:
    """The spec groups a search recorded: a result directory's, or (MODEL + --plan) those in the
    header of a result's best/plan.json. None for a bare plan."""
    if Path(target).is_dir():
        return config_of(read_result_dir(target).how_measured())
    document = load_plan_document(plan) if plan is not None else {}
    if "search" not in document or "model" not in document:
        return None
    return config_of(read_plan_file(Path(plan), document).how_measured())


def config_of(measured: HowMeasured) -> SearchConfig:
    """The spec groups a result recorded; for a result written before they were recorded, what its
    record says of them."""
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
    (:func:`recreate`); MODEL + a result's best/plan.json, re-created from the record in its header;
    or MODEL + a bare plan, analysed with the default space on ``data``."""
    target = Path(target)
    if not target.is_dir():
        if plan is None:
            raise AutoprecError(f"{target}: give --plan PLAN.json (or a result directory instead "
                                "of the model)")
        document = load_plan_document(plan)
        # a result's best/plan.json: its search's analysis
        if "search" in document and "model" in document:
            return _from_plan_file(target, Path(plan), document, data, shapes)
        baseline = load_baseline(target, load_search_space(), data, shapes)
        return PlanContext(_fits(plan_in(document, plan), baseline.info, f"--plan {plan}"),
                           baseline,
                           SearchConfig(InputSpec(target)), named=f"the plan in {plan}")
    result = read_result_dir(target)
    if trial is not None:
        chosen, number, named = result.plan_of(trial), trial, f"trial {trial} of {target}"
        if chosen is None:
            raise AutoprecError(f"--trial {trial}: {target} has no finished trial {trial}; see "
                                f"autoprec show {target}")
    elif plan is not None:
        chosen, number, named = load_plan(plan), None, f"the plan in {plan}"
    elif result.best_plan is not None:
        chosen, number = result.best_plan
        named = f"trial {number} of {target}, the chosen plan (best/plan.json)"
    else:
        raise AutoprecError(f"{target}: no chosen plan; pass --trial N (see autoprec show "
                            f"{target})")
    baseline = recreate(result, data, shapes, profile)
    where = f"--plan {plan}" if plan is not None else str(target)
    shown = result.shown_trial(number)
    return PlanContext(_fits(chosen, baseline.info, where), baseline,
                       config_of(result.how_measured()), number, named,
                       shown.loss if shown else None)


def _from_plan_file(model: Path, plan: Path, document: dict, data, shapes) -> PlanContext:
    """MODEL + a result's best/plan.json: the analysis its search recorded (space, shapes, data
    split, calibration in the result folder beside it), on MODEL (checked to be the searched
    model)."""
    result = read_plan_file(plan, document, model)
    baseline = recreate(result, data, shapes)
    chosen, number = result.best_plan
    return PlanContext(_fits(chosen, baseline.info, f"--plan {plan}"), baseline,
                       config_of(result.how_measured()),
                       number, f"trial {number} in {plan}, as its search recorded it",
                       _loss_in(document))


def _loss_in(document: dict) -> float | None:
    """A plan file's recorded loss (``accuracy_loss``); None where it has none it can be read as."""
    try:
        return float(document["accuracy_loss"])
    except (KeyError, TypeError, ValueError):
        return None

"""What a search works on, resolved from its configuration: the model and data analysed, the engine
and the space it searches; and what every trial shares: the calibrated model and FP32 reference, the
judge, the lowering."""

from __future__ import annotations

import fnmatch
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from autoprec.analysis.baseline import Baseline, baseline_of, load_inputs, shared_files
from autoprec.analysis.data import Dataset
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.subgraphs import all_nodes
from autoprec.app.config import SearchConfig
from autoprec.app.resolve import (
    check_out_dir,
    engine_space,
    judge_for,
    metric_for,
    removed_if_refused,
    repeats_decided,
    resolve_model,
    result_dir,
    wanted_metric,
)
from autoprec.backends import Backend, get_backend
from autoprec.core import atomic, untrusted
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Precision
from autoprec.core.search_space import SearchSpace, load_search_space
from autoprec.lower import Int4Form
from autoprec.lower.int4 import keep_kernels, valid_kernels
from autoprec.measure.accuracy import Judge, Metric
from autoprec.measure.int4_kernels import int4_kernels, said
from autoprec.measure.measurement import Lowering, Screen
from autoprec.measure.measurers import build_workers
from autoprec.record.trial import EngineInfo
from autoprec.results.files import OWN_FILES, OWN_FOLDERS, result_owns
from autoprec.study.coordination import GRACE_BEATS
from autoprec.study.joining import Joined

log = logging.getLogger("autoprec")


@dataclass(frozen=True)
class Setup:
    """What a search works on: the model and data analysed, the engine and the space it searches."""

    model_path: Path
    data: str | os.PathLike | None
    out_dir: Path
    engine: Backend
    engine_info: EngineInfo  # asked once: a GPU engine's asks the driver
    workers: int
    space: SearchSpace
    searched: list[str]
    left_out: dict[str, str]
    info: ModelInfo
    dataset: Dataset
    one_time: dict[str, float]
    metric: Metric
    made: Path | None = None  # the folder this run made for its results (removed if refused)

    @property
    def cache(self) -> Path:
        return self.out_dir / "cache"


def set_up(config: SearchConfig) -> Setup:
    model_path, data, shapes, default_out = resolve_model(config.inputs.model, config.inputs.data,
                                                          config.inputs.shapes)
    out_dir = result_dir(config.out, default_out)
    if config.study.storage is None and any(c in str(out_dir.resolve()) for c in "%{}"):
        raise AutoprecError(f"--out {out_dir}: its path holds '%', '{{' or '}}', which the study's "
                            "default SQLite URL cannot carry; choose another --out, or give "
                            "--storage")
    wanted = wanted_metric(config.judge, config.inputs.model)
    engine = get_backend(config.engine.backend, config.engine.device, out_dir / "cache",
                         config.engine.threads)
    workers = build_workers(config.isolation.build_workers, engine, config.isolation.isolate)
    space, searched, left_out = engine_space(
        load_search_space(config.space.search_space).with_overrides(list(config.space.overrides)),
        engine,
        config.space.precisions,
    )
    _check_apart(out_dir, model_path, data)
    made = check_out_dir(out_dir)
    untrusted.checked_tree(out_dir, (*OWN_FOLDERS, *OWN_FILES), f"the result folder {out_dir}")
    untrusted.only_name(out_dir / "study.db", f"the result folder {out_dir}")
    for folder in (out_dir, out_dir / "best", out_dir / "cache"):
        atomic.remove_stale(folder)
    with removed_if_refused(made):
        info, dataset, one_time = load_inputs(
            model_path, space, data, shapes, config.study.seed, config.inputs.image,
            config.inputs.constants, cache=out_dir / "cache",
            bounds=(config.inputs.min_shapes or {}, config.inputs.max_shapes or {}),
            shape_runs=config.inputs.shape_weights,
            judge_shapes=not engine.one_shape_only,  # TensorRT builds each candidate for one shape
            dims={k: tuple(v) for k, v in (config.inputs.dims or {}).items()},
        )
        if engine.one_shape_only and info.shape_profile.dynamic:
            log.warning(f"{engine.name}: every plan is judged at the data's shape only "
                        f"({engine.one_shape_only}); other shapes are checked on the shipped "
                        "model, on ONNX Runtime")
        _check_earlier_result(out_dir, info)
        _check_overrides(config.space.overrides, info)
        info = repeats_decided(info, config.space.tie_repeats)
        _say_pinned_ops(info, engine, left_out)
        metric = metric_for(wanted, info, dataset)
    return Setup(model_path, data, out_dir, engine, engine.info(), workers, space, searched,
                 left_out, info, dataset, one_time, metric, made)


def _check_apart(out_dir: Path, model: Path, data: str | os.PathLike | None) -> None:
    """Refuse a search whose results would land on its own inputs: the model or data among the files
    it writes in ``out_dir``, or ``out_dir`` the data folder itself (its figures read as data next
    time; a folder below it is not read)."""
    if result_owns(out_dir, model):
        raise AutoprecError(f"{model}: one of the files a search writes in --out {out_dir} (best/, "
                            "cache/, pareto.json, ...): it would replace its own input; copy the "
                            "model elsewhere, or give another --out")
    if data is None or str(data).startswith("zoo:"):
        return
    folder = Path(data).resolve()
    if result_owns(out_dir, folder) or (folder.is_dir() and out_dir.resolve() == folder):
        raise AutoprecError(f"--out {out_dir}: the --data folder {data} (or holding it): the "
                            "result's figures would be read as data by the next run; give another "
                            "--out (a folder below the data's is fine)")


def _check_earlier_result(out_dir: Path, info: ModelInfo) -> None:
    """Refuse to write over a result in ``out_dir`` that is another model's, or no result autoprec
    wrote: a search replaces pareto.json, trials.json and best/ there."""
    earlier = out_dir / "pareto.json"
    if not earlier.exists():
        return
    try:
        model = untrusted.read_json(earlier, f"the result folder {out_dir}")["model"]
        sha256, name = model["sha256"], Path(model["path"]).name
    except (OSError, ValueError, KeyError, TypeError):
        raise AutoprecError(f"--out {out_dir}: holds a pareto.json autoprec did not write (or "
                            "cannot read): a search would replace it; give another --out, or move "
                            "that file") from None
    if sha256 != info.sha256:
        changed = " as it was: the model changed since" if name == info.path.name else ""
        raise AutoprecError(f"--out {out_dir}: holds the result of a search of another model "
                            f"({name}{changed}, sha256 {str(sha256)[:12]}…); a search of "
                            f"{info.path.name} would replace it: give another --out, or remove "
                            "that result")


def _check_overrides(overrides: Sequence[str], info: ModelInfo) -> None:
    """Refuse an --override whose pattern names no unit (a typo would leave the unit it meant searched)."""
    names = [u.name for u in info.units]
    for text in overrides:
        pattern = text.partition("=")[0]
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            node = next((n for n in all_nodes(info.model) if fnmatch.fnmatchcase(n.name, pattern)), None)
            if node is not None:
                raise AutoprecError(
                    f"--override {text!r}: {pattern!r} names a {node.op_type} node of {info.path.name} that is no "
                    "precision unit: units are the search space's op types (MatMul, Gemm, Conv, ...: `autoprec "
                    "show` or `sensitivity` lists them) and, where int4 is searched, embeddings (a Gather along "
                    "axis 0 of a constant float32 2-D table whose rows are whole int4 blocks)")
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise AutoprecError(f"--override {text!r}: {pattern!r} matches no unit of "
                                f"{info.path.name} (its units: {shown}; names are case-sensitive, "
                                "see autoprec sensitivity or show)")


def _say_pinned_ops(info: ModelInfo, engine: Backend, left_out: dict[str, str]) -> None:
    """The model's units of op types the engine runs in FP32 only, or without INT8: said once, and
    kept in ``left_out``."""
    for op in sorted({u.op_type for u in info.units} & set(engine.float32_ops)):
        log.info(f"{engine.name}: {op} units kept FP32 ({engine.float32_ops[op]})")
        left_out[f"{op} units"] = f"kept FP32: {engine.float32_ops[op]}"
    for op in sorted({u.op_type for u in info.units if Precision.INT8 not in u.allowed} & set(engine.float_int8_ops)):
        log.info(f"{engine.name}: {op} units take no INT8 ({engine.float_int8_ops[op]})")
        left_out[f"{op} units"] = f"no INT8: {engine.float_int8_ops[op]}"


@dataclass(frozen=True)
class Shared:
    """What every trial shares: the calibrated model and FP32 reference, the judge, the lowering."""

    baseline: Baseline
    judge: Judge
    judged: dict[str, Any]  # what the result records of the judge
    ranking: Judge
    lowering: Lowering
    screen: Screen | None
    # the MatMulNBits kernel INT4 units take, and what chose it (None: no INT4 on ONNX Runtime)
    int4_kernels: dict[str, Any] | None = None

    @property
    def info(self) -> ModelInfo:
        return self.baseline.info


def shared_inputs(config: SearchConfig, setup: Setup, joined: Joined) -> Shared:
    files = shared_files(setup.info, setup.dataset, setup.cache, joined.shared.file_names("reference"))
    with joined.shared.once(joined.locks, "reference", files, joined.me) as fetched:
        if fetched:
            log.info(f"study {joined.name!r}: calibration ranges and FP32 reference from its "
                     f"artifact store ({joined.shared.store_dir})")
        baseline = baseline_of(setup.info, setup.dataset, setup.one_time, setup.cache)
    judge, judged = judge_for(setup.metric, baseline, config.judge.max_loss)
    running = joined.running
    if joined.done or running:
        budget = config.study.budget
        done = (f"{joined.done} of {budget} trials done" if joined.done < budget else
                f"{joined.done} trials done, the budget of {budget} reached: no new trial runs")
        log.info(f"joining study {joined.name!r}: {done}"
                 + (f"; trial(s) {', '.join(map(str, running))} running elsewhere (a dead worker's "
                    f"is re-run after {GRACE_BEATS * config.study.heartbeat} s without a "
                    "heartbeat)" if running else ""))
    screen = (
        Screen.for_search(config.judge.max_loss, len(setup.dataset.evaluation)) if config.study.early_reject else None
    )
    method = config.space.method
    ranges = baseline.ranges
    lowering = Lowering(
        baseline.info, ranges.with_thresholds(method) if ranges is not None else None
    )  # only plans travel
    return Shared(baseline, judge, judged, judge.for_ranking(), lowering, screen,
                  _int4_kernels(setup, joined, lowering))


def _int4_kernels(setup: Setup, joined: Joined, lowering: Lowering) -> dict[str, Any] | None:
    """Which MatMulNBits kernel the INT4 units take on this engine, measured once per model (see
    :mod:`autoprec.measure.int4_kernels`), before any worker lowers a plan; None where the search
    lowers no unit to MatMulNBits."""
    engine, info = setup.engine, lowering.info
    if (Precision.INT4.value not in setup.searched or engine.int4_form is not Int4Form.MATMUL_NBITS
            or not setup.engine_info.measured or not info.plan_at(Precision.INT4).counts().get("int4")):
        return None
    with joined.locks.hold("int4 kernels"):
        # one kernel for the whole study: its other workers and resumed runs take the first's
        measured = valid_kernels(joined.study.user_attrs.get(KERNELS_ATTR))
        if measured is not None:
            keep_kernels(info.stored.folder, measured)
        else:
            measured = int4_kernels(engine, setup.engine_info, info, lowering, setup.dataset.workload)
            joined.study.set_user_attr(KERNELS_ATTR, measured)
    log.info(said(measured))
    return measured


KERNELS_ATTR = "int4_kernels"


def study_identity(config: SearchConfig, setup: Setup) -> dict[str, Any]:
    """What must match for a resumed or shared study: mixing would compare latencies or losses that
    were not measured the same way (or constrained differently)."""
    info = setup.info
    return {
        "model_sha256": info.sha256, "backend": config.engine.backend,
        "data": setup.dataset.fingerprint(),
        "metric": setup.metric.describe(), "units": len(info.units),
        "calibration": config.space.calibration,
        "max_loss": config.judge.max_loss, "precisions": setup.searched,
        "search_space": setup.space.digest(),
        "shapes": {i.name: list(i.shape) for i in info.inputs},
        "tie_repeats": config.space.tie_repeats,
    }

"""``autoprec.search``: model file -> analysis -> calibration -> Optuna study -> result directory."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import optuna

from autoprec import atomic, console
from autoprec.accuracy import resolve_metric
from autoprec.backends import get_backend
from autoprec.calibrate import (
    CALIBRATION_METHODS,
    DEFAULT_CALIBRATION,
    ActivationRanges,
    calibrate,
    reference_outputs,
)
from autoprec.data import Dataset, RandomDataWarning, build_dataset, item_shapes
from autoprec.errors import AutoprecError
from autoprec.isolation import IsolatedMeasurer, Limits
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure import measure
from autoprec.model import ModelInfo, analyse, declared_inputs, load_onnx
from autoprec.plots import plot_result_dir
from autoprec.results import (
    SearchResult,
    model_json,
    read_result_dir,
    units_json,
    write_results,
)
from autoprec.search import (
    StudyContext,
    choose,
    counted,
    default_sampler,
    default_study_name,
    finished_records,
    open_study,
    pareto_front,
    recover_interrupted,
    run_study,
    seed_uniform_plans,
)
from autoprec.search_space import SearchSpace, load_search_space


def _check_out_dir(out: Path) -> None:
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
        console.note(f"zoo:{fetched.name}: {fetched.model} (licence: {fetched.notice})")
        return fetched.model, data if data is not None else fetched.data, shapes or fetched.shapes, fetched.name
    return Path(model), data, shapes, Path(model).stem


@dataclass(frozen=True)
class Prepared:
    """What every trial of a search shares: computed once (and cached on disk when a cache is given)."""

    info: ModelInfo
    dataset: Dataset
    ranges: ActivationRanges
    reference: list[dict]
    seconds: dict[str, float]


def prepare(
    model_path: Path,
    space: SearchSpace,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    image_mean: Sequence[float] = (0.0,),
    image_std: Sequence[float] = (1.0,),
    cache: Path | None = None,
) -> Prepared:
    """Analyse the model, load and split the data, calibrate, compute the FP32 reference."""
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    raw = load_onnx(model_path)
    given = {k: tuple(v) for k, v in (shapes or {}).items()}
    info = analyse(model_path, space, given, item_shapes(data, declared_inputs(raw)), model=raw)
    seconds["analyse"] = time.monotonic() - t0
    for line in info.notes:
        console.note(line)
    console.note(
        f"{model_path.name}: {len(info.units)} precision units ({len(info.searchable_units)} searched), "
        f"inputs {', '.join(f'{i.name} {list(i.shape)}' for i in info.inputs)}"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RandomDataWarning)
        dataset = build_dataset(data, info.inputs, seed=seed, image_mean=image_mean, image_std=image_std)
    for w in caught:
        console.warn(str(w.message))
    console.note(
        f"data: {dataset.source} — {len(dataset.calibration)} calibration / {len(dataset.evaluation)} evaluation batch(es)"
    )
    fingerprint = dataset.fingerprint()
    t0 = time.monotonic()
    ranges = calibrate(info, dataset.calibration, fingerprint, cache)
    seconds["calibrate"] = time.monotonic() - t0
    t0 = time.monotonic()
    reference = reference_outputs(info, dataset.evaluation, fingerprint, cache)
    seconds["reference"] = time.monotonic() - t0
    where = f"; cached in {cache}" if cache else ""
    console.note(f"calibration ranges and FP32 reference ready ({seconds['calibrate'] + seconds['reference']:.1f} s{where})")
    return Prepared(info, dataset, ranges, reference, seconds)


def search(
    model: str | os.PathLike,
    budget: int = 50,
    data: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    backend: str = "ort-cpu",
    max_loss: float | None = None,
    seed: int = 0,
    storage: str | None = None,
    study_name: str | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    metric: str = "cosine",
    search_space: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    calibration: str = DEFAULT_CALIBRATION,
    image_mean: Sequence[float] = (0.0,),
    image_std: Sequence[float] = (1.0,),
    progress: bool = True,
    isolate: bool = True,
    trial_timeout: float = 600.0,
    trial_memory_gb: float | None = None,
) -> SearchResult:
    """Search per-unit precisions for ``model`` and write the result directory.

    Example::

        result = autoprec.search("model.onnx", budget=50, data="samples/", max_loss=0.01)
        result = autoprec.search("zoo:ppocr-det", budget=50)  # a zoo model, with its own real data
        print(result.chosen.latency_ms, result.chosen.plan.counts())

    The study lives in ``storage`` (default: SQLite in ``out``), so calling this again with the
    same arguments resumes it: finished trials are kept, an interrupted one is re-run.

    Each candidate is built and measured in a worker process (``isolate``) limited to
    ``trial_timeout`` seconds and ``trial_memory_gb`` (default 75 % of RAM): a crash, hang or
    out-of-memory fails that trial, with its cause recorded, and the study goes on.
    """
    started = time.monotonic()
    if budget < 1:
        raise AutoprecError(f"--budget {budget}: must be at least 1 (the number of trials to run)")
    if calibration not in CALIBRATION_METHODS:
        raise AutoprecError(f"--calibration {calibration!r}: choose one of {', '.join(CALIBRATION_METHODS)}")
    model_path, data, shapes, default_out = resolve_model(model, data, shapes)
    out_dir = Path(out) if out is not None else Path("autoprec_out") / default_out
    metric_name, loss_function = resolve_metric(metric)
    space = load_search_space(search_space).with_overrides(list(overrides))
    engine = get_backend(backend)
    _check_out_dir(out_dir)
    for folder in (out_dir, out_dir / "best", out_dir / "cache"):
        atomic.remove_stale(folder)
    prepared = prepare(model_path, space, data, shapes, seed, image_mean, image_std, out_dir / "cache")
    info, dataset, ranges, reference, fingerprint = (
        prepared.info, prepared.dataset, prepared.ranges, prepared.reference, prepared.dataset.fingerprint()
    )
    one_time = dict(prepared.seconds)

    engine_info = engine.info()
    storage_url = storage or f"sqlite:///{(out_dir / 'study.db').resolve()}"
    name = study_name or default_study_name(model_path, backend)
    identity = {
        "model_sha256": info.sha256,
        "backend": backend,
        "data": fingerprint,
        "metric": metric_name,
        "units": len(info.units),
        "calibration": calibration,
        "max_loss": max_loss,
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(storage_url, name, identity, default_sampler(seed))
    requeued, given_up = recover_interrupted(study)
    if requeued:
        console.note(f"resuming: interrupted trial(s) {', '.join(map(str, requeued))} will be re-run")
    for number in given_up:
        console.warn(f"trial {number} was a re-run and was interrupted again; its plan is not retried")
    seed_uniform_plans(study, info)
    done = sum(counted(t) for t in study.get_trials(deepcopy=False))
    if done:
        console.note(f"resuming study {name!r}: {done} of {budget} trials already done")
    with contextlib.ExitStack() as stack:
        if isolate:
            limits = Limits.default(trial_timeout, trial_memory_gb)
            measurer = stack.enter_context(
                IsolatedMeasurer(backend, dataset.evaluation, reference, metric, limits, out_dir / "cache" / "worker-stderr.log")
            )
            t0 = time.monotonic()
            measurer.start()
            one_time["worker_start"] = time.monotonic() - t0
            measure_candidate = measurer.measure
            memory = f"{limits.memory_bytes / 2**30:.2f} GiB" if limits.memory_bytes else "no memory limit"
            console.note(f"each candidate runs in a worker process (limits: {limits.seconds:g} s, {memory})")
        else:
            def measure_candidate(model):
                return measure(engine, model, dataset.evaluation, reference, metric_name, loss_function)

            console.warn("--no-isolation: candidates run in this process; an engine crash ends the search (resume with the same command)")
        ctx = StudyContext(info, engine, ranges, measure_candidate, calibration, max_loss)
        console.note(f"engine: {engine_info.label()} ({engine_info.qdq_form} Q/DQ form)")
        with console.SearchProgress(budget, min(done, budget), max_loss, enabled=progress) as bar:
            run_study(study, ctx, budget, on_trial=bar.update)

    trials = finished_records(study)
    front = pareto_front(study)
    chosen = choose(front, max_loss)
    search_facts = {
        "budget": budget,
        "trials": len(trials),
        "metric": metric_name,
        "max_loss": max_loss,
        "seed": seed,
        "calibration": calibration,
        "study_name": name,
        "storage": storage_url,
        "data": dataset.source,
        "random_data": dataset.random,
        "batches": {"calibration": len(dataset.calibration), "evaluation": len(dataset.evaluation)},
        "search_space": space.source,
        "wall_seconds": round(time.monotonic() - started, 2),
        "one_time_seconds": {k: round(v, 3) for k, v in one_time.items()},
        "sampler": type(study.sampler).__name__,
    }
    result = SearchResult(out_dir, model_json(info), engine_info, search_facts, tuple(trials), tuple(front), chosen, units_json(info))
    chosen_model = tensorrt_model = None
    if chosen is not None:
        chosen_model = engine.lower(info, chosen.plan, ranges)
        if engine.qdq_form is not QDQForm.TENSORRT and chosen.plan.counts()["int8"]:
            tensorrt_model = lower_plan(info, chosen.plan, ranges, QDQForm.TENSORRT)
    write_results(result, chosen_model, tensorrt_model)
    plot_result_dir(read_result_dir(out_dir))
    return result

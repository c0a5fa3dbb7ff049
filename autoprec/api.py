"""``autoprec.search``: model file -> analysis -> calibration -> Optuna study -> result directory."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import optuna

from autoprec import atomic, console
from autoprec.accuracy import HeadOptions, Judge, Metric, decision_changes, resolve_metric
from autoprec.backends import Backend, get_backend
from autoprec.export.tensorrt import BuildSpec
from autoprec.calibrate import (
    CALIBRATION_METHODS,
    DEFAULT_CALIBRATION,
    ActivationRanges,
    calibrate,
    calibration_cache,
    reference_cache,
    reference_outputs,
)
from autoprec.data import Dataset, RandomDataWarning, build_dataset, item_shapes
from autoprec.coordination import (
    DEFAULT_HEARTBEAT,
    GRACE_BEATS,
    SharedInputs,
    StudyLocks,
    check_storage,
    default_artifacts,
    redacted,
    without_password,
    worker_id,
)
from autoprec.errors import AutoprecError, ModelError, SearchFailed, StudyError
from autoprec.isolation import FileLock, IsolatedMeasurer, Limits, MeasurerPool, TrialCrash, device_lock_path
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure import Screen, accuracy_loss, measure, screening_batches, time_interleaved
from autoprec.model import ModelInfo, analyse, declared_inputs, load_onnx
from autoprec.plan import Plan, Precision
from autoprec.plots import plot_result_dir
from autoprec.results import (
    ResultFiles,
    SearchResult,
    json_safe,
    load_json,
    model_json,
    plan_ignored,
    read_result_dir,
    timing_drift,
    units_json,
    write_results,
)
from autoprec.search import (
    StudyContext,
    choose,
    counted,
    default_study_name,
    finished_records,
    make_sampler,
    nothing_measured,
    open_study,
    RETIME_ROUNDS,
    rejected_trials,
    retimed_front,
    run_warm_started,
)
from autoprec.sensitivity import Sensitivity, analyse_sensitivity, cache_key, cached_sensitivity

from autoprec.search_space import SearchSpace, load_search_space, parse_precisions


def result_dir(out: str | os.PathLike | None, default_name: str) -> Path:
    """``--out``, or ``autoprec_out/<default_name>``: never the working directory or a folder above it
    (an empty ``--out``, or a model file named ``...onnx`` whose stem is ``..``, is not taken for one)."""
    if out is not None:
        if not str(out).strip():
            raise AutoprecError("--out '': empty; give a folder for the results, e.g. --out results/model")
        return Path(out)
    name = "".join(c if c.isprintable() and c not in "/\\" else "_" for c in default_name).strip()
    return Path("autoprec_out") / (name if name.strip(".") else "model")


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
    labels = dataset.labels[0] if dataset.labels else {}
    implied = [task for key, task in (("text", "ctc-text"), ("boxes", "detection")) if key in labels]
    metric = replace(metric, tasks=tuple(dict.fromkeys((*metric.tasks, *implied))))
    if "text" in labels and metric.options.charset is None and "character" in info.metadata:
        metric = replace(metric, options=replace(metric.options, charset=tuple(info.metadata["character"].splitlines())))
    return metric


def judge_for(metric: Metric, prepared: Prepared) -> tuple[Judge, dict]:
    """The judge of every candidate, checked on the FP32 outputs (a head it cannot decode, labels it
    lacks: one line, now); with what the result records of it (FP32 against the labels, notes)."""
    judge = Judge(metric, prepared.reference, prepared.dataset.labels)
    fp32 = judge.check()
    notes = judge.notes()
    for line in notes:
        console.note(line)
    if fp32:
        console.note("FP32 against the data's labels: " + "; ".join(
            f"{name} {', '.join(f'{k} {v:.4g}' for k, v in values.items())}" for name, values in fp32.items()))
    return judge, {"metric_tasks": metric.to_json(), "fp32_on_labels": fp32, "metric_notes": notes}


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
    image_mean: Sequence[float] = (0.0,),
    image_std: Sequence[float] = (1.0,),
) -> tuple[ModelInfo, Dataset, dict[str, float]]:
    """Analyse the model, load and split the data (the seconds each took)."""
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
    ranges = calibrate(info, dataset.calibration, fingerprint, cache) if needs_calibration(info) else None
    seconds["calibrate"] = time.monotonic() - t0
    where = f"; cached in {cache}" if cache else ""
    ready = "calibration ranges and FP32 reference" if ranges is not None else "FP32 reference (no INT8 searched: no calibration)"
    console.note(f"{ready} ready ({seconds['calibrate'] + seconds['reference']:.1f} s{where})")
    return Prepared(info, dataset, ranges, reference, seconds)


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
    image_mean: Sequence[float] = (0.0,),
    image_std: Sequence[float] = (1.0,),
    cache: Path | None = None,
) -> Prepared:
    """Analyse the model, load and split the data, calibrate, compute the FP32 reference."""
    return prepare_reference(*load_inputs(model_path, space, data, shapes, seed, image_mean, image_std), cache)


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
    precisions: Sequence[str] | None = None,
    device: int = 0,
    sampler: str = "tpe",
    warm_start: bool = True,
    early_reject: bool = True,
    build_workers: int | None = None,
    heartbeat: int = DEFAULT_HEARTBEAT,
    artifacts: str | os.PathLike | None = None,
    head: HeadOptions | None = None,
) -> SearchResult:
    """Search per-unit precisions for ``model`` and write the result directory.

    Example::

        result = autoprec.search("model.onnx", budget=50, data="samples/", max_loss=0.01)
        result = autoprec.search("zoo:ppocr-det", budget=50)  # a zoo model, with its own real data
        print(result.chosen.latency_ms, result.chosen.plan.counts())

    The study lives in ``storage`` (default: SQLite in ``out``), so calling this again with the
    same arguments resumes it: finished trials are kept, an interrupted one is re-run.

    Several processes or hosts (one per GPU: ``device``) given the same ``storage`` (PostgreSQL)
    and ``study_name`` work on one study: ``budget`` is the study's total, a plan is measured
    once, and the calibration ranges, FP32 reference and sensitivity are computed by the first
    worker and shared through Optuna's artifact store in ``artifacts`` (a directory every worker
    reaches; default: beside a SQLite storage, else in this host's autoprec cache). A worker's running
    trial beats a heartbeat every ``heartbeat`` seconds; one silent for four beats is failed and
    re-run once by another worker.

    Each candidate is built and measured in a worker process (``isolate``) limited to
    ``trial_timeout`` seconds and ``trial_memory_gb`` (default 75 % of RAM): a crash, hang or
    out-of-memory fails that trial, with its cause recorded, and the study goes on.

    ``precisions`` limits what any unit may take (default: those the engine runs faster than
    FP32; ort-cuda leaves INT8 out). ``device`` is the GPU index for GPU engines.

    The search starts with a sensitivity pass (each unit lowered alone; ``warm_start``) whose
    ranking seeds the study, then ``sampler`` explores. With ``max_loss``, a candidate whose loss
    on the first quarter of the evaluation batches is far past the limit is rejected there
    (``early_reject``): pruned, counted against the budget, kept in the results.

    ``metric`` is the loss the limit constrains: a similarity to the FP32 outputs (cosine, rel_l2,
    max_abs), a task metric (top1, ctc-text, detection, embedding: what the model decides, as FP32
    decides it), ``TASK@labels`` (the drop against the data's ground truth), or ``module:function``.
    Every other metric that applies is recorded beside it; ``head`` says how to decode outputs
    whose shape does not (CTC blank and dictionary, YOLO layout, thresholds, which output).

    ``build_workers`` worker processes measure candidates side by side: their builds overlap while a
    device lock lets one candidate at a time be evaluated and timed. Default: the engine's (2 for
    TensorRT, whose builds are slow; 1 for ONNX Runtime, whose builds are cheap and, on the CPU or
    at small batch on the GPU, would disturb the timed candidate).
    """
    started = time.monotonic()
    for option, value in (("--study-name", study_name), ("--artifacts", artifacts), ("--storage", storage)):
        if value is not None and not str(value).strip():
            raise AutoprecError(f"{option} '': empty; give a value or leave the option out for the default")
    if budget < 1:
        raise AutoprecError(f"--budget {budget}: must be at least 1 (the number of trials to run)")
    if calibration not in (*CALIBRATION_METHODS, "auto"):
        raise AutoprecError(f"--calibration {calibration!r}: choose auto or one of {', '.join(CALIBRATION_METHODS)}")
    model_path, data, shapes, default_out = resolve_model(model, data, shapes)
    out_dir = result_dir(out, default_out)
    wanted = resolve_metric(metric, declared_tasks(model), head)
    engine = get_backend(backend, device, out_dir / "cache")
    workers = _build_workers(build_workers, engine, isolate)
    space, searched, left_out = _engine_space(load_search_space(search_space).with_overrides(list(overrides)), engine, precisions)
    _check_out_dir(out_dir)
    for folder in (out_dir, out_dir / "best", out_dir / "cache"):
        atomic.remove_stale(folder)
    info, dataset, one_time = load_inputs(model_path, space, data, shapes, seed, image_mean, image_std)
    fingerprint = dataset.fingerprint()
    metric_used = metric_for(wanted, info, dataset)

    engine_info = engine.info()
    storage_url = storage or f"sqlite:///{(out_dir / 'study.db').resolve()}"
    check_storage(storage_url)
    name = study_name or default_study_name(model_path, backend)
    identity = {
        "model_sha256": info.sha256,
        "backend": backend,
        "data": fingerprint,
        "metric": metric_used.describe(),
        "units": len(info.units),
        "calibration": calibration,
        "max_loss": max_loss,
        "precisions": searched,
        "search_space": space.digest(),
        "shapes": {i.name: list(i.shape) for i in info.inputs},
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    locks = StudyLocks(storage_url, name)
    # Trials in flight elsewhere too (threads here, or other workers of a --storage): TPE's constant liar.
    parallel = workers > 1 or storage is not None
    me = worker_id(device if backend != "ort-cpu" else None)
    with locks.hold("identity"):  # two workers starting a new study at once agree on one identity
        study = open_study(storage_url, name, identity, make_sampler(sampler, seed, parallel), heartbeat)
        if study.get_trials(deepcopy=False) or "budget" in study.user_attrs:
            # joining (or resuming) a study: a seed of its own, or workers sharing one history propose alike
            study.sampler = make_sampler(sampler, zlib.crc32(f"{seed}:{me}".encode()), parallel)
        study.set_user_attr("budget", budget)  # for `autoprec status`; each worker stops at its own --budget
    shared = SharedInputs(study, Path(artifacts) if artifacts else default_artifacts(storage_url))
    cache = out_dir / "cache"
    with shared.once(locks, "reference", shared_files(info, dataset, cache), me) as fetched:
        if fetched:
            console.note(f"study {name!r}: calibration ranges and FP32 reference from its artifact store ({shared.store_dir})")
        prepared = prepare_reference(info, dataset, one_time, cache)
    ranges = prepared.ranges
    judge, judged = judge_for(metric_used, prepared)
    ranking = judge.for_ranking()
    one_time = dict(prepared.seconds)
    trials_now = study.get_trials(deepcopy=False)
    done = sum(counted(t) for t in trials_now)
    running = [t.number for t in trials_now if t.state == optuna.trial.TrialState.RUNNING]
    if done or running:
        console.note(f"joining study {name!r}: {done} of {budget} trials done"
                     + (f"; trial(s) {', '.join(map(str, running))} running elsewhere (a dead worker's is re-run "
                        f"after {GRACE_BEATS * heartbeat} s without a heartbeat)" if running else ""))
    screen = Screen.for_search(max_loss, len(dataset.evaluation)) if early_reject else None
    screened = screening_batches(len(dataset.evaluation))
    with contextlib.ExitStack() as stack:
        if isolate:
            limits = Limits.default(trial_timeout, trial_memory_gb, workers)
            lock = FileLock(device_lock_path(backend, device)).check()
            measurers = [
                stack.enter_context(IsolatedMeasurer(
                    backend, dataset.evaluation, judge, limits,
                    out_dir / "cache" / f"worker{'' if i == 0 else f'-{i}'}-stderr.log", device, out_dir / "cache", lock,
                ))
                for i in range(workers)
            ]
            measurer, pool = measurers[0], MeasurerPool(measurers)
            t0 = time.monotonic()
            try:
                for each in measurers:
                    each.start()
            except TrialCrash as exc:
                raise AutoprecError(f"the worker that measures candidates did not start ({exc}); give it more room "
                                    "(--trial-memory, at least 1 GB) or check the engine's installation") from None
            one_time["worker_start"] = time.monotonic() - t0
            time_models = measurer.time_interleaved

            def measure_candidate(model):
                return pool.measure(model, screen)

            def loss_of(model):
                return measurer.accuracy_loss(model, screened)
            memory = f"{limits.memory_bytes / 2**30:.2f} GiB" if limits.memory_bytes else "no memory limit"
            console.note(f"each candidate runs in a worker process (limits: {limits.seconds:g} s, {memory})")
            if workers > 1:
                console.note(f"{workers} workers: candidates are built side by side; evaluation and timing hold "
                             f"{engine_info.device} one candidate at a time")
        else:
            def measure_candidate(model):
                return measure(engine, model, dataset.evaluation, judge, screen)

            def loss_of(model):
                return accuracy_loss(engine, model, dataset.evaluation[:screened], ranking)

            def time_models(models, rounds):
                return time_interleaved(engine, models, dataset.evaluation[0], rounds)

            console.warn("--no-isolation: candidates run in this process; an engine crash ends the search (resume with the same command)")
        ctx = StudyContext(info, engine, ranges, measure_candidate, calibration, max_loss, locks, me)
        unit_sensitivity, from_cache = None, False
        if warm_start:
            if ranking is not judge:
                console.note(f"sensitivity: units are ranked by their cosine loss (the constraint, {metric_used.name}, "
                             "changes few decisions on a quarter of the data: too coarse to rank units by)")
            with shared.once(locks, "sensitivity", [out_dir / "sensitivity.json"], me) as fetched:
                unit_sensitivity, from_cache = sensitivity_pass(
                    prepared, engine, loss_of, screened, ranking.metric.describe(), calibration,
                    out_dir / "sensitivity.json", progress
                )
            one_time["sensitivity"] = 0.0 if from_cache else unit_sensitivity.seconds
        if screen is not None:
            console.note(f"cheap rejection: a candidate with loss > {screen.reject_above:g} on the first "
                         f"{screen.batches} of {len(dataset.evaluation)} evaluation batches is not timed")
        console.note(f"engine: {engine_info.label()} ({engine_info.qdq_form} Q/DQ form)")
        if engine_info.caveat:
            console.warn(engine_info.caveat)
        with console.SearchProgress(budget, min(done, budget), max_loss, enabled=progress) as bar:
            warm, slow = run_warm_started(study, ctx, budget, unit_sensitivity, on_trial=bar.update, workers=workers)
        if unit_sensitivity is not None:
            console.note(f"warm start: {len(warm)} plan(s) from the sensitivity ranking were queued"
                         + (f" (none lowering to {' or '.join(slow)}: not faster than FP32 on this engine)"
                            if slow else ""))
        trials = finished_records(study)
        console.note(f"re-timing the front, the fastest plans within --max-loss and the all-FP32 plan: each built once, "
                     f"× {RETIME_ROUNDS} interleaved rounds")
        front, retimed = retimed_front(
            study, lambda plans: time_models([engine.lower(info, p, ranges) for p in plans], RETIME_ROUNDS), max_loss=max_loss
        )
    trials = [retimed.get(t.number, t) for t in trials]
    chosen = choose(front, max_loss)
    changed = decision_changes(metric_used, chosen.measurement.metrics) if chosen is not None else []
    for line in changed:
        console.warn(f"the chosen plan keeps {metric_used.name} within the limit, but on {line}")
    search_facts = {
        "budget": budget,
        "trials": len(trials),
        "metric": metric_used.name,
        **judged,
        "decision_changes": changed,
        "timing_drift": timing_drift(trials),
        "max_loss": max_loss,
        "seed": seed,
        "calibration": calibration,
        "study_name": name,
        "storage": redacted(storage_url),
        "data": dataset.source,
        "data_path": str(Path(data).resolve()) if data is not None else None,
        "data_fingerprint": fingerprint,
        "calibration_file": (str(calibration_cache(info, fingerprint, cache).relative_to(out_dir))
                             if ranges is not None else None),
        "image_norm": {"mean": list(image_mean), "std": list(image_std)},
        "random_data": dataset.random,
        "batches": {"calibration": len(dataset.calibration), "evaluation": len(dataset.evaluation)},
        "search_space": space.to_json(),
        "precisions": searched,
        "left_out": left_out,
        "wall_seconds": round(time.monotonic() - started, 2),
        "one_time_seconds": {k: round(v, 3) for k, v in one_time.items()},
        "sampler": type(study.sampler).__name__,
        "build_workers": workers,
        "sensitivity": None if unit_sensitivity is None else {
            "evaluations": unit_sensitivity.evaluations, "batches": unit_sensitivity.batches,
            "seconds": round(unit_sensitivity.seconds, 2),
            "from_cache": from_cache, "warm_start_plans": len(warm), "ranked_by": ranking.metric.name,
        },
        "early_reject": None if screen is None else {"batches": screen.batches, "reject_above": screen.reject_above},
        "rejected": rejected_trials(study),
        "plan_ignored": [t.number for t in trials if plan_ignored(t)],
    }
    if search_facts["plan_ignored"]:
        console.warn(f"{engine_info.engine} did not run some units at their planned precision in trial(s) "
                     f"{', '.join(map(str, search_facts['plan_ignored']))}: see 'build.plan_fidelity' in trials.json")
    result = SearchResult(out_dir, model_json(info), engine_info, search_facts, tuple(trials), tuple(front), chosen, units_json(info))
    chosen_model = tensorrt_model = None
    if chosen is not None:
        chosen_model = engine.lower(info, chosen.plan, ranges)
        if engine.qdq_form is not QDQForm.TENSORRT and chosen.plan.counts()["int8"]:
            tensorrt_model = lower_plan(info, chosen.plan, ranges, QDQForm.TENSORRT)
    write_results(result, chosen_model, tensorrt_model)
    plot_result_dir(read_result_dir(out_dir))
    if not trials:
        raise SearchFailed(nothing_measured(study, out_dir))
    return result


def _build_workers(requested: int | None, engine: Backend, isolate: bool) -> int:
    """How many candidates are measured side by side (see ``search``'s ``build_workers``)."""
    if requested is not None and requested < 1:
        raise AutoprecError(f"--build-workers {requested}: must be at least 1")
    if not isolate:
        if requested and requested > 1:
            raise AutoprecError(f"--build-workers {requested} needs worker processes; drop --no-isolation")
        return 1
    if requested is None:
        return engine.default_build_workers
    if requested > engine.default_build_workers:
        console.warn(f"--build-workers {requested} on {engine.name}: a build beside the timed candidate can disturb its "
                     "latency (it shares the CPU that runs or launches it); see benchmarks/parallel_builds.py")
    return requested


def sensitivity_pass(
    prepared: Prepared, engine: Backend, loss_of, batches: int, metric: str, calibration: str, path: Path, progress: bool
) -> tuple[Sensitivity, bool]:
    """The sensitivity of every searchable unit, read from ``path`` when it was measured the same way."""
    method = DEFAULT_CALIBRATION if calibration == "auto" else calibration
    key = cache_key(prepared.info, engine, prepared.dataset.fingerprint(), metric, method, batches)
    steps = sum(len(u.allowed) - 1 for u in prepared.info.searchable_units)
    with console.StepProgress("sensitivity", steps, enabled=progress) as bar:
        found, from_cache = cached_sensitivity(path, key, lambda: analyse_sensitivity(
            prepared.info, engine, prepared.ranges, loss_of, prepared.dataset.evaluation[0], batches, method, bar.update
        ))
    if from_cache:
        console.note(f"sensitivity: read from {path} (same model, data, engine and space)")
    else:
        console.note(f"sensitivity: {found.evaluations} one-unit plans evaluated on {batches} batch(es) in {found.seconds:.1f} s")
    if found.failed:
        every = found.failed == found.evaluations
        console.warn(f"sensitivity: {'every one' if every else f'{found.failed} of {found.evaluations}'} of the one-unit "
                     f"plans failed (first: {found.first_error})"
                     + ("; no warm start comes from it" if every else "; those units stay FP32 in the warm start"))
    return found, from_cache


def sensitivity(
    model: str | os.PathLike,
    data: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    backend: str = "ort-cpu",
    shapes: Mapping[str, Sequence[int]] | None = None,
    metric: str = "cosine",
    search_space: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    calibration: str = DEFAULT_CALIBRATION,
    image_mean: Sequence[float] = (0.0,),
    image_std: Sequence[float] = (1.0,),
    precisions: Sequence[str] | None = None,
    device: int = 0,
    progress: bool = True,
    head: HeadOptions | None = None,
) -> tuple[Sensitivity, Path]:
    """Each unit lowered alone to each precision it may take: loss, and its share of FP32 latency.

    Writes ``sensitivity.json`` and ``sensitivity.png`` in ``out`` (the same files a search writes
    there, so a later search with the same settings reuses them).
    """
    from autoprec.plots import plot_sensitivity

    model_path, data, shapes, default_out = resolve_model(model, data, shapes)
    out_dir = result_dir(out, default_out)
    wanted = resolve_metric(metric, declared_tasks(model), head)
    engine = get_backend(backend, device, out_dir / "cache")
    if caveat := engine.info().caveat:
        console.warn(caveat)
    space, _, _ = _engine_space(load_search_space(search_space).with_overrides(list(overrides)), engine, precisions)
    _check_out_dir(out_dir)
    prepared = prepare(model_path, space, data, shapes, 0, image_mean, image_std, out_dir / "cache")
    batches = screening_batches(len(prepared.dataset.evaluation))
    metric_used = metric_for(wanted, prepared.info, prepared.dataset)
    ranking = judge_for(metric_used, prepared)[0].for_ranking()
    evaluation = prepared.dataset.evaluation[:batches]
    found, _ = sensitivity_pass(
        prepared, engine, lambda m: accuracy_loss(engine, m, evaluation, ranking),
        batches, ranking.metric.describe(), calibration, out_dir / "sensitivity.json", progress,
    )
    plot_sensitivity(found.to_json(), model_path.name, out_dir / "sensitivity.png")
    return found, out_dir


def _engine_space(
    space: SearchSpace, engine: Backend, precisions: Sequence[str] | None
) -> tuple[SearchSpace, list[str], dict[str, str]]:
    """The space narrowed to ``precisions``, or to what ``engine`` runs faster than FP32; says what was left out and why."""
    if precisions is None:
        keep = [p for p in Precision if p not in engine.slow_precisions]
        left_out = {p.value: why for p, why in engine.slow_precisions.items()}
        for p, why in left_out.items():
            console.note(f"{engine.name}: {p} left out of the search ({why}); include it with --precisions int8,fp16,fp32")
    else:
        keep = list(parse_precisions(list(precisions), "--precisions"))
        left_out = {p.value: "not in --precisions" for p in Precision if p not in keep and p is not Precision.FP32}
        for p in keep:
            if p in engine.slow_precisions:
                console.warn(f"{engine.name}: {p} searched as asked, but {engine.slow_precisions[p]}")
    searched = [p.value for p in Precision if p in keep or p is Precision.FP32]
    return space.restricted(keep), searched, left_out


def load_plan(path: str | os.PathLike) -> Plan:
    """A plan file: best/plan.json of a result, or a bare plan ({"precisions": ..., "calibration": ...})."""
    try:
        data = load_json(Path(path))
        plan = data.get("plan", data)
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
    trial: int | None = None  # the result's trial the plan is, where it is one


def _recorded(result: ResultFiles, key: str, where: dict, nullable: bool = False):
    """``where[key]`` of a result's record; one line when an older result does not record it."""
    if key not in where or (where[key] is None and not nullable):
        raise AutoprecError(f"{result.out_dir}: its result files do not record {key!r} (written by an older autoprec); "
                            "rerun the search to re-create, check or export its plans")
    return where[key]


def recreate(result: ResultFiles, data: str | os.PathLike | None = None,
             shapes: Mapping[str, Sequence[int]] | None = None) -> Prepared:
    """The analysis a search measured with, exactly: its model (checked against the recorded sha256,
    external data included), search space and overrides, input shapes, data split (seed) and
    normalisation, and its calibration ranges. ``data`` replaces the evaluation data only: the
    INT8 scales stay those the search calibrated. Anything that differs is refused with one line."""
    facts, model = result.pareto["search"], result.pareto["model"]
    path, sha256 = Path(_recorded(result, "path", model)), _recorded(result, "sha256", model)
    space = SearchSpace.from_json(_recorded(result, "search_space", facts))
    recorded_shapes = {name: tuple(spec["shape"]) for name, spec in _recorded(result, "inputs", model).items()}
    if shapes and {k: tuple(v) for k, v in shapes.items()} != {k: recorded_shapes[k] for k in shapes if k in recorded_shapes}:
        raise AutoprecError(f"--shape: {result.out_dir} was searched at "
                            + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in recorded_shapes.items())
                            + "; its plans are measured at those shapes (search again for others)")
    norm = facts.get("image_norm") or {"mean": [0.0], "std": [1.0]}
    recorded_data, fingerprint = facts.get("data_path"), _recorded(result, "data_fingerprint", facts)
    info, dataset, seconds = load_inputs(path, space, data if data is not None else recorded_data, recorded_shapes,
                                         int(_recorded(result, "seed", facts)), norm["mean"], norm["std"])
    if info.sha256 != sha256:
        raise AutoprecError(f"{path}: not the model {result.out_dir} was searched with (sha256 {info.sha256[:12]}…, "
                            f"recorded {str(sha256)[:12]}…; its weights or external data changed): restore that model "
                            "or search again")
    same_data = dataset.fingerprint() == fingerprint
    if data is None and not same_data:
        raise AutoprecError(f"{recorded_data or 'the random data'}: not the data {result.out_dir} was searched with "
                            "(its content changed): restore it, or pass --data to evaluate on other data")
    cache = result.out_dir / "cache"
    calibration_file = _recorded(result, "calibration_file", facts, nullable=True)  # None: no INT8 was searched
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
    return Prepared(info, dataset, ranges, reference, seconds)


def plan_context(
    target: str | os.PathLike, plan: str | os.PathLike | None = None, trial: int | None = None,
    data: str | os.PathLike | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
) -> PlanContext:
    """A result directory (its chosen plan, --trial N, or --plan) re-created as it was searched
    (:func:`recreate`); or MODEL + --plan, analysed with the default space on ``data``."""
    target = Path(target)
    if not target.is_dir():
        if plan is None:
            raise AutoprecError(f"{target}: give --plan PLAN.json (or a result directory instead of the model)")
        prepared = prepare(target, load_search_space(), data, shapes)
        return PlanContext(_fits(load_plan(plan), prepared.info, f"--plan {plan}"), prepared)
    result = read_result_dir(target)
    if trial is not None:
        found = result.trial(trial)
        if found is None:
            raise AutoprecError(f"--trial {trial}: {target} has no finished trial {trial}; see autoprec show {target}")
        chosen, number = Plan.from_json(found["plan"]), trial
    elif plan is not None:
        chosen, number = load_plan(plan), None
    elif result.plan is not None:
        chosen, number = Plan.from_json(result.plan["plan"]), result.plan["trial"]
    else:
        raise AutoprecError(f"{target}: no chosen plan; pass --trial N (see autoprec show {target})")
    prepared = recreate(result, data, shapes)
    return PlanContext(_fits(chosen, prepared.info, f"--plan {plan}" if plan is not None else str(target)), prepared, number)


def diagnose_plan(
    target: str | os.PathLike,
    plan: str | os.PathLike | None = None,
    trial: int | None = None,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    backend: str = "ort-cpu",
    batches: int = 4,
    out: str | os.PathLike | None = None,
) -> tuple[list, Path]:
    """Layer-wise error of a plan; writes diagnosis.json and error_by_layer.png (see autoprec.diagnose)."""
    from autoprec.diagnose import diagnose, plot_errors

    context = plan_context(target, plan, trial, data, shapes)
    prepared, found, model_path = context.prepared, context.plan, context.prepared.info.path
    engine = get_backend(backend)
    rows = diagnose(prepared.info, engine, prepared.ranges, found, list(prepared.dataset.evaluation)[:batches])
    out_dir = Path(target) if out is None and Path(target).is_dir() else result_dir(out, model_path.stem)
    label = f"trial {trial}" if trial is not None else "plan"
    atomic.write_json(out_dir / "diagnosis.json", json_safe({
        "model": str(model_path), "engine": engine.info().to_json(), "plan": found.to_json(),
        "batches": min(batches, len(prepared.dataset.evaluation)), "units": [r.to_json() for r in rows],
    }))
    title = f"{model_path.name} · {label} ({found.counts()['int8']} int8 / {found.counts()['fp16']} fp16) · {engine.info().label()}"
    plot_errors(rows, title, out_dir / "error_by_layer.png")
    return rows, out_dir


def activation_report(
    model: str | os.PathLike, data: str | os.PathLike | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
    entropy: bool = False, image_mean: Sequence[float] = (0.0,), image_std: Sequence[float] = (1.0,),
) -> list[dict]:
    """Per-tensor activation statistics from calibration (see autoprec.diagnose.activation_ranges)."""
    from autoprec.diagnose import FAST_METHODS, activation_ranges

    model_path, data, shapes, _ = resolve_model(model, data, shapes)
    prepared = prepare(model_path, load_search_space(), data, shapes, 0, image_mean, image_std)
    methods = CALIBRATION_METHODS if entropy else FAST_METHODS
    return activation_ranges(prepared.info, prepared.ranges, methods)


def check_plan(
    target: str | os.PathLike,
    plan: str | os.PathLike | None,
    max_loss: float,
    latency_budget_ms: float | None = None,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    backend: str = "ort-cpu",
    metric: str = "cosine",
    head: HeadOptions | None = None,
) -> dict:
    """Re-measure a saved plan; ``passed`` is False when accuracy or latency regress past the limits."""
    wanted = resolve_metric(metric, (), head)
    context = plan_context(target, plan, None, data, shapes)
    prepared, found, model_path = context.prepared, context.plan, context.prepared.info.path
    engine = get_backend(backend)
    judge, _ = judge_for(metric_for(wanted, prepared.info, prepared.dataset), prepared)
    result = measure(engine, engine.lower(prepared.info, found, prepared.ranges), prepared.dataset.evaluation, judge)
    failures = []
    if not result.loss <= max_loss:
        failures.append(f"accuracy loss {result.loss:.4g} > --max-loss {max_loss:g}")
    if latency_budget_ms is not None and result.latency.median_ms > latency_budget_ms:
        failures.append(f"latency {result.latency.median_ms:.4g} ms > --latency-budget {latency_budget_ms:g} ms")
    return {
        "passed": not failures, "failures": failures, "model": str(model_path), "engine": engine.info().to_json(),
        "metric": wanted.name, "max_loss": max_loss, "latency_budget_ms": latency_budget_ms,
        "measurement": result.to_json(), "plan": found.to_json(),
    }


def lowered_for_export(result_dir: str | os.PathLike, trial: int | None = None) -> tuple[onnx.ModelProto, str, str]:
    """The measured model of a result's chosen plan (best/model.onnx) or of --trial N (lowered again)."""
    result = read_result_dir(result_dir)
    stem = Path(result.pareto["model"]["path"]).stem
    engine = result.pareto["engine"]
    if trial is None:
        if result.plan is None:
            raise AutoprecError(f"{result_dir}: no chosen plan to export; pass --trial N")
        note = f"autoprec: trial {result.plan['trial']} (chosen), measured on {engine['engine']} {engine['provider']}"
        return onnx.load(str(Path(result_dir) / "best" / "model.onnx")), note, stem
    context = plan_context(result_dir, trial=trial)
    model = lower_plan(context.prepared.info, context.plan, context.prepared.ranges, QDQForm(engine["qdq_form"]))
    return model, f"autoprec: trial {trial}, measured on {engine['engine']} {engine['provider']}", stem


def tensorrt_build_spec(result_dir: str | os.PathLike, trial: int | None = None) -> BuildSpec:
    """A result's chosen plan (or --trial N) with what a TensorRT build of it needs: the plan in
    TensorRT's Q/DQ form, its units, calibrated ranges, and the measured figures."""
    from autoprec.backends.tensorrt import stamp_plan  # the TensorRT backend module only where TensorRT is meant

    result = read_result_dir(result_dir)
    context = plan_context(result_dir, trial=trial)
    prepared, plan, model_path = context.prepared, context.plan, context.prepared.info.path
    fp32 = result.pareto.get("uniform", {}).get("fp32")
    return BuildSpec(
        name=model_path.stem, original_model=model_path,
        model=stamp_plan(lower_plan(prepared.info, plan, prepared.ranges, QDQForm.TENSORRT), prepared.info, plan),
        plan=plan, info=prepared.info,
        ranges=prepared.ranges, trial=result.trial(context.trial), fp32_trial=result.trial(fp32) if fp32 is not None else None,
        engine=result.pareto["engine"], search=result.pareto["search"],
    )


def study_status(storage: str, study_name: str) -> dict:
    """A (shared) study as its storage holds it (see :func:`autoprec.coordination.study_status`). Reads
    only: a missing SQLite file is refused, not created."""
    from autoprec.coordination import study_status as status_of

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_storage(storage, existing=True)
    locks = StudyLocks(storage, study_name)
    try:
        # not while a worker creates the schema; a study no worker ever locked has none being made
        with locks.hold("identity") if locks.ever_held else contextlib.nullcontext():
            study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise StudyError(f"no study {study_name!r} in {redacted(storage)}; see the --study-name a search printed") from None
    except AutoprecError:
        raise
    except Exception as exc:  # SQLAlchemy and Optuna raise many types for a bad URL
        first = without_password((str(exc).strip().splitlines() or [""])[0], storage)
        raise StudyError(f"--storage {redacted(storage)}: cannot be opened ({type(exc).__name__}: {first})") from None
    return status_of(study)

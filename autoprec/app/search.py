"""``autoprec search`` and ``autoprec sensitivity``: model file -> analysis -> calibration -> Optuna study -> result directory."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import optuna

from autoprec.analysis.calibrate import ActivationRanges, calibration_cache
from autoprec.analysis.data import Dataset
from autoprec.analysis.model import ModelInfo
from autoprec.app.config import SearchConfig
from autoprec.app.prepare import (
    Prepared,
    check_out_dir,
    declared_tasks,
    judge_for,
    load_inputs,
    metric_for,
    prepare,
    prepare_reference,
    resolve_model,
    result_dir,
    shared_files,
)
from autoprec.backends import Backend, get_backend
from autoprec.core import atomic
from autoprec.core.errors import AutoprecError, SearchFailed
from autoprec.core.plan import DEFAULT_CALIBRATION, Plan, Precision
from autoprec.core.search_space import SearchSpace, load_search_space, parse_precisions
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.accuracy import HeadOptions, decision_changes, resolve_metric
from autoprec.measure import speedup
from autoprec.measure.deployment import CHECKED_BATCHES, Deployment, ProfileTiming, deploy, time_across
from autoprec.measure.isolation import (
    FileLock,
    IsolatedMeasurer,
    Limits,
    MeasurerPool,
    TrialCrash,
    device_lock_path,
)
from autoprec.measure.measurement import (
    InProcessMeasurer,
    Lowering,
    Measurer,
    Screen,
    screening_batches,
)
from autoprec.results import console
from autoprec.results.files import (
    SearchResult,
    model_json,
    plan_ignored,
    read_result_dir,
    timing_drift,
    units_json,
    write_results,
)
from autoprec.results.plots import plot_result_dir
from autoprec.study.coordination import (
    GRACE_BEATS,
    SharedInputs,
    StudyLocks,
    check_storage,
    default_artifacts,
    redacted,
    worker_id,
)
from autoprec.study.proposals import Proposer
from autoprec.study.search import (
    RETIME_ROUNDS,
    StudyContext,
    built_trials,
    choose,
    counted,
    default_study_name,
    finished_records,
    make_sampler,
    nothing_measured,
    on_profile_build,
    open_study,
    rejected_trials,
    Retiming,
    TrialRecord,
    retimed_front,
    uniform_trials,
    run_warm_started,
)
from autoprec.study.sensitivity import (
    Sensitivity,
    analyse_sensitivity,
    cache_key,
    cached_sensitivity,
    searched_sensitive,
)

log = logging.getLogger("autoprec")


def search(model: str | os.PathLike, **options: Any) -> SearchResult:
    """Search per-unit precisions for ``model`` and write the result directory. ``options`` are
    :class:`~autoprec.app.config.SearchConfig`'s fields, checked once there.

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

    ``shapes`` (``--shape``) fix each input's shape for measuring: the profile's opt. ``min_shapes`` and
    ``max_shapes`` bound the shapes the model is deployed at: best/model.onnx keeps the source's dynamic
    dims and is checked against the given model at min, opt and max; the exports carry the profile.
    ``time_shapes`` also times the front's plans there, as deployed.

    ``constants`` feed inputs one fixed value each (``{"sr": 16000}``): a scalar setting such as a
    sample rate, which random data cannot choose and the data need not hold.

    ``build_workers`` worker processes measure candidates side by side: their builds overlap while a
    device lock lets one candidate at a time be evaluated and timed. Default: the engine's (2 for
    TensorRT, whose builds are slow; 1 for ONNX Runtime, whose builds are cheap and, on the CPU or
    at small batch on the GPU, would disturb the timed candidate).
    """
    return run_search(SearchConfig(model=model, **options).checked())


def run_search(config: SearchConfig) -> SearchResult:
    """:func:`search` for a checked configuration."""
    started = time.monotonic()
    model, budget, data, out = config.model, config.budget, config.data, config.out
    backend, max_loss, seed, storage = config.backend, config.max_loss, config.seed, config.storage
    study_name, shapes, metric, search_space = config.study_name, config.shapes, config.metric, config.search_space
    overrides, calibration, image_mean, image_std = config.overrides, config.calibration, config.image_mean, config.image_std
    progress, isolate, trial_timeout, trial_memory_gb = config.progress, config.isolate, config.trial_timeout, config.trial_memory_gb
    precisions, device, sampler, warm_start = config.precisions, config.device, config.sampler, config.warm_start
    tie_repeats = config.tie_repeats
    early_reject, build_workers, heartbeat, artifacts = config.early_reject, config.build_workers, config.heartbeat, config.artifacts
    head, constants, proposals = config.head, config.constants, config.proposals
    model_path, data, shapes, default_out = resolve_model(model, data, shapes)
    out_dir = result_dir(out, default_out)
    wanted = resolve_metric(metric, declared_tasks(model), head)
    engine = get_backend(backend, device, out_dir / "cache", config.threads)
    workers = _build_workers(build_workers, engine, isolate)
    space, searched, left_out = engine_space(load_search_space(search_space).with_overrides(list(overrides)), engine, precisions)
    check_out_dir(out_dir)
    for folder in (out_dir, out_dir / "best", out_dir / "cache"):
        atomic.remove_stale(folder)
    info, dataset, one_time = load_inputs(model_path, space, data, shapes, seed, image_mean, image_std, constants,
                                          cache=out_dir / "cache", bounds=(config.min_shapes or {}, config.max_shapes or {}))
    info = repeats_decided(info, tie_repeats)
    _say_pinned_ops(info, engine, left_out)
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
        "tie_repeats": tie_repeats,
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
            log.info(f"study {name!r}: calibration ranges and FP32 reference from its artifact store ({shared.store_dir})")
        prepared = prepare_reference(info, dataset, one_time, cache)
    info, ranges = prepared.info, prepared.ranges  # info: with the units the data never runs pinned
    judge, judged = judge_for(metric_used, prepared)
    ranking = judge.for_ranking()
    one_time = dict(prepared.seconds)
    trials_now = study.get_trials(deepcopy=False)
    done = sum(counted(t) for t in trials_now)
    running = [t.number for t in trials_now if t.state == optuna.trial.TrialState.RUNNING]
    if done or running:
        log.info(f"joining study {name!r}: {done} of {budget} trials done"
                     + (f"; trial(s) {', '.join(map(str, running))} running elsewhere (a dead worker's is re-run "
                        f"after {GRACE_BEATS * heartbeat} s without a heartbeat)" if running else ""))
    screen = Screen.for_search(max_loss, len(dataset.evaluation)) if early_reject else None
    screened = screening_batches(len(dataset.evaluation))
    method = DEFAULT_CALIBRATION if calibration == "auto" else calibration
    lowering = Lowering(info, ranges.with_thresholds(method) if ranges is not None else None)  # only plans travel
    with contextlib.ExitStack() as stack:
        if isolate:
            limits = Limits.default(trial_timeout, trial_memory_gb, workers)
            lock = FileLock(device_lock_path(backend, device)).check()
            measurers = [
                stack.enter_context(IsolatedMeasurer(
                    backend, dataset.evaluation, judge, limits,
                    out_dir / "cache" / f"worker{'' if i == 0 else f'-{i}'}-stderr.log", device, out_dir / "cache", lock,
                    lowering, config.threads,
                ))
                for i in range(workers)
            ]
            measurer: Measurer = MeasurerPool(measurers)
            t0 = time.monotonic()
            try:
                for each in measurers:
                    each.start()
            except TrialCrash as exc:
                raise AutoprecError(f"the worker that measures candidates did not start ({exc}); give it more room "
                                    "(--trial-memory, at least 1 GB) or check the engine's installation") from None
            one_time["worker_start"] = time.monotonic() - t0
            memory = f"{limits.memory_bytes / 2**30:.2f} GiB" if limits.memory_bytes else "no memory limit"
            log.info(f"each candidate runs in a worker process (limits: {limits.seconds:g} s, {memory})")
            if workers > 1:
                log.info(f"{workers} workers: candidates are built side by side; evaluation and timing hold "
                             f"{engine_info.device} one candidate at a time")
        else:
            measurer = InProcessMeasurer(engine, dataset.evaluation, judge, ranking, lowering)
            log.warning("--no-isolation: candidates run in this process; an engine crash ends the search (resume with the same command)")
        ctx = StudyContext(info, engine, ranges, lambda plan: measurer.measure(plan, screen), calibration, max_loss, locks, me)
        per_build = engine.default_proposals if proposals is None else proposals
        reference, executor, judged_on_target = _reference_executor(engine, measurer, per_build, ctx, dataset, judge, ranking,
                                                                    limits if isolate else None, out_dir / "cache", stack,
                                                                    lowering)
        unit_sensitivity, from_cache = None, False
        if warm_start:
            if ranking is not judge:
                log.info(f"sensitivity: units are ranked by their cosine loss (the constraint, {metric_used.name}, "
                             "changes few decisions on a quarter of the data: too coarse to rank units by)")
            with shared.once(locks, "sensitivity", [out_dir / "sensitivity.json"], me) as fetched:
                unit_sensitivity, from_cache = sensitivity_pass(
                    prepared, engine, lambda plan: reference.accuracy_loss(plan, screened), screened, ranking.metric.describe(), calibration,
                    out_dir / "sensitivity.json", progress
                )
            one_time["sensitivity"] = 0.0 if from_cache else unit_sensitivity.seconds
        info, sensitive_units = searched_sensitive(info, unit_sensitivity, max_loss)
        if sensitive_units["found"]:
            log.info(f"sensitive units (softmax, normalisations, reductions): {sensitive_units['searched']} of "
                     f"{sensitive_units['found']} searched, the rest kept FP32 ({sensitive_units['too_lossy']} lose more "
                     f"than the limit alone, {sensitive_units['no_gain']} save no time in the profile); "
                     f"{len(info.searchable_units)} unit(s) searched in all, {len(info.dimensions)} dimension(s)")
            ctx = replace(ctx, info=info)
        if screen is not None:
            log.info(f"cheap rejection: a candidate with loss > {screen.reject_above:g} on the first "
                         f"{screen.batches} of {len(dataset.evaluation)} evaluation batches is not timed")
        log.info(f"engine: {engine_info.label()} ({engine_info.qdq_form} Q/DQ form)")
        if engine_info.caveat:
            log.warning(engine_info.caveat)
        proposer = None
        if per_build:
            gains = {u.unit: dict(u.gain) for u in unit_sensitivity.units} if unit_sensitivity is not None else {}
            if any(gains.values()):
                with locks.hold("identity"):
                    proposer = Proposer.open(storage_url, name, identity, seed, ctx, lambda plan: reference.accuracy_loss(
                        plan, len(dataset.evaluation), constraint=True), gains, per_build)
                log.info(f"proposals: {per_build} plan(s) judged before each build, their loss by {executor}, their "
                         f"latency by a model fitted to {engine.name}'s profiles (refitted on every build)")
            else:
                log.warning(f"--proposals {per_build}: no per-unit profile of {engine.name} to predict latency from "
                            "(no sensitivity pass, or the engine has no profiler): every trial is built")
        with console.SearchProgress(budget, min(done, budget), max_loss, enabled=progress) as bar:
            warm, slow = run_warm_started(study, ctx, budget, unit_sensitivity, on_trial=bar.update, workers=workers,
                                          propose=proposer)
        if unit_sensitivity is not None:
            log.info(f"warm start: {len(warm)} plan(s) from the sensitivity ranking were queued"
                     + (" as proposals" if proposer is not None else "")
                         + (f" (none lowering to {' or '.join(slow)}: not faster than FP32 on this engine)"
                            if slow else ""))
        engine.drop_kept_builds()
        trials = finished_records(study)
        log.info(f"re-timing the front and the fastest plans within --max-loss, each beside the all-FP32 plan in "
                 f"{RETIME_ROUNDS} interleaved rounds (two engines alive at most)")
        front, retiming = retimed_front(study, measurer.time_paired, RETIME_ROUNDS, max_loss=max_loss)
        trials = [retiming.trials.get(t.number, t) for t in trials]
        chosen, versus = _compare_chosen(measurer, trials, choose(front, max_loss), config, retiming.apart)
    _say_retiming(retiming)
    if chosen is not None and chosen.number not in {t.number for t in front}:  # all-FP32, shipped for want of a proven gain
        front = sorted([*front, chosen], key=lambda r: r.latency_ms)
    builds = _builds(study, unit_sensitivity if not from_cache else None, retiming.builds, proposer, judged_on_target)
    predicted = proposer.report(study) if proposer is not None else None
    log.info(f"{engine.name} builds: {builds['total']} ({', '.join(f'{k} {v}' for k, v in builds['by_phase'].items())}"
             + (f"; {builds['trials_on_profile_builds']} trial(s) timed on the engine built for their profile"
                if builds["trials_on_profile_builds"] else "") + "); "
             f"reference evaluations: {builds['reference_evaluations']}"
             + (f"; latency model error {predicted['median_abs_error_percent']} % (median of {len(predicted['predictions'])} "
                "prediction(s) made before the build)" if predicted and predicted["predictions"] else ""))
    changed = decision_changes(metric_used, chosen.measurement.metrics) if chosen is not None else []
    for line in changed:
        log.warning(f"the chosen plan keeps {metric_used.name} within the limit, but on {line}")
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
        "constants": dict(constants or {}),
        "out_of_range": list(info.out_of_range),
        "random_data": dataset.random,
        "batches": {"calibration": len(dataset.calibration), "evaluation": len(dataset.evaluation)},
        "search_space": space.to_json(),
        "precisions": searched,
        "dimensions": len(info.dimensions),
        "tied_units": len(info.searchable_units) - len(info.dimensions),
        "tie_repeats": tie_repeats,
        "sensitive_units": sensitive_units,
        "left_out": left_out,
        "wall_seconds": round(time.monotonic() - started, 2),
        "one_time_seconds": {k: round(v, 3) for k, v in one_time.items()},
        "sampler": type(study.sampler).__name__,
        "build_workers": workers,
        "sensitivity": None if unit_sensitivity is None else {
            "evaluations": unit_sensitivity.evaluations, "batches": unit_sensitivity.batches,
            "seconds": round(unit_sensitivity.seconds, 2),
            "evaluation_seconds": round(unit_sensitivity.evaluation_seconds, 2),
            "from_cache": from_cache, "warm_start_plans": len(warm), "ranked_by": ranking.metric.name,
        },
        "early_reject": None if screen is None else {"batches": screen.batches, "reject_above": screen.reject_above},
        "retiming": {"rounds": RETIME_ROUNDS, **retiming.to_json()},
        "profile": info.shape_profile.to_json(),
        "rejected": rejected_trials(study),
        "engine_builds": builds["total"],
        "engine_builds_by_phase": builds["by_phase"],
        "trials_on_profile_builds": builds["trials_on_profile_builds"],
        "reference_evaluations": builds["reference_evaluations"],
        "reference": {"executor": executor, "proposals_per_build": per_build if proposer is not None else 0, **(predicted or {})},
        "plan_ignored": [t.number for t in trials if plan_ignored(t)],
    }
    if search_facts["plan_ignored"]:
        log.warning(f"{engine_info.engine} did not run some units at their planned precision in trial(s) "
                     f"{', '.join(map(str, search_facts['plan_ignored']))}: see 'build.plan_fidelity' in trials.json")
    deployment = _deployment(info, engine, chosen.plan, ranges, dataset) if chosen is not None else None
    if config.time_shapes and front:
        search_facts["profile_timing"] = _timed_across(info, engine, front, max_loss, ranges, dataset).to_json()
    result = SearchResult(out_dir, model_json(info), engine_info, search_facts, tuple(trials), tuple(front), chosen,
                          units_json(info), versus)
    write_results(result, deployment)
    plot_result_dir(read_result_dir(out_dir))
    if not trials:
        raise SearchFailed(nothing_measured(study, out_dir))
    return result


def _compare_chosen(measurer: Measurer, trials: Sequence[TrialRecord], chosen: TrialRecord | None, config: SearchConfig,
                    apart: bool) -> tuple[TrialRecord | None, dict[str, Any]]:
    """The chosen plan timed beside all-FP32 and the given model until its speed-ups are known (see
    :mod:`autoprec.measure.speedup`): the plan to ship (all-FP32 where the chosen one is not faster beyond
    timing noise, unless ``--ship-within-noise``) and pareto.json's ``chosen_vs_fp32`` / ``chosen_vs_source``."""
    fp32 = uniform_trials(trials).get("fp32")
    if chosen is None or fp32 is None:
        return chosen, {}
    log.info(f"timing the chosen plan (trial {chosen.number}) beside all-FP32 and the given model until the speed-ups "
             f"are known ({speedup.CONFIDENCE:.0%} interval within {speedup.NARROW:.0%}, or {config.retime_seconds:g} s)")
    try:
        found = speedup.compared(measurer.time_compared(fp32.plan, chosen.plan, config.retime_seconds, apart))
    except (AutoprecError, RuntimeError, ValueError) as exc:
        log.warning(f"the final timing failed ({exc}): the speed-up stands on the re-timing's {RETIME_ROUNDS} rounds")
        return chosen, {}
    versus_fp32, versus_source, preparation = found[("fp32", "chosen")], found.get(("source", "chosen")), found.get(("source", "fp32"))
    versus: dict[str, Any] = {}
    if chosen.plan.key() != fp32.plan.key() and not versus_fp32.beyond_timing_noise and not config.ship_within_noise:
        versus["not_shipped"] = {"trial": chosen.number, **versus_fp32.to_json(), "why": (
            f"not faster than all-FP32 beyond timing noise ({versus_fp32.label()}): best/ holds the all-FP32 plan "
            "(--ship-within-noise ships it anyway)")}
        log.warning(f"trial {chosen.number}: {versus['not_shipped']['why']}")
        chosen, versus_source = fp32, preparation
    versus["chosen_vs_fp32"] = {"fp32_trial": fp32.number, **versus_fp32.to_json(), "retimed": True} \
        if chosen is not fp32 else None
    if versus_source is not None:
        versus["chosen_vs_source"] = {**versus_source.to_json(), "preparation": preparation.to_json()}
    return chosen, versus


def _deployment(info: ModelInfo, engine: Backend, plan: Plan, ranges: ActivationRanges | None, dataset: Dataset) -> Deployment:
    """The chosen plan as best/ ships it (the source's dims kept where it can be), checked across the profile."""
    tensorrt = None
    if engine.qdq_form is not QDQForm.TENSORRT and plan.counts()["int8"]:
        tensorrt = lambda graph: lower_plan(graph, plan, ranges, QDQForm.TENSORRT)  # noqa: E731
    return deploy(info, lambda graph: engine.lower(graph, plan, ranges), tensorrt, dataset.evaluation[:CHECKED_BATCHES],
                  dataset.other_shapes)


def _timed_across(info: ModelInfo, engine: Backend, front: Sequence[TrialRecord], max_loss: float | None,
                  ranges: ActivationRanges | None, dataset: Dataset) -> ProfileTiming:
    """``--time-shapes``: the front's plans timed as deployed at min, opt and max."""
    log.info(f"timing the {len(front)} plan(s) of the front at the profile's min, opt and max shapes, as deployed")
    feasible = [t.number for t in front if max_loss is None or t.feasible]
    timing = time_across(engine, info, {t.number: t.plan for t in front}, feasible, ranges, dataset.evaluation[0])
    for trial, why in timing.failed.items():
        log.warning(f"--time-shapes: trial {trial} could not be built as deployed ({why})")
    if timing.feasible:
        log.info("fastest at " + ", ".join(f"{p}: trial {timing.fastest(p, timing.feasible)}" for p in ("min", "opt", "max"))
                 + f"; across the range, deploy trial {timing.across_range()} (the least slowdown at its worst shape; "
                 "timed one plan after another, so a few percent apart is noise)")
    return timing


def _build_workers(requested: int | None, engine: Backend, isolate: bool) -> int:
    """How many candidates are measured side by side (see ``search``'s ``build_workers``)."""
    if not isolate:
        return 1
    if requested is None:
        return engine.default_build_workers
    if requested > engine.default_build_workers:
        log.warning(f"--build-workers {requested} on {engine.name}: a build beside the timed candidate can disturb its "
                     "latency (it shares the CPU that runs or launches it); see benchmarks/parallel_builds.py")
    return requested


def sensitivity_pass(
    prepared: Prepared, engine: Backend, loss_of, batches: int, metric: str, calibration: str, path: Path, progress: bool
) -> tuple[Sensitivity, bool]:
    """The sensitivity of every searchable unit, read from ``path`` when it was measured the same way."""
    method = DEFAULT_CALIBRATION if calibration == "auto" else calibration
    key = cache_key(prepared.info, engine, prepared.dataset.fingerprint(), metric, method, batches)
    steps = sum(len(u.allowed) - 1 for u in prepared.info.dimensions)
    with console.StepProgress("sensitivity", steps, enabled=progress) as bar:
        found, from_cache = cached_sensitivity(path, key, lambda: analyse_sensitivity(
            prepared.info, engine, prepared.ranges, loss_of, prepared.dataset.evaluation[0], batches, method, bar.update
        ))
    if from_cache:
        log.info(f"sensitivity: read from {path} (same model, data, engine and space)")
    else:
        log.info(f"sensitivity: {found.evaluations} one-unit plans evaluated on {batches} batch(es) in {found.seconds:.1f} s")
    if found.failed:
        every = found.failed == found.evaluations
        log.warning(f"sensitivity: {'every one' if every else f'{found.failed} of {found.evaluations}'} of the one-unit "
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
    progress: bool = False,
    head: HeadOptions | None = None,
    constants: Mapping[str, float] | None = None,
    tie_repeats: bool = True,
) -> tuple[Sensitivity, Path]:
    """Each unit lowered alone to each precision it may take: loss, and its share of FP32 latency.

    Writes ``sensitivity.json`` and ``sensitivity.png`` in ``out`` (the same files a search writes
    there, so a later search with the same settings reuses them).
    """
    from autoprec.results.plots import plot_sensitivity

    model_path, data, shapes, default_out = resolve_model(model, data, shapes)
    out_dir = result_dir(out, default_out)
    wanted = resolve_metric(metric, declared_tasks(model), head)
    engine = get_backend(backend, device, out_dir / "cache")
    if caveat := engine.info().caveat:
        log.warning(caveat)
    space, _, _ = engine_space(load_search_space(search_space).with_overrides(list(overrides)), engine, precisions)
    check_out_dir(out_dir)
    prepared = prepare(model_path, space, data, shapes, 0, image_mean, image_std, out_dir / "cache", constants)
    prepared = replace(prepared, info=repeats_decided(prepared.info, tie_repeats))
    batches = screening_batches(len(prepared.dataset.evaluation))
    metric_used = metric_for(wanted, prepared.info, prepared.dataset)
    judge = judge_for(metric_used, prepared)[0]
    ranking = judge.for_ranking()
    measurer = InProcessMeasurer(engine, prepared.dataset.evaluation, judge, ranking, Lowering(prepared.info, prepared.ranges))
    found, _ = sensitivity_pass(
        prepared, engine, lambda plan: measurer.accuracy_loss(plan, batches),
        batches, ranking.metric.describe(), calibration, out_dir / "sensitivity.json", progress,
    )
    engine.drop_kept_builds()  # no trial follows
    plot_sensitivity(found.to_json(), model_path.name, out_dir / "sensitivity.png")
    return found, out_dir


def engine_space(
    space: SearchSpace, engine: Backend, precisions: Sequence[str] | None
) -> tuple[SearchSpace, list[str], dict[str, str]]:
    """The space narrowed to ``precisions``, or to what ``engine`` runs faster than FP32; says what was left out and why."""
    if precisions is None:
        keep = [p for p in Precision if p not in engine.slow_precisions]
        left_out = {p.value: why for p, why in engine.slow_precisions.items()}
        for p, why in left_out.items():
            log.info(f"{engine.name}: {p} left out of the search ({why}); include it with --precisions int8,fp16,fp32")
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


def _say_retiming(retiming: Retiming) -> None:
    """A re-timing that failed is said, with what it leaves: the trial's own figures, and no verdict."""
    for failed in retiming.failed:
        log.warning(f"re-timing trial {failed['trial']} beside all-FP32 failed ({failed['error'][:300]}): its latency "
                    "is the trial's own, and no verdict on timing noise is given for it")
    if retiming.apart:
        log.info("re-timing: engines too large to keep two alive were built one at a time, anew in each round")


def _say_pinned_ops(info: ModelInfo, engine: Backend, left_out: dict[str, str]) -> None:
    """The model's units of op types the engine runs in FP32 only: said once, and kept in ``left_out``."""
    for op in sorted({u.op_type for u in info.units} & set(engine.float32_ops)):
        log.info(f"{engine.name}: {op} units kept FP32 ({engine.float32_ops[op]})")
        left_out[f"{op} units"] = f"kept FP32: {engine.float32_ops[op]}"


def _reference_executor(engine: Backend, measurer: Measurer, per_build: int, ctx: StudyContext, dataset, judge, ranking,
                        limits: Limits | None, cache: Path, stack: contextlib.ExitStack,
                        lowering: Lowering) -> tuple[Measurer, str, bool]:
    """Where a plan's loss is computed without building it on the target, what that is, and whether its
    evaluations are builds of the target: ONNX Runtime on the CPU running the graph in the target's Q/DQ
    form. On ort-cpu that is the target itself (its untimed sessions are counted as reference
    evaluations); without proposals, or where the CPU cannot run the target's form (an op ONNX Runtime
    lacks, said once), the target judges its own plans."""
    if engine.name == "ort-cpu":
        return measurer, "ONNX Runtime CPU (the target engine itself)", False
    if not per_build:
        return measurer, f"{engine.name} itself (--proposals 0: plans are judged where they are built)", True
    in_target_form = replace(lowering, form=engine.qdq_form)  # the graph the target builds, run on the CPU
    if limits is not None:
        reference: Measurer = stack.enter_context(IsolatedMeasurer("ort-cpu", dataset.evaluation, judge, limits,
                                                                   cache / "reference-stderr.log", 0, cache,
                                                                   lowering=in_target_form))
    else:
        reference = InProcessMeasurer(get_backend("ort-cpu"), dataset.evaluation, judge, ranking, in_target_form)
    executor = f"ONNX Runtime CPU running the graph {engine.name} builds ({engine.qdq_form.value} Q/DQ form)"
    method = DEFAULT_CALIBRATION if ctx.calibration == "auto" else ctx.calibration
    try:
        for precision in (Precision.INT8, Precision.FP16):
            units = [u.name for u in ctx.info.searchable_units if precision in u.allowed]
            if units:
                reference.accuracy_loss(ctx.info.plan_at(precision, units, method), 1)
    except Exception as exc:  # noqa: BLE001 - any engine error: this study's accuracy comes from the target
        log.warning(f"the reference executor cannot run this model ({type(exc).__name__}: "
                    f"{(str(exc).strip().splitlines() or [''])[0][:200]}): {engine.name} measures every plan's accuracy")
        return measurer, f"{engine.name} itself (ONNX Runtime CPU could not run the model)", True
    return reference, executor, False


def _builds(study: optuna.Study, sensitivity: Sensitivity | None, retimed: int, proposer: Proposer | None,
            judged_on_target: bool) -> dict:
    """Builds (or sessions) of the target engine in every phase of this search, and the plans the
    reference executor evaluated instead (counted as builds where the target had to be the reference)."""
    built = built_trials(study)
    on_profiled = sum(map(on_profile_build, built))
    by_phase = {"profiles": sensitivity.profiles if sensitivity else 0, "trials": len(built) - on_profiled, "retiming": retimed}
    evaluations = (sensitivity.evaluations if sensitivity else 0) + (proposer.evaluated() if proposer else 0)
    if judged_on_target:
        by_phase["accuracy"], evaluations = evaluations, 0
    return {"total": sum(by_phase.values()), "by_phase": by_phase, "reference_evaluations": evaluations,
            "trials_on_profile_builds": on_profiled}

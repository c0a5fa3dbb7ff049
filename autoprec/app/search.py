"""``autoprec search`` and ``autoprec sensitivity``: model file -> analysis -> calibration -> Optuna study -> result directory."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, Sequence

import optuna

from autoprec.analysis.baseline import Prepared, load_inputs, prepare_reference, shared_files
from autoprec.analysis.calibrate import ActivationRanges, calibration_cache
from autoprec.analysis.data import Dataset
from autoprec.analysis.model import ModelInfo
from autoprec.app.config import SearchConfig
from autoprec.app.resolve import (
    check_out_dir,
    engine_space,
    judge_for,
    metric_for,
    repeats_decided,
    resolve_model,
    result_dir,
    wanted_metric,
)
from autoprec.app.sensitivity_pass import sensitivity_pass
from autoprec.app.specs import InputSpec
from autoprec.backends import REFERENCE_BACKEND, Backend, EngineInfo, get_backend
from autoprec.core import atomic
from autoprec.core.errors import AutoprecError, MetricError, SearchFailed, first_line
from autoprec.core.locks import FileLock
from autoprec.core.plan import Plan, Precision
from autoprec.core.search_space import SearchSpace, load_search_space
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure import confirmation, speedup
from autoprec.measure.accuracy import Judge, Metric, decision_changes
from autoprec.measure.deployment import CHECKED_BATCHES, Deployment, ProfileTiming, deploy, time_across
from autoprec.measure.isolation import IsolatedMeasurer, Limits, MeasurerPool, TrialCrash, device_lock_path
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
    plan_ignored,
    read_result_dir,
    units_json,
    withdraw_result,
    write_results,
)
from autoprec.results.plots import plot_result_dir
from autoprec.results.record import Claim, Drift, ModelRecord, NotShipped, Rival, Versus
from autoprec.study.coordination import (
    GRACE_BEATS,
    SharedInputs,
    StudyLocks,
    check_storage,
    default_artifacts,
    redacted,
    worker_id,
)
from autoprec.study.optimize import (
    RETIME_ROUNDS,
    Holding,
    Retiming,
    StudyContext,
    TrialRecord,
    built_trials,
    choose,
    counted,
    default_study_name,
    finished_records,
    forget_if_unused,
    make_sampler,
    nothing_measured,
    on_node_time_build,
    open_study,
    rejected_trials,
    retimed_front,
    rivals,
    run_warm_started,
    uniform_trials,
)
from autoprec.study.proposals import Proposer
from autoprec.study.sensitivity import (
    Sensitivity,
    searched_sensitive,
)

log = logging.getLogger("autoprec")


class FinalTiming(Protocol):
    """The final timing of the chosen plan and its rivals (``contenders``, the chosen one first) beside all-FP32 and
    the given model, until their speed-ups are known (:mod:`autoprec.measure.speedup`): its rounds, or None where it
    did not time them (the speed-up then stands on the re-timing's rounds, as where the timing fails)."""

    def __call__(self, measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord], seconds: float,
                 apart: bool) -> speedup.Rounds | None: ...


def timed_until_known(measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord], seconds: float,
                      apart: bool) -> speedup.Rounds:
    """The final timing a search runs: the measurer times the plans in blocks of interleaved rounds, every model's
    session built anew for each block, until their speed-ups' intervals are narrow or ``seconds`` pass."""
    chosen = contenders[0]
    beside = f" and trial(s) {', '.join(str(r.number) for r in contenders[1:])}, which the re-timing could not " \
        "tell from it," if len(contenders) > 1 else ""
    log.info(
        f"timing the chosen plan (trial {chosen.number}){beside} beside all-FP32 and the given model until the "
        f"speed-ups are known ({speedup.CONFIDENCE:.0%} interval within {speedup.NARROW:.0%}; every model's session "
        f"built anew for each of {speedup.MIN_BLOCKS} or more blocks of rounds, then up to {seconds:g} s)"
    )
    return measurer.time_compared(fp32.plan, [r.plan for r in contenders], seconds, apart)


def not_timed(measurer: Measurer, fp32: TrialRecord, contenders: Sequence[TrialRecord], seconds: float,
              apart: bool) -> None:
    """No final timing: the chosen plan ships with the speed-up the re-timing's rounds give it (a search in a
    hurry, and the tests that are not about the final timing)."""
    return None


def search(config: SearchConfig | str | os.PathLike, *, final_timing: FinalTiming = timed_until_known) -> SearchResult:
    """Search per-unit precisions for a model and write the result directory. ``config`` holds the spec
    groups (:mod:`autoprec.app.specs`), checked once; a model path alone searches with the defaults.

    Example::

        from autoprec import InputSpec, JudgeSpec, SearchConfig, StudySpec, search
        result = search(SearchConfig(InputSpec("model.onnx", data="samples/"), judge=JudgeSpec(max_loss=0.01),
                                     study=StudySpec(budget=50)))
        result = search("zoo:ppocr-det")  # a zoo model, with its own real data
        print(result.chosen.latency_ms, result.chosen.plan.counts())

    The fields named below are those of the groups (``budget``: ``StudySpec.budget``, ``data``:
    ``InputSpec.data``, ...).

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

    ``final_timing`` times the chosen plan with its rivals until the speed-ups are known (:class:`FinalTiming`);
    :func:`not_timed` leaves it out.
    """
    if not isinstance(config, SearchConfig):
        config = SearchConfig(InputSpec(config))
    return run_search(config.checked(), final_timing)


def run_search(config: SearchConfig, final_timing: FinalTiming = timed_until_known) -> SearchResult:
    """:func:`search` for a checked configuration, in phases: set up, join the study, prepare what every
    trial shares, start the measurers, the sensitivity pass, run and choose, write."""
    started = time.monotonic()
    setup = _set_up(config)
    joined = _join_study(config, setup)
    try:
        shared = _shared_inputs(config, setup, joined)
        with contextlib.ExitStack() as stack:
            measuring = _start_measurers(config, setup, shared, stack)
            warm = _warm_start(config, setup, joined, shared, measuring)
            outcome = _run_and_choose(config, setup, joined, shared, measuring, warm, final_timing)
    except AutoprecError:
        _after_failure(config, setup, joined)
        raise
    _say_retiming(outcome.retiming)
    return _write(config, setup, joined, shared, measuring, warm, outcome, time.monotonic() - started)


def _after_failure(config: SearchConfig, setup: Setup, joined: Joined) -> None:
    """A run that stops before its result: a study it made and asked nothing of goes (the corrected run would be
    refused as another search); one that began its trials leaves no earlier result in its folder passing for its
    own (its trials stay in the study)."""
    trials = len(joined.study.get_trials(deepcopy=False))
    if trials == 0 and joined.fresh and config.study.storage is None:  # the folder's own study, made by this run
        forget_if_unused(joined.study, joined.storage_url)
    elif trials > joined.asked and (removed := withdraw_result(setup.out_dir)):
        log.warning(f"{setup.out_dir}: the earlier run's result ({', '.join(removed)}) removed: this run began its "
                    "trials and stopped without one")


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

    @property
    def cache(self) -> Path:
        return self.out_dir / "cache"


def _set_up(config: SearchConfig) -> Setup:
    model_path, data, shapes, default_out = resolve_model(config.inputs.model, config.inputs.data, config.inputs.shapes)
    out_dir = result_dir(config.out, default_out)
    if config.study.storage is None and any(c in str(out_dir.resolve()) for c in "%{}"):
        raise AutoprecError(f"--out {out_dir}: its path holds '%', '{{' or '}}', which the study's default SQLite URL "
                            "cannot carry; choose another --out, or give --storage")
    wanted = wanted_metric(config.judge, config.inputs.model)
    engine = get_backend(config.engine.backend, config.engine.device, out_dir / "cache", config.engine.threads)
    workers = _build_workers(config.isolation.build_workers, engine, config.isolation.isolate)
    space, searched, left_out = engine_space(
        load_search_space(config.space.search_space).with_overrides(list(config.space.overrides)),
        engine,
        config.space.precisions,
    )
    check_out_dir(out_dir)
    for folder in (out_dir, out_dir / "best", out_dir / "cache"):
        atomic.remove_stale(folder)
    info, dataset, one_time = load_inputs(
        model_path,
        space,
        data,
        shapes,
        config.study.seed,
        config.inputs.image,
        config.inputs.constants,
        cache=out_dir / "cache",
        bounds=(config.inputs.min_shapes or {}, config.inputs.max_shapes or {}),
    )
    info = repeats_decided(info, config.space.tie_repeats)
    _say_pinned_ops(info, engine, left_out)
    return Setup(
        model_path,
        data,
        out_dir,
        engine,
        engine.info(),
        workers,
        space,
        searched,
        left_out,
        info,
        dataset,
        one_time,
        metric_for(wanted, info, dataset),
    )


@dataclass(frozen=True)
class Joined:
    """The study this process works on, and what it shares with the study's other workers."""

    study: optuna.Study
    name: str
    storage_url: str
    identity: dict[str, Any]
    locks: StudyLocks
    me: str
    shared: SharedInputs
    done: int  # trials the study counted when this process joined it
    running: list[int]  # and those running elsewhere then
    run: str  # this run of this worker, among the study's runs
    fresh: bool = False  # this run made the study
    asked: int = 0  # trials the study held when this process joined it, finished or not


def _join_study(config: SearchConfig, setup: Setup) -> Joined:
    storage_url = config.study.storage or f"sqlite:///{(setup.out_dir / 'study.db').resolve()}"
    check_storage(storage_url)
    name = config.study.study_name or default_study_name(setup.model_path, config.engine.backend)
    info = setup.info
    # What must match for a resumed or shared study: mixing would compare latencies or losses that were not
    # measured the same way (or constrained differently).
    identity = {
        "model_sha256": info.sha256, "backend": config.engine.backend, "data": setup.dataset.fingerprint(),
        "metric": setup.metric.describe(), "units": len(info.units), "calibration": config.space.calibration,
        "max_loss": config.judge.max_loss, "precisions": setup.searched, "search_space": setup.space.digest(),
        "shapes": {i.name: list(i.shape) for i in info.inputs}, "tie_repeats": config.space.tie_repeats,
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    locks = StudyLocks(storage_url, name)
    # Trials in flight elsewhere too (threads here, or other workers of a --storage): TPE's constant liar.
    parallel = setup.workers > 1 or config.study.storage is not None
    me = worker_id(config.engine.device if setup.engine.uses_device else None)
    with locks.hold("identity"):  # two workers starting a new study at once agree on one identity
        study = open_study(
            storage_url,
            name,
            identity,
            make_sampler(config.study.sampler, config.study.seed, parallel),
            config.study.heartbeat,
        )
        fresh = not (study.get_trials(deepcopy=False) or "budget" in study.user_attrs)
        if not fresh:
            # joining (or resuming) a study: a seed of its own, or workers sharing one history propose alike
            study.sampler = make_sampler(
                config.study.sampler, zlib.crc32(f"{config.study.seed}:{me}".encode()), parallel
            )
        study.set_user_attr(
            "budget", config.study.budget
        )  # for `autoprec status`; each worker stops at its own --budget
    shared = SharedInputs(
        study, Path(config.study.artifacts) if config.study.artifacts else default_artifacts(storage_url)
    )
    trials_now = study.get_trials(deepcopy=False)
    done = sum(counted(t) for t in trials_now)
    running = [t.number for t in trials_now if t.state == optuna.trial.TrialState.RUNNING]
    return Joined(study, name, storage_url, identity, locks, me, shared, done, running, f"{me}:{time.time_ns()}",
                  fresh, len(trials_now))


@dataclass(frozen=True)
class Shared:
    """What every trial shares: the calibrated model and FP32 reference, the judge, the lowering."""

    prepared: Prepared
    judge: Judge
    judged: dict[str, Any]  # what the result records of the judge
    ranking: Judge
    lowering: Lowering
    screen: Screen | None

    @property
    def info(self) -> ModelInfo:
        return self.prepared.info


def _shared_inputs(config: SearchConfig, setup: Setup, joined: Joined) -> Shared:
    files = shared_files(setup.info, setup.dataset, setup.cache)
    with joined.shared.once(joined.locks, "reference", files, joined.me) as fetched:
        if fetched:
            log.info(f"study {joined.name!r}: calibration ranges and FP32 reference from its artifact store "
                     f"({joined.shared.store_dir})")
        prepared = prepare_reference(setup.info, setup.dataset, setup.one_time, setup.cache)
    judge, judged = judge_for(setup.metric, prepared, config.judge.max_loss)
    running = joined.running
    if joined.done or running:
        budget = config.study.budget
        done = (f"{joined.done} of {budget} trials done" if joined.done < budget else
                f"{joined.done} trials done, the budget of {budget} reached: no new trial runs")
        log.info(f"joining study {joined.name!r}: {done}"
                 + (f"; trial(s) {', '.join(map(str, running))} running elsewhere (a dead worker's is re-run "
                    f"after {GRACE_BEATS * config.study.heartbeat} s without a heartbeat)" if running else ""))
    screen = (
        Screen.for_search(config.judge.max_loss, len(setup.dataset.evaluation)) if config.study.early_reject else None
    )
    method = config.space.method
    ranges = prepared.ranges
    lowering = Lowering(
        prepared.info, ranges.with_thresholds(method) if ranges is not None else None
    )  # only plans travel
    return Shared(prepared, judge, judged, judge.for_ranking(), lowering, screen)


@dataclass(frozen=True)
class Measuring:
    """Who measures: the target's measurer(s), and the reference executor judging plans before a build."""

    measurer: Measurer
    limits: Limits | None
    reference: Measurer
    executor: str
    judged_on_target: bool
    per_build: int
    one_time: dict[str, float]


def _start_measurers(config: SearchConfig, setup: Setup, shared: Shared, stack: contextlib.ExitStack) -> Measuring:
    one_time = dict(shared.prepared.seconds)
    limits = None
    if config.isolation.isolate:
        limits = Limits.default(config.isolation.trial_timeout, config.isolation.trial_memory_gb, setup.workers)
        measurer: Measurer = _isolated_measurers(config, setup, shared, limits, stack, one_time)
    else:
        measurer = InProcessMeasurer(
            setup.engine, setup.dataset.evaluation, shared.judge, shared.ranking, shared.lowering
        )
        log.warning("--no-isolation: candidates run in this process; an engine crash ends the search (resume with the "
                    "same command)")
    if setup.metric.user_function is not None:  # the user's code, judged once before any trial: a broken one stops
        measurer.accuracy_loss(shared.info.plan_at(Precision.FP32), 1, constraint=True)  # the search here
    per_build = setup.engine.default_proposals if config.study.proposals is None else config.study.proposals
    reference, executor, judged_on_target = _reference_executor(setup.engine, measurer, per_build, shared, config,
                                                                 setup.dataset, limits, setup.cache, stack)
    return Measuring(measurer, limits, reference, executor, judged_on_target, per_build, one_time)


def _isolated_measurers(config: SearchConfig, setup: Setup, shared: Shared, limits: Limits, stack: contextlib.ExitStack,
                        one_time: dict[str, float]) -> Measurer:
    """``setup.workers`` worker processes measuring candidates, started (the time it took in ``one_time``)."""
    lock = FileLock(device_lock_path(config.engine.backend, config.engine.device)).check()
    measurers = [
        stack.enter_context(IsolatedMeasurer(
            config.engine.backend, setup.dataset.evaluation, shared.judge, limits,
            setup.cache / f"worker{'' if i == 0 else f'-{i}'}-stderr.log", config.engine.device, setup.cache, lock,
            shared.lowering, config.engine.threads,
        ))
        for i in range(setup.workers)
    ]
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
    if setup.workers > 1:
        log.info(f"{setup.workers} workers: candidates are built side by side; evaluation and timing hold "
                 f"{setup.engine_info.device} one candidate at a time")
    return MeasurerPool(measurers)


@dataclass(frozen=True)
class WarmStart:
    """The sensitivity pass and what it decided: the model information the study searches."""

    info: ModelInfo
    sensitivity: Sensitivity | None
    from_cache: bool
    sensitive_units: dict[str, int]


def _warm_start(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared, measuring: Measuring) -> WarmStart:
    unit_sensitivity, from_cache = None, False
    if config.study.warm_start:
        if shared.ranking is not shared.judge:
            log.info(f"sensitivity: units are ranked by their cosine loss (the constraint, {setup.metric.name}, "
                     "changes few decisions on a quarter of the data: too coarse to rank units by)")
        screened = screening_batches(len(setup.dataset.evaluation))
        with joined.shared.once(joined.locks, "sensitivity", [setup.out_dir / "sensitivity.json"], joined.me):
            unit_sensitivity, from_cache = sensitivity_pass(
                shared.prepared,
                setup.engine,
                lambda plan: measuring.reference.accuracy_loss(plan, screened),
                screened,
                shared.ranking,
                config.space.calibration,
                setup.out_dir / "sensitivity.json",
                config.progress,
            )
        measuring.one_time["sensitivity"] = 0.0 if from_cache else unit_sensitivity.seconds
    info, sensitive_units = searched_sensitive(shared.info, unit_sensitivity, config.judge.max_loss)
    if sensitive_units["found"]:
        log.info(f"sensitive units (softmax, normalisations, reductions): {sensitive_units['searched']} of "
                 f"{sensitive_units['found']} searched, the rest kept FP32 ({sensitive_units['too_lossy']} lose more "
                 f"than the limit alone, {sensitive_units['no_gain']} save no time in the profile); "
                 f"{len(info.searchable_units)} unit(s) searched in all, {len(info.dimensions)} dimension(s)")
    return WarmStart(info, unit_sensitivity, from_cache, sensitive_units)


@dataclass(frozen=True)
class Outcome:
    """What the study found, re-timed, and the plan chosen."""

    trials: list[TrialRecord]
    front: list[TrialRecord]
    chosen: TrialRecord | None
    versus: Versus
    retiming: Retiming
    warm_plans: int
    proposer: Proposer | None
    held_out: confirmation.HeldOut | None = None


def _run_and_choose(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared, measuring: Measuring,
                    warm: WarmStart, final_timing: FinalTiming) -> Outcome:
    screen = shared.screen
    ctx = StudyContext(
        warm.info,
        setup.engine,
        shared.prepared.ranges,
        lambda plan: measuring.measurer.measure(plan, screen),
        config.space.calibration,
        config.judge.max_loss,
        joined.locks,
        joined.me,
    )
    if screen is not None:
        log.info(f"cheap rejection: a candidate with loss > {screen.reject_above:g} on the first "
                 f"{screen.batches} of {len(setup.dataset.evaluation)} evaluation batches is not timed")
    engine_info = setup.engine_info
    log.info(f"engine: {engine_info.label()} ({engine_info.qdq_form} Q/DQ form)")
    if engine_info.caveat:
        log.warning(engine_info.caveat)
    proposer = _proposer(config, setup, joined, measuring, warm, ctx)
    with console.SearchProgress(config.study.budget, min(joined.done, config.study.budget), config.judge.max_loss,
                                enabled=config.progress) as bar:
        started = run_warm_started(
            joined.study,
            ctx,
            config.study.budget,
            warm.sensitivity,
            on_trial=bar.update,
            workers=setup.workers,
            propose=proposer,
        )
    if warm.sensitivity is not None:
        slow, earlier = started.slow, len(started.plans) - started.queued
        log.info(f"warm start: {len(started.plans)} plan(s) from the sensitivity ranking"
                 + (f" ({earlier} already in the study from an earlier run)" if earlier else "")
                 + (" queued as proposals" if proposer is not None else "")
                 + (f" (none lowering to {' or '.join(slow)}: not faster than FP32 on this engine)" if slow else ""))
    setup.engine.drop_kept_builds()
    trials = finished_records(joined.study)
    log.info(f"re-timing the front and the fastest plans within --max-loss, each beside the all-FP32 plan in "
             f"{RETIME_ROUNDS} interleaved rounds (two engines alive at most)")
    front, retiming = retimed_front(
        joined.study, measuring.measurer.time_paired, RETIME_ROUNDS, max_loss=config.judge.max_loss
    )
    trials = [retiming.trials.get(t.number, t) for t in trials]
    holding = Holding(_held_out_judge(setup, shared), lambda plan: shared.lowering(setup.engine, plan),
                      config.judge.max_loss)
    chosen, versus = _compare_chosen(
        measuring.measurer, trials, holding.first(choose(front, config.judge.max_loss), trials), config,
        retiming.apart, holding, final_timing,
    )
    if chosen is not None:
        holding.judged(chosen)  # (the knee, chosen without a limit: its loss there for the record)
    if chosen is not None and chosen.number not in {
        t.number for t in front
    }:  # all-FP32, shipped for want of a proven gain
        front = sorted([*front, chosen], key=lambda r: r.latency_ms)
    return Outcome(trials, front, chosen, versus, retiming, len(started.plans), proposer, holding.record())


def _proposer(config: SearchConfig, setup: Setup, joined: Joined, measuring: Measuring, warm: WarmStart,
              ctx: StudyContext) -> Proposer | None:
    """Plans judged before each build (``--proposals``), where the engine's profiles can predict latency."""
    per_build, engine = measuring.per_build, setup.engine
    if not per_build:
        return None
    gains = {u.unit: dict(u.gain) for u in warm.sensitivity.units} if warm.sensitivity is not None else {}
    if not any(gains.values()):
        log.warning(f"--proposals {per_build}: no per-unit profile of {engine.name} to predict latency from "
                    "(no sensitivity pass, or the engine has no profiler): every trial is built")
        return None
    evaluations = len(setup.dataset.evaluation)
    with joined.locks.hold("identity"):
        proposer = Proposer.open(joined.storage_url, joined.name, joined.identity, config.study.seed, ctx,
                                 lambda plan: measuring.reference.accuracy_loss(plan, evaluations, constraint=True),
                                 gains, per_build)
    log.info(f"proposals: {per_build} plan(s) judged before each build, their loss by {measuring.executor}, their "
             f"latency by a model fitted to {engine.name}'s profiles (refitted on every build)")
    return proposer


def _write(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared, measuring: Measuring, warm: WarmStart,
           outcome: Outcome, wall_seconds: float) -> SearchResult:
    """The result files, the chosen plan as deployed, the plots; a search that measured nothing ends in one line."""
    info, engine, chosen = warm.info, setup.engine, outcome.chosen
    builds = _builds(
        joined.study,
        joined.run,
        warm.sensitivity if not warm.from_cache else None,
        outcome.retiming.builds,
        outcome.proposer,
        measuring.judged_on_target,
    )
    predicted = outcome.proposer.report(joined.study) if outcome.proposer is not None else None
    _say_builds(engine.name, builds, predicted)
    changed = decision_changes(setup.metric, chosen.measurement.metrics) if chosen is not None else []
    for line in changed:
        log.warning(f"the chosen plan keeps {setup.metric.name} within the limit, but on {line}")
    facts = _search_facts(config, setup, joined, shared, measuring, warm, outcome, wall_seconds)
    facts.update(decision_changes=changed, **_builds_facts(builds, measuring, outcome.proposer, predicted))
    if facts["plan_ignored"]:
        log.warning(f"{setup.engine_info.engine} did not run some units at their planned precision in trial(s) "
                    f"{', '.join(map(str, facts['plan_ignored']))}: see 'build.plan_fidelity' in trials.json")
    ranges = shared.prepared.ranges
    deployment = _deployment(info, engine, chosen.plan, ranges, setup.dataset) if chosen is not None else None
    if outcome.held_out is not None:
        facts["held_out"] = outcome.held_out.to_json()
    if config.time_shapes and outcome.front:
        facts["profile_timing"] = _timed_across(info, engine, outcome.front, config.judge.max_loss, ranges,
                                                setup.dataset).to_json()
    result = SearchResult(setup.out_dir, ModelRecord.of(info), setup.engine_info, facts, tuple(outcome.trials),
                          tuple(outcome.front), chosen, units_json(info), outcome.versus)
    write_results(result, deployment)
    plot_result_dir(read_result_dir(setup.out_dir))
    if not outcome.trials:
        raise SearchFailed(nothing_measured(joined.study, setup.out_dir))
    return result


def _search_facts(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared, measuring: Measuring,
                  warm: WarmStart, outcome: Outcome, wall_seconds: float) -> dict[str, Any]:
    """pareto.json's ``search``: how the search was asked and what it did."""
    info, dataset, sensitivity = warm.info, setup.dataset, warm.sensitivity
    fingerprint = dataset.fingerprint()
    return {
        "spec": config.to_json(),
        "run": joined.run,  # which run wrote the result files: each carries it, so no file of another passes
        "budget": config.study.budget,
        "trials": len(outcome.trials),
        "metric": setup.metric.name,
        **shared.judged,
        "timing_drift": drift.to_json() if (drift := Drift.of(outcome.trials)) else None,
        "max_loss": config.judge.max_loss,
        "seed": config.study.seed,
        "calibration": config.space.calibration,
        "study_name": joined.name,
        "storage": redacted(joined.storage_url),
        "data": dataset.source,
        "data_path": str(Path(setup.data).resolve()) if setup.data is not None else None,
        "data_fingerprint": fingerprint,
        "calibration_file": (
            str(calibration_cache(info, fingerprint, setup.cache).relative_to(setup.out_dir))
            if shared.prepared.ranges is not None
            else None
        ),
        "image_norm": config.inputs.image.to_json(),
        "constants": dict(config.inputs.constants or {}),
        "out_of_range": list(info.out_of_range),
        "random_data": dataset.random,
        "batches": {"calibration": len(dataset.calibration), "evaluation": len(dataset.evaluation)},
        "search_space": setup.space.to_json(),
        "precisions": setup.searched,
        "dimensions": len(info.dimensions),
        "tied_units": len(info.searchable_units) - len(info.dimensions),
        "tie_repeats": config.space.tie_repeats,
        "sensitive_units": warm.sensitive_units,
        "left_out": setup.left_out,
        "wall_seconds": round(wall_seconds, 2),
        "one_time_seconds": {k: round(v, 3) for k, v in measuring.one_time.items()},
        "sampler": type(joined.study.sampler).__name__,
        "build_workers": setup.workers,
        "sensitivity": None
        if sensitivity is None
        else {
            "evaluations": sensitivity.evaluations,
            "batches": sensitivity.batches,
            "seconds": round(sensitivity.seconds, 2),
            "evaluation_seconds": round(sensitivity.evaluation_seconds, 2),
            "from_cache": warm.from_cache,
            "warm_start_plans": outcome.warm_plans,
            "ranked_by": shared.ranking.metric.name,
        },
        "early_reject": None
        if shared.screen is None
        else {"batches": shared.screen.batches, "reject_above": shared.screen.reject_above},
        "retiming": {"rounds": RETIME_ROUNDS, **outcome.retiming.to_json()},
        "profile": info.shape_profile.to_json(),
        "rejected": rejected_trials(joined.study),
        "plan_ignored": [t.number for t in outcome.trials if plan_ignored(t)],
    }


def _builds_facts(
    builds: dict, measuring: Measuring, proposer: Proposer | None, predicted: dict | None
) -> dict[str, Any]:
    return {
        "engine_builds": builds["total"],
        "engine_builds_by_phase": builds["by_phase"],
        "engine_builds_scope": f"the study: its {builds['runs']} run(s) that wrote a result, workers included",
        "trials_on_profile_builds": builds["trials_on_profile_builds"],
        "reference_evaluations": builds["reference_evaluations"],
        "reference": {"executor": measuring.executor,
                      "proposals_per_build": measuring.per_build if proposer is not None else 0, **(predicted or {})},
    }


def _say_builds(engine: str, builds: dict, predicted: dict | None) -> None:
    log.info(
        f"{engine} builds in the study ({builds['runs']} run(s)): {builds['total']} ("
        + ", ".join(f"{k} {v}" for k, v in builds["by_phase"].items())
        + (
            f"; {builds['trials_on_profile_builds']} trial(s) timed on the engine built for their profile"
            if builds["trials_on_profile_builds"]
            else ""
        )
        + "); "
        f"reference evaluations: {builds['reference_evaluations']}"
        + (
            f"; latency model error {predicted['median_abs_error_percent']} % (median of "
            f"{len(predicted['predictions'])} prediction(s) made before the build)"
            if predicted and predicted["predictions"]
            else ""
        )
    )


def _compare_chosen(measurer: Measurer, trials: Sequence[TrialRecord], chosen: TrialRecord | None, config: SearchConfig,
                    apart: bool, holding: Holding, final_timing: FinalTiming) -> tuple[TrialRecord | None, Versus]:
    """The chosen plan, and the rivals the re-timing could not tell from it (:func:`rivals`), timed beside
    all-FP32 and the given model until their speed-ups are known (see :mod:`autoprec.measure.speedup`): the
    fastest of them in those rounds is the plan to ship (all-FP32 where it is not faster beyond timing noise,
    unless ``--ship-within-noise``), with pareto.json's ``chosen_vs_fp32`` / ``chosen_vs_source``."""
    fp32 = uniform_trials(trials).get("fp32")
    if chosen is None or fp32 is None:
        return chosen, Versus()
    contenders = [chosen, *(r for r in rivals(holding.without_failed(trials), chosen, fp32, config.judge.max_loss)
                            if holding(r))]
    try:
        rounds = final_timing(measurer, fp32, contenders, config.retime_seconds, apart)
        if rounds is None:
            return chosen, Versus()
        winner, over_fp32 = speedup.fastest(rounds, len(contenders))
        found = speedup.compared(rounds, winner)
    except (AutoprecError, RuntimeError, ValueError) as exc:
        log.warning(f"the final timing failed ({exc}): the speed-up stands on the re-timing's {RETIME_ROUNDS} rounds")
        return chosen, Versus()
    steadiness = rounds.steadiness()
    if said := steadiness.said():
        log.warning(said)
    named = {speedup.contender(i): r for i, r in enumerate(contenders)}
    if named[winner] is not chosen:
        log.info(f"trial {named[winner].number} ran faster than trial {chosen.number} in the same rounds "
                 f"({over_fp32[winner].label()} against {over_fp32['chosen'].label()} over all-FP32): it is the choice")
        chosen = named[winner]
    rivals_found = tuple(Rival(named[n].number, Claim.measured(c)) for n, c in over_fp32.items() if n != winner)
    chosen, versus = _shipped(chosen, fp32, found, rivals_found, config)
    return chosen, replace(versus, steadiness=steadiness)


def _shipped(chosen: TrialRecord, fp32: TrialRecord, found: dict, rivals_found: tuple[Rival, ...],
             config: SearchConfig) -> tuple[TrialRecord, Versus]:
    """The chosen plan, or all-FP32 where the chosen one is not faster beyond timing noise; and what it is said to
    gain."""
    versus_fp32, versus_source, preparation = (
        found[("fp32", "chosen")],
        found.get(("source", "chosen")),
        found.get(("source", "fp32")),
    )
    not_shipped = None
    if chosen.plan.key() != fp32.plan.key() and not versus_fp32.beyond_timing_noise and not config.ship_within_noise:
        unknown = "" if versus_fp32.narrow else (
            f"; the final timing could not narrow it in {versus_fp32.rounds} rounds ({versus_fp32.blocks} sessions): "
            f"{speedup.ADVICE}")
        not_shipped = NotShipped(chosen.number, Claim.measured(versus_fp32), (
            f"not faster than all-FP32 beyond timing noise ({versus_fp32.label()}): best/ holds the all-FP32 plan "
            f"(--ship-within-noise ships it anyway){unknown}"))
        log.warning(f"trial {chosen.number}: {not_shipped.why}")
        chosen, versus_source = fp32, preparation
    shipped_fp32 = chosen.plan.key() == fp32.plan.key()
    return chosen, Versus(
        None if shipped_fp32 else Claim.measured(versus_fp32), None if shipped_fp32 else fp32.number,
        Claim.measured(versus_source) if versus_source else None,
        Claim.measured(preparation) if versus_source and preparation else None, not_shipped, rivals_found)


def _deployment(
    info: ModelInfo, engine: Backend, plan: Plan, ranges: ActivationRanges | None, dataset: Dataset
) -> Deployment:
    """The chosen plan as best/ ships it (the source's dims kept where it can be), checked across the profile."""
    tensorrt = None
    if engine.qdq_form is not QDQForm.TENSORRT and plan.counts()["int8"]:
        tensorrt = lambda graph: lower_plan(graph, plan, ranges, QDQForm.TENSORRT)  # noqa: E731
    return deploy(info, lambda graph: engine.lower(graph, plan, ranges), tensorrt, dataset.evaluation[:CHECKED_BATCHES],
                  dataset.other_shapes)


def _held_out_judge(setup: Setup, shared: Shared) -> confirmation.HeldOutJudge | None:
    """The judge of plans on the calibration batches; None for a user's metric (its code runs in the measuring
    worker only), or where one batch both calibrated and judged."""
    dataset, metric = setup.dataset, setup.metric
    if metric.user_function is not None or not dataset.calibration_apart:
        return None
    return confirmation.HeldOutJudge(shared.prepared.info.stored, dataset.calibration, dataset.calibration_labels,
                                     metric)


def _timed_across(info: ModelInfo, engine: Backend, front: Sequence[TrialRecord], max_loss: float | None,
                  ranges: ActivationRanges | None, dataset: Dataset) -> ProfileTiming:
    """``--time-shapes``: the front's plans timed as deployed at min, opt and max."""
    log.info(f"timing the {len(front)} plan(s) of the front at the profile's min, opt and max shapes, as deployed")
    feasible = [t.number for t in front if max_loss is None or t.feasible]
    timing = time_across(engine, info, {t.number: t.plan for t in front}, feasible, ranges, dataset.evaluation[0])
    for trial, why in timing.failed.items():
        log.warning(f"--time-shapes: trial {trial} could not be built as deployed ({why})")
    if timing.feasible:
        log.info(
            "fastest at "
            + ", ".join(f"{p}: trial {timing.fastest(p, timing.feasible)}" for p in ("min", "opt", "max"))
            + f"; across the range, deploy trial {timing.across_range()} (the least slowdown at its worst shape; "
            "timed one plan after another, so a few percent apart is noise)"
        )
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


def _say_retiming(retiming: Retiming) -> None:
    """A re-timing that failed is said, with what it leaves: the trial's own figures, and no verdict."""
    for failed in retiming.failed:
        log.warning(f"re-timing trial {failed['trial']} beside all-FP32 failed ({failed['error'][:300]}): its latency "
                    "is the trial's own, and no verdict on timing noise is given for it")
    if retiming.apart:
        log.info("re-timing: engines too large to keep two alive were built one at a time, anew in each round")


def _say_pinned_ops(info: ModelInfo, engine: Backend, left_out: dict[str, str]) -> None:
    """The model's units of op types the engine runs in FP32 only, or without INT8: said once, and kept in
    ``left_out``."""
    for op in sorted({u.op_type for u in info.units} & set(engine.float32_ops)):
        log.info(f"{engine.name}: {op} units kept FP32 ({engine.float32_ops[op]})")
        left_out[f"{op} units"] = f"kept FP32: {engine.float32_ops[op]}"
    for op in sorted({u.op_type for u in info.units if Precision.INT8 not in u.allowed} & set(engine.float_int8_ops)):
        log.info(f"{engine.name}: {op} units take no INT8 ({engine.float_int8_ops[op]})")
        left_out[f"{op} units"] = f"no INT8: {engine.float_int8_ops[op]}"


def _reference_executor(engine: Backend, measurer: Measurer, per_build: int, shared: Shared, config: SearchConfig,
                        dataset: Dataset, limits: Limits | None, cache: Path,
                        stack: contextlib.ExitStack) -> tuple[Measurer, str, bool]:
    """Where a plan's loss is computed without building it on the target, what that is, and whether its
    evaluations are builds of the target: ONNX Runtime on the CPU running the graph in the target's Q/DQ
    form. Where the target is that reference engine itself, its untimed sessions are counted as reference
    evaluations; without proposals, or where the CPU cannot run the target's form (an op ONNX Runtime
    lacks, said once), the target judges its own plans."""
    if engine.is_reference:
        return measurer, "ONNX Runtime CPU (the target engine itself)", False
    if not per_build:
        return measurer, f"{engine.name} itself (--proposals 0: plans are judged where they are built)", True
    in_target_form = replace(shared.lowering, form=engine.qdq_form)  # the graph the target builds, run on the CPU
    if limits is not None:
        reference: Measurer = stack.enter_context(IsolatedMeasurer(REFERENCE_BACKEND, dataset.evaluation, shared.judge,
                                                                   limits, cache / "reference-stderr.log", 0, cache,
                                                                   lowering=in_target_form))
    else:
        reference = InProcessMeasurer(get_backend(REFERENCE_BACKEND), dataset.evaluation, shared.judge, shared.ranking,
                                      in_target_form)
    executor = f"ONNX Runtime CPU running the graph {engine.name} builds ({engine.qdq_form.value} Q/DQ form)"
    method = config.space.method
    try:
        for precision in (Precision.INT8, Precision.FP16):
            units = [u.name for u in shared.info.searchable_units if precision in u.allowed]
            if units:
                reference.accuracy_loss(shared.info.plan_at(precision, units, method), 1)
    except MetricError:  # the metric's fault: the search stops with it
        raise
    except Exception as exc:  # noqa: BLE001 - any engine error: this study's accuracy comes from the target
        log.warning(
            f"the reference executor cannot run this model ({type(exc).__name__}: "
            f"{first_line(exc, 200, empty='')}): {engine.name} measures every plan's accuracy"
        )
        return measurer, f"{engine.name} itself (ONNX Runtime CPU could not run the model)", True
    return reference, executor, False


BUILDS_ATTR = "autoprec:builds:"  # + a run of one worker: the builds it made outside the study's trials


def _builds(study: optuna.Study, run: str, sensitivity: Sensitivity | None, retimed: int, proposer: Proposer | None,
            judged_on_target: bool) -> dict:
    """Builds (or sessions) of the target engine in every phase of the study, over every run and worker that
    wrote to it (this ``run``'s recorded in the study first; another worker's once it wrote its result), and
    the plans the reference executor evaluated instead (counted as builds where the target had to be the
    reference). ``sensitivity``: the pass this run made (None where it read the study's)."""
    study.set_user_attr(BUILDS_ATTR + run, {"profiles": sensitivity.node_time_builds if sensitivity else 0,
                                            "retiming": retimed,
                                            "evaluations": sensitivity.evaluations if sensitivity else 0})
    runs = [v for k, v in study.user_attrs.items() if k.startswith(BUILDS_ATTR)]
    built = built_trials(study)
    on_node_timed = sum(map(on_node_time_build, built))
    by_phase = {
        "profiles": sum(r["profiles"] for r in runs),
        "trials": len(built) - on_node_timed,
        "retiming": sum(r["retiming"] for r in runs),
    }
    evaluations = sum(r["evaluations"] for r in runs) + (proposer.evaluated() if proposer else 0)
    if judged_on_target:
        by_phase["accuracy"], evaluations = evaluations, 0
    return {"total": sum(by_phase.values()), "by_phase": by_phase, "reference_evaluations": evaluations,
            "trials_on_profile_builds": on_node_timed, "runs": len(runs)}

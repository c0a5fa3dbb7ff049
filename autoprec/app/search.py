"""``autoprec search`` and ``autoprec sensitivity``: model file -> analysis -> calibration -> Optuna
study -> result directory."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from typing import Sequence

from autoprec.app.config import SearchConfig
from autoprec.app.resolve import remove_made, removed_if_refused
from autoprec.app.search_record import Outcome, WarmStart, search_facts
from autoprec.app.search_setup import Setup, Shared, set_up, shared_inputs, study_identity
from autoprec.app.sensitivity_pass import help_sensitivity_pass, sensitivity_pass
from autoprec.app.specs import InputSpec
from autoprec.core.errors import AutoprecError, SearchFailed
from autoprec.core.plan import Plan
from autoprec.core.timing import Stages
from autoprec.measure.accuracy import decision_changes
from autoprec.measure.confirmation import held_out_judge
from autoprec.measure.deployment import deploy_plan, time_front_across
from autoprec.measure.isolation import Spawned, start_worker_server
from autoprec.measure.measurement import screening_batches
from autoprec.measure.measurers import (
    MeasurerInputs,
    MeasurerSettings,
    Measuring,
    spawn_workers,
    start_measurers,
)
from autoprec.record.trial import Retiming
from autoprec.results import console
from autoprec.results.files import (
    SearchResult,
    model_record,
    read_result_dir,
    units_json,
    withdraw_result,
    write_results,
)
from autoprec.results.plots import DRAWING_MODULES, plot_result_dir
from autoprec.study.build_counts import builds_facts, count_builds, note_builds, say_builds
from autoprec.study.choice import (
    FinalTiming,
    HeldOutJudging,
    ShipRule,
    choose_shipped,
    chosen_once,
    timed_until_known,
)
from autoprec.study.coordination import SharedSteps, log_folded
from autoprec.study.joining import Joined, join_study
from autoprec.study.opening import default_study_name, forget_if_unused
from autoprec.study.optimize import StudyContext
from autoprec.study.ordered import run_warm_started
from autoprec.study.proposals import open_proposer
from autoprec.study.reading import finished_records, nothing_measured, uniform_trials
from autoprec.study.retiming import NO_FP32, RETIME_ROUNDS, retimed_front
from autoprec.study.sensitivity import searched_sensitive

log = logging.getLogger("autoprec")


def search(config: SearchConfig | str | os.PathLike, *,
           final_timing: FinalTiming = timed_until_known) -> SearchResult:
    """Search per-unit precisions for a model and write the result directory. ``config`` holds the
    spec groups (:mod:`autoprec.app.specs`), checked once; a model path alone searches with the
    defaults.

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

    Several processes or hosts (one per GPU: ``device``) given the same ``storage`` (PostgreSQL) and
    ``study_name`` work on one study: ``budget`` is the study's total, a plan is measured once, and
    the calibration ranges, FP32 reference and sensitivity are computed by the first worker and
    shared through Optuna's artifact store in ``artifacts`` (a directory every worker reaches;
    default: beside a SQLite storage, else in this host's autoprec cache). A worker's running trial
    beats a heartbeat every ``heartbeat`` seconds; one silent for four beats is failed and re-run
    once by another worker.

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

    ``shapes`` (``--shape``) fix each input's shape for measuring: the profile's opt. ``min_shapes``
    and ``max_shapes`` bound the shapes the model is deployed at: best/model.onnx keeps the source's
    dynamic dims and is checked against the given model at min, opt and max; the exports carry the
    profile. ``time_shapes`` also times the front's plans there, as deployed. ``plots``: the figures
    beside the results (``autoprec plot`` draws them later).

    ``constants`` feed inputs one fixed value each (``{"sr": 16000}``): a scalar setting such as a
    sample rate, which random data cannot choose and the data need not hold.

    ``build_workers`` worker processes measure candidates side by side: their builds overlap while a
    device lock lets one candidate at a time be evaluated and timed. Default: the engine's (2 for
    TensorRT, whose builds are slow; 1 for ONNX Runtime, whose builds are cheap and, on the CPU or
    at small batch on the GPU, would disturb the timed candidate).

    ``final_timing`` times the chosen plan with its rivals until the speed-ups are known
    (:class:`FinalTiming`); :func:`not_timed` leaves it out.
    """
    if not isinstance(config, SearchConfig):
        config = SearchConfig(InputSpec(config))
    with _collections_skip_what_exists():
        return run_search(config.checked(), final_timing)


@contextlib.contextmanager
def _collections_skip_what_exists():
    """What exists before the search (its modules above all) out of its collections while it runs: a
    full collection walked them, 57 ms each, six times in a search of yolov8n (0.34 -> 0.06 s). What an
    earlier search in this process left is collected first, not held through this one; a process that
    froze its own heap (a server before it forks) keeps it as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_search(config: SearchConfig, final_timing: FinalTiming = timed_until_known) -> SearchResult:
    """:func:`search` for a checked configuration, in phases: set up, join the study, start the
    worker processes, compute the baseline every trial shares (while they start), give the measurers
    their data, the sensitivity pass, run and choose, write."""
    started, stages = time.monotonic(), Stages()
    with stages.timed("set_up"):
        if config.isolation.isolate:
            start_worker_server(DRAWING_MODULES if config.plots else ())
        setup = set_up(config)
        with removed_if_refused(setup.made):
            joined = _join_study(config, setup)
    with log_folded(joined.storage_url):
        try:
            with contextlib.ExitStack() as stack:
                with stages.timed("set_up"):
                    settings = _measurer_settings(config, setup)
                    spawned = spawn_workers(settings, stack)
                    shared = shared_inputs(config, setup, joined)
                    measuring = _start_measurers(config, setup, settings, shared, stack, spawned)
                with stages.timed("sensitivity"):
                    warm = _warm_start(config, setup, joined, shared, measuring)
                outcome = _run_and_choose(config, setup, joined, shared, measuring, warm, final_timing,
                                          stages)
        except AutoprecError:
            _after_failure(config, setup, joined)
            raise
        _say_retiming(outcome.retiming)
        return _write(config, setup, joined, shared, measuring, warm, outcome, started, stages)


def _join_study(config: SearchConfig, setup: Setup) -> Joined:
    study = config.study
    return join_study(study_identity(config, setup), study.storage, setup.out_dir,
                      study.study_name or default_study_name(setup.model_path, config.engine.backend), study.sampler,
                      study.seed, study.heartbeat, study.budget, study.artifacts,
                      # trials in flight here or elsewhere
                      setup.workers > 1 or study.storage is not None,
                      config.engine.device if setup.engine.uses_device else None)


def _measurer_settings(config: SearchConfig, setup: Setup) -> MeasurerSettings:
    engine, isolation = config.engine, config.isolation
    # as this process's engine took them (AUTOPREC_THREADS read here: a forked worker's environment
    # is its server's, from the first worker's start)
    threads = getattr(setup.engine, "threads", engine.threads)
    return MeasurerSettings(engine.backend, engine.device, threads, setup.cache, isolation.isolate,
                            isolation.trial_timeout, isolation.trial_memory_gb, setup.workers,
                            config.study.proposals)


def _start_measurers(config: SearchConfig, setup: Setup, settings: MeasurerSettings, shared: Shared,
                     stack: contextlib.ExitStack, spawned: Sequence[Spawned]) -> Measuring:
    inputs = MeasurerInputs(setup.dataset.evaluation, setup.dataset.workload, shared.judge,
                            shared.ranking,
                            shared.lowering, config.space.method)
    return start_measurers(settings, setup.engine, setup.engine_info, inputs,
                           shared.baseline.seconds,
                           setup.metric.user_function is not None, stack, spawned)


def _after_failure(config: SearchConfig, setup: Setup, joined: Joined) -> None:
    """A run that stops before its result: a study it made and asked nothing of goes (the corrected
    run would be refused as another search); one that began its trials leaves no earlier result in
    its folder passing for its own (its trials stay in the study)."""
    trials = len(joined.study.get_trials(deepcopy=False))
    # the folder's own study, made by this run
    if trials == 0 and joined.fresh and config.study.storage is None:
        forget_if_unused(joined.study, joined.storage_url)
        remove_made(setup.made)
    elif trials > joined.asked and (removed := withdraw_result(setup.out_dir)):
        log.warning(f"{setup.out_dir}: the earlier run's result ({', '.join(removed)}) removed: "
                    "this run began its trials and stopped without one")


def _warm_start(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared,
                measuring: Measuring) -> WarmStart:
    unit_sensitivity, from_cache = None, False
    if config.study.warm_start:
        if shared.ranking is not shared.judge:
            log.info("sensitivity: units are ranked by their cosine loss (the constraint, "
                     f"{setup.metric.name}, changes few decisions on a quarter of the data: too "
                     "coarse to rank units by)")
        screened = screening_batches(len(setup.dataset.evaluation))
        steps = SharedSteps(joined.shared, joined.locks, "sensitivity", joined.me)

        def loss_of(plan: Plan) -> float:
            return measuring.reference.accuracy_loss(plan, screened, one_unit=True)

        def helping() -> None:  # while another worker computes the pass: this worker's share of it
            help_sensitivity_pass(shared.baseline, setup.engine, loss_of, screened, shared.ranking,
                                  config.space.calibration, steps)

        with joined.shared.once(joined.locks, "sensitivity", [setup.out_dir / "sensitivity.json"],
                                joined.me,
                                while_waiting=helping):
            unit_sensitivity, from_cache = sensitivity_pass(
                shared.baseline, setup.engine, loss_of, screened, shared.ranking,
                config.space.calibration,
                setup.out_dir / "sensitivity.json", config.progress, steps,
            )
        measuring.one_time["sensitivity"] = 0.0 if from_cache else unit_sensitivity.seconds
        note_builds(joined.study, joined.run, None if from_cache else unit_sensitivity)
    info, sensitive_units = searched_sensitive(shared.info, unit_sensitivity, config.judge.max_loss)
    if sensitive_units["found"]:
        log.info("sensitive units (softmax, normalisations, reductions; embeddings where INT4 is searched): "
                 f"{sensitive_units['searched']} of {sensitive_units['found']} searched, the rest "
                 f"kept FP32 ({sensitive_units['too_lossy']} lose more than the limit alone, "
                 f"{sensitive_units['no_gain']} save no time in the profile); "
                 f"{len(info.searchable_units)} unit(s) searched in all, {len(info.dimensions)} "
                 "dimension(s)")
    return WarmStart(info, unit_sensitivity, from_cache, sensitive_units)


def _run_and_choose(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared,
                    measuring: Measuring,
                    warm: WarmStart, final_timing: FinalTiming, stages: Stages) -> Outcome:
    screen = shared.screen
    ctx = StudyContext(warm.info, setup.engine, shared.baseline.ranges,
                       lambda plan: measuring.measurer.measure(plan, screen),
                       config.space.calibration, config.judge.max_loss, joined.locks, joined.me)
    if screen is not None:
        log.info(f"cheap rejection: a candidate with loss > {screen.reject_above:g} on the first "
                 f"{screen.batches} of {len(setup.dataset.evaluation)} evaluation batches is not "
                 "timed")
    engine_info = setup.engine_info
    log.info(f"engine: {engine_info.label()} ({engine_info.qdq_form} Q/DQ form)")
    if engine_info.caveat:
        log.warning(engine_info.caveat)
    proposer = open_proposer(joined, measuring, warm.sensitivity, setup.engine.name,
                             len(setup.dataset.evaluation),
                             config.study.seed, ctx)
    with stages.timed("trials"), console.SearchProgress(config.study.budget,
                                                        min(joined.done, config.study.budget),
                                                        config.judge.max_loss,
                                                        enabled=config.progress) as bar:
        started = run_warm_started(joined.study, ctx, config.study.budget, warm.sensitivity,
                                   on_trial=bar.update,
                                   workers=setup.workers, propose=proposer)
    if warm.sensitivity is not None:
        slow, earlier = started.slow, len(started.plans) - started.queued
        log.info(f"warm start: {len(started.plans)} plan(s) from the sensitivity ranking"
                 + (f" ({earlier} already in the study: a uniform plan of this run, or one another "
                    f"worker or an earlier run queued)" if earlier else "")
                 + (" queued as proposals" if proposer is not None else "")
                 + (f" (none lowering to {' or '.join(slow)}: not faster than FP32 on this "
                    f"engine)" if slow else ""))
    setup.engine.drop_kept_builds()
    trials = finished_records(joined.study)
    if "fp32" in uniform_trials(trials):  # (an --override without fp32 leaves none: nothing re-timed)
        log.info("re-timing the front and the fastest plans within --max-loss, each beside the "
                 f"all-FP32 plan in up to {RETIME_ROUNDS} interleaved rounds (a third only where two leave the "
                 "plan's place open; two engines alive at most)")
    # the workers' shares
    steps = SharedSteps(joined.shared, joined.locks, f"retiming:{len(trials)}", joined.me)
    with stages.timed("retiming"):
        front, retiming = retimed_front(joined.study, measuring.measurer.time_paired, RETIME_ROUNDS,
                                        max_loss=config.judge.max_loss, shared=steps)
    trials = [retiming.trials.get(t.number, t) for t in trials]
    held_out = HeldOutJudging(held_out_judge(shared.baseline.info.stored, setup.dataset,
                                             setup.metric),
                              lambda plan: shared.lowering(setup.engine, plan),
                              config.judge.max_loss)
    rule = ShipRule(config.judge.max_loss, config.retime_seconds or ShipRule.final_seconds(stages),
                    config.ship_within_noise)
    with stages.timed("held_out_and_final_timing"):
        choice = chosen_once(joined.shared, joined.locks, joined.me,
                             setup.out_dir / "cache" / "choice.json", trials,
                             lambda: choose_shipped(front, trials, held_out, measuring.measurer,
                                                    final_timing, rule,
                                                    retiming.apart))
    return Outcome(trials, choice.front, choice.shipped, choice.versus, retiming,
                   len(started.plans), proposer,
                   choice.held_out)


def _write(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared, measuring: Measuring,
           warm: WarmStart,
           outcome: Outcome, started: float, stages: Stages) -> SearchResult:
    """The result files, the chosen plan as deployed, the plots; a search that measured nothing ends
    in one line."""
    info, engine, chosen = warm.info, setup.engine, outcome.chosen
    builds = count_builds(joined.study, joined.run,
                          warm.sensitivity if not warm.from_cache else None,
                          outcome.retiming.builds,
                          outcome.proposer.evaluated() if outcome.proposer else 0,
                          measuring.judged_on_target)
    predicted = outcome.proposer.report(joined.study) if outcome.proposer is not None else None
    say_builds(engine.name, builds, predicted)
    changed = decision_changes(setup.metric, chosen.measurement.metrics) if chosen is not None else []
    for line in changed:
        log.warning(f"the chosen plan keeps {setup.metric.name} within the limit, but on {line}")
    facts = search_facts(config, setup, joined, shared, measuring, warm, outcome)
    per_build = measuring.per_build if outcome.proposer is not None else 0
    facts.update(decision_changes=changed,
                 **builds_facts(builds, measuring.executor, per_build, predicted))
    if facts["plan_ignored"]:
        log.warning(f"{setup.engine_info.engine} did not run some units at their planned precision "
                    f"in trial(s) {', '.join(map(str, facts['plan_ignored']))}: see "
                    "'build.plan_fidelity' in trials.json")
    ranges = shared.baseline.ranges
    with stages.timed("deployment"):
        deployment = deploy_plan(info, engine, chosen.plan, ranges, setup.dataset) if chosen is not None else None
    if outcome.held_out is not None:
        facts["held_out"] = outcome.held_out.to_json()
    if config.time_shapes and outcome.front:
        feasible = [t.number for t in outcome.front if config.judge.max_loss is None or t.feasible]
        with stages.timed("profile_timing"):
            facts["profile_timing"] = time_front_across(info, engine,
                                                        {t.number: t.plan for t in outcome.front},
                                                        feasible,
                                                        ranges, setup.dataset.evaluation[0]).to_json()
    # up to the writing
    facts.update(wall_seconds=round(time.monotonic() - started, 2), stage_seconds=dict(stages))
    result = SearchResult(setup.out_dir, model_record(info), setup.engine_info, facts,
                          tuple(outcome.trials),
                          tuple(outcome.front), chosen, units_json(info), outcome.versus)
    write_results(result, deployment)
    if config.plots:
        plot_result_dir(read_result_dir(setup.out_dir), side_by_side=config.isolation.isolate)
    if not outcome.trials:
        raise SearchFailed(nothing_measured(joined.study, setup.out_dir, config.judge.max_loss))
    return result


def _say_retiming(retiming: Retiming) -> None:
    """A re-timing that failed is said, with what it leaves: the trial's own figures, and no
    verdict."""
    unpaired = [str(f["trial"]) for f in retiming.failed if f["error"] == NO_FP32]
    if unpaired:
        log.warning("no all-FP32 plan in this study (an --override without fp32 leaves none): trial(s) "
                    f"{', '.join(unpaired)} keep their trials' latencies, no speed-up is stated, and the "
                    "chosen plan ships without the test that it runs faster than all-FP32")
    for failed in (f for f in retiming.failed if f["error"] != NO_FP32):
        log.warning(f"re-timing trial {failed['trial']} beside all-FP32 failed "
                    f"({failed['error'][:300]}): its latency is the trial's own, and no verdict on "
                    "timing noise is given for it")
    if retiming.apart:
        log.info("re-timing: engines too large to keep two alive were built one at a time, anew in "
                 "each round")



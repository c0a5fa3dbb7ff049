"""The Optuna study: one categorical per unit, two objectives (latency, accuracy loss), resumable.

Optuna does the heavy lifting (storage, sampler, Pareto front, constraints); this module turns
trials into plans, measures each distinct plan once, and keeps the study honest across restarts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autoprec.analysis.calibrate import CALIBRATION_METHODS, ActivationRanges
from autoprec.analysis.model_info import ModelInfo
from autoprec.backends.base import Backend
from autoprec.core.errors import AutoprecError, MetricError, StudyError, first_line
from autoprec.core.fields import Fields
from autoprec.core.plan import AUTO_CALIBRATION, DEFAULT_CALIBRATION, Plan, Precision, calibration_method
from autoprec.core.timing import Timing
from autoprec.measure.isolation import TrialCrash
from autoprec.measure.measurement import Measurement, Paired, Rejected
from autoprec.study.coordination import (
    DEFAULT_HEARTBEAT,
    SharedSteps,
    StepFailure,
    StudyLocks,
    beating,
    driver_missing,
    each_result,
    fail_dead_trials,
    give_back,
    redacted,
    storage_for,
    storage_hint,
    without_password,
    worker_id,
)
from autoprec.study.sensitivity import (
    Sensitivity,
)
from autoprec.study.warm_start import not_faster_than_fp32, warm_start_params

log = logging.getLogger("autoprec")


@dataclass(frozen=True)
class TrialRecord:
    """A finished trial as the result files and tables see it."""

    number: int
    plan: Plan
    measurement: Measurement
    feasible: bool
    duplicate_of: int | None = None
    retimed_ms: tuple[float, ...] = ()  # medians of the final interleaved re-timing rounds, if re-timed

    @property
    def latency_ms(self) -> float:
        """The latency to rank by: the re-timed median when there is one, else the trial's own."""
        return statistics.median(self.retimed_ms) if self.retimed_ms else self.measurement.latency.median_ms

    @property
    def loss(self) -> float:
        return self.measurement.loss

    def losses_by_shape(self) -> dict[str, float]:
        """Its loss at each shape it was judged at (and of its generation, for a decoder); {} at one shape."""
        return {point: figures["loss"] for point, figures in self.measurement.by_shape.items() if "loss" in figures}

    @property
    def worst_shape(self) -> str | None:
        """Where its loss is: the judged shape whose loss is the largest; None where it was judged at one."""
        losses = self.losses_by_shape()
        return max(losses, key=losses.get) if losses else None

    # --- as the views show it: the final latency is the re-timing rounds' median when the trial was re-timed, else
    # its own; the range behind it is those rounds' span, else its own p10-p90 ---

    @property
    def low_ms(self) -> float:
        return min(self.retimed_ms) if self.retimed_ms else self.measurement.latency.p10_ms

    @property
    def high_ms(self) -> float:
        return max(self.retimed_ms) if self.retimed_ms else self.measurement.latency.p90_ms

    @property
    def metrics(self) -> dict[str, dict[str, float]]:
        return self.measurement.metrics

    @property
    def precisions(self) -> dict[str, str]:
        return {name: p.value for name, p in self.plan.precisions}

    @property
    def mix(self) -> str:
        counts = self.plan.counts()
        return f"{counts['int8']}/{counts['fp16']}/{counts['fp32']}"

    def to_json(self) -> dict[str, Any]:
        """The trial as the result files write it (trials.json, pareto.json's front, best/plan.json)."""
        m = self.measurement
        return {
            "trial": self.number,
            "latency_ms": m.latency.to_json(),
            "final_latency_ms": self.latency_ms,
            "retimed_ms": list(self.retimed_ms),
            "latency_unstable": m.unstable,
            "retimes": m.retimes,
            "accuracy_loss": m.loss,
            "feasible": self.feasible,
            "metrics": m.metrics,
            "seconds": m.seconds,
            "duplicate_of": self.duplicate_of,
            "plan": self.plan.to_json(),
            "build": m.build,
            **({"by_shape": m.by_shape} if m.by_shape else {}),
        }

    @classmethod
    def from_json(cls, f: Fields) -> TrialRecord:
        """A trial as a result file has it, checked field by field (``final_latency_ms``, ``latency_unstable`` and
        the plan's ``counts`` are its figures' own: checked to be of their kind, not kept)."""
        latency, plan, duplicate = f["latency_ms"], f["plan"], f["duplicate_of"].nullable()
        timing = Timing(*(latency[k].number() for k in ("median_ms", "p10_ms", "p90_ms")), latency["runs"].integer(),
                        latency["warmup"].integer())
        f["final_latency_ms"].number(), f["latency_unstable"].flag()
        for precision in Precision:
            plan["counts"][precision.value].integer()
        precisions = {name: p.one_of(PRECISIONS) for name, p in plan["precisions"].mapping().items()}
        metrics = {name: {key: value.number() for key, value in output.mapping().items()}
                   for name, output in f["metrics"].mapping().items()}
        seconds = {key: value.number() for key, value in f["seconds"].mapping().items()} if "seconds" in f.value else {}
        retimes, build = f.get("retimes"), f["build"].nullable()
        shapes = ({point: {key: value.number() for key, value in figures.mapping().items()}
                   for point, figures in f["by_shape"].mapping().items()} if "by_shape" in f.value else {})
        measurement = Measurement(timing, metrics, f["accuracy_loss"].number(), seconds,
                                  retimes.integer() if retimes else 0, build.kind(dict) if build else None, shapes)
        return cls(f["trial"].integer(), Plan.from_mapping(precisions, plan["calibration"].text()), measurement,
                   f["feasible"].flag(), duplicate.integer() if duplicate else None, tuple(f["retimed_ms"].numbers()))


PRECISIONS = tuple(p.value for p in Precision)


class Proposals(Protocol):
    """Plans judged before they are built (:class:`autoprec.study.proposals.Proposer`)."""

    def __call__(self, study: optuna.Study) -> tuple[dict[str, str], dict] | None:
        """The next plan to build and what was predicted of it; None: the study's sampler proposes."""

    def enqueue(self, plans: list[dict[str, str]]) -> None:
        """Plans to judge first."""

    def judge(self, study: optuna.Study, params: dict[str, str]) -> tuple[float, float] | None:
        """A plan's predicted latency (ms) and reference loss, without building it; None: not yet known."""


@dataclass
class StudyContext:
    """Everything a trial needs, prepared once per search."""

    info: ModelInfo
    backend: Backend
    ranges: ActivationRanges | None
    measure: Callable[[Plan], Measurement]  # lowered and measured in a worker process (isolation) or in-process
    calibration: str
    max_loss: float | None
    locks: StudyLocks = field(default_factory=lambda: StudyLocks(None, f"local-{os.getpid()}-{id(object())}"))
    worker: str = field(default_factory=worker_id)
    # The next plan to build and what was predicted of it (autoprec.study.proposals), once set; None: the sampler's.
    propose: Proposals | None = None


# With --calibration auto the INT8 range method is one more categorical of the study.
CALIBRATION_PARAM = "@calibration"


def distributions(info: ModelInfo, calibration: str = DEFAULT_CALIBRATION) -> dict[str, CategoricalDistribution]:
    """One categorical per dimension: a searchable unit, with the units of its repeated pattern tied to it."""
    found = {u.name: CategoricalDistribution([p.value for p in u.allowed]) for u in info.dimensions}
    if calibration == AUTO_CALIBRATION:
        found[CALIBRATION_PARAM] = CategoricalDistribution(list(CALIBRATION_METHODS))
    return found


def plan_from_params(info: ModelInfo, params: dict[str, str], calibration: str) -> Plan:
    """Searched units take the trial's choice (a tied unit its pattern's); pinned units their only precision."""
    method = params.get(CALIBRATION_PARAM, calibration_method(calibration))
    return Plan.from_mapping({u.name: params.get(u.tied_to or u.name, u.allowed[0].value) for u in info.units}, method)


def uniform_params(info: ModelInfo, precision: Precision) -> dict[str, str]:
    """Every unit at ``precision``; a unit that may not take it gets the next wider one it allows, and a
    sensitive one (softmax, normalisation) stays at its safe FP32: the search decides those one by one."""
    widening = [Precision.INT8, Precision.FP16, Precision.FP32]
    candidates = widening[widening.index(precision):]
    return {
        u.name: (
            Precision.FP32 if u.sensitive else next((p for p in candidates if p in u.allowed), u.allowed[-1])
        ).value
        for u in info.dimensions
    }


def default_sampler(seed: int, parallel: bool = False) -> optuna.samplers.BaseSampler:
    """Multi-objective TPE: models the categorical choices jointly, honours the loss constraint.
    With trials in flight at once, the constant liar keeps it from proposing the same region twice."""
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10, constant_liar=parallel)


def make_sampler(name: str, seed: int, parallel: bool = False) -> optuna.samplers.BaseSampler:
    """``--sampler``: tpe (default), nsga2, gp (needs torch) or random; all Optuna's own."""
    if name == "tpe":
        return default_sampler(seed, parallel)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        try:
            import torch  # noqa: F401 - Optuna's GPSampler needs it
        except ImportError:
            raise AutoprecError(
                "--sampler gp: Optuna's GPSampler needs PyTorch; pip install torch, or use --sampler tpe"
            ) from None
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=10)
    raise AutoprecError(f"--sampler {name!r}: choose one of {', '.join(SAMPLERS)}")


SAMPLERS = ("tpe", "nsga2", "gp", "random")


def open_study(
    storage: str | optuna.storages.BaseStorage,
    study_name: str,
    identity: dict[str, Any],
    sampler: optuna.samplers.BaseSampler,
    heartbeat: int = DEFAULT_HEARTBEAT,
) -> optuna.Study:
    """Create or join the study (a storage URL gets heartbeats, see :mod:`autoprec.study.coordination`);
    refuse one that was made for another model, data or engine: every field of ``identity`` (what makes
    latencies and losses comparable) must match what the study recorded."""
    shown = redacted(storage) if isinstance(storage, str) else type(storage).__name__
    try:
        study = optuna.create_study(
            storage=storage_for(storage, heartbeat) if isinstance(storage, str) else storage,
            study_name=study_name,
            directions=["minimize", "minimize"],
            sampler=sampler,
            load_if_exists=True,
        )
    except ImportError as exc:
        raise driver_missing(str(storage), exc.__cause__ or exc) from None
    except Exception as exc:  # SQLAlchemy/Optuna raise many types for a bad URL or file
        cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ else exc
        first = without_password(first_line(cause, None, empty=""), str(storage))
        said = any(word in first.lower() for word in ("disk", "connect", "malformed", "database"))
        hint = storage_hint(first) if said else ("give a valid Optuna storage URL, e.g. "
                                                 "sqlite:///study.db or "
                                                 "postgresql://user:password@host/db")
        raise StudyError(f"--storage {shown}: cannot be opened ({type(exc).__name__}: {first}); {hint}") from None
    existing = study.user_attrs
    if not any(k in existing for k in identity):
        for key, value in identity.items():
            study.set_user_attr(key, value)
        return study
    differs = [k for k in identity if k in existing and existing[k] != identity[k]]
    if differs == ["metric"] and not study.get_trials(deepcopy=False):
        # nothing measured yet (a run refused for its metric's options, say): the study takes the new metric
        study.set_user_attr("metric", identity["metric"])
        return study
    if differs:
        detail = "; ".join(f"{k}: study has {existing[k]!r}, this run {identity.get(k)!r}" for k in differs[:3])
        raise StudyError(
            f"study {study_name!r} in {shown} was made for a different search ({detail}); "
            "use another --study-name or --out, or rerun with the original settings"
        )
    return study


def forget_if_unused(study: optuna.Study, storage: str) -> None:
    """Delete ``study`` where no trial was ever asked of it: what a run refused before its first trial leaves
    (bad labels, a metric that does not agree with itself), which would refuse the corrected run as made for a
    different search."""
    if not study.get_trials(deepcopy=False):
        optuna.delete_study(study_name=study.study_name, storage=storage)


def planned_params(trial: FrozenTrial) -> dict:
    """The plan a trial measures: its suggested parameters, or those it was queued with when it
    was interrupted before suggesting them (``enqueue_trial`` keeps them in the system attribute
    "fixed_params"; Optuna has no public reader for a queued trial's parameters)."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params", {}))


def counted(trial: FrozenTrial) -> bool:
    """Trials that count against the budget: finished ones, real failures (which carry an error) and
    candidates rejected early (pruned, with their screened loss).

    A trial failed by :func:`recover_interrupted` has no error and is re-run instead.
    """
    return (
        trial.state == TrialState.COMPLETE
        or (trial.state == TrialState.FAIL and "error" in trial.user_attrs)
        or (trial.state == TrialState.PRUNED and "rejected" in trial.user_attrs)
    )


# The study's first trials: all-FP32, all-FP16, all-INT8; the warm start reads their latencies.
UNIFORM = (Precision.FP32, Precision.FP16, Precision.INT8)


def seed_plans(study: optuna.Study, ctx: StudyContext, warm: Sequence[dict[str, str]] = (),
               uniform: Sequence[Precision] = UNIFORM) -> int:
    """Enqueue the ``uniform`` plans (all-FP32, all-FP16, all-INT8: both ends of the front), then the ``warm`` plans;
    returns how many were queued now.

    Each is queued unless some trial already holds it (another worker, or an earlier run of this search, queued
    it: the check and the queueing hold the study's lock), so a kill between two enqueues loses none.
    """
    with ctx.locks.hold("queue"):
        return _enqueue_unheld(study, [*(uniform_params(ctx.info, p) for p in uniform), *warm])


def _enqueue_unheld(study: optuna.Study, plans: Sequence[dict[str, str]]) -> int:
    """:func:`seed_plans` inside the study's queue lock."""
    queued = 0
    planned = [planned_params(t) for t in study.get_trials(deepcopy=False)]
    for params in plans:
        if not any(holds(p, params) for p in planned):
            planned.append(params)
            study.enqueue_trial(params)
            queued += 1
    return queued


def holds(planned: dict[str, str], params: dict[str, str]) -> bool:
    """A trial's planned parameters hold ``params``: each of them, at its value."""
    return all(planned.get(k) == v for k, v in params.items())


def record(trial: FrozenTrial | optuna.trial.BaseTrial) -> TrialRecord | None:
    attrs = trial.user_attrs
    if "measurement" not in attrs:
        return None
    try:
        return TrialRecord(
            number=trial.number,
            plan=Plan.from_json(attrs["plan"]),
            measurement=Measurement.from_json(attrs["measurement"]),
            feasible=all(v <= 0.0 for v in trial.constraints.values()),
            duplicate_of=attrs.get("duplicate_of"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StudyError(f"trial {trial.number} of the study: its stored plan or measurement is damaged "
                         f"({type(exc).__name__}: {exc}); search into a new --out (or --study-name)") from None


# How often a worker looks again when the rest of the budget is held by other workers' trials.
WAIT_SECONDS = 0.25
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what ends a search as Ctrl-C does


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (or SIGTERM, SIGHUP) during the block is raised when it ends: where a trial is created
    but not yet held by anything that would give it back, an interrupt would leave it RUNNING until
    its heartbeat goes stale. (Only the main thread receives signals; elsewhere the block runs as
    is.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {number: signal.signal(number, lambda signum, frame: caught.append(signum))
                for number in INTERRUPTS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if caught and caught[0] == signal.SIGINT:
            raise KeyboardInterrupt  # what Ctrl-C raises, whatever handler the process runs under
        if caught:
            signal.raise_signal(caught[0])  # to its own handler again (the command's: Terminated)


def start_trial(
    study: optuna.Study, ctx: StudyContext, budget: int, started: list[optuna.Trial]
) -> optuna.Trial | None:
    """A new trial while the study's budget has room, counting every worker's trials; None once
    ``budget`` trials count. The trial is appended to ``started`` as it is created, so whatever
    stops this worker next can give it back.

    While the rest of the budget is held by running trials, waits: they finish, or their worker
    died and they are failed and queued again (heartbeat), and this worker runs the re-run.

    The trial's ``asked`` attribute says how long this worker waited for the queue's lock (the other
    workers' asks) and held it (the storage's reads and the sampler's ask): what a trial costs beyond
    its measurement when many workers share the study.
    """
    while True:
        proposal = None
        if ctx.propose is not None and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            if sum(counted(t) for t in study.get_trials(deepcopy=False)) < budget:
                proposal = ctx.propose(study)  # judged on the reference executor, outside the lock
        lock_wanted_at = time.perf_counter()
        with ctx.locks.hold("queue"):
            lock_taken_at = time.perf_counter()
            fail_dead_trials(study)
            trials = study.get_trials(deepcopy=False)
            done = sum(counted(t) for t in trials)
            if done >= budget or every_plan_settled(trials, ctx):
                return None
            if done + sum(t.state == TrialState.RUNNING for t in trials) < budget:
                if proposal is not None:
                    study.enqueue_trial(proposal[0], user_attrs=proposal[1])
                with interrupts_deferred():
                    started.append(study.ask(distributions(ctx.info, ctx.calibration)))
                asked = {"queue_wait_s": round(lock_taken_at - lock_wanted_at, 4),
                         "queue_held_s": round(time.perf_counter() - lock_taken_at, 4)}
                break
        time.sleep(WAIT_SECONDS)
    started[-1].set_user_attr("asked", asked)
    return started[-1]


def distinct_plans(ctx: StudyContext) -> int:
    """How many distinct plans the study's space holds: the product of every dimension's choices."""
    return math.prod(len(d.choices) for d in distributions(ctx.info, ctx.calibration).values())


def every_plan_settled(trials: Sequence[FrozenTrial], ctx: StudyContext) -> bool:
    """Every distinct plan of the space was measured, failed or rejected: a trial more could only
    repeat one, so a budget larger than the space ends here (the sampler would propose duplicates
    for ever)."""
    settled = {t.user_attrs["plan_key"] for t in trials
               if counted(t) and "plan_key" in t.user_attrs}
    return len(settled) >= distinct_plans(ctx)


def run_trial(study: optuna.Study, ctx: StudyContext, trial: optuna.Trial) -> TrialRecord | None:
    """Measure the trial's plan (or reuse its earlier measurement), tell the result."""
    started = time.perf_counter()
    plan = plan_from_params(ctx.info, trial.params, ctx.calibration)
    key = plan.key()
    trial.set_user_attr("plan", plan.to_json())
    trial.set_user_attr("plan_key", key)
    with ctx.locks.hold(f"plan:{key}"):  # a worker measuring this plan finishes first; then it is reused
        return _settle(study, ctx, trial, plan, key, started)


def _earlier(study: optuna.Study, key: str, number: int) -> FrozenTrial | None:
    """The trial (of any worker) that settled plan ``key`` first: measured it, failed it or rejected it."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)):
        attrs = trial.user_attrs
        if trial.number == number or attrs.get("plan_key") != key or "duplicate_of" in attrs:
            continue
        if trial.state == TrialState.COMPLETE or "error" in attrs or "rejected" in attrs:
            return trial
    return None


def _settle(
    study: optuna.Study, ctx: StudyContext, trial: optuna.Trial, plan: Plan, key: str, started: float
) -> TrialRecord | None:
    earlier = _earlier(study, key, trial.number)
    if earlier is not None and earlier.state == TrialState.COMPLETE:
        trial.set_user_attr("measurement", earlier.user_attrs["measurement"])
        for key_, value in earlier.constraints.items():
            trial.set_constraint(key_, value)
        trial.set_user_attr("duplicate_of", earlier.number)
        study.tell(trial, earlier.values)
        return record(study.get_trials(deepcopy=False)[trial.number])
    if earlier is not None and earlier.state == TrialState.FAIL:
        trial.set_user_attr("error", f"the same plan failed in trial {earlier.number}; not measured again")
        trial.set_user_attr("duplicate_of", earlier.number)
        study.tell(trial, state=TrialState.FAIL)
        return None
    if earlier is not None:
        _reject(study, trial, ctx, {**earlier.user_attrs["rejected"], "duplicate_of": earlier.number})
        return None
    looked_up = time.perf_counter() - started  # the plan read and written, its lock, the earlier trials read
    try:
        result = _measure_at_most_twice(ctx, plan)
    except Rejected as rejected:
        _reject(study, trial, ctx, rejected.to_json())
        return None
    except MetricError:
        study.tell(trial, state=TrialState.FAIL)
        raise
    except (AutoprecError, RuntimeError, ValueError, KeyError) as exc:
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:4000])
        study.tell(trial, state=TrialState.FAIL)
        return None
    result.seconds["trial"] = time.perf_counter() - started  # all of it: sampling, lowering, IPC, engine work
    result.seconds["lookup"] = looked_up
    trial.set_user_attr("measurement", result.to_json())
    if ctx.max_loss is not None:  # Optuna's constraint: feasible when loss - max_loss <= 0
        trial.set_constraint("max_loss", result.loss - ctx.max_loss)
    study.tell(trial, [result.latency.median_ms, result.loss])
    return record(study.get_trials(deepcopy=False)[trial.number])


def _reject(study: optuna.Study, trial: optuna.Trial, ctx: StudyContext, screened: dict) -> None:
    """Pruned, with its screened loss kept and as an (infeasible) constraint the sampler learns from."""
    trial.set_user_attr("rejected", screened)
    if ctx.max_loss is not None:
        trial.set_constraint("max_loss", screened["loss"] - ctx.max_loss)
    study.tell(trial, state=TrialState.PRUNED)


def _measure_at_most_twice(ctx: StudyContext, plan: Plan) -> Measurement:
    """A crash may be the machine's fault, so it gets one retry in a fresh worker; a second one fails the plan."""
    try:
        return ctx.measure(plan)
    except TrialCrash as first:
        try:
            return ctx.measure(plan)
        except TrialCrash as second:
            raise TrialCrash(f"crashed twice, not retried again. First: {first}. Second: {second}") from None


def run_study(
    study: optuna.Study,
    ctx: StudyContext,
    budget: int,
    on_trial: Callable[[int, TrialRecord | None], None] | None = None,
    workers: int = 1,
    before_ask: Callable[[], object] | None = None,
) -> None:
    """Run trials until ``budget`` of them count, this process's and every other worker's of the
    study alike (already finished ones, of a resumed study, too). ``workers`` trials run at once
    here (each thread's ``ctx.measure`` takes its own worker process); ``before_ask`` runs before
    each trial is asked for.

    A trial stopped by Ctrl-C or an error is failed and queued again at once, as one whose
    worker died is by its heartbeat."""
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            started: list[optuna.Trial] = []
            try:
                if before_ask is not None:
                    before_ask()
                trial = start_trial(study, ctx, budget, started)
                if trial is None:
                    return
                with beating(study, trial, ctx.worker):
                    result = run_trial(study, ctx, trial)
            except BaseException:
                stop.set()  # the other threads finish the trial they are in, then stop
                for unfinished in started:  # created, even if interrupted before it could beat
                    give_back(study, unfinished)
                raise
            if on_trial is not None:
                on_trial(sum(counted(t) for t in study.get_trials(deepcopy=False)), result)

    if workers <= 1:
        work()
        _say_if_every_plan_settled(study, ctx, budget)
        return
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="autoprec-trial") as pool:
        try:
            for future in [pool.submit(work) for _ in range(workers)]:
                future.result()
        except BaseException:  # an error in a trial, or Ctrl-C here: no new trials, then the pool closes
            stop.set()
            raise
    _say_if_every_plan_settled(study, ctx, budget)


def _say_if_every_plan_settled(study: optuna.Study, ctx: StudyContext, budget: int) -> None:
    """Said where the study ended before its budget for want of a plan it has not measured."""
    trials = study.get_trials(deepcopy=False)
    if sum(counted(t) for t in trials) < budget and every_plan_settled(trials, ctx):
        log.info(f"every one of the {distinct_plans(ctx)} distinct plans of the space is measured: "
                 f"no trial is left to run before --budget {budget}")


@dataclass(frozen=True)
class WarmStarted:
    """The warm-start plans, how many of them this run queued (a resumed study holds the rest already), and the
    precisions they left out (their all-units plan was not faster than all-FP32)."""

    plans: list[dict[str, str]]
    slow: list[str]
    queued: int


def run_warm_started(
    study: optuna.Study,
    ctx: StudyContext,
    budget: int,
    sensitivity: Sensitivity | None,
    on_trial: Callable[[int, TrialRecord | None], None] | None = None,
    workers: int = 1,
    propose: Proposals | None = None,
) -> WarmStarted:
    """The uniform plans first, then (with a sensitivity) the warm-start plans built from their
    measured latencies, then the sampler, until ``budget`` trials count. The warm-start plans are queued
    once the uniform plans are measured; a worker free before that (the study has more workers than
    uniform plans) runs the sampler's trials meanwhile instead of waiting. With ``propose``, the
    all-FP32 plan is built first; the other uniform plans are judged before they are built (the
    reference loss, the predicted latency) and only those within the limit built, so no build goes
    to an all-INT8 plan far past it (the warm start reads its judged numbers instead); the
    warm-start plans and the sampler's are proposals.

    Returns the warm-start plans (how many were new to the study) and the precisions they left out whose
    all-units plan was not faster than all-FP32.
    """
    if propose is not None:
        return _run_proposed(study, ctx, budget, sensitivity, on_trial, workers, propose)
    seed_plans(study, ctx, uniform=UNIFORM)
    warm = _WarmStart(study, ctx, sensitivity)
    run_study(study, ctx, budget, on_trial, workers, before_ask=warm.queue_once_uniform_measured)
    return warm.queue_once_uniform_measured() or WarmStarted([], [], 0)


class _WarmStart:
    """Queues the warm-start plans, once, when every uniform plan's trial has finished (on any worker)."""

    def __init__(self, study: optuna.Study, ctx: StudyContext, sensitivity: Sensitivity | None):
        self.study, self.ctx, self.sensitivity = study, ctx, sensitivity
        self.uniform = [uniform_params(ctx.info, p) for p in UNIFORM]
        self.started: WarmStarted | None = None
        self._lock = threading.Lock()  # the in-process workers' threads

    def queue_once_uniform_measured(self) -> WarmStarted | None:
        """The warm start, queued now if the uniform plans are measured; None while one is not. The check and the
        queueing hold the study's queue lock: a dead worker's uniform trial is failed and queued again inside it."""
        with self._lock:
            if self.started is None:
                with self.ctx.locks.hold("queue"):
                    if not self._uniform_pending():
                        self.started = self._queued()
            return self.started

    def _queued(self) -> WarmStarted:
        warm, slow = _warm_plans(self.ctx, self.sensitivity, uniform_measured(self.study))
        return WarmStarted(warm, slow, _enqueue_unheld(self.study, warm))

    def _uniform_pending(self) -> bool:
        """A uniform plan still queued or running (a trial of it that died is queued again)."""
        pending = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
        return any(holds(planned_params(t), params) for t in pending for params in self.uniform)


def _warm_plans(ctx: StudyContext, sensitivity: Sensitivity | None,
                measured: dict[str, tuple[float, float]]) -> tuple[list[dict[str, str]], list[str]]:
    """The warm-start plans from the uniform plans' (latency, loss), and the precisions they leave out because
    their all-units plan was not faster than all-FP32; none without a sensitivity."""
    if sensitivity is None:
        return [], []
    warm = warm_start_params(ctx.info, sensitivity, ctx.max_loss, measured)
    return warm, [p for p in not_faster_than_fp32(measured) if not any(p in plan.values() for plan in warm)]


def _run_proposed(study: optuna.Study, ctx: StudyContext, budget: int, sensitivity: Sensitivity | None,
                  on_trial: Callable[[int, TrialRecord | None], None] | None, workers: int,
                  propose: Proposals) -> WarmStarted:
    """:func:`run_warm_started` with proposals: all-FP32 built, the other uniform plans judged and those within the
    limit built, then the warm start and the sampler's plans as proposals."""
    seed_plans(study, ctx, uniform=(Precision.FP32,))
    run_study(study, ctx, min(budget, 1), on_trial, workers)
    fp32 = uniform_params(ctx.info, Precision.FP32)
    reduced = {
        p: params for p in UNIFORM[1:] if (params := uniform_params(ctx.info, p)) != fp32
    }  # a precision no unit takes: none
    measured = uniform_measured(study)
    judged = {p: found for p, params in reduced.items()
              if p.value not in measured and (found := propose.judge(study, params)) is not None}
    # within the limit a uniform plan may be the answer (or, without one, is an end of the front): built
    # as before; past it, its judged numbers stand in for the warm start and it costs no build
    worth = [reduced[p] for p, (_, loss) in judged.items() if ctx.max_loss is None or loss <= ctx.max_loss]
    worth = [params for i, params in enumerate(worth) if params not in worth[:i]]  # all-INT8 may be all-FP16
    seed_plans(study, ctx, worth, uniform=())
    run_study(study, ctx, min(budget, 1 + len(worth)), on_trial, workers)
    measured = {**{p.value: found for p, found in judged.items()}, **uniform_measured(study)}
    warm, slow = _warm_plans(ctx, sensitivity, measured)
    propose.enqueue([*reduced.values(), *warm])
    ctx.propose = propose
    run_study(study, ctx, budget, on_trial, workers)
    return WarmStarted(warm, slow, len(warm))


def uniform_trials(trials: Sequence[TrialRecord]) -> dict[str, TrialRecord]:
    """The first all-fp32 / all-fp16 / all-int8 trial of each kind, where the study has one."""
    found: dict[str, TrialRecord] = {}
    for trial in trials:
        for precision, n in trial.plan.counts().items():
            if n == len(trial.plan.precisions):
                found.setdefault(precision, trial)
    return found


def uniform_measured(study: optuna.Study) -> dict[str, tuple[float, float]]:
    """(latency ms, loss) of each uniform plan the study has measured, by its precision."""
    return {p: (t.latency_ms, t.loss) for p, t in uniform_trials(finished_records(study)).items()}


def rejected_trials(study: optuna.Study) -> list[dict[str, Any]]:
    """Candidates stopped by cheap rejection: trial number and what their screening measured."""
    return [
        {"trial": t.number, **t.user_attrs["rejected"], "plan": t.user_attrs.get("plan")}
        for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)) if "rejected" in t.user_attrs
    ]


def nothing_measured(study: optuna.Study, out_dir: Path) -> str:
    """Why a study has no measured trial: how its trials ended and the first error, in one line."""
    trials = [t for t in study.get_trials(deepcopy=False) if counted(t)]
    errors = [(t.number, first_line(t.user_attrs["error"])) for t in trials
              if t.state == TrialState.FAIL and "error" in t.user_attrs]
    rejected = sum(t.state == TrialState.PRUNED for t in trials)
    cause = (f"all {len(errors)} failed ({'; '.join(f'trial {n}: {e}' for n, e in errors[:1])})" if errors else
             f"{rejected} rejected early for their loss")
    return (f"no candidate was measured: of {len(trials)} trial(s), {cause}"
            + (f", {rejected} rejected early" if errors and rejected else "")
            + f". The study and {out_dir} are kept; fix the cause and search again into a new --out "
            "(this study's budget is spent)")


def built_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials whose plan the target engine built: measured, rejected after screening, or failed
    (a duplicate reuses an earlier build)."""
    return [t for t in study.get_trials(deepcopy=False) if counted(t) and "duplicate_of" not in t.user_attrs]


def on_node_time_build(trial: FrozenTrial) -> bool:
    """Whether the trial was timed on the engine built for the sensitivity pass's profile of the same
    graph (so it is no build of its own; see the TensorRT backend's NodeTimedEngines)."""
    return bool(((trial.user_attrs.get("measurement") or {}).get("build") or {}).get("reused_build"))


def finished_records(study: optuna.Study) -> list[TrialRecord]:
    return [r for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if (r := record(t))]


def pareto_front(study: optuna.Study) -> list[TrialRecord]:
    """Optuna's Pareto front (feasible trials only when --max-loss is set), one trial per plan."""
    front, seen = [], set()
    for trial in sorted(study.best_trials, key=lambda t: t.values[0]):
        r = record(trial)
        if r is not None and r.plan.key() not in seen:
            seen.add(r.plan.key())
            front.append(r)
    return front


@dataclass(frozen=True)
class Retiming:
    """What the re-timing measured: each re-timed trial again, the engine builds it took, and each plan
    whose re-timing failed (its figures stay the trial's own: no verdict on timing noise rests on them)."""

    trials: dict[int, TrialRecord]
    builds: int = 0
    apart: bool = False  # engines built one at a time, anew each round (too large to keep two)
    failed: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"retimed": sorted(self.trials), "builds": self.builds, "one_engine_at_a_time": self.apart,
                "failed": list(self.failed)}


def retime(records: Sequence[TrialRecord], fp32: TrialRecord | None, time_paired: Callable[[Plan, Plan, int], Paired],
           rounds: int = 3, shared: SharedSteps | None = None) -> Retiming:
    """Time each plan again beside the all-FP32 plan (``fp32``), one plan at a time, in interleaved rounds
    (``time_paired``: :meth:`autoprec.measure.measurement.Measurer.time_paired`), so the choice does not rest
    on one lucky or unlucky trial, and memory does not grow with the plans re-timed. The all-FP32 plan's
    re-timed figure is every round it ran beside them. A plan whose re-timing fails (a crash, the memory or
    time limit) keeps its trial's timing, and is said in ``failed``. With ``shared``, the study's workers
    re-time the plans side by side, each plan beside all-FP32 on one worker's device, each plan once."""
    if fp32 is None:
        return Retiming({}, failed=tuple({"trial": r.number, "error": "no all-FP32 trial to re-time it beside"}
                                         for r in records))
    others = [r for r in records if r.plan.key() != fp32.plan.key()]
    steps = [(f"{fp32.number}:{r.number}:{rounds}", partial(_paired_rounds, time_paired, fp32.plan, r.plan, rounds))
             for r in others]
    found = shared.spread(steps) if shared is not None else {step: each_result(compute) for step, compute in steps}
    timed_by = shared.workers_of([step for step, _ in steps]) if shared is not None else set()
    if len(timed_by) > 1:
        log.info(f"re-timing: {len(steps)} plan(s) re-timed by {len(timed_by)} workers of the study (or its earlier runs), "
                 "each beside all-FP32 on its own device; each plan's rounds are read against its own all-FP32's")
        found = _on_one_scale(found)
    trials, reference, failed, builds, apart = {}, [], [], 0, False
    for record, (step, _) in zip(others, steps):
        paired = found[step]
        if isinstance(paired, StepFailure):
            failed.append({"trial": record.number, "error": paired.text})
            continue
        trials[record.number] = replace(record, retimed_ms=tuple(paired["candidate"]))
        reference += paired["reference"]
        builds, apart = builds + paired["builds"], apart or paired["apart"]
    if reference:
        trials[fp32.number] = replace(fp32, retimed_ms=tuple(reference))
    return Retiming(trials, builds, apart, tuple(failed))


def _on_one_scale(found: dict[str, Any]) -> dict[str, Any]:
    """Re-timings from several devices, each plan's rounds (and its all-FP32's) rescaled so that its all-FP32 median
    is the median of all of them: what each pairing measured is the plan against all-FP32 on one device, and a
    device 3 % slower than another would otherwise decide the front."""
    timed = {step: paired for step, paired in found.items() if not isinstance(paired, StepFailure)}
    if not timed:
        return found
    pooled = statistics.median(ms for paired in timed.values() for ms in paired["reference"])
    rescaled = {}
    for step, paired in timed.items():
        factor = pooled / statistics.median(paired["reference"])
        rescaled[step] = {**paired, "candidate": [ms * factor for ms in paired["candidate"]],
                          "reference": [ms * factor for ms in paired["reference"]]}
    return {**found, **rescaled}


def _paired_rounds(time_paired: Callable[[Plan, Plan, int], Paired], fp32: Plan, plan: Plan, rounds: int) -> dict[str, Any]:
    """One plan re-timed beside all-FP32: each round's median, as the study stores it."""
    try:
        paired = time_paired(fp32, plan, rounds)
    except (AutoprecError, RuntimeError, ValueError) as exc:
        raise StepFailure(f"{type(exc).__name__}: {exc}"[:1000]) from None
    return {"candidate": [t.median_ms for t in paired.candidate], "reference": [t.median_ms for t in paired.reference],
            "builds": paired.builds, "apart": paired.apart}


# Final re-timing of the front: enough rounds for a max/min comparison to mean something.
RETIME_ROUNDS = 3


# Besides the front, this many of the fastest plans within --max-loss are re-timed: a coarse loss (a
# task metric on a few items) ties many plans at one value, and the front keeps one per loss value,
# chosen on a single trial's timing.
RETIME_FEASIBLE = 3


def retimed_front(
    study: optuna.Study, time_paired: Callable[[Plan, Plan, int], Paired], rounds: int = RETIME_ROUNDS,
    max_loss: float | None = None, shared: SharedSteps | None = None,
) -> tuple[list[TrialRecord], Retiming]:
    """The Pareto front, fastest first, after it and the ``RETIME_FEASIBLE`` fastest other plans within
    ``max_loss`` were timed again beside the all-FP32 plan in ``rounds`` interleaved rounds (see
    :func:`retime`; with ``shared``, spread over the study's workers); and the re-timing.

    Membership is decided again on the re-timed numbers: a member that the re-timing shows slower
    than another re-timed plan at no less loss (the all-FP32 plan included) is dominated, and
    leaves the front, and the all-FP32 plan is on it when nothing re-timed dominates it: the front
    shown is a front in the numbers shown, never empty."""
    front = pareto_front(study)
    finished = finished_records(study)
    fp32 = uniform_trials(finished).get("fp32")
    on_front = {r.plan.key() for r in front}
    feasible = sorted(
        (
            r
            for r in finished
            if max_loss is not None and r.loss <= max_loss and r.plan.key() not in on_front and r.duplicate_of is None
        ),
        key=lambda r: r.latency_ms,
    )
    extra, seen = [], set(on_front)
    for r in feasible:
        if r.plan.key() not in seen and len(extra) < RETIME_FEASIBLE:
            seen.add(r.plan.key())
            extra.append(r)
    candidates = [*front, *extra, *([fp32] if fp32 else [])]
    retiming = retime(list({r.number: r for r in candidates}.values()), fp32, time_paired, rounds, shared)
    shown, plans = [], set()
    for r in candidates:  # one trial per plan: the front's, the fastest feasible others, the all-FP32 plan
        if r.plan.key() not in plans:
            plans.add(r.plan.key())
            shown.append(retiming.trials.get(r.number, r))
    # the all-FP32 plan rejoins the front when the re-timing shows nothing faster at its (zero) loss
    kept = [r for r in shown if not any(_dominates(other, r) for other in shown)]
    return sorted(kept, key=lambda r: r.latency_ms), retiming


def _dominates(a: TrialRecord, b: TrialRecord) -> bool:
    """``a`` is at least as fast and as accurate as ``b``, and better in one (different plans only)."""
    if a.plan.key() == b.plan.key():
        return False
    return a.latency_ms <= b.latency_ms and a.loss <= b.loss and (a.latency_ms < b.latency_ms or a.loss < b.loss)


def default_study_name(model_path: Path, backend: str) -> str:
    return f"autoprec-{model_path.stem}-{backend}"

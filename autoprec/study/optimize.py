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
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autoprec.analysis.calibrate import CALIBRATION_METHODS, ActivationRanges
from autoprec.analysis.model_info import ModelInfo
from autoprec.backends.base import Backend
from autoprec.core.errors import AutoprecError, MetricError
from autoprec.core.plan import (
    AUTO_CALIBRATION,
    DEFAULT_CALIBRATION,
    Plan,
    Precision,
    calibration_method,
)
from autoprec.measure.isolation import TrialCrash
from autoprec.measure.measurement import Rejected
from autoprec.record.trial import Measurement, TrialRecord
from autoprec.study.coordination import (
    StudyLocks,
    beating,
    fail_dead_trials,
    give_back,
    worker_id,
)
from autoprec.study.reading import counted, record

log = logging.getLogger("autoprec")


class Proposals(Protocol):
    """Plans judged before they are built (:class:`autoprec.study.proposals.Proposer`)."""

    def __call__(self, study: optuna.Study) -> tuple[dict[str, str], dict] | None:
        """The next plan to build and what was predicted of it; None: the study's sampler
        proposes."""

    def enqueue(self, plans: list[dict[str, str]]) -> None:
        """Plans to judge first."""

    def judge(self, study: optuna.Study, params: dict[str, str]) -> tuple[float, float] | None:
        """A plan's predicted latency (ms) and reference loss, without building it; None: not yet
        known."""


@dataclass
class StudyContext:
    """Everything a trial needs, prepared once per search."""

    info: ModelInfo
    backend: Backend
    ranges: ActivationRanges | None
    # lowered and measured in a worker process (isolation) or in-process
    measure: Callable[[Plan], Measurement]
    calibration: str
    max_loss: float | None
    locks: StudyLocks = field(default_factory=lambda: StudyLocks(None, f"local-{os.getpid()}-{id(object())}"))
    worker: str = field(default_factory=worker_id)
    # The next plan to build and what was predicted of it (autoprec.study.proposals), once set;
    # None: the sampler's.
    propose: Proposals | None = None


# With --calibration auto the INT8 range method is one more categorical of the study.
CALIBRATION_PARAM = "@calibration"


def distributions(info: ModelInfo, calibration: str = DEFAULT_CALIBRATION) -> dict[str, CategoricalDistribution]:
    """One categorical per dimension: a searchable unit, with the units of its repeated pattern tied
    to it."""
    found = {u.name: CategoricalDistribution([p.value for p in u.allowed]) for u in info.dimensions}
    if calibration == AUTO_CALIBRATION:
        found[CALIBRATION_PARAM] = CategoricalDistribution(list(CALIBRATION_METHODS))
    return found


def plan_from_params(info: ModelInfo, params: dict[str, str], calibration: str) -> Plan:
    """Searched units take the trial's choice (a tied unit its pattern's); pinned units their only
    precision."""
    method = params.get(CALIBRATION_PARAM, calibration_method(calibration))
    return Plan.from_mapping({u.name: params.get(u.tied_to or u.name, u.allowed[0].value) for u in info.units}, method)


def uniform_params(info: ModelInfo, precision: Precision) -> dict[str, str]:
    """Every unit at ``precision``; a unit that may not take it gets the next wider one it allows,
    and a sensitive one (softmax, normalisation) stays at its safe FP32: the search decides those
    one by one."""
    widening = list(Precision)
    candidates = widening[widening.index(precision):]
    return {
        u.name: (
            Precision.FP32 if u.sensitive else next((p for p in candidates if p in u.allowed),
                                                    u.allowed[-1])
        ).value
        for u in info.dimensions
    }


def planned_params(trial: FrozenTrial) -> dict:
    """The plan a trial measures: its suggested parameters, or those it was queued with when it
    was interrupted before suggesting them (``enqueue_trial`` keeps them in the system attribute
    "fixed_params"; Optuna has no public reader for a queued trial's parameters)."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params", {}))


# The study's first trials: all-FP32, all-FP16, all-INT8, all-INT4 where units take it (one plan is
# queued once: where no unit takes INT4 it is all-INT8); the warm start reads their latencies.
UNIFORM = (Precision.FP32, Precision.FP16, Precision.INT8, Precision.INT4)


def seed_plans(study: optuna.Study, ctx: StudyContext, warm: Sequence[dict[str, str]] = (),
               uniform: Sequence[Precision] = UNIFORM) -> int:
    """Enqueue the ``uniform`` plans (all-FP32, all-FP16, all-INT8: both ends of the front), then
    the ``warm`` plans; returns how many were queued now.

    Each is queued unless some trial already holds it (another worker, or an earlier run of this
    search, queued it: the check and the queueing hold the study's lock), so a kill between two
    enqueues loses none.
    """
    with ctx.locks.hold("queue"):
        return enqueue_unheld(study, [*(uniform_params(ctx.info, p) for p in uniform), *warm])


def enqueue_unheld(study: optuna.Study, plans: Sequence[dict[str, str]]) -> int:
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
    workers' asks) and held it (the storage's reads and the sampler's ask): what a trial costs
    beyond its measurement when many workers share the study.
    """
    while True:
        proposal = None
        if ctx.propose is not None and not study.get_trials(deepcopy=False,
                                                            states=(TrialState.WAITING,)):
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
    # a worker measuring this plan finishes first; then it is reused
    with ctx.locks.hold(f"plan:{key}"):
        return _settle(study, ctx, trial, plan, key, started)


def _earlier(study: optuna.Study, key: str, number: int) -> FrozenTrial | None:
    """The trial (of any worker) that settled plan ``key`` first: measured it, failed it or rejected
    it."""
    for trial in study.get_trials(deepcopy=False,
                                  states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)):
        attrs = trial.user_attrs
        if trial.number == number or attrs.get("plan_key") != key or "duplicate_of" in attrs:
            continue
        if trial.state == TrialState.COMPLETE or "error" in attrs or "rejected" in attrs:
            return trial
    return None


def _settle(
    study: optuna.Study, ctx: StudyContext, trial: optuna.Trial, plan: Plan, key: str,
    started: float
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
        trial.set_user_attr("error", f"the same plan failed in trial {earlier.number}; not "
                                     "measured again")
        trial.set_user_attr("duplicate_of", earlier.number)
        study.tell(trial, state=TrialState.FAIL)
        return None
    if earlier is not None:
        _reject(study, trial, ctx,
                {**earlier.user_attrs["rejected"], "duplicate_of": earlier.number})
        return None
    # the plan read and written, its lock, the earlier trials read
    looked_up = time.perf_counter() - started
    try:
        result = _measure_at_most_twice(ctx, plan)
    except Rejected as rejected:
        _reject(study, trial, ctx, rejected.screened.to_json())
        return None
    except MetricError:
        study.tell(trial, state=TrialState.FAIL)
        raise
    except (AutoprecError, RuntimeError, ValueError, KeyError) as exc:
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:4000])
        study.tell(trial, state=TrialState.FAIL)
        return None
    # all of it: sampling, lowering, IPC, engine work
    result.seconds["trial"] = time.perf_counter() - started
    result.seconds["lookup"] = looked_up
    trial.set_user_attr("measurement", result.to_json())
    if ctx.max_loss is not None:  # Optuna's constraint: feasible when loss - max_loss <= 0
        trial.set_constraint("max_loss", result.loss - ctx.max_loss)
    study.tell(trial, [result.latency.median_ms, result.loss])
    return record(study.get_trials(deepcopy=False)[trial.number])


def _reject(study: optuna.Study, trial: optuna.Trial, ctx: StudyContext, screened: dict) -> None:
    """Pruned, with its screened loss kept and as an (infeasible) constraint the sampler learns
    from."""
    trial.set_user_attr("rejected", screened)
    if ctx.max_loss is not None:
        trial.set_constraint("max_loss", screened["loss"] - ctx.max_loss)
    study.tell(trial, state=TrialState.PRUNED)


def _measure_at_most_twice(ctx: StudyContext, plan: Plan) -> Measurement:
    """A crash may be the machine's fault, so it gets one retry in a fresh worker; a second one
    fails the plan."""
    try:
        return ctx.measure(plan)
    except TrialCrash as first:
        try:
            return ctx.measure(plan)
        except TrialCrash as second:
            raise TrialCrash(f"crashed twice, not retried again. First: {first}. Second: "
                             f"{second}") from None


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
        # an error in a trial, or Ctrl-C here: no new trials, then the pool closes
        except BaseException:
            stop.set()
            raise
    _say_if_every_plan_settled(study, ctx, budget)


def _say_if_every_plan_settled(study: optuna.Study, ctx: StudyContext, budget: int) -> None:
    """Said where the study ended before its budget for want of a plan it has not measured."""
    trials = study.get_trials(deepcopy=False)
    if sum(counted(t) for t in trials) < budget and every_plan_settled(trials, ctx):
        log.info(f"every one of the {distinct_plans(ctx)} distinct plans of the space is measured: "
                 f"no trial is left to run before --budget {budget}")



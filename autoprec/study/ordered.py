"""The study run in its order: the uniform plans first (all-FP32, all-FP16, all-INT8), then the
warm-start plans built from their measured latencies and the sensitivity pass, then the sampler,
until the budget counts; with proposals, plans judged before they are built."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

import optuna
from optuna.trial import TrialState

from autoprec.core.plan import Precision
from autoprec.record.per_unit import Sensitivity
from autoprec.record.trial import TrialRecord
from autoprec.study.optimize import (
    UNIFORM,
    Proposals,
    StudyContext,
    enqueue_unheld,
    holds,
    planned_params,
    run_study,
    seed_plans,
    uniform_params,
)
from autoprec.study.reading import uniform_measured
from autoprec.study.warm_start import not_faster_than_fp32, warm_start_params

log = logging.getLogger("autoprec")


@dataclass(frozen=True)
class WarmStarted:
    """The warm-start plans, how many of them this run queued (a resumed study holds the rest
    already), and the precisions they left out (their all-units plan was not faster than
    all-FP32)."""

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
    measured latencies, then the sampler, until ``budget`` trials count. The warm-start plans are
    queued once the uniform plans are measured; a worker free before that (the study has more
    workers than uniform plans) runs the sampler's trials meanwhile instead of waiting. With
    ``propose``, the all-FP32 plan is built first; the other uniform plans are judged before they
    are built (the reference loss, the predicted latency) and only those within the limit built, so
    no build goes to an all-INT8 plan far past it (the warm start reads its judged numbers instead);
    the warm-start plans and the sampler's are proposals.

    Returns the warm-start plans (how many were new to the study) and the precisions they left out
    whose all-units plan was not faster than all-FP32.
    """
    if propose is not None:
        return _run_proposed(study, ctx, budget, sensitivity, on_trial, workers, propose)
    seed_plans(study, ctx, uniform=UNIFORM)
    warm = _WarmStart(study, ctx, sensitivity)
    run_study(study, ctx, budget, on_trial, workers, before_ask=warm.queue_once_uniform_measured)
    return warm.queue_once_uniform_measured() or WarmStarted([], [], 0)


class _WarmStart:
    """Queues the warm-start plans, once, when every uniform plan's trial has finished (on any
    worker)."""

    def __init__(self, study: optuna.Study, ctx: StudyContext, sensitivity: Sensitivity | None):
        self.study, self.ctx, self.sensitivity = study, ctx, sensitivity
        self.uniform = [uniform_params(ctx.info, p) for p in UNIFORM]
        self.started: WarmStarted | None = None
        self._lock = threading.Lock()  # the in-process workers' threads

    def queue_once_uniform_measured(self) -> WarmStarted | None:
        """The warm start, queued now if the uniform plans are measured; None while one is not. The
        check and the queueing hold the study's queue lock: a dead worker's uniform trial is failed
        and queued again inside it."""
        with self._lock:
            if self.started is None:
                with self.ctx.locks.hold("queue"):
                    if not self._uniform_pending():
                        self.started = self._queued()
            return self.started

    def _queued(self) -> WarmStarted:
        warm, slow = _warm_plans(self.ctx, self.sensitivity, uniform_measured(self.study))
        return WarmStarted(warm, slow, enqueue_unheld(self.study, warm))

    def _uniform_pending(self) -> bool:
        """A uniform plan still queued or running (a trial of it that died is queued again)."""
        pending = self.study.get_trials(deepcopy=False,
                                        states=(TrialState.WAITING, TrialState.RUNNING))
        return any(holds(planned_params(t), params) for t in pending for params in self.uniform)


def _warm_plans(ctx: StudyContext, sensitivity: Sensitivity | None,
                measured: dict[str, tuple[float, float]]) -> tuple[list[dict[str, str]], list[str]]:
    """The warm-start plans from the uniform plans' (latency, loss), and the precisions they leave
    out because their all-units plan was not faster than all-FP32; none without a sensitivity."""
    if sensitivity is None:
        return [], []
    warm = warm_start_params(ctx.info, sensitivity, ctx.max_loss, measured)
    return warm, [p for p in not_faster_than_fp32(measured) if not any(p in plan.values() for plan in warm)]


def _run_proposed(study: optuna.Study, ctx: StudyContext, budget: int,
                  sensitivity: Sensitivity | None,
                  on_trial: Callable[[int, TrialRecord | None], None] | None, workers: int,
                  propose: Proposals) -> WarmStarted:
    """:func:`run_warm_started` with proposals: all-FP32 built, the other uniform plans judged and
    those within the limit built, then the warm start and the sampler's plans as proposals."""
    seed_plans(study, ctx, uniform=(Precision.FP32,))
    run_study(study, ctx, min(budget, 1), on_trial, workers)
    fp32 = uniform_params(ctx.info, Precision.FP32)
    reduced = {
        p: params for p in UNIFORM[1:] if (params := uniform_params(ctx.info, p)) != fp32
    }  # a precision no unit takes: none
    measured = uniform_measured(study)
    judged = {p: found for p, params in reduced.items()
              if p.value not in measured and (found := propose.judge(study, params)) is not None}
    # within the limit a uniform plan may be the answer (or, without one, is an end of the front):
    # built as before; past it, its judged numbers stand in for the warm start and it costs no build
    worth = [reduced[p] for p, (_, loss) in judged.items() if ctx.max_loss is None or loss <= ctx.max_loss]
    # all-INT8 may be all-FP16
    worth = [params for i, params in enumerate(worth) if params not in worth[:i]]
    seed_plans(study, ctx, worth, uniform=())
    run_study(study, ctx, min(budget, 1 + len(worth)), on_trial, workers)
    measured = {**{p.value: found for p, found in judged.items()}, **uniform_measured(study)}
    warm, slow = _warm_plans(ctx, sensitivity, measured)
    propose.enqueue([*reduced.values(), *warm])
    ctx.propose = propose
    run_study(study, ctx, budget, on_trial, workers)
    return WarmStarted(warm, slow, len(warm))

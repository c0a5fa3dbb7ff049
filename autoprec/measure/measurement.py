"""One candidate, measured: lower its plan, build it on the engine, run the evaluation set, time it,
compare."""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Sequence

from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.data import Batch, Workload
from autoprec.analysis.model_info import ModelInfo
from autoprec.backends.base import Backend, Runner
from autoprec.core.errors import first_line
from autoprec.core.locks import DeviceTurns
from autoprec.core.plan import Plan, Precision
from autoprec.core.stored import StoredModel
from autoprec.core.timing import RETIME_TURN, Timing
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.accuracy import Judge
from autoprec.measure.downstream import Captures, Downstream
from autoprec.measure.shaped import by_shape
from autoprec.measure.speedup import COMPARED, contender, in_turn, time_until_known
from autoprec.measure.workload import time_work, warm_up
from autoprec.record.trial import MAX_TIMING_SPREAD, Measurement, Paired, Screened
from autoprec.record.verdict import Rounds

log = logging.getLogger("autoprec")

RETIMES = 2


@dataclass(frozen=True)
class Screen:
    """Cheap rejection: accuracy on the first ``batches`` evaluation batches first; a candidate
    whose loss there is above ``reject_above`` is not evaluated further nor timed."""

    batches: int
    reject_above: float

    @classmethod
    def for_search(cls, max_loss: float | None, evaluation_batches: int) -> Screen | None:
        """A quarter of the evaluation set (at least one batch), rejecting at ``REJECT_FACTOR`` ×
        --max-loss; None without a loss limit or with a single batch (nothing to save)."""
        if max_loss is None or evaluation_batches < 2:
            return None
        return cls(screening_batches(evaluation_batches), REJECT_FACTOR * max_loss)


def screening_batches(evaluation_batches: int) -> int:
    """A quarter of the evaluation batches, at least one: for cheap rejection and the sensitivity
    pass."""
    return max(1, evaluation_batches // 4)


# Screened loss above this multiple of --max-loss rejects a candidate: far enough past the limit
# that a loss measured on a quarter of the data does not reject plans the full set would accept.
REJECT_FACTOR = 4.0


class Rejected(Exception):
    """The candidate's loss on the screening batches is already far past the limit (what was
    measured: its ``screened`` record)."""

    def __init__(self, screened: Screened):
        super().__init__(f"loss {screened.loss:.3g} on the first {screened.batches} evaluation "
                         "batch(es)")
        self.screened = screened


def accuracy_loss(backend: Backend, model: StoredModel, batches: Sequence[Batch], judge: Judge,
                  downstream: Downstream | None = None) -> float:
    """Loss only (no timing): what the sensitivity pass needs of each one-unit plan; with
    ``downstream`` (all-FP32's tensors on these batches), run from the plan's first changed node on
    where the judge reads outputs alone."""
    if downstream is not None and not judge.runs_the_model:
        outputs = downstream.outputs(backend, model)
        if outputs is not None:
            return judge.loss(judge.metrics(outputs), outputs)
    return accuracy_by_shape(backend, model, batches, judge)[0]


def accuracy_by_shape(backend: Backend, model: StoredModel, batches: Sequence[Batch], judge: Judge
                      ) -> tuple[float, dict[str, float]]:
    """The loss (no timing), and where ``judge`` judges several shapes, each one's (on the engine's
    :meth:`~autoprec.backends.base.Backend.judging_runner`)."""
    with backend.judging_runner(model) as runner:
        outputs = [runner.run(batch) for batch in batches]
        metrics = {**judge.metrics(outputs), **judge.generation_metrics(runner.run)}
    return judge.loss(metrics, outputs), by_shape(judge, metrics, outputs)


def measure(
    backend: Backend,
    model: StoredModel,
    batches: Sequence[Batch],
    judge: Judge,
    screen: Screen | None = None,
    device: DeviceTurns | None = None,
    work: Workload | None = None,
) -> Measurement:
    """Latency of ``work`` (default: the first evaluation batch); accuracy on all of them, as
    ``judge`` scores it (a decoder's generation too, where it judges one).

    With ``screen``, raises :class:`Rejected` after the screening batches when their loss is too
    high. ``device`` is taken while the candidate runs, not while it is built: shared while it is
    evaluated (beside other processes' evaluations), alone while it is timed; with several workers,
    builds overlap and the device times one candidate at a time.
"""
    seconds = {}
    turns = device or DeviceTurns(None)
    t0 = time.perf_counter()
    with backend.runner(model) as runner:
        seconds["build"] = time.perf_counter() - t0
        build = runner.build_report()
        t0 = time.perf_counter()
        with turns.evaluating():
            seconds["device_wait"] = time.perf_counter() - t0
            outputs = _run(runner, batches, judge, screen, seconds)
            t0 = time.perf_counter()
            # a decoder's greedy generation, where judged
            if generated := judge.generation_metrics(runner.run):
                seconds["generate"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with turns.timing():
            seconds["device_wait"] += time.perf_counter() - t0
            latency, retimes, parts = _time(runner, work or Workload.of(batches[0]), seconds)
        t0 = time.perf_counter()
    seconds["release"] = time.perf_counter() - t0  # the engine's memory given back
    t0 = time.perf_counter()
    metrics = {**judge.metrics(outputs), **generated}
    loss = judge.loss(metrics, outputs)
    shapes = {point: {"loss": value} for point, value in by_shape(judge, metrics, outputs).items()}
    for point, timing in parts.items():
        shapes.setdefault(point, {})["latency_ms"] = timing.median_ms
    seconds["judge"] = time.perf_counter() - t0
    return Measurement(latency, metrics, loss, seconds, retimes, build, shapes)


def _run(runner, batches, judge: Judge, screen, seconds):
    t0 = time.perf_counter()
    outputs = []
    for i, batch in enumerate(batches):
        outputs.append(runner.run(batch))
        if screen is not None and i + 1 == screen.batches < len(batches):
            loss = judge.loss(judge.metrics(outputs), outputs)
            if loss > screen.reject_above:
                seconds["evaluate"] = time.perf_counter() - t0
                raise Rejected(Screened(loss, len(outputs), seconds))
    seconds["evaluate"] = time.perf_counter() - t0
    return outputs


def _time(runner, work: Workload, seconds):
    t0 = time.perf_counter()
    (latency, parts), retimes = time_work(runner, work), 0
    while latency.spread > MAX_TIMING_SPREAD and retimes < RETIMES:  # noisy neighbour: try again
        retimes += 1
        latency, parts = min((latency, parts), time_work(runner, work),
                             key=lambda timed: timed[0].spread)
    seconds["time"] = time.perf_counter() - t0
    return latency, retimes, parts


def times_shipped(backend: Backend) -> bool:
    """Whether the final timing times the graph best/ ships (the source's dims kept): where the
    engine runs dynamic dims at the measured shapes, not TensorRT's one-shape builds."""
    return not backend.one_shape_only


@dataclass(frozen=True)
class Lowering:
    """What turns a plan into the model an engine builds: the prepared model, its calibrated ranges
    and, for a reference executor judging another engine's graphs, that engine's Q/DQ form. A
    measurer holds it (a worker process gets it once), so a plan travels as itself, never as a
    model."""

    info: ModelInfo
    ranges: ActivationRanges | None
    form: QDQForm | None = None  # None: the measuring engine's own form

    def as_shipped(self, backend: Backend) -> Lowering:
        """Onto the graph best/ ships, beside the given model as it is (:meth:`ModelInfo.as_shipped`),
        where :func:`times_shipped` ``backend``: what the final timing states speed-ups of."""
        return replace(self, info=self.info.as_shipped()) if times_shipped(backend) else self

    def __call__(self, backend: Backend, plan: Plan) -> StoredModel:
        if self.form in (None, backend.qdq_form):
            return backend.lower(self.info, plan, self.ranges)
        return lower_plan(self.info, plan, self.ranges, self.form)

    def downstream(self, backend: Backend, captures: Captures, batches: Sequence[Batch]) -> Downstream | None:
        """All-FP32's tensors on ``batches``, as this lowering makes all-FP32 (kept in ``captures``)."""
        return captures.of(backend, lambda: self(backend, self.info.plan_at(Precision.FP32)), batches)


def resident_bytes(pid: int | None = None, peak: bool = False) -> int | None:
    """A process's resident memory (this one's by default), or its peak since it started or since
    :func:`reset_peak`; None where the system does not say."""
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field)), None)
    except (OSError, ValueError):
        return None


def reset_peak(pid: int) -> None:
    """Start a process's peak resident memory afresh (Linux: ``clear_refs``), so the next peak is
    one candidate's."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# An engine that takes more memory than this is never kept beside another: the re-timing then builds
# the all-FP32 engine and the candidate's anew in each round, one at a time (their builds cost less
# than holding two such engines; memory stays at one engine whatever the model's size).
PAIR_ENGINE_BYTES = 1 << 30


class KeptSession:
    """One model's session kept from one call to the next: the all-FP32 model the re-timing times plan
    after plan beside is built once, not once per plan (a ViT-base's CPU session took 2.5 s to build,
    two per re-timed plan). Its holder closes it before anything else runs; an engine too large to keep
    beside another (PAIR_ENGINE_BYTES) is never kept."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.runner: Runner | None = None
        self.stack = contextlib.ExitStack()

    def of(self, key: str) -> Runner | None:
        """The kept session where it is ``key``'s model's; else None, any other one closed."""
        if key != self.key:
            self.close()
        return self.runner

    def keep(self, key: str, runner: Runner, stack: contextlib.ExitStack) -> None:
        """``runner`` kept as ``key``'s, its closing taken from ``stack``."""
        self.key, self.runner, self.stack = key, runner, stack.pop_all()

    def close(self) -> None:
        self.stack.close()
        self.key = self.runner = None


def time_paired(backend: Backend, reference: StoredModel, candidate: StoredModel, work: Workload,
                rounds: int, kept: tuple[KeptSession, str] | None = None,
                dominated_ms: float | None = None) -> Paired:
    """The all-FP32 model (``reference``) and a candidate timed in turn, ``rounds`` times at most
    (fewer where more would not change what the re-timing decides: :func:`enough_rounds`), so drift
    (a busy neighbour, clocks) hits both alike. Two engines at most are alive; where the reference's
    engine takes more than PAIR_ENGINE_BYTES, one: each is built anew in every round. With ``kept``
    (a session holder and the reference's key), the reference's session is the one kept there for
    that key, or is built and left there for the next plan; a kept one, timed in every round beside
    the plans before, is timed in the middle round only (its figure is the median of all its rounds:
    eight plans re-timed timed it 24 times, a third of the re-timing)."""
    timings: dict[str, list[Timing]] = {"reference": [], "candidate": []}
    models = {"reference": reference, "candidate": candidate}
    before = resident_bytes() or 0
    with contextlib.ExitStack() as stack:
        runner = kept[0].of(kept[1]) if kept else None
        reused = runner is not None
        builds, apart = int(not reused), False
        if runner is None:
            runner = stack.enter_context(backend.runner(reference))
            # first run: allocations and kernel selection stay out of the rounds
            warm_up(runner, work)
            apart = (resident_bytes() or 0) - before > PAIR_ENGINE_BYTES
            if kept and not apart:
                kept[0].keep(kept[1], runner, stack)
        runners = {"reference": runner}
        if apart:
            timings["reference"].append(time_work(runner, work, RETIME_TURN)[0])
            stack.close()
        else:
            runners["candidate"] = stack.enter_context(backend.runner(candidate))
            warm_up(runners["candidate"], work)
            builds += 1
        for round_ in range(rounds):
            if enough_rounds(timings["candidate"], dominated_ms):
                break
            for which in in_turn(["reference", "candidate"], round_):
                if which == "reference" and reused and round_ != rounds // 2:
                    continue
                if not apart:
                    timings[which].append(time_work(runners[which], work, RETIME_TURN)[0])
                elif len(timings[which]) <= round_:
                    with backend.runner(models[which]) as each:
                        warm_up(each, work)
                        timings[which].append(time_work(each, work, RETIME_TURN)[0])
                    builds += 1
    return Paired(tuple(timings["reference"]), tuple(timings["candidate"]), builds, apart)


# Two re-timed rounds this close (the slower over the faster, less one) leave a third nothing to
# decide: a median of three lies between them.
RETIME_STEADY = 0.03


def enough_rounds(candidate: Sequence[Timing], dominated_ms: float | None) -> bool:
    """Whether a plan's re-timing may stop at two rounds, where a third cannot change what it
    decides (a median of three lies between two of them): the two within RETIME_STEADY of each
    other, or both slower than ``dominated_ms`` (a plan at no more loss, re-timed: this one leaves
    the front whatever a third round reads)."""
    ms = [t.median_ms for t in candidate]
    if len(ms) != 2:
        return False
    return max(ms) / min(ms) - 1 <= RETIME_STEADY or (dominated_ms is not None and min(ms) > dominated_ms)


def time_compared(backend: Backend, lowering: Lowering, fp32: Plan, contenders: Sequence[Plan],
                  work: Workload,
                  seconds: float, apart: bool = False) -> Rounds:
    """The contenders (the chosen plan first: ``speedup.contender``), the all-FP32 plan and the
    given model as it is (``source``), timed until their speed-ups (see COMPARED; every contender's
    over all-FP32) are known, or until each contender is known faster or slower than all-FP32: what
    a search picks its plan and states its gain by. Timed as shipped (:meth:`Lowering.as_shipped`:
    the source's dims kept). A contender that is the all-FP32 plan is not timed again: its rounds
    are all-FP32's."""
    own = [contender(i) for i, plan in enumerate(contenders) if plan.key() != fp32.key()]
    try:
        models = _compared_models(backend, lowering.as_shipped(backend), fp32, contenders, own)
    except Exception as exc:  # noqa: BLE001 - a plan that lowers onto the fixed graph only (deploy says why)
        log.info(f"the final timing times the fixed-shape graphs: a plan does not lower onto the shipped one "
                 f"({type(exc).__name__}: {first_line(exc)})")
        models = _compared_models(backend, lowering, fp32, contenders, own)
    pairs = [pair for pair in COMPARED if set(pair) <= set(models)]
    pairs += [("fp32", name) for name in own if name != "chosen"]
    rounds = time_until_known(backend, models, work, pairs, seconds, apart,
                              [("fp32", name) for name in own])
    same = {contender(i): rounds.timings["fp32"] for i in range(len(contenders)) if contender(i) not in own}
    return replace(rounds, timings={**rounds.timings, **same})


def _compared_models(backend: Backend, lowering: Lowering, fp32: Plan, contenders: Sequence[Plan],
                     own: Sequence[str]) -> dict[str, StoredModel]:
    info = lowering.info
    models = {"fp32": lowering(backend, fp32), **{contender(i): lowering(backend, plan)
                                                  for i, plan in enumerate(contenders) if contender(i) in own}}
    if info.source is not None:
        models["source"] = StoredModel(info.source, info.folder)
    return models


class Measurer(abc.ABC):
    """Where a search's plans are lowered and measured: :class:`InProcessMeasurer` here, or
    :class:`autoprec.measure.isolation.IsolatedMeasurer` in a worker process that a crash cannot
    take down."""

    @abc.abstractmethod
    def measure(self, plan: Plan, screen: Screen | None = None) -> Measurement:
        """:func:`measure` of the lowered plan on the evaluation batches (``seconds["lower"]``: its
        lowering)."""

    @abc.abstractmethod
    def accuracy_loss(self, plan: Plan, batches: int, constraint: bool = False, one_unit: bool = False) -> float:
        """:func:`accuracy_loss` on the first ``batches`` evaluation batches, as the sensitivity
        pass ranks units (:meth:`autoprec.measure.accuracy.Judge.for_ranking`), or as ``--max-loss``
        constrains plans (``constraint``: the search's own judge, what a plan proposed before its
        build is held to). ``one_unit``: one of the pass's plans, run from its first changed node
        on (:mod:`autoprec.measure.downstream`)."""

    @abc.abstractmethod
    def time_paired(self, reference: Plan, plan: Plan, rounds: int, dominated_ms: float | None = None) -> Paired:
        """:func:`time_paired` on the first evaluation batch."""

    @abc.abstractmethod
    def time_compared(self, fp32: Plan, contenders: Sequence[Plan], seconds: float, apart: bool) -> Rounds:
        """:func:`time_compared` on the first evaluation batch."""


def measured(backend: Backend, lowering: Lowering, plan: Plan, batches: Sequence[Batch],
             judge: Judge,
             screen: Screen | None = None, device: DeviceTurns | None = None,
             work: Workload | None = None) -> Measurement:
    """:func:`measure` of ``plan`` as ``lowering`` lowers it, the lowering's seconds among the
    rest."""
    t0 = time.perf_counter()
    model = lowering(backend, plan)
    lower_s = time.perf_counter() - t0
    try:
        result = measure(backend, model, batches, judge, screen, device, work)
    except Rejected as rejected:
        rejected.screened.seconds["lower"] = lower_s
        raise
    result.seconds["lower"] = lower_s
    return result


class InProcessMeasurer(Measurer):
    """Candidates run in this process (``--no-isolation``): no worker to start, but an engine crash
    ends the search."""

    def __init__(self, backend: Backend, batches: Sequence[Batch], judge: Judge, ranking: Judge,
                 lowering: Lowering,
                 work: Workload | None = None):
        """``ranking``: ``judge.for_ranking()``, made once by the caller, who also reports what it
        ranks by; ``work``: what a latency times (default: the first batch)."""
        self.backend, self.batches, self.judge, self.ranking, self.lowering = backend, batches, judge, ranking, lowering
        self.work = work or Workload.of(batches[0])
        self.captures = Captures()

    def measure(self, plan: Plan, screen: Screen | None = None) -> Measurement:
        self.captures.clear()
        return measured(self.backend, self.lowering, plan, self.batches, self.judge, screen,
                        work=self.work)

    def accuracy_loss(self, plan: Plan, batches: int, constraint: bool = False, one_unit: bool = False) -> float:
        if not one_unit:  # the pass is over: its tensors given back
            self.captures.clear()
        return accuracy_loss(self.backend, self.lowering(self.backend, plan),
                             self.batches[:batches],
                             self.judge if constraint else self.ranking,
                             self.lowering.downstream(self.backend, self.captures, self.batches[:batches])
                             if one_unit else None)

    def time_paired(self, reference: Plan, plan: Plan, rounds: int, dominated_ms: float | None = None) -> Paired:
        return time_paired(self.backend, self.lowering(self.backend, reference),
                           self.lowering(self.backend, plan),
                           self.work, rounds, dominated_ms=dominated_ms)

    def time_compared(self, fp32: Plan, contenders: Sequence[Plan], seconds: float, apart: bool) -> Rounds:
        return time_compared(self.backend, self.lowering, fp32, contenders, self.work, seconds,
                             apart)

"""The target engine's measurers, started: candidates measured in worker processes (or in this one),
side by side or one at a time, and the reference executor that judges plans before they are
built."""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from autoprec.analysis.data import Batch, Workload
from autoprec.backends import REFERENCE_BACKEND, Backend, get_backend
from autoprec.core.errors import AutoprecError, MetricError, first_line
from autoprec.core.locks import FileLock
from autoprec.core.plan import REDUCED, Precision
from autoprec.measure.accuracy import Judge
from autoprec.measure.isolation import (
    IsolatedMeasurer,
    Limits,
    MeasurerPool,
    Spawned,
    TrialCrash,
    device_lock_path,
    spawn_worker,
)
from autoprec.measure.measurement import InProcessMeasurer, Lowering, Measurer
from autoprec.record.trial import EngineInfo

log = logging.getLogger("autoprec")


@dataclass(frozen=True)
class Measuring:
    """Who measures: the target's measurer(s), and the reference executor judging plans before a
    build."""

    measurer: Measurer
    limits: Limits | None
    reference: Measurer
    executor: str
    judged_on_target: bool
    per_build: int
    one_time: dict[str, float]


@dataclass(frozen=True)
class MeasurerSettings:
    """How the target engine's candidates are measured: the engine by name, its device and threads,
    its cache; in worker processes (``isolate``) within ``trial_timeout`` seconds and
    ``trial_memory_gb``, ``workers`` side by side; ``proposals`` plans judged before each build
    (None: the engine's default)."""

    backend: str
    device: int
    threads: int
    cache: Path
    isolate: bool
    trial_timeout: float
    trial_memory_gb: float | None
    workers: int
    proposals: int | None


@dataclass(frozen=True)
class MeasurerInputs:
    """What every candidate is measured against: the evaluation batches, the judge (and the one that
    ranks units), the lowering, and the calibration method a plan takes."""

    evaluation: Sequence[Batch]
    work: Workload  # what a latency times: one request's batches (autoprec.analysis.data.Workload)
    judge: Judge
    ranking: Judge
    lowering: Lowering
    method: str


def start_measurers(settings: MeasurerSettings, engine: Backend, engine_info: EngineInfo,
                    inputs: MeasurerInputs,
                    seconds: dict[str, float], user_metric: bool, stack: contextlib.ExitStack,
                    spawned: Sequence[Spawned] = ()) -> Measuring:
    """The target's measurer(s) and the reference executor, started (the workers ``spawned`` earlier
    taken); ``seconds``: the one-time costs so far (the workers' start is added); ``user_metric``:
    the metric is the user's code, judged once here before any trial."""
    one_time = dict(seconds)
    limits = None
    if settings.isolate:
        limits = Limits.default(settings.trial_timeout, settings.trial_memory_gb, settings.workers)
        measurer: Measurer = _isolated_measurers(settings, engine_info, inputs, limits, stack,
                                                 one_time, spawned)
    else:
        measurer = InProcessMeasurer(engine, inputs.evaluation, inputs.judge, inputs.ranking,
                                     inputs.lowering,
                                     inputs.work)
        log.warning("--no-isolation: candidates run in this process; an engine crash ends the "
                    "search (resume with the same command)")
    # the user's code, judged once before any trial: a broken one stops the search here
    if user_metric:
        measurer.accuracy_loss(inputs.lowering.info.plan_at(Precision.FP32), 1, constraint=True)
    per_build = engine.default_proposals if settings.proposals is None else settings.proposals
    reference, executor, judged_on_target = _reference_executor(engine, measurer, per_build, inputs, limits,
                                                                 settings.cache, stack)
    return Measuring(measurer, limits, reference, executor, judged_on_target, per_build, one_time)


def worker_log(cache: Path, worker: int) -> Path:
    """Where the search's ``worker``-th worker process writes its stderr."""
    return cache / f"worker{'' if worker == 0 else f'-{worker}'}-stderr.log"


def spawn_workers(settings: MeasurerSettings, stack: contextlib.ExitStack) -> list[Spawned]:
    """The worker processes :func:`start_measurers` will give their data to, started now (none without
    isolation), so that their start-up overlaps the search's calibration; ended with ``stack`` where
    no measurer took them."""
    if not settings.isolate:
        return []
    spawned = [spawn_worker(worker_log(settings.cache, i)) for i in range(settings.workers)]
    for each in spawned:
        stack.callback(each.kill)
    return spawned


def _isolated_measurers(settings: MeasurerSettings, engine_info: EngineInfo, inputs: MeasurerInputs,
                        limits: Limits,
                        stack: contextlib.ExitStack, one_time: dict[str, float],
                        spawned: Sequence[Spawned]) -> Measurer:
    """``settings.workers`` worker processes measuring candidates (those ``spawned`` given their
    data), started (the time it took in ``one_time``)."""
    lock = FileLock(device_lock_path(settings.backend, settings.device)).check()
    measurers = [
        stack.enter_context(IsolatedMeasurer(
            settings.backend, inputs.evaluation, inputs.judge, limits, worker_log(settings.cache, i),
            settings.device, settings.cache, lock,
            inputs.lowering, settings.threads, inputs.work,
        ))
        for i in range(settings.workers)
    ]
    t0 = time.monotonic()
    try:
        for each, early in itertools.zip_longest(measurers, spawned[:len(measurers)]):
            each.start(early)
    except TrialCrash as exc:
        raise AutoprecError(f"the worker that measures candidates did not start ({exc}); give it "
                            "more room (--trial-memory, at least 1 GB) or check the engine's "
                            "installation") from None
    one_time["worker_start"] = time.monotonic() - t0
    memory = f"{limits.memory_bytes / 2**30:.2f} GiB" if limits.memory_bytes else "no memory limit"
    log.info(f"each candidate runs in a worker process (limits: {limits.seconds:g} s, {memory})")
    if settings.workers > 1:
        log.info(f"{settings.workers} workers: candidates are built side by side; evaluation and "
                 f"timing hold {engine_info.device} one candidate at a time")
    return MeasurerPool(measurers)


def _reference_executor(engine: Backend, measurer: Measurer, per_build: int, inputs: MeasurerInputs,
                        limits: Limits | None, cache: Path, stack: contextlib.ExitStack) -> tuple[Measurer, str, bool]:
    """Where a plan's loss is computed without building it on the target, what that is, and whether
    its evaluations are builds of the target: ONNX Runtime on the CPU running the graph in the
    target's Q/DQ form. Where the target is that reference engine itself, its untimed sessions are
    counted as reference evaluations; without proposals, or where the CPU cannot run the target's
    form (an op ONNX Runtime lacks, said once), the target judges its own plans."""
    if engine.is_reference:
        return measurer, "ONNX Runtime CPU (the target engine itself)", False
    if not per_build:
        return measurer, f"{engine.name} itself (--proposals 0: plans are judged where they are built)", True
    # the graph the target builds, run on the CPU
    in_target_form = replace(inputs.lowering, form=engine.qdq_form)
    if limits is not None:
        reference: Measurer = stack.enter_context(IsolatedMeasurer(REFERENCE_BACKEND, inputs.evaluation, inputs.judge,
                                                                   limits, cache / "reference-stderr.log", 0, cache,
                                                                   lowering=in_target_form, work=inputs.work))
    else:
        reference = InProcessMeasurer(get_backend(REFERENCE_BACKEND), inputs.evaluation,
                                      inputs.judge, inputs.ranking,
                                      in_target_form, inputs.work)
    executor = f"ONNX Runtime CPU running the graph {engine.name} builds ({engine.qdq_form.value} Q/DQ form)"
    method, info = inputs.method, inputs.lowering.info
    try:
        for precision in REDUCED:
            units = [u.name for u in info.searchable_units if precision in u.allowed]
            if units:
                reference.accuracy_loss(info.plan_at(precision, units, method), 1)
    except MetricError:  # the metric's fault: the search stops with it
        raise
    except Exception as exc:  # noqa: BLE001 - any engine error: this study's accuracy comes from the target
        log.warning(
            f"the reference executor cannot run this model ({type(exc).__name__}: "
            f"{first_line(exc, 200, empty='')}): {engine.name} measures every plan's accuracy"
        )
        return measurer, f"{engine.name} itself (ONNX Runtime CPU could not run the model)", True
    return reference, executor, False


def build_workers(requested: int | None, engine: Backend, isolate: bool) -> int:
    """How many candidates are measured side by side (see ``search``'s ``build_workers``)."""
    if not isolate:
        return 1
    if requested is None:
        return engine.default_build_workers
    if requested > engine.default_build_workers:
        log.warning(f"--build-workers {requested} on {engine.name}: a build beside the timed "
                    "candidate can disturb its latency (it shares the CPU that runs or launches "
                    "it); see docs/design.md, \"Builds side by side\"")
    return requested

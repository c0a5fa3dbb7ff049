"""One candidate, measured: build it on the engine, run the evaluation set, time it, compare."""

from __future__ import annotations

import abc
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Sequence

from autoprec.analysis.data import Batch
from autoprec.backends.base import Backend, Timing
from autoprec.core.stored import StoredModel
from autoprec.measure.accuracy import Judge

# A latency whose p10-p90 range exceeds this fraction of its median is re-timed, then flagged.
MAX_TIMING_SPREAD = 0.25
RETIMES = 2


@dataclass(frozen=True)
class Measurement:
    latency: Timing
    metrics: dict[str, dict[str, float]]
    loss: float
    seconds: dict[str, float]  # where the trial's wall time went
    retimes: int = 0
    build: dict[str, Any] | None = None  # the engine's own report on the build (Runner.build_report)

    @property
    def unstable(self) -> bool:
        """The latency stayed too spread to trust after re-timing: shown as such, not hidden."""
        return self.latency.spread > MAX_TIMING_SPREAD

    def to_json(self) -> dict[str, Any]:
        return {
            "latency": self.latency.to_json(),
            "metrics": self.metrics,
            "loss": self.loss,
            "seconds": self.seconds,
            "retimes": self.retimes,
            "latency_unstable": self.unstable,
            "build": self.build,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(Timing.from_json(data["latency"]), data["metrics"], data["loss"], data.get("seconds", {}), data.get("retimes", 0),
                   data.get("build"))


@dataclass(frozen=True)
class Screen:
    """Cheap rejection: accuracy on the first ``batches`` evaluation batches first; a candidate whose
    loss there is above ``reject_above`` is not evaluated further nor timed."""

    batches: int
    reject_above: float

    @classmethod
    def for_search(cls, max_loss: float | None, evaluation_batches: int) -> Screen | None:
        """A quarter of the evaluation set (at least one batch), rejecting at ``REJECT_FACTOR`` × --max-loss;
        None without a loss limit or with a single batch (nothing to save)."""
        if max_loss is None or evaluation_batches < 2:
            return None
        return cls(screening_batches(evaluation_batches), REJECT_FACTOR * max_loss)


def screening_batches(evaluation_batches: int) -> int:
    """A quarter of the evaluation batches, at least one: for cheap rejection and the sensitivity pass."""
    return max(1, evaluation_batches // 4)


# Screened loss above this multiple of --max-loss rejects a candidate: far enough past the limit
# that a loss measured on a quarter of the data does not reject plans the full set would accept.
REJECT_FACTOR = 4.0


class Rejected(Exception):
    """The candidate's loss on the screening batches is already far past the limit."""

    def __init__(self, loss: float, batches: int, seconds: dict[str, float]):
        super().__init__(f"loss {loss:.3g} on the first {batches} evaluation batch(es)")
        self.loss, self.batches, self.seconds = loss, batches, seconds

    def to_json(self) -> dict[str, Any]:
        return {"loss": self.loss, "batches": self.batches, "seconds": self.seconds}


def accuracy_loss(backend: Backend, model: StoredModel, batches: Sequence[Batch], judge: Judge) -> float:
    """Loss only (no timing): what the sensitivity pass needs of each one-unit plan."""
    with backend.prepare(model) as runner:
        outputs = [runner.run(batch) for batch in batches]
    return judge.loss(judge.metrics(outputs), outputs)


def measure(
    backend: Backend,
    model: StoredModel,
    batches: Sequence[Batch],
    judge: Judge,
    screen: Screen | None = None,
    device: contextlib.AbstractContextManager | None = None,
) -> Measurement:
    """Latency on the first evaluation batch; accuracy on all of them, as ``judge`` scores it.

    With ``screen``, raises :class:`Rejected` after the screening batches when their loss is too high.
    ``device`` is held while the candidate runs (evaluation and timing), not while it is built: with
    several workers, builds overlap and the device runs one candidate at a time.
    """
    seconds = {}
    t0 = time.perf_counter()
    with backend.prepare(model) as runner:
        seconds["build"] = time.perf_counter() - t0
        build = runner.build_report()
        t0 = time.perf_counter()
        with device or contextlib.nullcontext():
            seconds["device_wait"] = time.perf_counter() - t0
            latency, retimes, outputs = _run_and_time(runner, batches, judge, screen, seconds)
    metrics = judge.metrics(outputs)
    return Measurement(latency, metrics, judge.loss(metrics, outputs), seconds, retimes, build)


def _run_and_time(runner, batches, judge: Judge, screen, seconds):
    t0 = time.perf_counter()
    outputs = []
    for i, batch in enumerate(batches):
        outputs.append(runner.run(batch))
        if screen is not None and i + 1 == screen.batches < len(batches):
            loss = judge.loss(judge.metrics(outputs), outputs)
            if loss > screen.reject_above:
                seconds["evaluate"] = time.perf_counter() - t0
                raise Rejected(loss, len(outputs), seconds)
    seconds["evaluate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    latency, retimes = runner.time(batches[0]), 0
    while latency.spread > MAX_TIMING_SPREAD and retimes < RETIMES:  # noisy neighbour: try again
        retimes += 1
        latency = min(latency, runner.time(batches[0]), key=lambda t: t.spread)
    seconds["time"] = time.perf_counter() - t0
    return latency, retimes, outputs


def time_interleaved(backend: Backend, models: Sequence[StoredModel], batch: Batch, rounds: int) -> list[list[Timing] | None]:
    """Build each model once, then time them in turn, ``rounds`` times, so drift (a busy neighbour,
    clocks) hits all alike. A model that fails to build or run gets None; the others go on."""
    with contextlib.ExitStack() as stack:
        runners = []
        for model in models:
            try:
                runner = stack.enter_context(backend.prepare(model))
                runner.run(batch)  # first run: allocations and kernel selection stay out of the rounds
                runners.append(runner)
            except Exception:  # noqa: BLE001 - engines raise their own types; this model is left out
                runners.append(None)
        timings: list[list[Timing] | None] = [[] if r is not None else None for r in runners]
        for _ in range(rounds):
            for i, runner in enumerate(runners):
                if timings[i] is not None:
                    try:
                        timings[i].append(runner.time(batch))
                    except Exception:  # noqa: BLE001
                        timings[i] = None
    return timings


class Measurer(abc.ABC):
    """Where a search's candidates are measured: :class:`InProcessMeasurer` here, or
    :class:`autoprec.measure.isolation.IsolatedMeasurer` in a worker process that a crash cannot take down."""

    @abc.abstractmethod
    def measure(self, model: StoredModel, screen: Screen | None = None) -> Measurement:
        """:func:`measure` on the evaluation batches."""

    @abc.abstractmethod
    def accuracy_loss(self, model: StoredModel, batches: int, constraint: bool = False) -> float:
        """:func:`accuracy_loss` on the first ``batches`` evaluation batches, as the sensitivity pass ranks
        units (:meth:`autoprec.measure.accuracy.Judge.for_ranking`), or as ``--max-loss`` constrains
        plans (``constraint``: the search's own judge, what a plan proposed before its build is held to)."""

    @abc.abstractmethod
    def time_interleaved(self, models: Sequence[StoredModel], rounds: int) -> list[list[Timing] | None]:
        """:func:`time_interleaved` on the first evaluation batch."""


class InProcessMeasurer(Measurer):
    """Candidates run in this process (``--no-isolation``): no worker to start, but an engine crash ends the search."""

    def __init__(self, backend: Backend, batches: Sequence[Batch], judge: Judge, ranking: Judge):
        """``ranking``: ``judge.for_ranking()``, made once by the caller, who also reports what it ranks by."""
        self.backend, self.batches, self.judge, self.ranking = backend, batches, judge, ranking

    def measure(self, model: StoredModel, screen: Screen | None = None) -> Measurement:
        return measure(self.backend, model, self.batches, self.judge, screen)

    def accuracy_loss(self, model: StoredModel, batches: int, constraint: bool = False) -> float:
        return accuracy_loss(self.backend, model, self.batches[:batches], self.judge if constraint else self.ranking)

    def time_interleaved(self, models: Sequence[StoredModel], rounds: int) -> list[list[Timing] | None]:
        return time_interleaved(self.backend, models, self.batches[0], rounds)

"""What one measurement is (the engine and device that made it, a candidate's latency, accuracy and
costs, a re-timing beside all-FP32 round by round), and what a trial is as the result files and
every view see it: its plan, its measurement, whether it holds the loss limit, the plan it repeats,
and its re-timed rounds; and what the re-timing of the front measured."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from autoprec.core.fields import Fields
from autoprec.core.plan import Plan, Precision
from autoprec.core.timing import Timing


@dataclass(frozen=True)
class EngineInfo:
    """Which engine and device produced a number: stored with every measurement."""

    backend: str
    engine: str
    version: str
    provider: str
    device: str
    qdq_form: str
    measured: bool = True  # False only for engines described, never executed here
    # driver, CUDA, cuDNN, ... where they matter
    versions: dict[str, str] = field(default_factory=dict)
    # what a reader of these numbers must know about the engine's code (shown with them)
    caveat: str = ""
    # what a latency is: which clock, what it includes, how many runs (shown with them)
    timing: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineInfo:
        """As a result recorded it (an older result's may lack the fields added since: their
        defaults)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def label(self) -> str:
        return f"{self.engine} {self.version} {self.provider} on {self.device}"

ROUNDING = 1e-9  # relative: a figure and its source computed in another order

# A latency whose p10-p90 range exceeds this fraction of its median is re-timed, then flagged.
MAX_TIMING_SPREAD = 0.25

# a metric's output name at a judged shape other than the data's own: ``logits @ prefill``
SHAPED = " @ "


@dataclass(frozen=True)
class Measurement:
    latency: Timing
    metrics: dict[str, dict[str, float]]  # by output name (SHAPED: at another judged shape)
    loss: float
    seconds: dict[str, float]  # where the trial's wall time went
    retimes: int = 0
    # the engine's own report on the build (Runner.build_report)
    build: dict[str, Any] | None = None
    # Judged at several shapes (autoprec.analysis.shape_points): each point's loss and, where timed,
    # its median latency (``latency`` is then their mix as one request runs them); {} at one shape.
    by_shape: dict[str, dict[str, float]] = field(default_factory=dict)

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
            **({"by_shape": self.by_shape} if self.by_shape else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(
            Timing.from_json(data["latency"]),
            data["metrics"],
            data["loss"],
            data.get("seconds", {}),
            data.get("retimes", 0),
            data.get("build"),
            data.get("by_shape") or {},
        )

@dataclass(frozen=True)
class Paired:
    """A re-timing of one plan beside all-FP32: their timings round by round."""

    reference: tuple[Timing, ...]  # the all-FP32 plan's
    candidate: tuple[Timing, ...]
    builds: int
    apart: bool  # engines built one at a time, anew each round (see PAIR_ENGINE_BYTES)

    def to_json(self) -> dict[str, Any]:
        return {"reference": [t.to_json() for t in self.reference],
                "candidate": [t.to_json() for t in self.candidate],
                "builds": self.builds, "apart": self.apart}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Paired:
        return cls(
            tuple(Timing.from_json(t) for t in data["reference"]),
            tuple(Timing.from_json(t) for t in data["candidate"]),
            data["builds"],
            data["apart"],
        )



@dataclass(frozen=True)
class TrialRecord:
    """A finished trial as the result files and tables see it."""

    number: int
    plan: Plan
    measurement: Measurement
    feasible: bool
    duplicate_of: int | None = None
    # medians of the final interleaved re-timing rounds, if re-timed
    retimed_ms: tuple[float, ...] = ()

    @property
    def latency_ms(self) -> float:
        """The latency to rank by: the re-timed median when there is one, else the trial's own."""
        return statistics.median(self.retimed_ms) if self.retimed_ms else self.measurement.latency.median_ms

    @property
    def loss(self) -> float:
        return self.measurement.loss

    def losses_by_shape(self) -> dict[str, float]:
        """Its loss at each shape it was judged at (and of its generation, for a decoder); {} at one
        shape."""
        return {point: figures["loss"] for point, figures in self.measurement.by_shape.items() if "loss" in figures}

    @property
    def worst_shape(self) -> str | None:
        """Where its loss is: the judged shape whose loss is the largest; None where it was judged
        at one."""
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
        """int8/fp16/fp32 unit counts, after the INT4 units' where the plan has some."""
        counts = self.plan.counts()
        weights4 = f"int4 {counts.get('int4')} · " if counts.get("int4") else ""
        return f"{weights4}{counts['int8']}/{counts['fp16']}/{counts['fp32']}"

    def to_json(self) -> dict[str, Any]:
        """The trial as the result files write it (trials.json, pareto.json's front,
        best/plan.json)."""
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
        """A trial as a result file has it, checked field by field (``final_latency_ms``,
        ``latency_unstable`` and the plan's ``counts`` are its figures' own: checked to be of their
        kind, not kept)."""
        latency, plan, duplicate = f["latency_ms"], f["plan"], f["duplicate_of"].nullable()
        timing = Timing(*(latency[k].number() for k in ("median_ms", "p10_ms", "p90_ms")),
                        latency["runs"].integer(),
                        latency["warmup"].integer())
        f["final_latency_ms"].number(), f["latency_unstable"].flag()
        for precision in PRECISIONS:
            # (int4 where there are any)
            if precision != Precision.INT4.value or precision in plan["counts"].value:
                plan["counts"][precision].integer()
        precisions = {name: p.one_of(PRECISIONS) for name, p in plan["precisions"].mapping().items()}
        metrics = {name: {key: value.number() for key, value in output.mapping().items()}
                   for name, output in f["metrics"].mapping().items()}
        seconds = {key: value.number() for key, value in f["seconds"].mapping().items()} if "seconds" in f.value else {}
        retimes, build = f.get("retimes"), f["build"].nullable()
        shapes = ({point: {key: value.number() for key, value in figures.mapping().items()}
                   for point, figures in f["by_shape"].mapping().items()} if "by_shape" in f.value else {})
        measurement = Measurement(timing, metrics, f["accuracy_loss"].number(), seconds,
                                  retimes.integer() if retimes else 0,
                                  build.kind(dict) if build else None, shapes)
        found = cls(f["trial"].integer(), Plan.from_mapping(precisions, plan["calibration"].text()),
                    measurement,
                    f["feasible"].flag(), duplicate.integer() if duplicate else None,
                    tuple(f["retimed_ms"].numbers()))
        found._check_figures(f)
        return found

    def _check_figures(self, f: Fields) -> None:
        """Its figures can be true as written: times above 0 and in order, the final latency its
        rounds' median (else its own), the counts its units, a loss that is a number (see
        :meth:`checked_against`)."""
        where, latency = f"trial {self.number}", self.measurement.latency
        times = {"p10_ms": latency.p10_ms, "median_ms": latency.median_ms, "p90_ms": latency.p90_ms,
                 "final_latency_ms": f["final_latency_ms"].number(),
                 **{f"retimed_ms[{i}]": v for i, v in enumerate(self.retimed_ms)}}
        for key, value in times.items():
            if not (math.isfinite(value) and value > 0):
                f.refuse(f"{where}: {key} is {value:g}, not a time above 0")
        low, median, high = latency.p10_ms, latency.median_ms, latency.p90_ms
        if not (low <= median * (1 + ROUNDING) and median <= high * (1 + ROUNDING)):
            f.refuse(f"{where}: its p10 {low:g}, median {median:g} and p90 {high:g} ms are not in "
                     "order")
        if not math.isclose(times["final_latency_ms"], self.latency_ms, rel_tol=ROUNDING):
            f.refuse(f"{where}: final_latency_ms is {times['final_latency_ms']:g}, not "
                     f"{self.latency_ms:g}, the median of its re-timed rounds (else its own)")
        counts = {key: value.value for key, value in f["plan"]["counts"].mapping().items()}
        if any(counts.get(p, 0) != self.plan.counts().get(p, 0) for p in PRECISIONS):
            f.refuse(f"{where}: its plan counts {counts} but its units are {self.plan.counts()}")
        if math.isnan(self.loss) or self.loss == -math.inf:
            f.refuse(f"{where}: accuracy_loss is {self.loss:g}, not a loss of 0 or more")
        at_least = {"latency_ms.runs": (latency.runs, 1), "latency_ms.warmup": (latency.warmup, 0),
                    "retimes": (self.measurement.retimes, 0),
                    **{f"seconds.{k}": (v, 0) for k, v in self.measurement.seconds.items()}}
        for key, (value, least) in at_least.items():
            if not (math.isfinite(value) and value >= least):
                f.refuse(f"{where}: {key} is {value:g}, not a count or duration of {least} or more")

    def checked_against(self, f: Fields, max_loss: float | None, labels: bool) -> TrialRecord:
        """Itself, where its loss is one a search of ``max_loss`` could record (below 0 only as a
        drop against ``labels``) and it is feasible exactly within that limit; else refused (``f``:
        where it was read)."""
        if self.loss < 0 and not labels:
            f.refuse(f"trial {self.number}: accuracy_loss is {self.loss:g}, not a loss of 0 or "
                     f"more")
        if self.feasible != (max_loss is None or self.loss <= max_loss):
            f.refuse(f"trial {self.number}: feasible is {self.feasible} with loss {self.loss:g} "
                     f"and --max-loss {'none' if max_loss is None else f'{max_loss:g}'}")
        return self

PRECISIONS = tuple(p.value for p in Precision)

@dataclass(frozen=True)
class Retiming:
    """What the re-timing measured: each re-timed trial again, the engine builds it took, and each
    plan whose re-timing failed (its figures stay the trial's own: no verdict on timing noise rests
    on them)."""

    trials: dict[int, TrialRecord]
    builds: int = 0
    apart: bool = False  # engines built one at a time, anew each round (too large to keep two)
    failed: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"retimed": sorted(self.trials), "builds": self.builds,
                "one_engine_at_a_time": self.apart,
                "failed": list(self.failed)}


@dataclass(frozen=True)
class Screened:
    """A candidate rejected early: its loss on the first ``batches`` evaluation batches (far past
    the limit), and where the time went until then."""

    loss: float
    batches: int
    seconds: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"loss": self.loss, "batches": self.batches, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Screened:
        return cls(float(data["loss"]), int(data["batches"]), dict(data["seconds"]))


@dataclass(frozen=True)
class Features:
    """What a plan proposed before its build was predicted from (a trial records it): the fraction
    of FP32 time its INT8 and FP16 units saved in the profiles, and the conversion nodes its
    lowering has."""

    saved_int8: float
    saved_fp16: float
    conversions: int

    def to_json(self) -> dict:
        return {"saved_int8": self.saved_int8, "saved_fp16": self.saved_fp16,
                "conversions": self.conversions}

    @classmethod
    def from_json(cls, data: Mapping) -> Features:
        return cls(float(data["saved_int8"]), float(data["saved_fp16"]), int(data["conversions"]))

"""What the record says per unit: its sensitivity (each precision alone: its loss and what it
saves), its place in the chosen plan, and its error in a diagnosis (where the error enters, tensor
by tensor)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from autoprec.core.fields import Fields
from autoprec.core.plan import Precision
from autoprec.record.trial import PRECISIONS


@dataclass(frozen=True)
class UnitSensitivity:
    unit: str
    op_type: str
    share: float | None  # fraction of the FP32 model's profiled time spent in this unit's nodes
    loss: dict[str, float]  # precision -> accuracy loss with only this unit lowered to it
    # precision -> fraction of the FP32 time saved by this unit in the profiled all-units plan
    # (negative: slower than FP32); empty when the engine has no profiler
    gain: dict[str, float] = field(default_factory=dict)
    # the units it stands for: itself and those of its repeated pattern, decided with it
    members: int = 1

    def cost(self, precision: str, by_gain: bool = False) -> float:
        """Loss per fraction of FP32 time saved (lower trades better); inf for a unit that saves
        nothing.

        The time saved is the unit's measured gain (``by_gain``, where profiled), else its FP32
        share; without a profile, the cost is the loss."""
        loss = self.loss[precision]
        saved = self.gain.get(precision, self.share) if by_gain else self.share
        if not math.isfinite(loss):
            return math.inf
        if saved is None:
            return loss
        return loss / saved if saved > 0 else math.inf


@dataclass(frozen=True)
class Sensitivity:
    units: tuple[UnitSensitivity, ...]  # searchable units, in graph order
    unattributed_share: float | None  # profiled time the engine could not attribute to a unit
    batches: int  # evaluation batches each loss was measured on
    evaluations: int  # one-unit plans evaluated (0 when read from the cache)
    seconds: float
    engine: str
    failed: int = 0  # one-unit plans that failed to lower or run (their loss is inf)
    first_error: str = ""
    # builds that timed a plan's nodes (the FP32 model, each all-units plan); json 'profiles'
    node_time_builds: int = 0
    # of ``seconds``, those the one-unit plans took (the rest: the node times)
    evaluation_seconds: float = 0.0
    # each loss's metric in words (Judge.said); "" in a file written before it was recorded
    judged: str = ""

    def ranking(self, precision: Precision, by_gain: bool = False) -> list[UnitSensitivity]:
        """Units that may take ``precision``, least loss per time saved first (those saving nothing
        last)."""
        return sorted(
            (u for u in self.units if precision.value in u.loss),
            key=lambda u: u.cost(precision.value, by_gain)
        )

    def node_timed(self, precision: Precision) -> bool:
        """Whether the time each unit saves in ``precision`` was measured."""
        return any(precision.value in u.gain for u in self.units)

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: a loss that is not finite (a failed or overflowing plan) is written
        "inf"."""
        units = [
            {**asdict(u), "loss": {p: v if math.isfinite(v) else "inf" for p, v in u.loss.items()}} for u in self.units
        ]
        return {
            "engine": self.engine, "batches": self.batches, "evaluations": self.evaluations,
            "seconds": round(self.seconds, 3), "unattributed_share": self.unattributed_share,
            "units": units,
            "failed": self.failed, "first_error": self.first_error,
            "profiles": self.node_time_builds,
            "evaluation_seconds": round(self.evaluation_seconds, 3), "judged": self.judged,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sensitivity:
        units = tuple(
            UnitSensitivity(u["unit"], u["op_type"], u["share"],
                            {p: float(v) for p, v in u["loss"].items()}, u["gain"],
                            u.get("members", 1))
            for u in data["units"]
        )
        return cls(
            units,
            data["unattributed_share"],
            data["batches"],
            data["evaluations"],
            data["seconds"],
            data["engine"],
            data.get("failed", 0),
            data.get("first_error", ""),
            data.get("profiles", 0),
            data.get("evaluation_seconds", 0.0),
            str(data.get("judged") or ""),
        )


@dataclass(frozen=True)
class ChosenUnit:
    """One unit of the chosen plan (best/plan.json's ``units``), in graph order."""

    name: str
    op_type: str
    fused: tuple[str, ...]
    precision: str

    allowed: tuple[str, ...] = ()
    tied_to: str | None = None  # the unit of its repeated pattern it takes its precision from

    @classmethod
    def from_json(cls, f: Fields) -> ChosenUnit:
        tied_to = f.get("tied_to")
        return cls(f["name"].text(), f["op_type"].text(), tuple(f["fused"].texts()),
                   f["precision"].one_of(PRECISIONS),
                   tuple(item.one_of(PRECISIONS) for item in f["allowed"].items()),
                   tied_to.text_or_none() if tied_to else None)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op_type": self.op_type, "fused": list(self.fused),
                "allowed": list(self.allowed),
                "tied_to": self.tied_to, "precision": self.precision}


@dataclass(frozen=True)
class UnitError:
    index: int
    unit: str
    op_type: str
    precision: str
    tensor: str
    rel_l2: float  # accumulated: this unit's output in the candidate vs FP32
    cosine: float
    max_abs: float
    added_rel_l2: float  # this unit alone in its precision, fed FP32 inputs; 0 for FP32 units
    # the model's loss with only this unit reduced, by the judge diagnose is given (the search's
    alone_loss: float
    # sensitivity pass's: the same figure sensitivity.json holds for it)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ActivationRow:
    """What calibration saw of one tensor: its range and percentiles, each method's INT8 threshold
    and the share of values beyond it, the values FP16 flushes (below its smallest subnormal), keeps
    subnormal or overflows, a histogram of |x|, and the risk flags (see
    :func:`activation_ranges`)."""

    tensor: str
    min: float
    max: float
    p99_9: float
    p99_99: float
    thresholds: Mapping[str, float]
    clipped_share: Mapping[str, float]
    values: int
    fp16_below_subnormal: int
    fp16_subnormal: int
    fp16_overflow: int
    histogram: str
    flags: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "min": self.min, "max": self.max, "p99.9": self.p99_9,
                "p99.99": self.p99_99,
                "thresholds": dict(self.thresholds), "clipped_share": dict(self.clipped_share),
                "values": self.values,
                "fp16_below_subnormal": self.fp16_below_subnormal,
                "fp16_subnormal": self.fp16_subnormal,
                "fp16_overflow": self.fp16_overflow, "histogram": self.histogram,
                "flags": list(self.flags)}

"""Precision and Plan: which precision each unit runs in. Engine-independent, JSON-serialisable."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from autoprec.core import atomic

# amax of |x| at the 99.99th percentile of the calibration data
DEFAULT_CALIBRATION = "percentile-99.99"
# --calibration auto: the range method is one more choice of the study, per trial
AUTO_CALIBRATION = "auto"


def calibration_method(calibration: str) -> str:
    """The INT8 range method a plan takes under ``--calibration`` where the study chose none for it:
    the method given, or with ``auto`` (the study chooses per trial) the default (the uniform plans,
    the sensitivity pass's one-unit plans, the reference executor's check)."""
    return DEFAULT_CALIBRATION if calibration == AUTO_CALIBRATION else calibration


class Precision(str, enum.Enum):
    """Narrowest first. INT4 is weight-only: a MatMul's or Gemm's constant weight in 4-bit blocks,
    its activations as they are (see :mod:`autoprec.lower.int4`)."""

    INT4 = "int4"
    INT8 = "int8"
    FP16 = "fp16"
    FP32 = "fp32"

    def __str__(self) -> str:
        return self.value


# what a unit may run in below FP32, narrowest first
REDUCED = (Precision.INT4, Precision.INT8, Precision.FP16)


@dataclass(frozen=True)
class Plan:
    """A precision for every searchable unit, plus how INT8 ranges were calibrated.

    The plan is what a study searches over; lowering it to an explicit-precision ONNX is
    a backend's job (see :mod:`autoprec.lower`).
    """

    precisions: tuple[tuple[str, Precision], ...]
    calibration: str = DEFAULT_CALIBRATION

    @classmethod
    def from_mapping(cls, precisions: Mapping[str, str | Precision],
                     calibration: str = DEFAULT_CALIBRATION) -> Plan:
        return cls(tuple((name, Precision(p)) for name, p in precisions.items()), calibration)

    @classmethod
    def uniform(cls, unit_names: list[str], precision: Precision,
                calibration: str = DEFAULT_CALIBRATION) -> Plan:
        return cls(tuple((name, precision) for name in unit_names), calibration)

    def as_dict(self) -> dict[str, Precision]:
        return dict(self.precisions)

    def __getitem__(self, unit: str) -> Precision:
        return self.as_dict()[unit]

    def counts(self) -> dict[str, int]:
        """Units per precision: INT8, FP16 and FP32 always, INT4 where the plan has some (as results
        before INT4 existed wrote them)."""
        counts = {p.value: 0 for p in Precision if p is not Precision.INT4}
        for _, p in self.precisions:
            counts[p.value] = counts.get(p.value, 0) + 1
        return {p.value: counts[p.value] for p in Precision if p.value in counts}

    def key(self) -> str:
        """Stable identity used to recognise a plan that was already measured."""
        return atomic.digest({"c": self.calibration,
                              "p": sorted((n, p.value) for n, p in self.precisions)})

    def to_json(self) -> dict[str, Any]:
        return {
            "calibration": self.calibration,
            "counts": self.counts(),
            "precisions": {name: p.value for name, p in self.precisions},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls.from_mapping(data["precisions"], data.get("calibration", DEFAULT_CALIBRATION))

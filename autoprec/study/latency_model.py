"""A latency model of the target engine: any plan's latency predicted without building it.

From the sensitivity pass's per-node profiles (the FP32 model and each all-units plan, the engine's
own profiler), each unit's time saved in each precision is known; a plan's prediction is the FP32
latency less the time its units save, plus a cost per conversion node (Q/DQ, Cast) its lowering
inserts at precision boundaries. Three coefficients (how far each precision's profiled saving holds
in a mixed plan, and the cost of one conversion) are refitted by least squares on every measured
trial, drawn towards the profile's own reading (1, 1, 0) so that three trials cannot over-fit them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from autoprec.analysis.subgraphs import all_nodes
from autoprec.core.plan import Plan
from autoprec.record.trial import Features

CONVERSION_OPS = ("QuantizeLinear", "Cast")
# How strongly the fit is drawn towards the profile's reading (1, 1, 0), in trials' worth of
# evidence.
PRIOR_WEIGHT = 2.0


def conversions(lowered: onnx.ModelProto, fp32: onnx.ModelProto) -> int:
    """Conversion nodes the lowering inserted: Q/DQ pairs and Casts beyond the FP32 model's own."""
    def count(model: onnx.ModelProto) -> int:
        return sum(n.op_type in CONVERSION_OPS for n in all_nodes(model))

    return max(0, count(lowered) - count(fp32))


@dataclass
class LatencyModel:
    """``fp32_ms``: the all-FP32 plan's measured latency; ``gains``: unit -> precision -> fraction
    of FP32 time the unit saves (``UnitSensitivity.gain``)."""

    fp32_ms: float
    gains: Mapping[str, Mapping[str, float]]
    # INT8 saving, FP16 saving, ms per conversion
    coefficients: tuple[float, float, float] = (1.0, 1.0, 0.0)
    fitted_on: int = 0

    def features(self, plan: Plan, lowered: onnx.ModelProto, fp32: onnx.ModelProto) -> Features:
        saved = {"int8": 0.0, "fp16": 0.0}
        for unit, precision in plan.as_dict().items():
            if precision.value in saved:
                saved[precision.value] += self.gains.get(unit, {}).get(precision.value, 0.0)
        return Features(saved["int8"], saved["fp16"], conversions(lowered, fp32))

    def predict(self, features: Features) -> float:
        int8, fp16, per_conversion = self.coefficients
        return (
            self.fp32_ms * (1.0 - int8 * features.saved_int8 - fp16 * features.saved_fp16)
            + per_conversion * features.conversions
        )

    def refit(self, measured: Sequence[tuple[Features, float]]) -> None:
        """Least squares on (features, measured ms), with the prior's rows beside the trials'."""
        if not measured:
            return
        rows = np.asarray(
            [[-self.fp32_ms * f.saved_int8, -self.fp32_ms * f.saved_fp16, float(f.conversions)] for f, _ in measured]
        )
        targets = np.asarray([ms - self.fp32_ms for _, ms in measured])
        # one prior row per coefficient, as large as PRIOR_WEIGHT trials' typical entries in its
        # column
        typical = np.sqrt((rows**2).mean(axis=0))
        weights = np.sqrt(PRIOR_WEIGHT) * np.where(typical > 0, typical, 1.0)
        prior = np.asarray([1.0, 1.0, 0.0])
        solution, *_ = np.linalg.lstsq(
            np.vstack([rows, np.diag(weights)]), np.concatenate([targets, weights * prior]),
            rcond=None
        )
        self.coefficients = tuple(float(c) for c in solution)
        self.fitted_on = len(measured)


def median_error_percent(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Median absolute error of (predicted, measured) latencies, in % of the measured: the
    predictions made before their plans were built."""
    errors = [abs(predicted - measured) / measured * 100 for predicted, measured in pairs if measured > 0]
    return round(statistics.median(errors), 2) if errors else None

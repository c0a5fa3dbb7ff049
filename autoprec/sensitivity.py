"""Sensitivity: how much accuracy each unit loses alone, and how much of the FP32 time it costs.

The search's first phase. Each unit is lowered alone to each precision it may take (everything
else FP32) and its accuracy loss measured: one evaluation per unit and precision, on the
screening batches, with the search's own calibration and FP32 reference. Each unit's share of the
FP32 latency comes from the engine's per-node profile, not from FLOP counts. From the ranking
(loss per share of latency) the warm-start plans are built: the k least sensitive units lowered,
for several k, so the front's shape is known after a handful of trials.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import onnx

from autoprec import atomic
from autoprec.backends.base import Backend
from autoprec.calibrate import DEFAULT_CALIBRATION, ActivationRanges
from autoprec.data import Batch
from autoprec.model import ModelInfo
from autoprec.plan import Plan, Precision

# Warm-start prefixes: where the summed single-unit losses of the k least sensitive units cross these
# multiples of --max-loss (losses of small errors roughly add up), or these fractions of the units
# when there is no limit.
LOSS_TARGETS = (0.25, 0.5, 1.0, 2.0)
UNIT_FRACTIONS = (0.25, 0.5, 0.75, 0.9)


@dataclass(frozen=True)
class UnitSensitivity:
    unit: str
    op_type: str
    share: float | None  # fraction of the FP32 model's profiled time spent in this unit's nodes
    loss: dict[str, float]  # precision -> accuracy loss with only this unit lowered to it


@dataclass(frozen=True)
class Sensitivity:
    units: tuple[UnitSensitivity, ...]  # searchable units, in graph order
    unattributed_share: float | None  # profiled time the engine could not attribute to a unit
    batches: int  # evaluation batches each loss was measured on
    evaluations: int  # one-unit plans evaluated (0 when read from the cache)
    seconds: float
    engine: str

    def ranking(self, precision: Precision) -> list[UnitSensitivity]:
        """Units that may take ``precision``, least loss per share of latency first (infinite losses last)."""
        def cost(u: UnitSensitivity) -> float:
            loss = u.loss[precision.value]
            if not math.isfinite(loss):
                return math.inf
            return loss / u.share if u.share else (loss if u.share is None else math.inf)

        return sorted((u for u in self.units if precision.value in u.loss), key=cost)

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: a loss that is not finite (a failed or overflowing plan) is written "inf"."""
        units = [{**asdict(u), "loss": {p: v if math.isfinite(v) else "inf" for p, v in u.loss.items()}} for u in self.units]
        return {
            "engine": self.engine, "batches": self.batches, "evaluations": self.evaluations,
            "seconds": round(self.seconds, 3), "unattributed_share": self.unattributed_share, "units": units,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sensitivity:
        units = tuple(
            UnitSensitivity(u["unit"], u["op_type"], u["share"], {p: float(v) for p, v in u["loss"].items()})
            for u in data["units"]
        )
        return cls(units, data["unattributed_share"], data["batches"], data["evaluations"], data["seconds"], data["engine"])


def latency_shares(info: ModelInfo, backend: Backend, batch: Batch) -> tuple[dict[str, float], float] | None:
    """Each unit's share of the FP32 model's profiled time, and the share no unit owns; None when
    the engine has no per-node profiler."""
    times = backend.node_times(info.model, batch)
    if not times:
        return None
    total = sum(times.values())
    owner = {node: u.name for u in info.units for node in u.nodes}
    shares: dict[str, float] = {}
    unattributed = 0.0
    for node, seconds in times.items():
        if node in owner:
            shares[owner[node]] = shares.get(owner[node], 0.0) + seconds / total
        elif not node:
            unattributed += seconds / total
    return shares, unattributed


def one_unit_plan(info: ModelInfo, unit: str, precision: Precision, calibration: str = DEFAULT_CALIBRATION) -> Plan:
    return Plan.from_mapping({u.name: precision if u.name == unit else u.allowed[-1] for u in info.units}, calibration)


def analyse_sensitivity(
    info: ModelInfo,
    backend: Backend,
    ranges: ActivationRanges | None,
    loss_of: Callable[[onnx.ModelProto], float],
    profile_batch: Batch,
    batches: int,
    calibration: str = DEFAULT_CALIBRATION,
    on_step: Callable[[int, int], None] | None = None,
) -> Sensitivity:
    """Profile the FP32 model, then measure every (unit, precision) alone with ``loss_of``.

    A one-unit plan that fails to lower or run counts as an infinite loss: that unit stays FP32 in
    the warm start, and the search may still try it.
    """
    started = time.monotonic()
    profiled = latency_shares(info, backend, profile_batch)
    shares, unattributed = profiled if profiled else ({}, None)
    steps = [(u, p) for u in info.searchable_units for p in u.allowed if p is not Precision.FP32]
    losses: dict[str, dict[str, float]] = {u.name: {} for u in info.searchable_units}
    for i, (unit, precision) in enumerate(steps):
        try:
            loss = loss_of(backend.lower(info, one_unit_plan(info, unit.name, precision, calibration), ranges))
        except Exception:  # noqa: BLE001 - any engine or lowering failure: this unit cannot take it alone
            loss = math.inf
        losses[unit.name][precision.value] = loss
        if on_step is not None:
            on_step(i + 1, len(steps))
    units = tuple(
        UnitSensitivity(u.name, u.op_type, shares.get(u.name, 0.0) if profiled else None, losses[u.name])
        for u in info.searchable_units
    )
    return Sensitivity(units, unattributed, batches, len(steps), time.monotonic() - started, backend.info().label())


def cache_key(info: ModelInfo, backend: Backend, data_fingerprint: str, metric: str, calibration: str, batches: int) -> str:
    """What a sensitivity depends on: model, engine (and its Q/DQ form), data, metric, calibration,
    batches, and what each unit may take."""
    allowed = {u.name: [p.value for p in u.allowed] for u in info.searchable_units}
    payload = json.dumps([info.sha256, backend.name, backend.qdq_form.value, data_fingerprint, metric, calibration,
                          batches, allowed], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cached_sensitivity(path: Path | None, key: str, compute: Callable[[], Sensitivity]) -> tuple[Sensitivity, bool]:
    """Read ``path`` when it holds the sensitivity for ``key``, else compute and write it. Returns (it, from cache)."""
    if path is not None and path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return Sensitivity.from_json(data), True
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or stale: measured again
    found = compute()
    if path is not None:
        atomic.write_json(path, {"key": key, **found.to_json()})
    return found, False


def not_faster_than_fp32(uniform: Mapping[str, tuple[float, float]]) -> list[str]:
    """Reduced precisions whose measured all-units plan (latency ms, loss) was no faster than all-FP32's."""
    if "fp32" not in uniform:
        return []
    return [p for p in ("int8", "fp16") if p in uniform and uniform[p][0] >= uniform["fp32"][0]]


def warm_start_params(
    info: ModelInfo,
    sensitivity: Sensitivity,
    max_loss: float | None,
    uniform: Mapping[str, tuple[float, float]] | None = None,
) -> list[dict[str, str]]:
    """Plans that lower the k least sensitive units (per latency share) to one precision, for several k.

    ``uniform`` holds the measured (latency ms, loss) of the uniform plans ("fp32", "fp16", "int8"):
    a precision whose all-units plan is not faster than all-FP32 gains nothing by lowering part of
    the model, so it gets no plans. k takes ``UNIT_FRACTIONS`` of the ranked units and, with
    --max-loss, the k where the predicted loss crosses ``LOSS_TARGETS`` × the limit. Single-unit
    losses do not simply add up (errors compound), so the prediction is their running sum scaled to
    the uniform plan's measured loss. Parameters are the study's (searchable units only).
    """
    uniform = uniform or {}
    plans: list[dict[str, str]] = []
    base = {u.name: u.allowed[-1].value for u in info.searchable_units}
    for precision in (Precision.INT8, Precision.FP16):
        measured = uniform.get(precision.value)
        if precision.value in not_faster_than_fp32(uniform):
            continue
        ranked = [u for u in sensitivity.ranking(precision) if math.isfinite(u.loss[precision.value])]
        if not ranked:
            continue
        counts = {max(1, round(f * len(ranked))) for f in UNIT_FRACTIONS}
        if max_loss:
            running = [0.0]
            for u in ranked:
                running.append(running[-1] + u.loss[precision.value])
            scale = measured[1] / running[-1] if measured and math.isfinite(measured[1]) and running[-1] > 0 else 1.0
            counts |= {next((k - 1 for k in range(1, len(running)) if scale * running[k] > t * max_loss), len(ranked))
                       for t in LOSS_TARGETS}
        for k in sorted(c for c in counts if 0 < c < len(base)):
            params = dict(base, **{u.unit: precision.value for u in ranked[:k]})
            if params not in plans:
                plans.append(params)
    return plans

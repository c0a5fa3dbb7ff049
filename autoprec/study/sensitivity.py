"""Sensitivity: how much accuracy each unit loses alone, and how much of the FP32 time it costs.

The search's first phase. Each unit is lowered alone to each precision it may take (everything else
FP32) and its accuracy loss measured: one evaluation per unit and precision, on the screening
batches, with the search's own calibration and FP32 reference. Each unit's share of the FP32 latency
comes from the engine's per-node profile, not from FLOP counts; so does the time it saves when
lowered, from one profile of each all-units plan (its Q/DQ and Cast nodes counted with the units
beside them; a sensitive unit's FP16 saving is measured in the FP16 region, against one more profile
with the sensitive units FP32). Where a precision's all-units plan is not faster than FP32, only the
units that save time are lowered by the warm start: on many engines only some layers run faster in
INT8, so such a model can still have fast partial plans. From the ranking (loss per time saved) the
warm-start plans are built: the k least sensitive units lowered, for several k, so the front's shape
is known after a handful of trials.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Mapping

import onnx

from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.data import Batch
from autoprec.analysis.model_info import ModelInfo, Unit
from autoprec.analysis.subgraphs import all_nodes, label
from autoprec.backends.base import Backend
from autoprec.core import atomic
from autoprec.core.errors import MetricError, first_line
from autoprec.core.plan import DEFAULT_CALIBRATION, REDUCED, Plan, Precision
from autoprec.record.per_unit import Sensitivity, UnitSensitivity
from autoprec.study.coordination import StepFailure


def latency_shares(info: ModelInfo, times: Mapping[str, float]) -> tuple[dict[str, float], float]:
    """Each unit's share of the FP32 model's profiled time (``times``: the engine's node times; a
    tied unit's counted in the unit it is tied to, which stands for its pattern), and the share no
    unit owns."""
    total = sum(times.values())
    owner = {key: u.tied_to or u.name for u in info.units for node in u.nodes for key in (node, label(u.scope, node))}
    shares: dict[str, float] = {}
    unattributed = 0.0
    for node, seconds in times.items():
        if node in owner:
            shares[owner[node]] = shares.get(owner[node], 0.0) + seconds / total
        elif not node:
            unattributed += seconds / total
    return shares, unattributed


def unit_times(
    info: ModelInfo, lowered: onnx.ModelProto, times: Mapping[str, float],
    lowered_units: frozenset[str] = frozenset(),
    through_free_nodes: bool = False,
) -> dict[str, float]:
    """Seconds per unit in a profile of ``lowered``: its own nodes, plus the nodes lowering inserted
    (Q/DQ, Cast) shared equally by the ``lowered_units`` they connect to (directly, or also through
    nodes no unit owns where ``through_free_nodes``)."""
    # A node by its own name (ONNX Runtime's profile) and by its path (TensorRT's layers:
    # If_1/then/a).
    owner = {key: u.name for u in info.units for node in u.nodes for key in (node, label(u.scope, node))}
    original = {n.name for n in all_nodes(info.model)}
    lowered_nodes = all_nodes(lowered)
    producer = {out: n for n in lowered_nodes for out in n.output}
    consumers: dict[str, list] = defaultdict(list)
    for n in lowered_nodes:
        for name in n.input:
            consumers[name].append(n)

    def neighbours(node) -> list:
        return [producer[t] for t in node.input if t in producer] + [c for t in node.output for c in consumers[t]]

    def adjacent_units(node) -> set[str]:
        found, seen, todo = set(), {node.name}, [node]
        while todo:
            for n in neighbours(todo.pop()):
                if owner.get(n.name) in lowered_units:
                    found.add(owner[n.name])
                elif n.name not in seen and (n.name not in original or (through_free_nodes and n.name not in owner)):
                    seen.add(n.name)
                    todo.append(n)
        return found

    per_unit: dict[str, float] = defaultdict(float)
    by_name = {n.name: n for n in lowered_nodes}
    for name, seconds in times.items():
        if name in owner:
            per_unit[owner[name]] += seconds
        elif name in by_name and name not in original:
            units = adjacent_units(by_name[name])
            for unit in units:
                per_unit[unit] += seconds / len(units)
    return dict(per_unit)


def unit_gains(info: ModelInfo, backend: Backend, ranges: ActivationRanges | None, batch: Batch,
               fp32_times: Mapping[str, float], calibration: str) -> tuple[dict[str, dict[str, float]], int]:
    """precision -> unit -> fraction of FP32 time the unit saves, from one profile of each reduced
    precision's all-units plan (and how many plans were profiled). A plan that cannot be lowered or
    profiled gives no gains."""
    total = sum(fp32_times.values())
    fp32 = unit_times(info, info.model, fp32_times)
    gains: dict[str, dict[str, float]] = {}
    profiled = 0

    # the lowered graph, its node times
    def profile(plan) -> tuple[onnx.ModelProto, Mapping[str, float] | None]:
        nonlocal profiled
        lowered = backend.lower(info, plan, ranges)
        profiled += 1
        return lowered.proto, backend.node_times(lowered, batch)

    for precision in REDUCED:
        lowered_units = [u for u in info.searchable_units if precision in u.allowed]
        if not lowered_units:
            continue
        names = frozenset(u.name for u in lowered_units)
        try:
            lowered, times = profile(info.plan_at(precision, names, calibration))
        except Exception:  # noqa: BLE001 - an engine that cannot run it: the warm start falls back to the uniform plan's latency
            continue
        if not times:
            continue
        spent = unit_times(info, lowered, times, names)
        # a unit the profile lost track of (renamed beyond recognition) has no measured gain
        gains[precision.value] = {u: (fp32.get(u, 0.0) - spent[u]) / total for u in names if spent.get(u)}
        sensitive = frozenset(u.name for u in lowered_units if u.sensitive)
        if sensitive and sensitive != names:
            try:
                kept = profile(info.plan_at(precision, names - sensitive, calibration))
            except Exception:  # noqa: BLE001 - their gain stays measured against FP32 alone
                continue
            if kept[1]:
                gains[precision.value].update(sensitive_gains(info, kept, sensitive, spent, total))
    return gains, profiled


def sensitive_gains(info: ModelInfo, kept_fp32: tuple[onnx.ModelProto, Mapping[str, float]],
                    sensitive: frozenset[str],
                    spent: Mapping[str, float], total: float) -> dict[str, float]:
    """Fraction of FP32 time each sensitive unit saves in the reduced-precision region: its cost
    kept FP32 amid it (its own nodes and the conversions at its borders, found through the neutral
    nodes between) less its cost lowered with it (``spent``, from the all-units profile). Measured
    against the FP32 model instead, a softmax between FP16 matrix multiplies would not be credited
    with the two Casts that keeping it FP32 costs."""
    lowered, times = kept_fp32
    cost = unit_times(info, lowered, times, sensitive, through_free_nodes=True)
    return {u: (cost.get(u, 0.0) - spent.get(u, 0.0)) / total for u in sensitive if cost.get(u) or spent.get(u)}


def analyse_sensitivity(
    info: ModelInfo,
    backend: Backend,
    ranges: ActivationRanges | None,
    loss_of: Callable[[Plan], float],
    timing_batch: Batch,
    batches: int,
    calibration: str = DEFAULT_CALIBRATION,
    on_step: Callable[[int, int], None] | None = None,
) -> Sensitivity:
    """Profile the FP32 model and each all-units plan, then measure every (unit, precision) alone
    with ``loss_of``.

    A one-unit plan that fails to lower or run counts as an infinite loss: that unit stays FP32 in
    the warm start, and the search may still try it.
    """
    started = time.monotonic()
    # the all-FP32 plan as the engine lowers it (ONNX Runtime: the model itself; TensorRT: stamped
    # with the plan), so that the study's all-FP32 trial is the very graph profiled here
    fp32_times = backend.node_times(
        backend.lower(info, info.plan_at(Precision.FP32, (), calibration), ranges), timing_batch
    )
    profiled = latency_shares(info, fp32_times) if fp32_times else None
    shares, unattributed = profiled if profiled else ({}, None)
    gains, timed = (
        unit_gains(info, backend, ranges, timing_batch, fp32_times, calibration) if fp32_times else ({}, 0)
    )
    steps = one_unit_steps(info)
    losses: dict[str, dict[str, float]] = {u.name: {} for u in info.dimensions}
    failures: list[str] = []
    evaluating = time.monotonic()
    for i, (unit, precision) in enumerate(steps):
        try:
            loss = one_unit_loss(loss_of, info.plan_at(precision, [unit.name], calibration))
        except StepFailure as failure:  # this unit cannot take it alone
            loss = math.inf
            failures.append(f"{unit.name} {precision}: {failure.text}")
        losses[unit.name][precision.value] = loss
        if on_step is not None:
            on_step(i + 1, len(steps))
    gains = {p: _by_dimension(info, by_unit) for p, by_unit in gains.items()}
    units = tuple(
        UnitSensitivity(
            u.name,
            u.op_type,
            shares.get(u.name, 0.0) if profiled else None,
            losses[u.name],
            {p: by_unit[u.name] for p, by_unit in gains.items() if u.name in by_unit},
            len(info.members(u.name)),
        )
        for u in info.dimensions
    )
    return Sensitivity(units, unattributed, batches, len(steps), time.monotonic() - started,
                       backend.info().label(),
                       len(failures), failures[0] if failures else "",
                       timed + (fp32_times is not None),
                       time.monotonic() - evaluating)


def one_unit_steps(info: ModelInfo) -> list[tuple[Unit, Precision]]:
    """The pass's one-unit plans, in the order it measures them: each dimension at each reduced
    precision."""
    return [(u, p) for u in info.dimensions for p in u.allowed if p is not Precision.FP32]


def one_unit_plans(info: ModelInfo, calibration: str) -> list[Plan]:
    return [info.plan_at(precision, [unit.name], calibration) for unit, precision in one_unit_steps(info)]


def one_unit_loss(loss_of: Callable[[Plan], float], plan: Plan) -> float:
    """``loss_of(plan)``, an engine's or lowering's failure raised as a :class:`StepFailure` with
    its one line (the metric's own failure is not the unit's: it stops the search)."""
    try:
        return loss_of(plan)
    except (MetricError, StepFailure):
        raise
    except Exception as exc:  # noqa: BLE001 - any engine or lowering failure: this unit cannot take it alone
        raise StepFailure(f"{type(exc).__name__}: {first_line(exc, empty='')}") from exc


def _by_dimension(info: ModelInfo, per_unit: Mapping[str, float]) -> dict[str, float]:
    """A per-unit figure summed into the units that stand for their repeated patterns."""
    leader = {u.name: u.tied_to or u.name for u in info.units}
    summed: dict[str, float] = defaultdict(float)
    for unit, value in per_unit.items():
        summed[leader.get(unit, unit)] += value
    return dict(summed)


def searched_sensitive(
    info: ModelInfo, sensitivity: Sensitivity | None, max_loss: float | None
) -> tuple[ModelInfo, dict]:
    """``info`` with the sensitive units (softmax, normalisations) that do not pay kept FP32, and
    what was decided. Each new dimension must earn its place: a sensitive unit is searched in a
    reduced precision only where, alone, it stays within ``max_loss`` and the engine's profile of
    the all-units plan shows it saving time (where the engine has no profiler, the loss decides).
    Without a sensitivity pass nothing shows that any pays: all stay FP32."""
    candidates = [u for u in info.dimensions if u.sensitive]
    facts = {"found": len(candidates), "searched": 0, "too_lossy": 0, "no_gain": 0}
    if not candidates:
        return info, facts
    if sensitivity is None:
        note = (
            f"{len(candidates)} sensitive unit(s) (softmax, normalisations, reductions, embeddings) kept FP32: "
            "no sensitivity pass measured whether lowering them pays"
        )
        return info.without(
            [p for p in Precision if p is not Precision.FP32], [u.name for u in candidates], note
        ), facts
    measured = {u.unit: u for u in sensitivity.units}
    for precision in REDUCED:
        lossy, idle = [], []
        for unit in candidates:
            found = measured.get(unit.name)
            if precision not in unit.allowed:
                continue
            loss = found.loss.get(precision.value, math.inf) if found else math.inf
            if not math.isfinite(loss) or (max_loss is not None and loss > max_loss):
                lossy.append(unit.name)
            elif sensitivity.node_timed(precision) and found.gain.get(precision.value, 0.0) <= 0:
                idle.append(unit.name)
        if lossy or idle:
            note = (
                f"{len(lossy) + len(idle)} of {len(candidates)} sensitive unit(s) kept out of "
                f"{precision} ({len(lossy)} lose more than the limit alone, {len(idle)} save no "
                f"time in the {precision} profile)"
            )
            info = info.without([precision], lossy + idle, note)
            facts["too_lossy"] += len(lossy)
            facts["no_gain"] += len(idle)
    facts["searched"] = sum(1 for u in info.dimensions if u.sensitive)
    return info, facts


def cache_key(
    info: ModelInfo, backend: Backend, data_fingerprint: str, metric: str, calibration: str,
    batches: int
) -> str:
    """What a sensitivity depends on: model, engine (and its Q/DQ form), data, metric, calibration,
    batches, and what each unit may take (each dimension: with the units tied to it)."""
    allowed = {u.name: [[p.value for p in u.allowed], info.members(u.name)] for u in info.dimensions}
    return atomic.digest([info.sha256, backend.name, backend.qdq_form.value, data_fingerprint,
                          metric, calibration,
                          batches, allowed], sort_keys=True)


def cached_sensitivity(path: Path | None, key: str, compute: Callable[[], Sensitivity]) -> tuple[Sensitivity, bool]:
    """Read ``path`` when it holds the sensitivity for ``key``, else compute and write it. Returns
    (it, from cache)."""
    kept = atomic.read_keyed(path, key) if path is not None else None
    if kept is not None:
        try:
            return Sensitivity.from_json(kept), True
        except (ValueError, KeyError, TypeError):
            pass  # damaged: measured again
    found = compute()
    if path is not None:
        atomic.write_keyed(path, key, found.to_json())
    return found, False

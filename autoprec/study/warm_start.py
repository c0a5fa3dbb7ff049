"""The warm start: plans seeded into the study from the sensitivity ranking (prefixes of the least
sensitive units per latency share, plans mixing precisions unit by unit where each saves the most
per loss, and plans keeping the first units unlowered), so that the sampler starts from the region a
per-unit measurement already points at."""

from __future__ import annotations

import math
from typing import Mapping

from autoprec.analysis.model_info import ModelInfo
from autoprec.core.plan import REDUCED, Precision
from autoprec.record.per_unit import Sensitivity, UnitSensitivity
from autoprec.study.optimize import uniform_params

# Warm-start prefixes: where the summed single-unit losses of the k least sensitive units cross
# these multiples of --max-loss (losses of small errors roughly add up), or these fractions of the
# units when there is no limit.
LOSS_TARGETS = (0.25, 0.5, 1.0, 2.0)
UNIT_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0)
# Where the all-units plan is faster but past --max-loss: plans keeping this many units nearest the
# input at their widest precision, the rest lowered. An error made early passes through every later
# layer (Polygraphy's precision bisection walks from there); a coarse task metric may be missed by a
# single decision that only the first layers fix, which a ranking of one-unit losses need not find.
LEADING_KEPT = (1, 2, 4)
NARROWEST_FIRST = [p.value for p in Precision]


def faster_than_fp32(uniform: Mapping[str, tuple[float, float]], precision: str) -> bool | None:
    """Whether the measured all-units plan of ``precision`` (latency ms, loss) beat all-FP32's;
    None where either was never timed (rejected early, failed)."""
    timed = [uniform.get(p, (math.nan,))[0] for p in (precision, "fp32")]
    return timed[0] < timed[1] if all(math.isfinite(t) for t in timed) else None


def not_faster_than_fp32(uniform: Mapping[str, tuple[float, float]]) -> list[str]:
    """Reduced precisions whose measured all-units plan was no faster than all-FP32's."""
    return [p.value for p in REDUCED if faster_than_fp32(uniform, p.value) is False]


def warm_start_params(
    info: ModelInfo,
    sensitivity: Sensitivity,
    max_loss: float | None,
    uniform: Mapping[str, tuple[float, float]] | None = None,
) -> list[dict[str, str]]:
    """Plans that lower the k least sensitive units (per time saved) to one precision, for several
    k.

    ``uniform`` holds the measured (latency ms, loss) of the uniform plans ("fp32", "fp16",
    "int8"). Where a precision's all-units plan is faster than all-FP32, lowering pays on the
    whole, and units are ranked per share of FP32 time. Where it is not, only the units the
    profile shows saving time are ranked, per time saved; without a profile, that precision gets
    no plans. (The profiled savings are not trusted beyond that: ORT's profiler costs time per
    node and lowering adds nodes, so summed savings can be negative for a plan that times faster.)
    Where the all-units plan was never timed (rejected early for its loss, or failed), which
    ranking fits is unknown, so both seed plans.
    k takes ``UNIT_FRACTIONS`` of the ranked units and, with
    --max-loss, the k where the predicted loss crosses ``LOSS_TARGETS`` × the limit; where the
    all-units plan is faster but past the limit, plans keeping the ``LEADING_KEPT`` units nearest
    the input unlowered join them. Single-unit
    losses do not simply add up (errors compound), so the prediction is their running sum scaled to
    the uniform plan's measured loss. Parameters are the study's (searchable units only).
    """
    uniform = uniform or {}
    base = {u.name: u.allowed[-1].value for u in info.dimensions}
    plans = mixed_plans(info, sensitivity, max_loss, base, uniform)
    for precision in REDUCED:
        lowerable = [u.name for u in info.dimensions if precision in u.allowed]
        faster = faster_than_fp32(uniform, precision.value)
        for by_gain in ([False, True] if faster is None else [not faster]):
            if not by_gain or sensitivity.node_timed(precision):
                _add_prefix_plans(plans, base, sensitivity, precision, by_gain,
                                  uniform.get(precision.value), max_loss,
                                  set(lowerable))
        if faster is not False and any(u.sensitive and precision in u.allowed for u in info.dimensions):
            # the uniform plan keeps sensitive units FP32; this one is the widest region the search
            # may use
            every = dict(base, **{name: precision.value for name in lowerable})
            if every not in plans:
                plans.append(every)
        measured = uniform.get(precision.value)
        if faster and max_loss is not None and measured is not None and measured[1] > max_loss:
            for kept in LEADING_KEPT:
                params = dict(base, **{name: precision.value for name in lowerable[kept:]})
                if kept < len(lowerable) and params not in plans:
                    plans.append(params)
    return plans


def _add_prefix_plans(plans: list[dict[str, str]], base: dict[str, str], sensitivity: Sensitivity,
                      precision: Precision, by_gain: bool, measured: tuple[float, float] | None,
                      max_loss: float | None, lowerable: set[str]) -> None:
    """Append (once each) the plans lowering the first k units of one ranking to ``precision``
    (of the units that may still take it: the search may have kept some FP32 since the pass)."""
    ranked = [u for u in sensitivity.ranking(precision, by_gain)
              if u.unit in lowerable and math.isfinite(u.cost(precision.value, by_gain))]
    if not ranked:
        return
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


def mixed_plans(info: ModelInfo, sensitivity: Sensitivity, max_loss: float | None,
                base: dict[str, str],
                uniform: Mapping[str, tuple[float, float]]) -> list[dict[str, str]]:
    """Plans mixing precisions unit by unit (INT4 on the units where it saves time at little more
    loss than INT8, INT8 on the rest): greedy paths, each step the one move of a unit to another
    precision that saves the most profiled time per loss it adds, and of each the plans where the
    summed one-unit losses cross ``LOSS_TARGETS`` × the limit (without one, its end). A path starts
    from ``base`` and from each uniform plan measured faster than all-FP32 within the limit: a
    unit's profiled saving can be a loss that the whole plan measured as a gain. Plans of one
    reduced precision are the prefix plans' to seed; only mixes are kept here. A precision counts
    only where its time saved per unit was measured (the profile)."""
    allowed = {u.name: {p.value for p in u.allowed} for u in info.dimensions}
    units = [u for u in sensitivity.units if u.unit in base]
    starts = [base] + [uniform_params(info, p) for p in REDUCED if faster_than_fp32(uniform, p.value)
                       and (max_loss is None or uniform[p.value][1] <= max_loss)]
    mixes = []
    for start in starts:
        path = _greedy_path(units, allowed, dict(start))
        if max_loss:
            picked = [next((plan for loss, plan in reversed(path) if loss <= t * max_loss), None)
                      for t in LOSS_TARGETS]
        else:
            picked = [path[-1][1]] if path else []
        for plan in picked:
            if plan is not None and len(set(plan.values()) - {"fp32"}) > 1 and plan not in mixes:
                mixes.append(plan)
    return mixes


def _greedy_path(units: list[UnitSensitivity], allowed: dict[str, set[str]],
                 plan: dict[str, str]) -> list[tuple[float, dict[str, str]]]:
    """Each plan along the path with its predicted loss (the sum of its units' one-unit losses).
    Units only narrow (a path from a measured plan keeps what it measured)."""
    path: list[tuple[float, dict[str, str]]] = []
    while True:
        best, move = 0.0, None
        for u in units:
            now = plan[u.unit]
            for precision in (p for p in NARROWEST_FIRST[:NARROWEST_FIRST.index(now)] if p in allowed[u.unit]):
                step = _step(u, now, precision)
                if step is not None and step > best:
                    best, move = step, (u.unit, precision)
        if move is None:
            return path
        plan = dict(plan, **{move[0]: move[1]})
        path.append((sum(_loss(u, plan[u.unit]) for u in units), plan))


def _step(unit: UnitSensitivity, now: str, precision: str) -> float | None:
    """Time saved per loss added by moving ``unit`` from ``now`` to ``precision``; None where it
    saves nothing or either is unmeasured."""
    saved = _saved(unit, precision) - _saved(unit, now)
    added = _loss(unit, precision) - _loss(unit, now)
    if not (math.isfinite(saved) and math.isfinite(added)) or saved <= 0:
        return None
    return saved / max(added, 1e-12)


def _saved(unit: UnitSensitivity, precision: str) -> float:
    return 0.0 if precision == "fp32" else unit.gain.get(precision, math.nan)


def _loss(unit: UnitSensitivity, precision: str) -> float:
    return 0.0 if precision == "fp32" else unit.loss.get(precision, math.inf)

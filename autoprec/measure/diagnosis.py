"""Where the error enters: unit-by-unit error against FP32, and what calibration saw of each tensor.

``diagnose``: the FP32 model and the lowered candidate run on the same inputs with every unit's
output exposed. Per unit, in graph order: the error of its output against FP32 (what has
accumulated there), and the error the unit itself adds — measured by lowering that unit *alone*
to its planned precision, so it is fed exact FP32 inputs. The units that add the most are the
ones to send back to FP32.

``activation_ranges``: per-tensor statistics from calibration with INT8 and FP16 risk flags.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from autoprec.analysis.calibrate import CALIBRATION_METHODS, FP16_MAX, ActivationRanges
from autoprec.analysis.data import Batch
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.subgraphs import graphs, with_outputs
from autoprec.backends.base import Backend
from autoprec.core.plan import Plan, Precision
from autoprec.core.stored import StoredModel
from autoprec.measure.accuracy import output_metrics
from autoprec.record.per_unit import ActivationRow, UnitError

FAST_METHODS = tuple(m for m in CALIBRATION_METHODS if m != "entropy")
SPARK = "▁▂▃▄▅▆▇█"


def _run(
    backend: Backend, model: StoredModel, names: Sequence[str], batches: Sequence[Batch]
) -> list[dict[str, np.ndarray]]:
    """The model's outputs and the tensors ``names`` (inside subgraphs too) on each batch."""
    exposed, read_as = with_outputs(model.proto, names)
    with backend.runner(model.with_proto(exposed)) as runner:
        runs = [runner.run(b) for b in batches]
    return [{**out, **{name: out[read] for name, read in zip(names, read_as)}} for out in runs]


def _unit_tensor(model: StoredModel, name: str) -> str:
    """The unit's output as the lowered graph names it (an FP16 region may keep only its FP16
    copy)."""
    produced = {t for _, graph in graphs(model.proto.graph) for n in graph.node for t in n.output}
    return name if name in produced else f"{name}_fp16"


def _error(reference: list[dict], candidate: list[dict], ref_name: str, cand_name: str) -> dict[str, float]:
    ref = np.concatenate([r[ref_name] for r in reference]).astype(np.float32)
    cand = np.concatenate([c[cand_name] for c in candidate]).astype(np.float32)
    return output_metrics(ref, cand)


# a judge's loss of the model's outputs, batch by batch
ModelLoss = Callable[[list[dict[str, np.ndarray]]], float]


def diagnose(
    info: ModelInfo, backend: Backend, ranges: ActivationRanges, plan: Plan,
    batches: Sequence[Batch],
    model_loss: ModelLoss,
) -> list[UnitError]:
    """Per unit in graph order: accumulated and added error of the plan's lowering on ``backend``,
    and the model's loss (``model_loss``, of its outputs on ``batches``) with only that unit reduced
    (units the batches never run, in an If branch they do not take, are left out)."""
    outputs = [u.output for u in info.units]
    finals = [o.name for o in info.outputs]
    reference = _run(backend, info.stored, outputs, batches)
    lowered = backend.lower(info, plan, ranges)
    names = [_unit_tensor(lowered, o) for o in outputs]
    candidate = _run(backend, lowered, names, batches)
    rows = []
    for index, (unit, name) in enumerate(zip(info.units, names)):
        if not any(r[unit.output].size for r in reference):
            continue  # in an If branch the data never takes: nothing ran to compare
        precision = plan[unit.name]
        accumulated = _error(reference, candidate, unit.output, name)
        added = alone_loss = 0.0
        if precision is not Precision.FP32:
            alone = backend.lower(info, info.plan_at(precision, [unit.name], plan.calibration),
                                  ranges)
            alone_name = _unit_tensor(alone, unit.output)
            alone_out = _run(backend, alone, [alone_name], batches)
            added = _error(reference, alone_out, unit.output, alone_name)["rel_l2"]
            alone_loss = model_loss([{f: out[f] for f in finals} for out in alone_out])
        rows.append(UnitError(index, unit.name, unit.op_type, precision.value, unit.output,
                              accumulated["rel_l2"], accumulated["cosine"], accumulated["max_abs"],
                              added, alone_loss))
    return rows


def culprits(rows: Sequence[UnitError], count: int = 5) -> list[UnitError]:
    """The reduced-precision units that cost the model's output the most by themselves, worst first.

    Ranked by ``alone_loss`` (what the unit does to the model's outputs), not by the error of its
    own output: a unit with a large local error can be harmless downstream, and the reverse.
    """
    reduced = [r for r in rows if r.precision != Precision.FP32.value]
    return sorted(reduced,
                  key=lambda r: -r.alone_loss if math.isfinite(r.alone_loss) else -math.inf)[:count]


def jumps(rows: Sequence[UnitError], factor: float = 3.0, floor: float = 1e-3) -> list[UnitError]:
    """Units, in graph order, where the accumulated error first jumps: at least ``factor`` × the
    largest error seen before them, and above ``floor``."""
    found, worst = [], 0.0
    for r in rows:
        if math.isfinite(r.rel_l2) and r.rel_l2 > floor and r.rel_l2 >= factor * worst:
            found.append(r)
        worst = max(worst, r.rel_l2 if math.isfinite(r.rel_l2) else worst)
    return found


def _spark(hist: np.ndarray, edges: np.ndarray, buckets: int = 16) -> str:
    """|x| distribution in ``buckets`` buckets from 0 to max|x| (log-scaled counts)."""
    centres = np.abs((edges[:-1] + edges[1:]) / 2)
    top = centres.max() if len(centres) else 0.0
    if top == 0:
        return SPARK[0] * buckets
    idx = np.minimum((centres / top * buckets).astype(int), buckets - 1)
    counts = np.bincount(idx, weights=hist, minlength=buckets)
    levels = np.log1p(counts) / max(np.log1p(counts).max(), 1e-12)
    return "".join(SPARK[min(int(v * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)] for v in levels)


def activation_ranges(
    info: ModelInfo, ranges: ActivationRanges, methods: Sequence[str] = FAST_METHODS
) -> list[ActivationRow]:
    """Per calibrated tensor, in graph order: range, thresholds, clipped shares, FP16 counts, flags.

    Flags: ``int8-outliers`` when the min-max range is over 10× the 99.99th percentile (outliers
    stretch the INT8 scale, so most values get few levels); ``fp16-overflow`` when |x| passes
    half of FP16's 65504 (headroom gone); ``fp16-underflow`` when over 1 % of the non-zero values
    fall below FP16's smallest subnormal (2^-24) and flush to zero.
    """
    order = [t for u in info.units for t in (*u.activations, u.output)]
    seen, rows = set(), []
    for name in order:
        if name in seen or name not in ranges.tensors:
            continue
        seen.add(name)
        r = ranges[name]
        absmax = max(abs(r.min), abs(r.max))
        total, tiny, subnormal, overflow = r.counts
        p9999 = r.amax("percentile-99.99")
        flags = []
        if p9999 > 0 and absmax / p9999 > 10:
            flags.append("int8-outliers")
        if absmax > FP16_MAX / 2 or overflow:
            flags.append("fp16-overflow")
        if total and tiny / total > 0.01:
            flags.append("fp16-underflow")
        rows.append(ActivationRow(name, r.min, r.max, r.amax("percentile-99.9"), p9999,
                                  {m: r.amax(m) for m in methods},
                                  {m: r.clipped_share(m) for m in methods}, total,
                                  tiny, subnormal, overflow, _spark(r.hist, r.edges), tuple(flags)))
    return rows

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from autoprec import atomic
from autoprec.accuracy import output_metrics
from autoprec.backends.base import Backend
from autoprec.calibrate import CALIBRATION_METHODS, FP16_MAX, ActivationRanges
from autoprec.data import Batch
from autoprec.model import ModelInfo
from autoprec.plan import Plan, Precision

FAST_METHODS = tuple(m for m in CALIBRATION_METHODS if m != "entropy")
SPARK = "▁▂▃▄▅▆▇█"


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
    alone_loss: float  # the model's accuracy loss (1 - mean cosine of its outputs) with only this unit reduced

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present)
    return exposed


def _run(backend: Backend, model: onnx.ModelProto, batches: Sequence[Batch]) -> list[dict[str, np.ndarray]]:
    with backend.prepare(model) as runner:
        return [runner.run(b) for b in batches]


def _unit_tensor(model: onnx.ModelProto, name: str) -> str:
    """The unit's output as the lowered graph names it (an FP16 region may keep only its FP16 copy)."""
    produced = {t for n in model.graph.node for t in n.output}
    return name if name in produced else f"{name}_fp16"


def _error(reference: list[dict], candidate: list[dict], ref_name: str, cand_name: str) -> dict[str, float]:
    ref = np.concatenate([r[ref_name] for r in reference]).astype(np.float32)
    cand = np.concatenate([c[cand_name] for c in candidate]).astype(np.float32)
    return output_metrics(ref, cand)


def diagnose(
    info: ModelInfo, backend: Backend, ranges: ActivationRanges, plan: Plan, batches: Sequence[Batch]
) -> list[UnitError]:
    """Per unit in graph order: accumulated and added error of the plan's lowering on ``backend``."""
    outputs = [u.output for u in info.units]
    finals = [o.name for o in info.outputs]
    reference = _run(backend, _with_outputs(info.model, outputs), batches)
    lowered = backend.lower(info, plan, ranges)
    names = [_unit_tensor(lowered, o) for o in outputs]
    candidate = _run(backend, _with_outputs(lowered, names), batches)
    rows = []
    for index, (unit, name) in enumerate(zip(info.units, names)):
        precision = plan[unit.name]
        accumulated = _error(reference, candidate, unit.output, name)
        added = alone_loss = 0.0
        if precision is not Precision.FP32:
            alone = backend.lower(info, Plan(((unit.name, precision),), plan.calibration), ranges)
            alone_name = _unit_tensor(alone, unit.output)
            alone_out = _run(backend, _with_outputs(alone, [alone_name]), batches)
            added = _error(reference, alone_out, unit.output, alone_name)["rel_l2"]
            alone_loss = float(np.mean([1 - _error(reference, alone_out, f, f)["cosine"] for f in finals]))
        rows.append(UnitError(index, unit.name, unit.op_type, precision.value, unit.output,
                              accumulated["rel_l2"], accumulated["cosine"], accumulated["max_abs"], added, alone_loss))
    return rows


def culprits(rows: Sequence[UnitError], count: int = 5) -> list[UnitError]:
    """The reduced-precision units that cost the model's output the most by themselves, worst first.

    Ranked by ``alone_loss`` (what the unit does to the model's outputs), not by the error of its
    own output: a unit with a large local error can be harmless downstream, and the reverse.
    """
    reduced = [r for r in rows if r.precision != Precision.FP32.value]
    return sorted(reduced, key=lambda r: -r.alone_loss if math.isfinite(r.alone_loss) else -math.inf)[:count]


def jumps(rows: Sequence[UnitError], factor: float = 3.0, floor: float = 1e-3) -> list[UnitError]:
    """Units, in graph order, where the accumulated error first jumps: at least ``factor`` × the largest
    error seen before them, and above ``floor``."""
    found, worst = [], 0.0
    for r in rows:
        if math.isfinite(r.rel_l2) and r.rel_l2 > floor and r.rel_l2 >= factor * worst:
            found.append(r)
        worst = max(worst, r.rel_l2 if math.isfinite(r.rel_l2) else worst)
    return found


def plot_errors(rows: Sequence[UnitError], title: str, path: Path) -> Path:
    """error_by_layer.png. Top: error accumulated at each unit's output (line) and the error the unit
    adds alone (bars). Bottom: the model's loss with only that unit reduced; the worst five named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autoprec.plots import PRECISION_COLOURS

    def positive(values):  # log axes: zero (an FP32 unit adds nothing) is left out, not floored
        return [v if v > 0 and math.isfinite(v) else np.nan for v in values]

    x = [r.index for r in rows]
    colours = [PRECISION_COLOURS[r.precision] if r.precision != "fp32" else "#BBBBBB" for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(min(24, max(9, 0.12 * len(rows) + 4)), 7), dpi=120)
    top.bar(x, positive([r.added_rel_l2 for r in rows]), color=colours, label="added by the unit alone (fed FP32 inputs)")
    top.plot(x, positive([r.rel_l2 for r in rows]), color="black", marker=".", lw=1.2, label="accumulated at its output")
    top.set_yscale("log")
    top.set_ylabel("rel. L2 error vs FP32")
    top.legend(fontsize=8, loc="lower right", framealpha=0.9)
    top.set_title(title, fontsize=9)
    bottom.bar(x, positive([r.alone_loss for r in rows]), color=colours)
    bottom.set_yscale("log")
    bottom.set_ylabel("model loss, unit alone")
    for r in culprits(rows):
        if r.alone_loss > 0:
            bottom.annotate(r.unit, (r.index, r.alone_loss), textcoords="offset points", xytext=(0, 4), ha="center",
                            fontsize=7, rotation=60, color="tab:red")
    bottom.set_xlabel("unit index in graph order (bar colour: planned precision — orange int8, blue fp16, grey fp32)")
    for ax in (top, bottom):
        ax.grid(True, axis="y", alpha=0.3)
    bottom.margins(y=0.35)
    fig.tight_layout()
    atomic.write_with(path, lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return path


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


def activation_ranges(info: ModelInfo, ranges: ActivationRanges, methods: Sequence[str] = FAST_METHODS) -> list[dict[str, Any]]:
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
        rows.append({
            "tensor": name,
            "min": r.min,
            "max": r.max,
            "p99.9": r.amax("percentile-99.9"),
            "p99.99": p9999,
            "thresholds": {m: r.amax(m) for m in methods},
            "clipped_share": {m: r.clipped_share(m) for m in methods},
            "values": total,
            "fp16_below_subnormal": tiny,
            "fp16_subnormal": subnormal,
            "fp16_overflow": overflow,
            "histogram": _spark(r.hist, r.edges),
            "flags": flags,
        })
    return rows

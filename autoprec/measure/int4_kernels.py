"""Which of ONNX Runtime's MatMulNBits kernels a search's INT4 units run, measured once per model and
engine: ``accuracy_level`` 4 rounds the activations to INT8 blocks and multiplies in integers (on
this project's CPU 5.3x FP32 at one token against level 0's 1.6x), which a CPU without integer dot
products or a GPU may not run faster, and which adds a rounding; level 0 multiplies in float. And
what a zero point per block costs: on this project's CPU at one token the kernels reading one ran
13–35 % slower than symmetric blocks (a 1024-wide LLaMA's projections), which a unit's lower error
must pay for (:func:`autoprec.lower.int4.zero_point_margin`).

Timed as the final timing times (:func:`autoprec.measure.speedup.time_until_known`: interleaved
rounds, sessions built anew per block) at the shape the search times, on the plan with every unit
that may take INT4 at INT4, each level with symmetric blocks and with zero points. Level 4 only
where it is faster beyond the timing's noise (its interval above 1); the answer is kept beside the
model (:func:`autoprec.lower.int4.keep_kernels`), where every lowering of it, a worker's, a resumed
search's or an export's, reads it.
"""

from __future__ import annotations

from typing import Any

from autoprec.analysis.data import Workload
from autoprec.analysis.model_info import ModelInfo
from autoprec.backends.base import Backend
from autoprec.core.plan import Precision
from autoprec.lower.int4 import (
    ACCURACY_LEVELS,
    keep_kernels,
    kept_kernels,
    with_kernel,
    zero_point_margin,
)
from autoprec.measure.measurement import Lowering
from autoprec.measure.speedup import time_until_known
from autoprec.record.trial import EngineInfo

SECONDS = 2.0  # at most, after the timing's least blocks
FLOAT, INTEGER = (f"level {level}" for level in ACCURACY_LEVELS)
WITH_ZERO_POINTS = ", zero points"


def engine_key(engine: EngineInfo) -> str:
    """What a kept answer was measured on."""
    return f"{engine.engine} {engine.version} {engine.provider} {engine.device}"


def int4_kernels(backend: Backend, engine: EngineInfo, info: ModelInfo, lowering: Lowering,
                 work: Workload) -> dict[str, Any]:
    """The accuracy level the model's INT4 units take on ``backend``, and what it was chosen by:
    kept for this engine, or measured now and kept."""
    key = engine_key(engine)
    kept = kept_kernels(info.stored.folder)
    if kept is not None and kept["engine"] == key:
        return kept
    all_int4 = lowering(backend, info.plan_at(Precision.INT4))
    models = {f"{name}{zeros}": with_kernel(all_int4, level, bool(zeros))
              for name, level in zip((FLOAT, INTEGER), ACCURACY_LEVELS) for zeros in ("", WITH_ZERO_POINTS)}
    pairs = [(FLOAT, INTEGER), *((name, name + WITH_ZERO_POINTS) for name in (FLOAT, INTEGER))]
    rounds = time_until_known(backend, models, work, pairs, SECONDS)
    found = rounds.speedup(FLOAT, INTEGER)
    chosen = INTEGER if found.low > 1 else FLOAT
    measured = {
        "accuracy_level": ACCURACY_LEVELS[chosen == INTEGER],
        "integer_over_float": _ratio(found),
        "zero_points": _ratio(rounds.speedup(chosen, chosen + WITH_ZERO_POINTS)),  # below 1: they cost time
        "rounds": len(rounds.blocks), "engine": key,
    }
    keep_kernels(info.stored.folder, measured)
    return measured


def _ratio(found) -> dict[str, float]:
    return {"speedup": round(found.speedup, 3), "low": round(found.low, 3), "high": round(found.high, 3)}


def said(measured: dict[str, Any]) -> str:
    """One line for the log."""
    found, zeros = measured["integer_over_float"], measured.get("zero_points")
    return (f"INT4 units run MatMulNBits at accuracy_level {measured['accuracy_level']}: level 4 (the "
            f"activations in INT8 blocks) timed {found['speedup']:.2f}x ({found['low']:.2f}–"
            f"{found['high']:.2f}) level 0's (float) on {measured['engine']}, the plan with every "
            "INT4 unit at INT4" + (
                f"; a zero point per block timed {zeros['speedup']:.2f}x ({zeros['low']:.2f}–{zeros['high']:.2f}) "
                f"symmetric blocks' speed, so a unit takes them where they cut its error by "
                f"{zero_point_margin(measured):.0%} or more" if zeros else ""))

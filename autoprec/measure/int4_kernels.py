"""Which of ONNX Runtime's MatMulNBits kernels a search's INT4 units run, measured once per model and
engine: ``accuracy_level`` 4 rounds the activations to INT8 blocks and multiplies in integers (on
this project's CPU 5.3x FP32 at one token against level 0's 1.6x), which a CPU without integer dot
products or a GPU may not run faster, and which adds a rounding; level 0 multiplies in float.

Timed as the final timing times (:func:`autoprec.measure.speedup.time_until_known`: interleaved
rounds, sessions built anew per block) at the shape the search times, on the plan with every unit
that may take INT4 at INT4. Level 4 only where it is faster beyond the timing's noise (its interval
above 1); the answer is kept beside the model (:func:`autoprec.lower.int4.keep_kernels`), where every
lowering of it, a worker's, a resumed search's or an export's, reads it.
"""

from __future__ import annotations

from typing import Any

from autoprec.analysis.data import Workload
from autoprec.analysis.model_info import ModelInfo
from autoprec.backends.base import Backend
from autoprec.core.plan import Precision
from autoprec.lower.int4 import ACCURACY_LEVELS, keep_kernels, kept_kernels, with_accuracy_level
from autoprec.measure.measurement import Lowering
from autoprec.measure.speedup import time_until_known
from autoprec.record.trial import EngineInfo

SECONDS = 2.0  # at most, after the timing's least blocks
FLOAT, INTEGER = (f"level {level}" for level in ACCURACY_LEVELS)


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
    models = {name: with_accuracy_level(all_int4, level) for name, level in zip((FLOAT, INTEGER), ACCURACY_LEVELS)}
    rounds = time_until_known(backend, models, work, [(FLOAT, INTEGER)], SECONDS)
    found = rounds.speedup(FLOAT, INTEGER)
    measured = {
        "accuracy_level": ACCURACY_LEVELS[1] if found.low > 1 else ACCURACY_LEVELS[0],
        "integer_over_float": {"speedup": round(found.speedup, 3), "low": round(found.low, 3),
                               "high": round(found.high, 3)},
        "rounds": len(rounds.blocks), "engine": key,
    }
    keep_kernels(info.stored.folder, measured)
    return measured


def said(measured: dict[str, Any]) -> str:
    """One line for the log."""
    found = measured["integer_over_float"]
    return (f"INT4 units run MatMulNBits at accuracy_level {measured['accuracy_level']}: level 4 (the "
            f"activations in INT8 blocks) timed {found['speedup']:.2f}x ({found['low']:.2f}–"
            f"{found['high']:.2f}) level 0's (float) on {measured['engine']}, the plan with every "
            "INT4 unit at INT4")

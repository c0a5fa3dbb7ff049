"""The FP32 model's own outputs on the evaluation batches: what every candidate is judged
against."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from autoprec.analysis.calibrate import content_key
from autoprec.analysis.data import Batch
from autoprec.analysis.model import RANDOM_OPS
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.preparation import cpu_session, given_session
from autoprec.analysis.subgraphs import with_outputs
from autoprec.core import atomic, untrusted
from autoprec.core.errors import DataError, ModelError, first_line
from autoprec.core.similarity import similarity_sums

log = logging.getLogger("autoprec")


def reference_cache(info: ModelInfo, fingerprint: str, cache_dir: Path) -> Path:
    """Where :func:`reference_outputs` keeps the FP32 outputs for this model and data."""
    return cache_dir / f"reference-{content_key(info, fingerprint, 'reference')}.npz"


def reference_outputs(
    info: ModelInfo, batches: Sequence[Batch], fingerprint: str, cache_dir: Path | None = None
) -> list[dict[str, np.ndarray]]:
    """The prepared FP32 model's outputs on the evaluation batches (ORT CPU: exact FP32), measured
    every time: a cache or a study's shared file holding them is kept only where it agrees (then
    every worker of a study judges against the same arrays), since a result folder is input too."""
    names = [o.name for o in info.outputs]
    session = cpu_session(info.stored, packed=True)
    try:
        outputs = [dict(zip(names, session.run(names, batch))) for batch in batches]
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises several types for inputs a model cannot take
        raise DataError(f"{info.path.name}: the FP32 model does not run on the evaluation data "
                        f"({first_line(exc)}); random data draws integers from [0, 100) and floats "
                        "from [0, 1), which an index or a size input may not take: give --data "
                        "with real inputs, or --const NAME=VALUE for a setting") from None
    if outputs:  # refused before the cache is written: a second run of the first batch must agree with the first
        check_deterministic(info, outputs[0], dict(zip(names, session.run(names, batches[0]))))
    del session
    if outputs and info.prepared_kept:
        _check_prepared(info, batches[0], outputs[0])
    cache = reference_cache(info, fingerprint, cache_dir) if cache_dir else None
    kept = _kept(cache) if cache is not None and cache.exists() else None
    if kept is not None:
        differs = _differs(outputs, kept)
        if differs is None:
            return kept
        log.warning(f"{cache}: not this model's FP32 outputs on this data ({differs}); measured "
                    "afresh and rewritten")
    if cache is not None:
        arrays = {"outputs": np.array(names, dtype=str), "count": np.array(len(outputs))}
        for i, out in enumerate(outputs):
            arrays.update({f"b{i}_o{j}": out[n] for j, n in enumerate(names)})
        # uncompressed: float outputs shrink by a tenth under zlib, which took 0.4 s of ppocr-rec's set-up and
        # 3.4-3.9 s for 1 x 128 x 151936 logits (benchmarks/results/reference_cache_write.json)
        atomic.write_with(cache, lambda f: np.savez(f, **arrays))
    return outputs


# FP32 outputs of one model on one machine and on another (a study's workers), or of the prepared
# model and the given file (folding moves rounding, not more): within this relative L2 they agree
KEPT_REL_L2 = 1e-4  # (a reference moved by that much moves a cosine loss by about 5e-9)


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return math.inf
    if a.dtype.kind not in "fc":
        return 0.0 if np.array_equal(a, b) else math.inf
    if np.array_equal(a, b, equal_nan=True):
        return 0.0
    sums = similarity_sums(a.reshape(1, -1), b.reshape(1, -1))
    if sums is None:  # a NaN or an infinity in b only
        return math.nan if np.isnan(b).any() else math.inf
    a_squares, _, _, error_squares, _ = sums
    return math.sqrt(error_squares) / max(math.sqrt(float(a_squares.sum())), 1e-30)


def _kept(cache: Path) -> list[dict[str, np.ndarray]] | None:
    try:
        with np.load(untrusted.npz_checked(cache, f"the cache {cache.parent}"), allow_pickle=False) as npz:
            names_kept = npz["outputs"]  # a str array; before 2026-11-29 one JSON text (a study's shared file)
            order = [str(n) for n in names_kept] if names_kept.ndim else json.loads(str(names_kept))
            return [{n: npz[f"b{i}_o{j}"] for j, n in enumerate(order)} for i in range(int(npz["count"]))]
    except (*untrusted.NUMPY_UNREADABLE, KeyError, TypeError, DataError):
        return None


def _differs(measured: list[dict[str, np.ndarray]], kept: list[dict[str, np.ndarray]]) -> str | None:
    """How ``kept`` is not ``measured`` (None: it agrees, output by output, within KEPT_REL_L2)."""
    if len(kept) != len(measured) or any(set(k) != set(m) for k, m in zip(kept, measured)):
        return "other batches or outputs"
    for i, (m, k) in enumerate(zip(measured, kept)):
        for name in m:
            error = _rel_l2(m[name], k[name])
            if not error <= KEPT_REL_L2:
                return f"batch {i}, output {name}: relative error {error:.3g}"
    return None


def _check_prepared(info: ModelInfo, batch: Batch, outputs: dict[str, np.ndarray]) -> None:
    """Refuse a prepared model an earlier run left in the cache whose outputs on ``batch`` are not the
    given file's: searching it would measure and ship another network."""
    try:
        given = given_session(info.path, info.stored.weight_bytes())
        wanted = dict(zip(outputs, given.run(list(outputs), batch)))
    except Exception:  # noqa: BLE001 - the file takes inputs the data does not hold (settings folded): not compared
        return
    differs = _differs([wanted], [outputs])
    if differs is not None:
        raise ModelError(f"{info.folder}: the prepared model an earlier run kept there does not "
                         f"give the given model's outputs ({differs}): it is not what autoprec "
                         f"made of {info.path.name} (edited or damaged); remove {info.folder} and "
                         "run again")


# two runs of one session on one input: equal but for reduction order, if that
DETERMINISTIC_REL_L2 = 1e-5


def check_deterministic(info: ModelInfo, first: dict[str, np.ndarray],
                        second: dict[str, np.ndarray]) -> None:
    """Refuse, in one line naming the output and any random op, a model whose FP32 outputs change
    from one run to the next on the same input: every candidate's loss against FP32 would be that
    noise, not its precision."""
    for name, a in first.items():
        error = _rel_l2(a, second[name])
        if not error <= DETERMINISTIC_REL_L2:
            said = f"relative error {error:.3g}" if a.dtype.kind in "fc" else "other values"
            random = [f"{n.op_type} {n.name!r}" for n in info.model.graph.node if n.op_type in RANDOM_OPS]
            cause = f"; it draws random values ({', '.join(random[:3])})" if random else ""
            raise ModelError(
                f"{info.path.name}: the FP32 model gives other outputs for the same input on a "
                f"second run (output {name}: {said}){cause}: a plan's loss against FP32 would be "
                "that noise. Give a deterministic model (random ops removed or fixed, exported "
                "for inference)")


def units_run(info: ModelInfo, batches: Sequence[Batch]) -> set[str]:
    """The units a run over ``batches`` computes: all but those in If branches (or Loop bodies) the
    data never enters, whose precision no measurement on this data could see."""
    inside = [u for u in info.units if u.scope and u.searchable]
    ran = {u.name for u in info.units if u not in inside}
    if not inside:
        return ran
    exposed, read_as = with_outputs(info.model, [u.output for u in inside])
    session = cpu_session(info.stored.with_proto(exposed))
    for batch in batches:
        ran |= {u.name for u, value in zip(inside, session.run(read_as, batch)) if value.size}
    return ran

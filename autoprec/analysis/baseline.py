"""What every trial of a search shares, computed once: the model analysed, the data loaded and
split, the calibration ranges and the FP32 reference."""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Mapping, Sequence

import numpy as np
import onnx

from autoprec.analysis.calibrate import (
    FP16_SAFE_MAX,
    ActivationRanges,
    calibrate,
    calibration_cache,
    out_of_range_nodes,
)
from autoprec.analysis.data import (
    Dataset,
    RandomDataWarning,
    build_dataset,
    item_shapes,
    scalar_values,
)
from autoprec.analysis.decoder import find_decoder
from autoprec.analysis.footprint import check_fits
from autoprec.analysis.images import ImageOptions
from autoprec.analysis.model import analyse, load_onnx
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.reference import reference_cache, reference_outputs, units_run
from autoprec.analysis.shape_points import judged_shapes
from autoprec.analysis.shapes import declared_inputs, output_specs
from autoprec.analysis.units import with_out_of_range
from autoprec.core.errors import ModelError
from autoprec.core.plan import Precision
from autoprec.core.search_space import SearchSpace

log = logging.getLogger("autoprec")


@dataclass(frozen=True)
class Baseline:
    """What every trial of a search shares: computed once (and cached on disk when a cache is
    given)."""

    info: ModelInfo
    dataset: Dataset
    ranges: ActivationRanges | None  # None when no unit may take INT8
    reference: list[dict]
    seconds: dict[str, float]


def load_inputs(
    model_path: Path,
    space: SearchSpace,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    image: ImageOptions = ImageOptions(),
    constants: Mapping[str, float] | None = None,
    out_of_range: Sequence[str] | None = None,
    cache: Path | None = None,
    raw: onnx.ModelProto | None = None,
    bounds: tuple[Mapping[str, Sequence[int]], Mapping[str, Sequence[int]]] | None = None,
    shape_runs: Mapping[str, int] | None = None,
    judge_shapes: bool = True,
    dims: Mapping[str, tuple[int, int | None, int]] | None = None,
) -> tuple[ModelInfo, Dataset, dict[str, float]]:
    """Analyse the model (``raw``: its graph, if the caller loaded it; ``bounds``: its deployment
    profile's min and max shapes, ``--shape`` its opt), load and split the data (the seconds each
    took); a model with dynamic dims is judged at every shape a deployment runs
    (:mod:`autoprec.analysis.shape_points`; ``shape_runs``: --shape-weights; ``dims``: --dim;
    ``judge_shapes`` False: at the data's shape alone, as results written before did). Where FP16 is
    searched, neutral ops out of FP16's range on the calibration data become units
    (``out_of_range``: the ones a search recorded, instead of measuring them again; else measured
    once per model and data and kept in ``cache``)."""
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    raw = raw if raw is not None else load_onnx(model_path)
    given = {k: tuple(v) for k, v in (shapes or {}).items()}
    # --const inputs need no data
    fed = [i for i in declared_inputs(raw) if i.name not in (constants or {})]
    # a decoder's data may be its prompts alone
    decoder = find_decoder(declared_inputs(raw), output_specs(raw))
    low, high = bounds or ({}, {})
    info = analyse(model_path, space, given, item_shapes(data, fed, decoder) if data is not None else None,
                   model=raw,
                   constants={**scalar_values(data, fed), **(constants or {})}, cache=cache,
                   min_shapes={k: tuple(v) for k, v in low.items()},
                   max_shapes={k: tuple(v) for k, v in high.items()},
                   dims=dims)
    seconds["analyse"] = time.monotonic() - t0
    check_fits(info.shape_profile, {i.name: np.dtype(i.dtype).itemsize for i in info.inputs},
               info.model,
               info.stored.weight_bytes())
    for line in info.notes:
        log.info(line)
    log.info(
        f"{model_path.name}: {len(info.units)} precision units ({len(info.searchable_units)} "
        f"searched), inputs {', '.join(f'{i.name} {list(i.shape)}' for i in info.inputs)}"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RandomDataWarning)
        dataset = build_dataset(
            data, info.inputs, seed=seed, image=image, constants=constants, decoder=decoder
        )
    for w in caught:
        log.warning(str(w.message))
    if judge_shapes:
        info, dataset = judged_shapes(info, dataset, shape_runs,
                                      bounds_given=bool(low or high or dims))
    log.info(
        f"data: {dataset.source} — {len(dataset.calibration)} calibration / "
        f"{len(dataset.evaluation)} evaluation batch(es)"
    )
    if Precision.FP16 in space.out_of_range:
        t0 = time.monotonic()
        found = (out_of_range_nodes(info, dataset.calibration, dataset.fingerprint(), cache) if out_of_range is None
                 else list(out_of_range))
        if found:
            info = with_out_of_range(info, space, found, (
                f"{len(found)} precision-neutral op(s) reach {FP16_SAFE_MAX:g} or more on the "
                f"calibration data (e.g. {found[0]}): units of their own, FP32 unless the search "
                "finds FP16 harmless there"))
            log.info(info.notes[-1])
        seconds["analyse"] += time.monotonic() - t0
    return info, dataset, seconds


def shared_files(info: ModelInfo, dataset: Dataset, cache: Path, shared: Collection[str] = ()) -> list[Path]:
    """The files :func:`baseline_of` leaves in ``cache``: what workers of one study share (a study
    sharing ``shared`` already: its calibration file, where it is an earlier autoprec's)."""
    fingerprint = dataset.fingerprint()
    calibration = [calibration_cache(info, fingerprint, cache, shared=shared)] if needs_calibration(info) else []
    return [*calibration, reference_cache(info, fingerprint, cache)]


def needs_calibration(info: ModelInfo) -> bool:
    return any(Precision.INT8 in u.allowed for u in info.searchable_units)


def baseline_of(
    info: ModelInfo, dataset: Dataset, seconds: dict[str, float], cache: Path | None = None
) -> Baseline:
    """Compute the FP32 reference and calibrate (when a unit may take INT8); read from ``cache``
    when there."""
    seconds = dict(seconds)
    fingerprint = dataset.fingerprint()
    t0 = time.monotonic()
    reference = reference_outputs(info, dataset.evaluation, fingerprint, cache)
    seconds["reference"] = time.monotonic() - t0
    _check_finite(info, reference)
    t0 = time.monotonic()
    info = pin_idle(info, dataset)
    ranges = calibrate(info, dataset.calibration, fingerprint, cache) if needs_calibration(info) else None
    seconds["calibrate"] = time.monotonic() - t0
    info = ranged(info, ranges)
    where = f"; cached in {cache}" if cache else ""
    ready = (
        "calibration ranges and FP32 reference"
        if ranges is not None
        else "FP32 reference (no INT8 searched: no calibration)"
    )
    log.info(f"{ready} ready ({seconds['calibrate'] + seconds['reference']:.1f} s{where})")
    return Baseline(info, dataset, ranges, reference, seconds)


def pin_idle(info: ModelInfo, dataset: Dataset) -> ModelInfo:
    """``info`` with units the data never runs (in an If branch it does not take) pinned to FP32:
    their precision would go unmeasured, so it is left as the model came."""
    ran = units_run(info, (*dataset.calibration, *dataset.evaluation))
    idle = [u.name for u in info.searchable_units if u.name not in ran]
    if not idle:
        return info
    note = (f"{len(idle)} unit(s) never run on the data (e.g. {idle[0]}, in an If branch it does "
            "not take or a loop it does not enter): kept FP32, since no measurement could see "
            "their precision")
    log.info(note)
    return info.without([p for p in Precision if p is not Precision.FP32], idle, note)


def ranged(info: ModelInfo, ranges: ActivationRanges | None) -> ModelInfo:
    """``info`` without INT8 for units the calibration batches never run (in an If branch only the
    evaluation batches take): there is no range to quantize them by."""
    if ranges is None:
        return info
    unseen = [u.name for u in info.searchable_units if Precision.INT8 in u.allowed
              and not all(t in ranges.tensors for t in u.activations)]
    if not unseen:
        return info
    note = (f"{len(unseen)} unit(s) never run on the calibration batches (e.g. {unseen[0]}, in an "
            "If branch only the evaluation batches take): INT8 left out for them, with no range "
            "to quantize by")
    log.info(note)
    return info.without((Precision.INT8,), unseen, note)


def _check_finite(info: ModelInfo, reference: list[dict]) -> None:
    """An FP32 output that is already NaN or Inf makes every candidate's loss infinite: say so,
    now."""
    for i, outputs in enumerate(reference):
        for name, value in outputs.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise ModelError(
                    f"{info.path}: the FP32 model's own output {name} is NaN or Inf on evaluation "
                    f"batch {i} of the data, so no candidate's accuracy can be measured; check the "
                    "data and its scaling (--image-mean/--image-std), or the model"
                )


def load_baseline(
    model_path: Path,
    space: SearchSpace,
    data: str | os.PathLike | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    image: ImageOptions = ImageOptions(),
    cache: Path | None = None,
    constants: Mapping[str, float] | None = None,
    judge_shapes: bool = True,
) -> Baseline:
    """Analyse the model, load and split the data (at every shape a deployment runs, unless
    ``judge_shapes`` is False), calibrate, compute the FP32 reference."""
    inputs = load_inputs(model_path, space, data, shapes, seed, image, constants, cache=cache,
                         judge_shapes=judge_shapes)
    return baseline_of(*inputs, cache)

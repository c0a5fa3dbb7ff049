"""``autoprec sensitivity``: each unit lowered alone, its loss and its share of FP32 latency (the search's first phase)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from autoprec.app.prepare import (
    Prepared,
    check_out_dir,
    declared_tasks,
    engine_space,
    judge_for,
    metric_for,
    prepare,
    repeats_decided,
    resolve_model,
    result_dir,
)
from autoprec.backends import Backend, get_backend
from autoprec.core.plan import DEFAULT_CALIBRATION
from autoprec.core.search_space import load_search_space
from autoprec.measure.accuracy import HeadOptions, resolve_metric
from autoprec.measure.measurement import InProcessMeasurer, Lowering, screening_batches
from autoprec.results import console
from autoprec.study.sensitivity import Sensitivity, analyse_sensitivity, cache_key, cached_sensitivity

log = logging.getLogger("autoprec")


def sensitivity_pass(
    prepared: Prepared,
    engine: Backend,
    loss_of,
    batches: int,
    metric: str,
    calibration: str,
    path: Path,
    progress: bool,
) -> tuple[Sensitivity, bool]:
    """The sensitivity of every searchable unit, read from ``path`` when it was measured the same way."""
    method = DEFAULT_CALIBRATION if calibration == "auto" else calibration
    key = cache_key(prepared.info, engine, prepared.dataset.fingerprint(), metric, method, batches)
    steps = sum(len(u.allowed) - 1 for u in prepared.info.dimensions)
    with console.StepProgress("sensitivity", steps, enabled=progress) as bar:
        found, from_cache = cached_sensitivity(path, key, lambda: analyse_sensitivity(
            prepared.info, engine, prepared.ranges, loss_of, prepared.dataset.evaluation[0], batches, method, bar.update
        ))
    if from_cache:
        log.info(f"sensitivity: read from {path} (same model, data, engine and space)")
    else:
        log.info(
            f"sensitivity: {found.evaluations} one-unit plans evaluated on {batches} batch(es) in {found.seconds:.1f} s"
        )
    if found.failed:
        every = found.failed == found.evaluations
        log.warning(
            f"sensitivity: {'every one' if every else f'{found.failed} of {found.evaluations}'} of the one-unit "
            f"plans failed (first: {found.first_error})"
            + ("; no warm start comes from it" if every else "; those units stay FP32 in the warm start")
        )
    return found, from_cache


def sensitivity(
    model: str | os.PathLike,
    data: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    backend: str = "ort-cpu",
    shapes: Mapping[str, Sequence[int]] | None = None,
    metric: str = "cosine",
    search_space: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    calibration: str = DEFAULT_CALIBRATION,
    image_mean: Sequence[float] = (0.0,),
    image_std: Sequence[float] = (1.0,),
    precisions: Sequence[str] | None = None,
    device: int = 0,
    progress: bool = False,
    head: HeadOptions | None = None,
    constants: Mapping[str, float] | None = None,
    tie_repeats: bool = True,
) -> tuple[Sensitivity, Path]:
    """Each unit lowered alone to each precision it may take: loss, and its share of FP32 latency.

    Writes ``sensitivity.json`` and ``sensitivity.png`` in ``out`` (the same files a search writes
    there, so a later search with the same settings reuses them).
    """
    from autoprec.results.plots import plot_sensitivity

    model_path, data, shapes, default_out = resolve_model(model, data, shapes)
    out_dir = result_dir(out, default_out)
    wanted = resolve_metric(metric, declared_tasks(model), head)
    engine = get_backend(backend, device, out_dir / "cache")
    if caveat := engine.info().caveat:
        log.warning(caveat)
    space, _, _ = engine_space(load_search_space(search_space).with_overrides(list(overrides)), engine, precisions)
    check_out_dir(out_dir)
    prepared = prepare(model_path, space, data, shapes, 0, image_mean, image_std, out_dir / "cache", constants)
    prepared = replace(prepared, info=repeats_decided(prepared.info, tie_repeats))
    batches = screening_batches(len(prepared.dataset.evaluation))
    metric_used = metric_for(wanted, prepared.info, prepared.dataset)
    judge = judge_for(metric_used, prepared)[0]
    ranking = judge.for_ranking()
    measurer = InProcessMeasurer(
        engine, prepared.dataset.evaluation, judge, ranking, Lowering(prepared.info, prepared.ranges)
    )
    found, _ = sensitivity_pass(
        prepared, engine, lambda plan: measurer.accuracy_loss(plan, batches),
        batches, ranking.metric.describe(), calibration, out_dir / "sensitivity.json", progress,
    )
    engine.drop_kept_builds()  # no trial follows
    plot_sensitivity(found.to_json(), model_path.name, out_dir / "sensitivity.png")
    return found, out_dir

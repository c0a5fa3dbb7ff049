"""``autoprec sensitivity``: each unit lowered alone, its loss and its share of FP32 latency (the
search's first phase)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from autoprec.analysis.baseline import Baseline, load_baseline
from autoprec.app.config import SearchConfig
from autoprec.app.resolve import (
    check_out_dir,
    engine_space,
    judge_for,
    metric_for,
    removed_if_refused,
    repeats_decided,
    resolve_model,
    result_dir,
    wanted_metric,
)
from autoprec.backends import Backend, get_backend
from autoprec.core.plan import Plan, calibration_method
from autoprec.core.search_space import load_search_space
from autoprec.measure.accuracy import Judge
from autoprec.measure.measurement import InProcessMeasurer, Lowering, screening_batches
from autoprec.record.per_unit import Sensitivity
from autoprec.results import console
from autoprec.study.coordination import SharedSteps
from autoprec.study.sensitivity import (
    analyse_sensitivity,
    cache_key,
    cached_sensitivity,
    one_unit_loss,
    one_unit_plans,
    one_unit_steps,
)

log = logging.getLogger("autoprec")


def sensitivity_pass(
    baseline: Baseline,
    engine: Backend,
    loss_of,
    batches: int,
    ranking: Judge,
    calibration: str,
    path: Path,
    progress: bool,
    shared: SharedSteps | None = None,
) -> tuple[Sensitivity, bool]:
    """The sensitivity of every searchable unit (each loss by the ``ranking`` judge, which it
    records in words), read from ``path`` when it was measured the same way. With ``shared``, a
    one-unit plan another worker of the study measured is read from the study instead of measured
    again."""
    method = calibration_method(calibration)
    key = _pass_key(baseline, engine, ranking, method, batches)
    measured = loss_of
    if shared is not None:
        def measured(plan: Plan) -> float:
            return shared.result(f"{key}:{plan.key()}", lambda: one_unit_loss(loss_of, plan))
    with console.StepProgress("sensitivity", len(one_unit_steps(baseline.info)), enabled=progress) as bar:
        found, from_cache = cached_sensitivity(path, key, lambda: replace(analyse_sensitivity(
            baseline.info, engine, baseline.ranges, measured, baseline.dataset.workload.first,
            batches, method,
            bar.update), judged=ranking.said()))
    if from_cache:
        log.info(f"sensitivity: read from {path} (same model, data, engine and space)")
    else:
        elsewhere = shared.computed_elsewhere(
            [f"{key}:{plan.key()}" for plan in one_unit_plans(baseline.info, method)]) if shared else 0
        log.info(
            f"sensitivity: {found.evaluations} one-unit plans evaluated on {batches} batch(es) in "
            f"{found.seconds:.1f} s"
            + (f" ({elsewhere} of them by the study's other workers)" if elsewhere else "")
        )
    if found.failed:
        every = found.failed == found.evaluations
        log.warning(
            f"sensitivity: {'every one' if every else f'{found.failed} of {found.evaluations}'} of "
            f"the one-unit plans failed (first: {found.first_error})"
            + ("; no warm start comes from it" if every else "; those units stay FP32 in the warm "
                                                             "start")
        )
    return found, from_cache


def help_sensitivity_pass(baseline: Baseline, engine: Backend, loss_of, batches: int,
                          ranking: Judge,
                          calibration: str, shared: SharedSteps) -> int:
    """This worker's share of the pass another worker of the study is computing: one-unit plans,
    from the last, that no worker measured or is measuring, until that worker publishes the pass.
    Returns how many."""
    method = calibration_method(calibration)
    key = _pass_key(baseline, engine, ranking, method, batches)
    plans = one_unit_plans(baseline.info, method)
    helped = shared.help([(f"{key}:{plan.key()}", lambda plan=plan: one_unit_loss(loss_of, plan)) for plan in plans])
    if helped:
        log.info(f"sensitivity: {helped} of its {len(plans)} one-unit plans measured here while "
                 "another worker computes the pass")
    return helped


def _pass_key(baseline: Baseline, engine: Backend, ranking: Judge, method: str, batches: int) -> str:
    return cache_key(baseline.info, engine, baseline.dataset.fingerprint(),
                     ranking.metric.describe(), method, batches)


def sensitivity(config: SearchConfig) -> tuple[Sensitivity, Path]:
    """Each unit lowered alone to each precision it may take: loss, and its share of FP32 latency.

    Writes ``sensitivity.json`` and ``sensitivity.png`` in ``out`` (the same files a search writes
    there, so a later search with the same settings reuses them).
    """
    from autoprec.results.plots import plot_sensitivity

    inputs, engine_spec, space_spec = config.inputs, config.engine, config.space
    model_path, data, shapes, default_out = resolve_model(inputs.model, inputs.data, inputs.shapes)
    out_dir = result_dir(config.out, default_out)
    wanted = wanted_metric(config.judge, inputs.model)
    engine = get_backend(engine_spec.backend, engine_spec.device, out_dir / "cache",
                         engine_spec.threads)
    if caveat := engine.info().caveat:
        log.warning(caveat)
    space, _, _ = engine_space(load_search_space(space_spec.search_space).with_overrides(list(space_spec.overrides)),
                               engine, space_spec.precisions)
    made = check_out_dir(out_dir)
    with removed_if_refused(made):
        baseline = load_baseline(model_path, space, data, shapes, config.study.seed, inputs.image,
                                 out_dir / "cache", inputs.constants,
                                 judge_shapes=not engine.one_shape_only)
        baseline = replace(baseline, info=repeats_decided(baseline.info, space_spec.tie_repeats))
        judge = judge_for(metric_for(wanted, baseline.info, baseline.dataset), baseline)[0]
    batches = screening_batches(len(baseline.dataset.evaluation))
    ranking = judge.for_ranking()
    measurer = InProcessMeasurer(
        engine, baseline.dataset.evaluation, judge, ranking,
        Lowering(baseline.info, baseline.ranges),
        baseline.dataset.workload,
    )
    found, _ = sensitivity_pass(
        baseline, engine, lambda plan: measurer.accuracy_loss(plan, batches, one_unit=True),
        batches, ranking, space_spec.calibration, out_dir / "sensitivity.json", config.progress,
    )
    engine.drop_kept_builds()  # no trial follows
    plot_sensitivity(found, model_path.name, out_dir / "sensitivity.png")
    return found, out_dir

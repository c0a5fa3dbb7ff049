"""The chosen plan as it ships: lowered onto the deployable graph (the source's dynamic dims kept)
and checked, by ONNX Runtime on the CPU, against the model that was measured (at opt) and against
the user's own file at every point of the shape profile (min, opt, max).

A deployable model that cannot be made (a unit whose nodes only the fixed-shape graph has) or that
computes other values than the measured one at opt is not shipped: best/ then holds the measured,
fixed-shape model, and the reason is said and recorded.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Sequence

import numpy as np
import onnxruntime

from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.data import Batch, Dataset
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.preparation import cpu_optimizers_left_off, cpu_session, given_session
from autoprec.analysis.shape_points import fitted
from autoprec.backends.base import Backend
from autoprec.core.errors import first_line
from autoprec.core.plan import Plan
from autoprec.core.profile import ShapeProfile
from autoprec.core.stored import StoredModel
from autoprec.lower import Int4Form, QDQForm, lower_plan
from autoprec.measure.accuracy import loss_from_metrics, output_metrics
from autoprec.measure.measurement import times_shipped
from autoprec.record.facts import Deployment, PointCheck, ProfileTiming

log = logging.getLogger("autoprec")

# The deployable model against the measured one at opt: the same graph and weights, so only kernel
# choice (ONNX Runtime picks others for dynamic dims) may move a value. Below this cosine loss, they
# are one model.
SAME_MODEL_LOSS = 1e-4
# evaluation batches the shipped model is checked on at each point of the profile
CHECKED_BATCHES = 4


Lower = Callable[[ModelInfo], StoredModel]  # a plan lowered onto one of the model's graphs


Runs = Sequence[tuple[str, Sequence[Batch]]]  # the checks' points, each with its batches


def deploy(info: ModelInfo, lower: Lower, tensorrt: Lower | None, samples: Sequence[Batch],
           others: Sequence[Batch] = (), judged: Runs = (), timed_as_shipped: bool = False) -> Deployment:
    """The chosen plan for best/ (see the module docstring): ``lower`` in the measured engine's
    form, ``tensorrt`` in TensorRT's (where that differs); checked on ``samples`` (evaluation
    batches, at opt) fitted to each point of the profile, and on ``others``, the data's items at
    other shapes, by shape; or, for a search that judged several shapes, on each of them
    (``judged``: each point's batches). ``timed_as_shipped``: the final timing timed the plan at
    the source's dims (:func:`autoprec.measure.measurement.times_shipped`), which a fixed
    best/ then does not hold."""
    profile, measured = info.shape_profile, lower(info)
    also = tensorrt or (lambda graph: None)
    # fixed shapes, or measured on the deployable graph already (at every point)
    if info.deployable is None:
        runs = judged or _runs(profile, samples, profile.points(), others)
        return Deployment(measured, also(info), None,
                          tuple(_checks(info, measured, profile, runs)))
    try:
        model = lower(info.for_deployment())
        differs = _differs(model, measured, samples[0])
    except Exception as exc:  # noqa: BLE001 - a lowering or a run the fixed graph allowed: said, and not shipped
        model, differs = None, (
            f"the plan does not lower onto it ({type(exc).__name__}: {first_line(exc)}; likely a "
            "weight the fixed-shape graph folded to a constant, which the graph at the source's "
            "dims computes from the input shapes)"
        )
    if differs:
        why = f"the model at the source's dims is not the measured one: {differs}"
        if timed_as_shipped and model is not None:
            why += ("; the stated speed-ups were timed on that model at the source's dims, not on "
                    "best/'s (autoprec check times best/)")
        runs = _runs(profile, samples, ["opt"], others)
        return Deployment(measured, also(info), why,
                          tuple(_checks(info, measured, profile, runs)))
    runs = _runs(profile, samples, profile.points(), others)
    return Deployment(model, also(info.for_deployment()), None,
                      tuple(_checks(info, model, profile, runs)))


def _runs(profile: ShapeProfile, samples: Sequence[Batch], points: Sequence[str],
          others: Sequence[Batch]) -> Runs:
    """``samples`` fitted to each point of the profile, then the data's items at other shapes (one
    run per shape)."""
    runs = [(point, [_at(sample, profile.at(point)) for sample in samples]) for point in points]
    by_shape: dict[tuple, list[Batch]] = {}
    for batch in others:
        by_shape.setdefault(tuple((k, v.shape) for k, v in batch.items()), []).append(batch)
    return runs + [("data", batches) for batches in by_shape.values()]


def session_outputs(session: onnxruntime.InferenceSession, feeds: Batch) -> dict[str, np.ndarray]:
    """Every output of ``session`` on ``feeds`` (inputs it does not take left out), by name."""
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def _loss(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> float:
    return loss_from_metrics({name: output_metrics(reference[name], candidate[name]) for name in reference}, "cosine")


def _differs(model: StoredModel, measured: StoredModel, sample: Batch) -> str | None:
    """None where ``model`` gives ``measured``'s outputs on ``sample`` in the same plain session,
    else how it does not (one whose session needs an optimizer left off that the measured one did
    not is not what was timed)."""
    with model.file() as path, measured.file() as timed:
        needs = (set(cpu_optimizers_left_off(model.proto, path))
                 - set(cpu_optimizers_left_off(measured.proto, timed)))
    if needs:
        return (f"an ONNX Runtime CPU session of it must leave {', '.join(sorted(needs))} off (its "
                "build crashes otherwise), the measured one's did not")
    want, got = session_outputs(cpu_session(measured), sample), session_outputs(cpu_session(model), sample)
    shapes = [name for name in want if got[name].shape != want[name].shape]
    if shapes:
        return f"output {shapes[0]} is {list(got[shapes[0]].shape)}, not {list(want[shapes[0]].shape)}"
    loss = _loss(want, got)
    return None if loss <= SAME_MODEL_LOSS else f"outputs differ at the measured shape (cosine loss {loss:.3g})"


def _checks(info: ModelInfo, model: StoredModel, profile: ShapeProfile, runs: Runs) -> list[PointCheck]:
    """``model`` against the given file at each run's point: the file is run as the user has it
    (from its path, external data beside it), everywhere first, so that its session is gone before
    the shipped model's is made (a 2 GB model's weights are not held twice)."""
    given = given_session(info.path, info.stored.weight_bytes())
    wanted = [_outputs_or_failure(given, batches) for _, batches in runs]
    del given
    shipped = cpu_session(model)
    return [_check(point, batches, want, shipped, profile) for (point, batches), want in zip(runs, wanted)]


def _outputs_or_failure(session, batches: Sequence[Batch]) -> list[dict[str, np.ndarray]] | str:
    """The session's outputs on ``batches``, or why it does not run them."""
    try:
        return [session_outputs(session, feeds) for feeds in batches]
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises several types for inputs a model cannot take
        return first_line(exc)


def _check(point: str, batches: Sequence[Batch], wanted: list[dict[str, np.ndarray]] | str, shipped,
           profile: ShapeProfile) -> PointCheck:
    shapes = {name: tuple(values.shape) for name, values in batches[0].items() if values.ndim}
    if isinstance(wanted, str):  # the user's own model does not run there: nothing to compare with
        return PointCheck(point, shapes, False, None, f"the given model itself does not run there ({wanted})",
                          len(batches))
    outputs = _outputs_or_failure(shipped, batches)
    if isinstance(outputs, str):  # the check says so
        return PointCheck(point, shapes, False, None, f"the shipped model does not run there ({outputs})",
                          len(batches))
    pairs = list(zip(wanted, outputs))
    outside = point == "data" and not _inside(shapes, profile)
    if not all(got[name].shape == want[name].shape for want, got in pairs for name in want):
        return PointCheck(point, shapes, False, None, None, len(batches), outside)
    stacked = [{name: np.concatenate([np.atleast_1d(pair[k][name]) for pair in pairs]) for name in pairs[0][0]} for k in (0, 1)]
    return PointCheck(point, shapes, True, max(0.0, _loss(*stacked)), None, len(batches), outside)


def _inside(shapes: Mapping[str, tuple[int, ...]], profile: ShapeProfile) -> bool:
    """Whether every input's shape lies within the profile's min and max (what an engine built for
    it takes)."""
    ranges = {i.name: i for i in profile.inputs}
    return all(name not in ranges or (len(dims) == len(ranges[name].min) and all(
        lo <= d <= hi for d, lo, hi in zip(dims, ranges[name].min, ranges[name].max))) for name, dims in shapes.items())


def time_across(backend: Backend, info: ModelInfo, plans: Mapping[int, Plan],
                feasible: Sequence[int],
                ranges: ActivationRanges | None, sample: Batch) -> ProfileTiming:
    """Each plan as deployed (on the deployable graph), timed on ``backend`` at every point of the
    profile."""
    profile, graph = info.shape_profile, info.for_deployment()
    ms: dict[int, dict[str, float | None]] = {}
    failed: dict[int, str] = {}
    for trial, plan in plans.items():
        try:
            with backend.runner(backend.lower(graph, plan, ranges)) as runner:
                ms[trial] = {point: _timed(runner, _at(sample, profile.at(point))) for point in ("min", "opt", "max")}
        except Exception as exc:  # noqa: BLE001 - a plan the deployable graph does not take: no figures, said
            ms[trial] = {point: None for point in ("min", "opt", "max")}
            failed[trial] = first_line(exc)
    return ProfileTiming(ms, tuple(t for t in feasible if None not in ms[t].values()), failed)


def _timed(runner, batch: Batch) -> float | None:
    """A point's median, or None where the plan does not run at that shape (a Conv whose kernel
    outgrows it)."""
    try:
        runner.run(batch)  # its first run at this shape (allocations) stays out of the timing
        return runner.time(batch).median_ms
    except Exception:  # noqa: BLE001 - ONNX Runtime raises several types for a shape a model cannot take
        return None


def _at(sample: Batch, shapes: Mapping[str, tuple[int, ...]]) -> Batch:
    return {name: fitted(values, shapes[name]) if name in shapes else values for name, values in sample.items()}


def deploy_plan(
    info: ModelInfo, engine: Backend, plan: Plan, ranges: ActivationRanges | None, dataset: Dataset
) -> Deployment:
    """The chosen plan as best/ ships it (the source's dims kept where it can be), checked across
    the profile."""
    tensorrt = None
    counts = plan.counts()
    if (engine.qdq_form is not QDQForm.TENSORRT and counts["int8"]) or (
            engine.int4_form is not Int4Form.DEQUANTIZE and counts.get("int4")):
        tensorrt = lambda graph: lower_plan(graph, plan, ranges, QDQForm.TENSORRT)  # noqa: E731
    return deploy(info, lambda graph: engine.lower(graph, plan, ranges), tensorrt,
                  dataset.main_evaluation[:CHECKED_BATCHES], dataset.other_shapes,
                  judged_runs(dataset), timed_as_shipped=times_shipped(engine))


def judged_runs(dataset: Dataset) -> Runs:
    """The first CHECKED_BATCHES evaluation batches of each shape the search judged (none where it
    judged one)."""
    return [(point.name,
             [b for b, at in zip(dataset.evaluation, dataset.evaluation_at) if at == i][:CHECKED_BATCHES])
            for i, point in enumerate(dataset.points)]


def widened_runs(profile: ShapeProfile, samples: Sequence[Batch], judged: Runs) -> Runs:
    """The profile's min and max where an export widened them past every point the search judged
    (``--batch``, ``--max-shape``: a dim below the least or above the most the points had):
    ``samples`` fitted to them, so a widened export is checked at its new ends as a single-shape
    result's is."""
    seen = [{k: np.shape(v) for k, v in batches[0].items()} for _, batches in judged if batches]

    def judged_sizes(name: str, axis: int) -> list[int]:
        return [shape[name][axis] for shape in seen if name in shape and axis < len(shape[name])]

    ends = (("min", lambda size, sizes: size < min(sizes)), ("max", lambda size, sizes: size > max(sizes)))
    wider = [point for point, past in ends
             if any(past(size, sizes) for name, dims in profile.at(point).items() for axis, size in enumerate(dims)
                    if (sizes := judged_sizes(name, axis)))]
    return [(f"{point} (widened)", batches) for point, batches in _runs(profile, samples, wider, ())]


def time_front_across(info: ModelInfo, engine: Backend, front: Mapping[int, Plan],
                      feasible: Sequence[int],
                      ranges: ActivationRanges | None, sample: Batch) -> ProfileTiming:
    """``--time-shapes``: the front's plans (by trial) timed as deployed at min, opt and max."""
    log.info(f"timing the {len(front)} plan(s) of the front at the profile's min, opt and max "
             "shapes, as deployed")
    timing = time_across(engine, info, front, feasible, ranges, sample)
    for trial, why in timing.failed.items():
        log.warning(f"--time-shapes: trial {trial} could not be built as deployed ({why})")
    if timing.feasible:
        log.info(
            "fastest at "
            + ", ".join(f"{p}: trial {timing.fastest(p, timing.feasible)}" for p in ("min", "opt", "max"))
            + f"; across the range, deploy trial {timing.across_range()} (the least slowdown at "
              f"its worst shape; "
            "timed one plan after another, so a few percent apart is noise)"
        )
    return timing

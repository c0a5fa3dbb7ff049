"""Where a result was judged and ships across shapes, in lines: the judged shapes and the chosen
plan at each, the plans left out for a shape other than the data's, best/ timed as deployed and
checked against the given model at the profile's points (show, report and export say these)."""

from __future__ import annotations

from typing import Mapping, Sequence

from autoprec.backends.int8_sums import EXACT, SAID
from autoprec.core.profile import POINTS, ShapeProfile, dims_text
from autoprec.record.facts import PointCheck, ProfileTiming
from autoprec.results.console import loss_text, ms_text
from autoprec.results.files import ResultFiles


def shape_lines(result: ResultFiles) -> list[str]:
    """Where a search judged several shapes: which, the chosen plan's loss and latency at each, and
    the faster plans left out for a shape other than the data's own (right at the data's shape,
    wrong at another)."""
    points, chosen = result.facts.judged_shapes, result.shown_chosen()
    if not points:
        return []
    runs = " · ".join(f"{p.name} ×{p.runs}" for p in points if p.runs)
    lines = [f"judged at {len(points)} shapes, every plan's loss its worst there: "
             + "; ".join(f"{p.name} ({p.said})" for p in points),
             f"        a latency is one request: {runs}"]
    if chosen is not None and chosen.measurement.by_shape:
        lines.append("        the chosen plan: " + " · ".join(
            f"{point} loss {loss_text(figures['loss'])}" + (f", {figures['latency_ms']:.3f} ms" if "latency_ms" in figures
                                                        else "")
            for point, figures in chosen.measurement.by_shape.items() if "loss" in figures))
    lines += [f"        ⚠ {line}" for line in _wrong_elsewhere(result)]
    return lines


def _wrong_elsewhere(result: ResultFiles) -> list[str]:
    """Plans faster than the chosen one, within --max-loss at the data's own shape but past it at
    another: not shipped, each line saying where."""
    max_loss, chosen = result.facts.max_loss, result.shown_chosen()
    if max_loss is None or chosen is None:
        return []
    lines = []
    for trial in sorted(result.trials.trials, key=lambda t: t.latency_ms):
        losses = trial.losses_by_shape()
        if trial.latency_ms >= chosen.latency_ms or trial.loss <= max_loss or losses.get("opt", max_loss) > max_loss:
            continue
        past = {point: loss for point, loss in losses.items() if loss > max_loss}
        lines.append(f"trial {trial.number} ({trial.mix}, {trial.latency_ms:.3f} ms) holds "
                     f"--max-loss {max_loss:g} "
                     f"at the data's own shape but not at " + ", ".join(f"{p} ({loss_text(v)})" for p, v in past.items())
                     + ": not shipped")
        if len(lines) == 3:
            break
    return lines


def _dims(dims: list) -> str:
    return dims_text(dims) or "scalar"


def deployment_lines(result: ResultFiles) -> list[str]:
    """What best/model.onnx is across the shapes it is deployed at: the source's dims kept (or why
    not), the profile, and how close it came to the given model at each of its points."""
    shipped = result.shipped_as
    if shipped is None:
        return []
    lines = _timed_as_deployed(result.facts.profile_timing)
    profile = result.profile
    if shipped.fixed_because:
        lines.append("⚠ best/model.onnx has the measured, fixed input shapes "
                     f"({shipped.fixed_because})")
    elif profile.dynamic:
        lines.append(f"best/model.onnx keeps the source's input dims: {profile.said()}")
    return lines + _checked_against_source(shipped.checks) + _int8_sums_said(result)


def _int8_sums_said(result: ResultFiles) -> list[str]:
    """Where INT8 losses were judged on ONNX Runtime's CPU provider: how that CPU sums INT8 products, which the
    losses hold for (see :mod:`autoprec.backends.int8_sums`)."""
    sums = result.engine.versions.get("int8_sums")
    if sums is None or not result.plan or not result.plan.trial.plan.counts()["int8"]:
        return []
    if sums == EXACT:
        return [f"⚠ best/model.onnx's INT8 losses were judged on a CPU that {SAID[sums]}; an x86 CPU without VNNI "
                "sums pairs in int16, which saturate: judge it there (autoprec check) before deploying to one"]
    return [f"best/model.onnx's INT8 losses were judged on a CPU that {SAID.get(sums, sums)}; a CPU with VNNI, AMX or "
            "Arm's dot products sums them exactly"]


def export_profile_lines(profile: ShapeProfile, checks: Sequence[PointCheck], result_dir: str,
                         widened: bool) -> list[str]:
    """Where an export is written: the deployment profile it is for (an engine built from it takes
    those shapes only), the plan's checks against the given model there, and how to widen it where a
    dim is held to one size."""
    if not profile.dynamic:
        return [f"the export takes the measured, {profile.said()} (the model declares no dynamic "
                "dim)"]
    lines = [f"deployment profile{' (widened)' if widened else ''}: {profile.said()}; an engine "
             "built from this export takes these shapes only", *_checked_against_source(checks)]
    held = [i for i in profile.inputs if any(i.min[a] == i.max[a] for a in i.dynamic_axes)]
    if held:
        batch = profile.batch_range()
        example = (f"--batch 1:{max(batch[1], 8)}" if batch and batch[0] == batch[1]
                   else f"--max-shape {held[0].name}={dims_text(held[0].max)}")
        lines.append("        a dynamic dim is held to one size here; to deploy at others, export "
                     "again with --batch LOW:HIGH or --min-shape/--max-shape (e.g. autoprec "
                     f"export {result_dir} … {example}): no new search, the plan is checked "
                     "against the given model at the new min and max")
    return lines


def _timed_as_deployed(timing: ProfileTiming | None) -> list[str]:
    """--time-shapes: each front plan at min, opt and max, and the one to deploy across the
    range."""
    if timing is None:
        return []
    lines = ["        timed as deployed (--time-shapes, one plan after another): " + "; ".join(
        f"trial {trial} " + " · ".join(f"{p} {_ms(ms[p])}" for p in ("min", "opt", "max"))
        for trial, ms in timing.ms.items())]
    if (across := timing.across_range()) is not None:
        fastest = " / ".join(str(timing.fastest(p, timing.feasible)) for p in ("min", "opt", "max"))
        lines.append(f"        fastest at min / opt / max: trial {fastest}; to deploy across the "
                     f"range: trial {across} (least slowdown at its worst shape)")
    return lines


def _checked_against_source(checks: Sequence[PointCheck]) -> list[str]:
    """The shipped model against the given one at each point of the profile and at the data's own
    shapes."""
    lines = []
    # at the shapes the search judged every plan at
    judged = any(c.point not in (*POINTS, "data") for c in checks)
    if points := [c for c in checks if c.point != "data"]:
        how = "the data at each shape judged" if judged else "the evaluation data fitted to each shape"
        lines.append(
            f"        against the given model (ONNX Runtime CPU, {how}): "
            + ", ".join(f"{c.point} {_verdict(c)}" for c in points)
        )
    for check in (c for c in checks if c.point == "data"):
        beyond = " (outside the shape profile: an engine built for it refuses this shape)" if check.outside_profile else ""
        lines.append(f"        the data's {check.items} item(s) at {_at(check.shapes)}{beyond}: "
                     f"{_verdict(check)}")
    at_opt = next((c.loss for c in checks if c.point == "opt" and c.loss is not None), None)
    for check in checks:
        if check.error or not check.same_shapes:
            what = check.error or "its outputs have other shapes than the given model's"
            lines.append(f"        ⚠ at {check.point} ({_at(check.shapes)}): {what}")
        elif not judged and at_opt is not None and check.loss > max(FARTHER * at_opt, LOSS_FLOOR):
            lines.append(
                f"        ⚠ at {check.point} ({_at(check.shapes)}) the plan strays further from "
                f"the given model (cosine loss {loss_text(check.loss)}) than at opt ({loss_text(at_opt)}), "
                "where it was searched: it may not hold there; search at that shape (--shape) or "
                "with data of it"
            )
    return lines


# A point of the profile is said to stray where its loss is this many times opt's, and above this
# floor (below it, a loss is rounding in any metric a plan is chosen by).
FARTHER, LOSS_FLOOR = 3.0, 1e-3


def _at(shapes: Mapping[str, Sequence[int]]) -> str:
    return ", ".join(f"{k} {_dims(v)}" for k, v in shapes.items())


def _ms(value: float | None) -> str:
    return "did not run" if value is None else f"{ms_text(value)} ms"


def _verdict(check: PointCheck) -> str:
    return f"cosine loss {loss_text(check.loss)}" if check.loss is not None else "FAILED"

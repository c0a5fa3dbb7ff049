"""The shapes a deployment runs, judged by every trial: a plan right at its data's one shape and
wrong at another is a false result.

A model with dynamic dims is judged at several *points*, each a set of batches of one shape:

- a decoder with a KV cache (:mod:`autoprec.analysis.decoder`): the data as given (``opt``); its tokens as a prompt with no
  past (prefill; data of one token after a past, a prompt as long as that context, generated from its token), and its
  first token alone (a prompt of one, a past of 0); one token after the prompt (decode, a
  past of the prompt's length) and after :data:`LONG_PAST` more tokens, the pasts made by the FP32 model
  generating greedily from the data's own tokens, as generation makes them;
- any other dynamic model: the data as given (``opt``), the profile's min and max (``--min-shape``/``--max-shape``; where
  none is given, a min derived: batch 1, a sequence of 1, a past of 0, where the model runs there), the data fitted
  to them, and the data's items at other shapes.

Every point's batches calibrate INT8 and judge each plan, whose loss is its worst over the points;
the latency is the weighted mix of one deployment request (:class:`autoprec.analysis.data.Workload`:
a decoder's prompt once and :data:`GENERATED_TOKENS` decode steps; one run of each other point). One
model runs at every point: the measured graph is the deployable one (the source's dims), and the
profile every export carries spans the points.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Mapping, Sequence

import numpy as np

from autoprec.analysis import decoder as decoders
from autoprec.analysis.data import Batch, Dataset
from autoprec.analysis.decoder import Decoder, find_decoder
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.preparation import cpu_runs
from autoprec.analysis.shapes import declared_inputs, output_specs
from autoprec.core.errors import AutoprecError, first_line
from autoprec.core.profile import InputRange, ShapeProfile
from autoprec.core.stored import StoredModel
from autoprec.record.facts import ShapePoint

log = logging.getLogger("autoprec")

GENERATED_TOKENS = 16  # one request of a decoder: its prompt, then this many tokens generated
LONG_PAST = 40  # decode is judged one token after the prompt and this many tokens later
STACKED_ROWS = 16  # data rows run together while the FP32 model makes their pasts
PROMPT_TOKENS = 64  # the longest prompt made for decode steps alone (--max-shape widens the profile)
# Words in a dynamic dim's name that say it counts tokens or steps (min 1) or the cache's length
# (min 0).
SEQUENCE_WORDS = ("seq", "length", "token", "time", "len", "step")
PAST_WORDS = ("past", "cache")

Run = Callable[[Batch], Mapping[str, np.ndarray]]
# each point with its calibration and evaluation batches
Points = list[tuple[ShapePoint, list[Batch], list[Batch]]]


def judged_shapes(info: ModelInfo, dataset: Dataset, runs: Mapping[str, int] | None = None,
                  bounds_given: bool = False) -> tuple[ModelInfo, Dataset]:
    """The model and data as the search judges them: unchanged for a model of fixed shapes; else
    measured on the deployable graph at every point (see the module docstring). ``runs``: a point's
    (or a phase's: ``decode``) runs per request, over the defaults; ``bounds_given``:
    --min-shape/--max-shape were given (no min derived)."""
    if info.deployable is None:
        return _one_shape(info, dataset, runs)
    deployable = StoredModel(info.deployable, info.folder)
    run = cpu_runs(deployable)
    decoder = find_decoder(declared_inputs(info.deployable), output_specs(info.deployable))
    points = _decoder_points_or_none(decoder, dataset, run, info.shape_profile) if decoder is not None else None
    points = points or _profile_points(info, dataset, run, bounds_given)
    if len(points) == 1:
        return _one_shape(info, dataset, runs)
    points = _weighted(points, runs or {})
    profile = _spanning(info.shape_profile, [p for p, _, _ in points])
    for point, _, _ in points[1:]:
        log.info(f"judged at {point.name}: {point.said}" + ("" if point.runs else " (judged, not "
                                                                                  "timed)"))
    measured = replace(info.as_shipped(), profile=profile)
    return measured, _interleaved(dataset, points)


def _long_past(decoder: Decoder, profile: ShapeProfile) -> int | None:
    """The past the profile's max gives the cache (--max-shape, --dim), where it was widened past
    the data's."""
    pair = decoder.cache[0]
    ranges = {i.name: i for i in profile.inputs}
    if pair.past not in ranges:
        return None
    high, opt = ranges[pair.past].max[pair.axis], ranges[pair.past].opt[pair.axis]
    return high if high > opt else None


def _decoder_points_or_none(decoder: Decoder, dataset: Dataset, run: Run, profile: ShapeProfile) -> Points | None:
    """:func:`_decoder_points`, or None (said) where the FP32 model does not run in a phase: it is
    judged as any other dynamic model then."""
    try:
        return _decoder_points(decoder, dataset, run, _long_past(decoder, profile))
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises several types for feeds a model cannot take
        log.warning(f"{decoder.describe()}: the given model does not run as one in prefill or "
                    f"decode ({first_line(exc, 200)}); judged as a model with dynamic dims instead")
        return None


def _decoder_points(decoder: Decoder, dataset: Dataset, run: Run, long_past: int | None) -> Points:
    """The data as given, prefill, a first token alone, decode after the prompt and at a long past:
    the profile's max where it gives one, else LONG_PAST tokens after the prompt."""
    log.info(f"{decoder.describe()}: judged at prefill and decode, pasts made by the FP32 model "
             "from the data's own tokens")
    phased = {"calibration": _all_phases(decoder, dataset.calibration, run, long_past),
              "evaluation": _all_phases(decoder, dataset.evaluation, run, long_past)}
    first = phased["evaluation"][0]
    points = []
    for name in first:
        batch = first[name]
        shapes = {k: tuple(np.shape(v)) for k, v in batch.items()}
        point = ShapePoint(name, _phase_said(decoder, name, batch), shapes, 0)
        points.append((point, [p[name] for p in phased["calibration"]],
                       [p[name] for p in phased["evaluation"]]))
    return points + _data_points(dataset, lambda batch: _phase_said(decoder, "data", batch))


def _all_phases(decoder: Decoder, batches: Sequence[Batch], run: Run,
                long_past: int | None) -> list[dict[str, Batch]]:
    """:func:`_phases` of each batch, those of one shape made together: their rows stacked into runs
    of up to STACKED_ROWS (one FP32 run a step for them all: 16 items of a 1024-wide decoder took
    28 s one at a time, 4 s stacked), then split back into the batches as given."""
    groups: dict[tuple, list[int]] = {}
    for i, batch in enumerate(batches):
        key = tuple((name, np.shape(v)[1:] if decoders.has_rows(decoder, name, v) else np.asarray(v).tobytes())
                    for name, v in sorted(batch.items()))
        groups.setdefault(key, []).append(i)
    found: list[dict[str, Batch]] = [{} for _ in batches]
    for members in groups.values():
        while members:
            rows = np.cumsum([len(batches[i][decoder.tokens]) for i in members])
            taken = members[:max(1, int(np.searchsorted(rows, STACKED_ROWS, side="right")))]
            members = members[len(taken):]
            phases = _phases(decoder, decoders.stacked(decoder, [batches[i] for i in taken]), run, long_past)
            start = 0
            for i in taken:
                end = start + len(batches[i][decoder.tokens])
                found[i] = {point: {name: v[start:end] if decoders.has_rows(decoder, name, v) else v
                                    for name, v in fed.items()}
                            for point, fed in phases.items()}
                start = end
    return found


def _phases(decoder: Decoder, batch: Batch, run: Run, long_past: int | None) -> dict[str, Batch]:
    """One data batch in each phase (see :func:`_decoder_points`), by point name."""
    tokens = np.asarray(batch[decoder.tokens])
    if tokens.shape[1] == 1 and decoder.past_length(batch) > 0:
        tokens = _prompt(decoder, batch, tokens, run)
    prefill = decoders.prefill(decoder, batch, tokens)
    found = {"opt": batch, "prefill": prefill}
    if tokens.shape[1] > 1:
        found["first token"] = decoders.prefill(decoder, batch, tokens[:, :1])
    steps = max(1, (long_past or tokens.shape[1] + LONG_PAST) - tokens.shape[1])
    fed, outputs = prefill, run(prefill)
    for step in range(steps + 1):
        fed = decoders.next_run(decoder, fed, outputs, decoders.greedy(outputs[decoder.logits]))
        if step in (0, steps):
            found[f"decode·{decoder.past_length(fed)}"] = fed
        if step < steps:
            outputs = run(fed)
    return found


def _prompt(decoder: Decoder, batch: Batch, first: np.ndarray, run: Run) -> np.ndarray:
    """Data of one token after a past (decode steps alone) holds no prompt, and a prefill of its one
    token is no prompt a deployment runs (a plan shipped so was 6 % over the limit on 7-token
    prompts): one as long as its context, past and token (at most PROMPT_TOKENS: each is an FP32 run
    here), its token followed by what the FP32 model generates greedily from it."""
    steps = min(decoder.past_length(batch), PROMPT_TOKENS - 1)
    generated = decoders.generate(run, decoder, decoders.prefill(decoder, batch, first), steps)
    return np.concatenate([first, generated.tokens], axis=1)


def _phase_said(decoder: Decoder, name: str, batch: Batch) -> str:
    tokens, past = np.shape(batch[decoder.tokens]), decoder.past_length(batch)
    phase = {"opt": "the data as given", "prefill": "prefill", "first token": "prefill of one "
                                                                              "token",
             "data": "the data's items"}.get(name, "decode")
    return f"{phase}: batch {tokens[0]}, {tokens[1]} token(s) after a past of {past}"


def _profile_points(info: ModelInfo, dataset: Dataset, run: Run, bounds_given: bool) -> Points:
    """The data as given, the profile's min and max (min derived where no bound was given), the
    data's items at other shapes: each fitted from the data's batches, kept where the FP32 model
    runs there."""
    profile = info.shape_profile
    given = ShapePoint("opt", "the data as given", profile.at("opt"))
    points: Points = [(given, list(dataset.calibration), list(dataset.evaluation))]
    ends = {"min": profile.at("min"), "max": profile.at("max")}
    if not bounds_given:
        ends["min"] = _derived_min(profile)
    for name, shapes in ends.items():
        if shapes == profile.at("opt") or any(shapes == p.shapes for p, _, _ in points):
            continue
        fitted = ([_fitted(b, shapes) for b in dataset.calibration],
                  [_fitted(b, shapes) for b in dataset.evaluation])
        why = _fails(run, fitted[1][0])
        if why is None:
            said = "; ".join(f"{k} {'x'.join(map(str, v))}" for k, v in shapes.items() if v != profile.at("opt")[k])
            points.append((ShapePoint(name, f"the profile's {name}: {said}", shapes), *fitted))
        elif bounds_given:
            raise AutoprecError(f"--{name}-shape: the given model does not run at {shapes} "
                                f"({why}); give a shape it takes")
        else:
            log.info(f"no {name} shape judged: the given model does not run at {shapes} ({why})")
    return points + _data_points(dataset)


def _derived_min(profile: ShapeProfile) -> dict[str, tuple[int, ...]]:
    """The profile's min where none was given: a dynamic batch of 1, a dynamic sequence (a dim named
    for tokens, steps or length) of 1, a past (a dim named for a cache) of 0; every other dim (a sum
    of dims among them) as measured."""
    return {i.name: tuple(_least(d, size, axis) for axis, (d, size) in enumerate(zip(i.declared, i.opt)))
            for i in profile.inputs}


def _least(dim: int | str | None, size: int, axis: int) -> int:
    name = (dim or "").lower() if not isinstance(dim, int) else None
    if name is None or "+" in name:
        return size
    if any(word in name for word in PAST_WORDS):
        return 0
    if axis == 0 or "batch" in name or any(word in name for word in SEQUENCE_WORDS):
        return min(size, 1)
    return size


def _data_points(dataset: Dataset, said_of: Callable[[Batch], str] | None = None) -> Points:
    """The data's items at other shapes, one point per shape (each item a batch of one), each said
    by ``said_of`` (a decoder's phase) or by its shapes."""
    by_shape: dict[tuple, list[Batch]] = {}
    for batch in dataset.other_shapes:
        by_shape.setdefault(tuple((k, np.shape(v)) for k, v in batch.items()), []).append(batch)
    points: Points = []
    for key, batches in by_shape.items():
        shapes = {k: tuple(v) for k, v in key}
        said = said_of(batches[0]) if said_of else "the data's items at " + "; ".join(
            f"{k} {'x'.join(map(str, v))}" for k, v in shapes.items() if v)
        # as the data's own batches: half calibrate, the rest judge; one does both
        half = len(batches) // 2
        calibration, evaluation = (batches[:half], batches[half:]) if half else (batches, batches)
        points.append((ShapePoint(f"data·{len(points) + 1}", said, shapes), calibration,
                       evaluation))
    return points


def fitted(values: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``values`` cut to their middle or repeated (wrapping round) along each axis to ``shape``:
    data of the right kind at another size (an image's centre, an image tiled wider, a token
    sequence repeated, a batch of the same items, a past of none; from none, zeros)."""
    for axis, size in enumerate(shape):
        if values.shape[axis] == 0 and size:
            values = np.zeros((*values.shape[:axis], size, *values.shape[axis + 1:]), values.dtype)
        have = max(values.shape[axis], 1)
        if have != size:
            start = (have - size) // 2 if size < have else 0
            values = np.take(values, (start + np.arange(size)) % have, axis=axis)
    return values


def _fitted(batch: Batch, shapes: Mapping[str, tuple[int, ...]]) -> Batch:
    return {name: fitted(values, shapes[name]) if name in shapes else values for name, values in batch.items()}


def _fails(run: Run, batch: Batch) -> str | None:
    """Why the FP32 model cannot be judged on ``batch`` (it does not run, or gives NaN/Inf), or
    None."""
    try:
        outputs = run(batch)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises several types for a shape a model cannot take
        return first_line(exc, 200)
    bad = [k for k, v in outputs.items() if np.asarray(v).dtype.kind == "f" and not np.isfinite(v).all()]
    return f"output {bad[0]} is NaN or Inf there" if bad else None


def _one_shape(info: ModelInfo, dataset: Dataset, runs: Mapping[str, int] | None) -> tuple[ModelInfo, Dataset]:
    """A model judged at its data's shape alone: nothing for --shape-weights to weigh (it was taken
    without a word, a name no point has among them)."""
    if runs:
        raise AutoprecError(f"--shape-weights {next(iter(runs))}: this model is judged at its data's one shape "
                            "(its dims fixed, or no other shape it runs at): there is nothing to weigh; leave the "
                            "option out")
    return info, dataset


def _weighted(points: Points, runs: Mapping[str, int]) -> Points:
    """Each point's runs per request: ``runs`` by name or phase (``decode``: shared by the decode
    points), else a decoder's prompt once and GENERATED_TOKENS decode steps shared by its decode
    points; one of any other point."""
    names = [p.name for p, _, _ in points]
    unknown = sorted(set(runs) - set(names) - {n.split("·")[0] for n in names})
    if unknown:
        raise AutoprecError(f"--shape-weights {unknown[0]}: no such point; the points are "
                            f"{', '.join(names)} (a phase, such as decode, weighs all its points)")
    decoding = [n for n in names if n.startswith("decode·")]
    defaults = ({"prefill": 1, "decode": GENERATED_TOKENS} if decoding else dict.fromkeys(names, 1))
    weighted = []
    for point, calibration, evaluation in points:
        phase = point.name.split("·")[0]
        if point.name in runs:
            count = runs[point.name]
        else:
            total = runs.get(phase, defaults.get(point.name, defaults.get(phase, 0)))
            share = [n for n in names if n.split("·")[0] == phase] if phase != point.name else [point.name]
            count = -(-total // len(share)) if total else 0
        weighted.append((replace(point, runs=int(count)), calibration, evaluation))
    if not any(p.runs for p, _, _ in weighted):
        raise AutoprecError("--shape-weights: every point weighs 0; give one a weight to time")
    return weighted


def _spanning(profile: ShapeProfile, points: Sequence[ShapePoint]) -> ShapeProfile:
    """``profile`` widened to hold every judged point: what the exports carry is what was judged."""
    ranges = []
    for i in profile.inputs:
        shapes = [p.shapes[i.name] for p in points if i.name in p.shapes and len(p.shapes[i.name]) == len(i.opt)]
        low = tuple(min([d, *(s[a] for s in shapes)]) for a, d in enumerate(i.min))
        high = tuple(max([d, *(s[a] for s in shapes)]) for a, d in enumerate(i.max))
        ranges.append(InputRange(i.name, i.declared, low, i.opt, high))
    return ShapeProfile(tuple(ranges))


def _interleaved(dataset: Dataset, points: Points) -> Dataset:
    """The dataset with every point's batches, interleaved point by point (a leading run of them
    holds each point), each batch's point recorded; labels stay with the data's own batches."""
    evaluation, evaluation_at = _mixed([e for _, _, e in points])
    calibration, calibration_at = _mixed([c for _, c, _ in points])
    labels = None
    if dataset.labels:
        own = iter(dataset.labels)
        labels = tuple(next(own) if at == 0 else {} for at in evaluation_at)
    calibration_labels = None
    if dataset.calibration_labels:
        own = iter(dataset.calibration_labels)
        calibration_labels = tuple(next(own) if at == 0 else {} for at in calibration_at)
    said = ", ".join(p.name for p, _, _ in points)
    return replace(dataset, calibration=tuple(calibration), evaluation=tuple(evaluation),
                   labels=labels,
                   calibration_labels=calibration_labels, points=tuple(p for p, _, _ in points),
                   evaluation_at=tuple(evaluation_at), calibration_at=tuple(calibration_at),
                   source=f"{dataset.source}; judged at {len(points)} shapes ({said})")


def _mixed(per_point: Sequence[Sequence[Batch]]) -> tuple[list[Batch], list[int]]:
    batches, at = [], []
    for i in range(max(len(b) for b in per_point)):
        for point, own in enumerate(per_point):
            if i < len(own):
                batches.append(own[i])
                at.append(point)
    return batches, at


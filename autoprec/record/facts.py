"""What a search did and what it ships, as its result records it: the model it was given, the facts
a reader is shown (how it was asked, the shapes it judged, where its wall clock went, how far the
machine drifted), the sensitivity pass, how best/ ships the chosen plan (its checks against the
given model at each shape, the timing across the profile), its units, and a diagnosis's rows. Views
(terminal, report, plots, compare, the build card) take these values, never the JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from autoprec.core.fields import Fields
from autoprec.core.profile import POINTS, ShapeProfile
from autoprec.core.stored import StoredModel
from autoprec.record.trial import TrialRecord
from autoprec.record.verdict import HELD_OUT_ADVICE, HeldOut

DRIFT_WORTH_SAYING = 10.0  # percent


@dataclass(frozen=True)
class Drift:
    """How far the re-timed plans' trial latencies lie from their re-timing. A host that drifts
    between the two (a busy neighbour; on a shared GPU host, launch-bound latencies that shift by a
    third for seconds at a time) moves absolute figures; interleaved rounds see it alike, so the
    choice holds."""

    plans: int
    largest_percent: float
    outside_trial_spread: int

    @classmethod
    def of(cls, trials: Sequence[TrialRecord]) -> Drift | None:
        # latency_ms: re-timed
        pairs = [(t.measurement.latency, t.latency_ms) for t in trials if t.retimed_ms]
        if not pairs:
            return None
        return cls(len(pairs),
                   100 * max(abs(trial.median_ms / final - 1) for trial, final in pairs),
                   sum(not trial.p10_ms <= final <= trial.p90_ms for trial, final in pairs))

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Drift | None:
        return cls(data["plans"], float(data["largest_percent"]), data["outside_trial_spread"]) if data else None

    def to_json(self) -> dict[str, Any]:
        return {"plans": self.plans, "largest_percent": self.largest_percent,
                "outside_trial_spread": self.outside_trial_spread}

    def said(self) -> str | None:
        """A sentence when latencies moved beyond the trials' own spread: absolute figures are then
        good to that much, ratios of interleaved rounds are not hit."""
        if not self.outside_trial_spread or self.largest_percent < DRIFT_WORTH_SAYING:
            return None
        return (
            f"latencies on this machine drifted up to {self.largest_percent:.0f} % between the "
            f"trials and the re-timing ({self.outside_trial_spread} of {self.plans} plans beyond "
            "their trial's p10–p90): absolute figures are good to about that much; the speed-up "
            "comes from interleaved rounds, which drift hits alike"
        )


STAGE_NAMES = {"set_up": "set-up", "trials": "trials", "sensitivity": "sensitivity pass",
               "retiming": "re-timing",
               "held_out_and_final_timing": "held-out judging and final timing",
               "deployment": "deployment checks",
               "profile_timing": "timing across the shape profile"}


@dataclass(frozen=True)
class SearchFacts:
    """pareto.json's ``search`` (the same in trials.json and best/plan.json): how the search was
    asked and what it did, as a reader is shown it, checked field by field when read. ``recorded``
    is the section as the search wrote it (an older result's: as it was), which is what
    :meth:`to_json` gives back."""

    metric: str
    max_loss: float | None
    budget: int
    trials: int
    rejected: int
    sampler: str
    seed: int
    calibration: str
    study: str
    storage: str
    data: str
    batches: tuple[int, int]  # calibration, evaluation
    random_data: bool
    wall_seconds: float
    fp32_on_labels: dict[str, dict[str, float]] = field(default_factory=dict)
    metric_notes: tuple[str, ...] = ()
    decision_changes: tuple[str, ...] = ()
    drift: Drift | None = None
    profile_timing: ProfileTiming | None = None  # --time-shapes
    given_model: str | None = None  # the model as the user named it (zoo:NAME, a path)
    # the plans judged on the calibration batches, the shipped one among them
    held_out: HeldOut | None = None
    # what --max-loss allows where the metric counts decisions (Judge.limit_said)
    limit_in_decisions: str | None = None
    profile: ShapeProfile | None = None  # None: an older result, measured at one shape
    run: str | None = None  # which run wrote the file (None: an older result)
    # where the wall clock went ({}: an older result)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # The shapes every trial was judged at (autoprec.analysis.shape_points); () at the data's one
    # shape, None: an older result, which judged at one shape
    judged_shapes: tuple[ShapePoint, ...] | None = None
    recorded: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, f: Fields) -> SearchFacts:
        search = f.as_object()
        _check_recorded(f)
        batches, timing, drift, held, spec = f["batches"], f.get("profile_timing"), f.get("timing_drift"), \
            f.get("held_out"), f.get("spec")
        return cls(
            f["metric"].text(), _max_loss(f["max_loss"]), f["budget"].integer(),
            f["trials"].integer(),
            len(f["rejected"].items()) if "rejected" in search else 0, f["sampler"].text(),
            f["seed"].integer(),
            f["calibration"].text(), f["study_name"].text(), f["storage"].text(), f["data"].text(),
            (batches["calibration"].integer(), batches["evaluation"].integer()),
            f["random_data"].flag(),
            _wall(f["wall_seconds"]), _metrics(f.get("fp32_on_labels")),
            tuple(f["metric_notes"].texts()) if "metric_notes" in search else (),
            tuple(f["decision_changes"].texts()) if "decision_changes" in search else (),
            _drift(drift.nullable()) if drift else None,
            _profile_timing(timing) if timing else None,
            _spec_model(spec) if spec else None, _held_out(held) if held else None,
            f["limit_in_decisions"].text_or_none() if "limit_in_decisions" in search else None,
            _profile(f["profile"]) if search.get("profile") else None,
            f["run"].text() if "run" in search else None,
            _stages(f["stage_seconds"]) if "stage_seconds" in search else {},
            _judged_shapes(f["judged_shapes"]) if "judged_shapes" in search else None,
            search,
        )

    def to_json(self) -> dict[str, Any]:
        return self.recorded

    def wall_said(self) -> str:
        """The wall clock, and each stage's share where the result records them."""
        stages = ", ".join(f"{STAGE_NAMES.get(k, k)} {v:.1f}" for k, v in self.stage_seconds.items())
        return f"{self.wall_seconds:.1f} s" + (f" ({stages})" if stages else "")

    @property
    def drift_said(self) -> str | None:
        return self.drift.said() if self.drift else None

    def held_out_said(self, chosen: int | None) -> list[str]:
        """The shipped plan's loss on the calibration batches, and the plans left out for passing
        the limit there."""
        held = self.held_out
        if held is None:
            return []
        where = f"the {held.batches} calibration batches, which judged no trial (ONNX Runtime CPU)"
        lines = [f"on {where}: {self.metric} loss {held.losses[chosen]:.3g}"] if chosen in held.losses else []
        if failed := held.failed():
            lines.append(f"⚠ within --max-loss {held.max_loss:g} on the evaluation batches but not "
                         f"on {where}, so not "
                         "chosen: " + ", ".join(f"trial {t} (loss {loss:.3g})" for t, loss in failed.items())
                         + f"; {HELD_OUT_ADVICE}")
        return lines


@dataclass(frozen=True)
class ModelRecord:
    """The model a search was given, as its result records it."""

    path: Path
    sha256: str
    inputs: dict[str, tuple[list[int], str]]  # name: (shape, dtype)
    outputs: dict[str, tuple[list, str]]
    units: int
    searchable_units: int
    preparation: tuple[str, ...]
    weight_bytes: int | None = None
    external_data: bool = False

    @classmethod
    def from_json(cls, f: Fields) -> ModelRecord:
        def tensors(which: str, shape: Any) -> dict[str, tuple[list, str]]:
            return {name: (shape(spec["shape"]), spec["dtype"].text()) for name, spec in f[which].mapping().items()}

        weight_bytes, external = f.get("weight_bytes"), f.get("external_data")
        return cls(Path(f["path"].text()), f["sha256"].text(), tensors("inputs", Fields.integers),
                   tensors("outputs", lambda shape: shape.kind(list)), f["units"].integer(),
                   f["searchable_units"].integer(), tuple(f["preparation"].texts()),
                   weight_bytes.integer() if weight_bytes else None,
                   bool(external and external.flag()))

    def to_json(self) -> dict[str, Any]:
        def tensors(found: dict[str, tuple[list, str]]) -> dict[str, Any]:
            return {name: {"shape": shape, "dtype": dtype} for name, (shape, dtype) in found.items()}

        return {"path": str(self.path), "sha256": self.sha256, "inputs": tensors(self.inputs),
                "outputs": tensors(self.outputs), "units": self.units,
                "searchable_units": self.searchable_units,
                "preparation": list(self.preparation), "weight_bytes": self.weight_bytes,
                "external_data": self.external_data}

    @property
    def external_weights(self) -> bool | None:
        """Whether exports keep their weights in a data file: as the given model did, else where
        they are large (None: :func:`autoprec.core.stored.save_models` decides by size)."""
        return True if self.external_data else None


@dataclass(frozen=True)
class ShippedAs:
    """What best/model.onnx is: the plan on the source's dims, or the measured fixed-shape model and
    why; with its checks against the given model across the profile (best/plan.json's
    ``deployment``)."""

    fixed_because: str | None
    checks: tuple[PointCheck, ...]

    keeps_source_dims: bool = True

    @classmethod
    def from_json(cls, f: Fields) -> ShippedAs:
        checks = []
        for check in f["checked_against_source"].items():
            # min, opt, max, data, or a shape the search judged (prefill, decode·39)
            check["point"].text()
            for dims in check["shapes"].mapping().values():
                dims.integers()
            check["same_output_shapes"].flag(), check["cosine_loss"].number_or_none(), check["error"].text_or_none()
            if (items := check.get("items")) is not None:
                items.integer()
            if (outside := check.get("outside_profile")) is not None:
                outside.flag()
            checks.append(PointCheck.from_json(check.value))
        return cls(f["fixed_because"].text_or_none(), tuple(checks), f["keeps_source_dims"].flag())

    def to_json(self) -> dict[str, Any]:
        return {"keeps_source_dims": self.keeps_source_dims, "fixed_because": self.fixed_because,
                "checked_against_source": [check.to_json() for check in self.checks]}


# --- reading the search section: each part checked where it is read (see autoprec.core.fields) ---


def _metrics(f: Fields | None) -> dict[str, dict[str, float]]:
    """Task metrics by output (a trial's ``metrics``, the search's ``fp32_on_labels``)."""
    if f is None:
        return {}
    return {name: {key: value.number() for key, value in output.mapping().items()}
            for name, output in f.mapping().items()}


def _max_loss(f: Fields) -> float | None:
    limit = f.number_or_none()
    if limit is not None and not (math.isfinite(limit) and limit >= 0):
        f.refuse(f"{f.path} is {f.value!r}, not a finite loss of 0 or more")
    return limit


def _stages(f: Fields) -> dict[str, float]:
    return {k: _wall(v) for k, v in f.mapping().items()}


def _wall(f: Fields) -> float:
    wall = float(f.number())
    if not (math.isfinite(wall) and wall >= 0):
        f.refuse(f"{f.path} is {wall:g}, not a duration")
    return wall


def _drift(f: Fields | None) -> Drift | None:
    if f is None:
        return None
    drift = Drift(f["plans"].integer(), float(f["largest_percent"].number()),
                  f["outside_trial_spread"].integer())
    if not (math.isfinite(drift.largest_percent) and drift.largest_percent >= 0
            and 0 <= drift.outside_trial_spread <= drift.plans):
        f.refuse(f"{f.path} {f.value} cannot be (a share of plans, a percent of 0 or more)")
    return drift


def _held_out(f: Fields) -> HeldOut:
    f["engine"].text()
    judged = {j["trial"].integer(): float(j["loss"].number()) for j in f["judged"].items()}
    for trial, loss in judged.items():
        if math.isnan(loss):
            f.refuse(f"{f.path} judged trial {trial} at loss {loss!r}: not a trial with a loss")
    return HeldOut(f["batches"].integer(), f["max_loss"].number_or_none(), judged)


def _judged_shapes(f: Fields) -> tuple[ShapePoint, ...]:
    points = []
    for point in f.items():
        point["name"].text(), point["said"].text(), point["runs"].integer()
        for dims in point["shapes"].mapping().values():
            dims.integers()
        points.append(ShapePoint.from_json(point.value))
    return tuple(points)


def _profile(f: Fields) -> ShapeProfile:
    for entry in f["inputs"].items():
        entry["name"].text()
        for item in entry["declared"].items():
            item.kind(int, str, type(None))
        for point in POINTS:
            entry[point].integers()
    return ShapeProfile.from_json(f.value)


def _profile_timing(f: Fields) -> ProfileTiming:
    for at in f["ms"].mapping().values():
        for point in POINTS:
            at[point].number_or_none()
    f["feasible"].integers()
    for fastest in f["fastest"].mapping().values():
        if fastest.nullable():
            fastest.integer()
    if (across := f["across_range"].nullable()) is not None:
        across.integer()
    f["how"].text()
    if (failed := f.get("failed")) is not None:
        for why in failed.mapping().values():
            why.text()
    return ProfileTiming.from_json(f.value)


def _image_norm(f: Fields) -> None:
    f["mean"].numbers()
    f["std"].numbers()
    for key, read in (("order", Fields.text), ("scale", Fields.number), ("resize", Fields.text)):
        if (found := f.get(key)) is not None:
            read(found)


def _spec_model(f: Fields) -> str | None:
    """The model as the user named it, from the option groups the search was asked (checked: a verb
    that re-creates the search reads them, autoprec.app.specs.SearchConfig.from_json)."""
    _spec(f)
    return f["inputs"]["model"].value or None


def _spec(f: Fields) -> None:
    inputs, judge, space, study, isolation, engine = (f[k] for k in ("inputs", "judge", "space", "study", "isolation",
                                                                     "engine"))
    inputs["model"].text()
    inputs["data"].text_or_none()
    for key in ("shapes", "min_shapes", "max_shapes"):
        if (shapes := inputs[key].nullable()) is not None:
            for dims in shapes.mapping().values():
                dims.integers()
    if (constants := inputs["constants"].nullable()) is not None:
        for value in constants.mapping().values():
            value.number()
    inputs["image_mean"].numbers()
    inputs["image_std"].numbers()
    for key, read in (("image_order", Fields.text), ("image_scale", Fields.number),
                      ("image_resize", Fields.text)):
        if (found := inputs.get(key)) is not None:
            read(found)
    engine["backend"].text(), engine["device"].integer(), engine["threads"].integer()
    _judge(judge)
    space["search_space"].text_or_none()
    space["overrides"].texts()
    if (precisions := space["precisions"].nullable()) is not None:
        precisions.texts()
    space["calibration"].text(), space["tie_repeats"].flag()
    study["budget"].integer(), study["seed"].integer(), study["sampler"].text(), study["heartbeat"].integer()
    study["warm_start"].flag(), study["early_reject"].flag()
    for key in ("storage", "study_name", "artifacts"):
        study[key].text_or_none()
    if (proposals := study["proposals"].nullable()) is not None:
        proposals.integer()
    isolation["isolate"].flag(), isolation["trial_timeout"].number(), isolation["trial_memory_gb"].number_or_none()
    if (workers := isolation["build_workers"].nullable()) is not None:
        workers.integer()


def _judge(f: Fields) -> None:
    f["metric"].text()
    f["max_loss"].number_or_none()
    head = f["head"]
    head["blank"].integer(), head["conf"].number(), head["iou"].number()
    if (charset := head["charset"].nullable()) is not None:
        charset.texts()
    head["layout"].text_or_none(), head["output"].text_or_none()
    for key in ("db_thresh", "db_box_thresh"):
        if (found := head.get(key)) is not None:
            found.number()
    if (image := head.get("image")) is not None and image.nullable() is not None:
        image.integers()


def _check_recorded(f: Fields) -> None:
    """The parts of the section a reader is not shown but a verb that re-creates the search reads
    (see :class:`autoprec.results.files.HowMeasured`), and the build counts: of the kind the search
    writes them."""
    optional = {
        "tied_units": Fields.integer, "out_of_range": Fields.texts, "data_fingerprint": Fields.text,
        "plan_ignored": Fields.integers, "engine_builds": Fields.integer,
        "engine_builds_scope": Fields.text,
        "reference_evaluations": Fields.integer, "image_norm": _image_norm,
        "data_path": Fields.text_or_none,
        "calibration_file": Fields.text_or_none,
        "search_space": lambda space: space.kind(dict, str),
    }
    for key, read in optional.items():
        if (found := f.get(key)) is not None:
            read(found)
    if (constants := f.get("constants")) is not None:
        for value in constants.mapping().values():
            value.number()
    if (phases := f.get("engine_builds_by_phase")) is not None:
        for count in phases.mapping().values():
            count.integer()
    if (reference := f.get("reference")) is not None:
        reference["executor"].text(), reference["proposals_per_build"].integer()
    if (tasks := f.get("metric_tasks")) is not None:
        tasks["tasks"].texts(), tasks["options"].kind(dict)


@dataclass(frozen=True)
class ShapePoint:
    """One shape a deployment runs, judged by every trial (see
    :mod:`autoprec.analysis.shape_points`): ``name`` as the result shows it (``opt``: the data's
    own, ``prefill``, ``decode·47``, ``min``), what it is in words, its inputs' shapes, and how many
    runs of it one deployment request makes (its weight in the latency; 0: judged, not timed)."""

    name: str
    said: str
    shapes: dict[str, tuple[int, ...]]
    runs: int = 1

    def to_json(self) -> dict:
        return {"name": self.name, "said": self.said,
                "shapes": {k: list(v) for k, v in self.shapes.items()},
                "runs": self.runs}

    @classmethod
    def from_json(cls, data: dict) -> ShapePoint:
        return cls(data["name"], data["said"], {k: tuple(v) for k, v in data["shapes"].items()},
                   int(data["runs"]))


@dataclass(frozen=True)
class PointCheck:
    """The shipped model at one point of the profile against the user's file: outputs of the same
    shape, and the cosine loss between them (1 - cosine; the relative L2 error of narrow
    outputs)."""

    point: str  # min, opt, max, or "data": items the data holds at this shape
    shapes: dict[str, tuple[int, ...]]
    same_shapes: bool
    loss: float | None  # None: it did not run
    error: str | None = None
    # batches run (the data's items at this shape; evaluation batches fitted to a point)
    items: int = 1
    # data at a shape beyond the profile's min..max: an engine built for it refuses it
    outside_profile: bool = False

    @property
    def passed(self) -> bool:
        return self.error is None and self.same_shapes

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "same_output_shapes": self.same_shapes,
            "cosine_loss": self.loss,
            "error": self.error,
            "items": self.items,
            "outside_profile": self.outside_profile,
        }

    @classmethod
    def from_json(cls, check: dict[str, Any]) -> PointCheck:
        loss = check["cosine_loss"]
        return cls(check["point"], {k: tuple(v) for k, v in check["shapes"].items()},
                   check["same_output_shapes"],
                   float(loss) if loss is not None else None, check["error"], check.get("items", 1),
                   bool(check.get("outside_profile")))


@dataclass(frozen=True)
class Deployment:
    """What best/model.onnx is: the plan on the source's dims (``fixed_because`` None), or the
    measured fixed-shape model and why; with its checks against the given model."""

    model: StoredModel
    tensorrt_model: StoredModel | None
    fixed_because: str | None
    checks: tuple[PointCheck, ...]

    def to_json(self) -> dict[str, Any]:
        return {"keeps_source_dims": self.fixed_because is None,
                "fixed_because": self.fixed_because,
                "checked_against_source": [c.to_json() for c in self.checks]}


@dataclass(frozen=True)
class ProfileTiming:
    """Plans timed as deployed at each point of the profile (``--time-shapes``), one plan after
    another on one engine: milliseconds by trial and point."""

    ms: dict[int, dict[str, float | None]]  # None: the plan did not run at that point
    # the trials within --max-loss that ran at every point, in the order of the front
    feasible: tuple[int, ...]
    # trials that could not be built as deployed, and why
    failed: dict[int, str] = field(default_factory=dict)

    def fastest(self, point: str, among: Sequence[int] | None = None) -> int | None:
        timed = [t for t in (among or self.ms) if self.ms[t][point] is not None]
        return min(timed, key=lambda trial: self.ms[trial][point]) if timed else None

    def across_range(self) -> int | None:
        """The plan within the loss limit whose worst latency, against the fastest such plan at each
        point, is least: the one to deploy across the range (None: no plan is within the limit)."""
        if not self.feasible:
            return None
        points = next(iter(self.ms.values()))
        best = {p: self.ms[self.fastest(p, self.feasible)][p] for p in points}
        return min(self.feasible,
                   key=lambda trial: max(self.ms[trial][p] / best[p] for p in points))

    def to_json(self) -> dict[str, Any]:
        points = list(next(iter(self.ms.values()), {}))
        return {
            "ms": {str(t): v for t, v in self.ms.items()},
            "feasible": list(self.feasible),
            "fastest": {p: self.fastest(p, self.feasible or None) for p in points},
            "across_range": self.across_range(),
            "failed": {str(t): why for t, why in self.failed.items()},
            "how": "each plan lowered on the source's dims, built once, timed at each point one "
                   "plan after another "
            "(not interleaved: differences of a few percent are noise)",
        }

    @classmethod
    def from_json(cls, timing: dict[str, Any]) -> ProfileTiming:
        ms = {int(t): {p: float(v) if v is not None else None for p, v in at.items()} for t, at in timing["ms"].items()}
        return cls(ms, tuple(timing["feasible"]),
                   {int(t): why for t, why in (timing.get("failed") or {}).items()})



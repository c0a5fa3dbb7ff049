"""The result record's typed parts, read from and written to the result files here: the model a search was
given, the search's facts a reader is shown, the chosen plan's speed-ups, its units and how best/ ships it.
Views (terminal, report, plots, compare, the build card) take these values, never the JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from autoprec.analysis.data import ShapePoint
from autoprec.analysis.model_info import ModelInfo
from autoprec.core.fields import Fields
from autoprec.core.plan import Precision
from autoprec.core.profile import POINTS, ShapeProfile
from autoprec.measure.confirmation import ADVICE, HeldOut
from autoprec.measure.deployment import PointCheck, ProfileTiming
from autoprec.study.optimize import TrialRecord

DRIFT_WORTH_SAYING = 10.0  # percent
PRECISIONS = tuple(p.value for p in Precision)


@dataclass(frozen=True)
class Drift:
    """How far the re-timed plans' trial latencies lie from their re-timing. A host that drifts between the
    two (a busy neighbour; on a shared GPU host, launch-bound latencies that shift by a third for seconds at a
    time) moves absolute figures; interleaved rounds see it alike, so the choice holds."""

    plans: int
    largest_percent: float
    outside_trial_spread: int

    @classmethod
    def of(cls, trials: Sequence[TrialRecord]) -> Drift | None:
        pairs = [(t.measurement.latency, t.latency_ms) for t in trials if t.retimed_ms]  # latency_ms: re-timed
        if not pairs:
            return None
        return cls(len(pairs), 100 * max(abs(trial.median_ms / final - 1) for trial, final in pairs),
                   sum(not trial.p10_ms <= final <= trial.p90_ms for trial, final in pairs))

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Drift | None:
        return cls(data["plans"], float(data["largest_percent"]), data["outside_trial_spread"]) if data else None

    def to_json(self) -> dict[str, Any]:
        return {"plans": self.plans, "largest_percent": self.largest_percent,
                "outside_trial_spread": self.outside_trial_spread}

    def said(self) -> str | None:
        """A sentence when latencies moved beyond the trials' own spread: absolute figures are then good to
        that much, ratios of interleaved rounds are not hit."""
        if not self.outside_trial_spread or self.largest_percent < DRIFT_WORTH_SAYING:
            return None
        return (
            f"latencies on this machine drifted up to {self.largest_percent:.0f} % between the trials and the "
            f"re-timing ({self.outside_trial_spread} of {self.plans} plans beyond their trial's p10–p90): absolute "
            "figures are good to about that much; the speed-up comes from interleaved rounds, which drift hits alike"
        )


STAGE_NAMES = {"set_up": "set-up", "trials": "trials", "sensitivity": "sensitivity pass", "retiming": "re-timing",
               "held_out_and_final_timing": "held-out judging and final timing", "deployment": "deployment checks",
               "profile_timing": "timing across the shape profile"}


@dataclass(frozen=True)
class SearchFacts:
    """pareto.json's ``search`` (the same in trials.json and best/plan.json): how the search was asked and what it
    did, as a reader is shown it, checked field by field when read. ``recorded`` is the section as the search wrote
    it (an older result's: as it was), which is what :meth:`to_json` gives back."""

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
    held_out: HeldOut | None = None  # the plans judged on the calibration batches, the shipped one among them
    limit_in_decisions: str | None = None  # what --max-loss allows where the metric counts decisions (Judge.limit_said)
    profile: ShapeProfile | None = None  # None: an older result, measured at one shape
    run: str | None = None  # which run wrote the file (None: an older result)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # where the wall clock went ({}: an older result)
    # The shapes every trial was judged at (autoprec.analysis.shape_points); () at the data's one shape, None: an
    # older result, which judged at one shape
    judged_shapes: tuple[ShapePoint, ...] | None = None
    recorded: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, f: Fields) -> SearchFacts:
        search = f.as_object()
        _check_recorded(f)
        batches, timing, drift, held, spec = f["batches"], f.get("profile_timing"), f.get("timing_drift"), \
            f.get("held_out"), f.get("spec")
        return cls(
            f["metric"].text(), _nullable_number(f["max_loss"]), f["budget"].integer(), f["trials"].integer(),
            len(f["rejected"].items()) if "rejected" in search else 0, f["sampler"].text(), f["seed"].integer(),
            f["calibration"].text(), f["study_name"].text(), f["storage"].text(), f["data"].text(),
            (batches["calibration"].integer(), batches["evaluation"].integer()), f["random_data"].flag(),
            float(f["wall_seconds"].number()), _metrics(f.get("fp32_on_labels")),
            tuple(f["metric_notes"].texts()) if "metric_notes" in search else (),
            tuple(f["decision_changes"].texts()) if "decision_changes" in search else (),
            _drift(drift.nullable()) if drift else None, _profile_timing(timing) if timing else None,
            _spec_model(spec) if spec else None, _held_out(held) if held else None,
            _nullable_text(f["limit_in_decisions"]) if "limit_in_decisions" in search else None,
            _profile(f["profile"]) if search.get("profile") else None,
            f["run"].text() if "run" in search else None,
            {k: v.number() for k, v in f["stage_seconds"].mapping().items()} if "stage_seconds" in search else {},
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
        """The shipped plan's loss on the calibration batches, and the plans left out for passing the limit there."""
        held = self.held_out
        if held is None:
            return []
        where = f"the {held.batches} calibration batches, which judged no trial (ONNX Runtime CPU)"
        lines = [f"on {where}: {self.metric} loss {held.losses[chosen]:.3g}"] if chosen in held.losses else []
        if failed := held.failed():
            lines.append(f"⚠ within --max-loss {held.max_loss:g} on the evaluation batches but not on {where}, so not "
                         "chosen: " + ", ".join(f"trial {t} (loss {loss:.3g})" for t, loss in failed.items())
                         + f"; {ADVICE}")
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
    def of(cls, info: ModelInfo) -> ModelRecord:
        return cls(Path(info.path).resolve(), info.sha256, {i.name: (list(i.shape), i.dtype) for i in info.inputs},
                   {o.name: (list(o.shape), o.dtype) for o in info.outputs}, len(info.units),
                   len(info.searchable_units), tuple(info.notes), info.stored.weight_bytes(), info.external_data)

    @classmethod
    def from_json(cls, f: Fields) -> ModelRecord:
        def tensors(which: str, shape: Any) -> dict[str, tuple[list, str]]:
            return {name: (shape(spec["shape"]), spec["dtype"].text()) for name, spec in f[which].mapping().items()}

        weight_bytes, external = f.get("weight_bytes"), f.get("external_data")
        return cls(Path(f["path"].text()), f["sha256"].text(), tensors("inputs", Fields.integers),
                   tensors("outputs", lambda shape: shape.kind(list)), f["units"].integer(),
                   f["searchable_units"].integer(), tuple(f["preparation"].texts()),
                   weight_bytes.integer() if weight_bytes else None, bool(external and external.flag()))

    def to_json(self) -> dict[str, Any]:
        def tensors(found: dict[str, tuple[list, str]]) -> dict[str, Any]:
            return {name: {"shape": shape, "dtype": dtype} for name, (shape, dtype) in found.items()}

        return {"path": str(self.path), "sha256": self.sha256, "inputs": tensors(self.inputs),
                "outputs": tensors(self.outputs), "units": self.units, "searchable_units": self.searchable_units,
                "preparation": list(self.preparation), "weight_bytes": self.weight_bytes,
                "external_data": self.external_data}

    @property
    def external_weights(self) -> bool | None:
        """Whether exports keep their weights in a data file: as the given model did, else where they are large
        (None: :func:`autoprec.core.stored.save_models` decides by size)."""
        return True if self.external_data else None


@dataclass(frozen=True)
class ChosenUnit:
    """One unit of the chosen plan (best/plan.json's ``units``), in graph order."""

    name: str
    op_type: str
    fused: tuple[str, ...]
    precision: str

    allowed: tuple[str, ...] = ()
    tied_to: str | None = None  # the unit of its repeated pattern it takes its precision from

    @classmethod
    def from_json(cls, f: Fields) -> ChosenUnit:
        tied_to = f.get("tied_to")
        return cls(f["name"].text(), f["op_type"].text(), tuple(f["fused"].texts()), f["precision"].one_of(PRECISIONS),
                   tuple(item.one_of(PRECISIONS) for item in f["allowed"].items()),
                   _nullable_text(tied_to) if tied_to else None)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op_type": self.op_type, "fused": list(self.fused), "allowed": list(self.allowed),
                "tied_to": self.tied_to, "precision": self.precision}


@dataclass(frozen=True)
class ShippedAs:
    """What best/model.onnx is: the plan on the source's dims, or the measured fixed-shape model and why; with
    its checks against the given model across the profile (best/plan.json's ``deployment``)."""

    fixed_because: str | None
    checks: tuple[PointCheck, ...]

    keeps_source_dims: bool = True

    @classmethod
    def from_json(cls, f: Fields) -> ShippedAs:
        checks = []
        for check in f["checked_against_source"].items():
            check["point"].text()  # min, opt, max, data, or a shape the search judged (prefill, decode·39)
            for dims in check["shapes"].mapping().values():
                dims.integers()
            check["same_output_shapes"].flag(), _nullable_number(check["cosine_loss"]), _nullable_text(check["error"])
            if (items := check.get("items")) is not None:
                items.integer()
            if (outside := check.get("outside_profile")) is not None:
                outside.flag()
            checks.append(PointCheck.from_json(check.value))
        return cls(_nullable_text(f["fixed_because"]), tuple(checks), f["keeps_source_dims"].flag())

    def to_json(self) -> dict[str, Any]:
        return {"keeps_source_dims": self.keeps_source_dims, "fixed_because": self.fixed_because,
                "checked_against_source": [check.to_json() for check in self.checks]}


# --- reading the search section: each part checked where it is read (see autoprec.core.fields) ---


def _nullable_number(f: Fields) -> float | None:
    return None if f.value is None else float(f.number())


def _nullable_text(f: Fields) -> str | None:
    return None if f.value is None else f.text()


def _metrics(f: Fields | None) -> dict[str, dict[str, float]]:
    """Task metrics by output (a trial's ``metrics``, the search's ``fp32_on_labels``)."""
    if f is None:
        return {}
    return {name: {key: value.number() for key, value in output.mapping().items()}
            for name, output in f.mapping().items()}


def _drift(f: Fields | None) -> Drift | None:
    if f is None:
        return None
    return Drift(f["plans"].integer(), float(f["largest_percent"].number()), f["outside_trial_spread"].integer())


def _held_out(f: Fields) -> HeldOut:
    f["engine"].text()
    judged = {j["trial"].integer(): float(j["loss"].number()) for j in f["judged"].items()}
    return HeldOut(f["batches"].integer(), _nullable_number(f["max_loss"]), judged)


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
            _nullable_number(at[point])
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
    """The model as the user named it, from the option groups the search was asked (checked: a verb that
    re-creates the search reads them, autoprec.app.specs.SearchConfig.from_json)."""
    _spec(f)
    return f["inputs"]["model"].value or None


def _spec(f: Fields) -> None:
    inputs, judge, space, study, isolation, engine = (f[k] for k in ("inputs", "judge", "space", "study", "isolation",
                                                                     "engine"))
    inputs["model"].text()
    _nullable_text(inputs["data"])
    for key in ("shapes", "min_shapes", "max_shapes"):
        if (shapes := inputs[key].nullable()) is not None:
            for dims in shapes.mapping().values():
                dims.integers()
    if (constants := inputs["constants"].nullable()) is not None:
        for value in constants.mapping().values():
            value.number()
    inputs["image_mean"].numbers()
    inputs["image_std"].numbers()
    for key, read in (("image_order", Fields.text), ("image_scale", Fields.number), ("image_resize", Fields.text)):
        if (found := inputs.get(key)) is not None:
            read(found)
    engine["backend"].text(), engine["device"].integer(), engine["threads"].integer()
    _judge(judge)
    _nullable_text(space["search_space"])
    space["overrides"].texts()
    if (precisions := space["precisions"].nullable()) is not None:
        precisions.texts()
    space["calibration"].text(), space["tie_repeats"].flag()
    study["budget"].integer(), study["seed"].integer(), study["sampler"].text(), study["heartbeat"].integer()
    study["warm_start"].flag(), study["early_reject"].flag()
    for key in ("storage", "study_name", "artifacts"):
        _nullable_text(study[key])
    if (proposals := study["proposals"].nullable()) is not None:
        proposals.integer()
    isolation["isolate"].flag(), isolation["trial_timeout"].number(), _nullable_number(isolation["trial_memory_gb"])
    if (workers := isolation["build_workers"].nullable()) is not None:
        workers.integer()


def _judge(f: Fields) -> None:
    f["metric"].text()
    _nullable_number(f["max_loss"])
    head = f["head"]
    head["blank"].integer(), head["conf"].number(), head["iou"].number()
    if (charset := head["charset"].nullable()) is not None:
        charset.texts()
    _nullable_text(head["layout"]), _nullable_text(head["output"])
    for key in ("db_thresh", "db_box_thresh"):
        if (found := head.get(key)) is not None:
            found.number()
    if (image := head.get("image")) is not None and image.nullable() is not None:
        image.integers()


def _check_recorded(f: Fields) -> None:
    """The parts of the section a reader is not shown but a verb that re-creates the search reads (see
    :class:`autoprec.results.files.HowMeasured`), and the build counts: of the kind the search writes them."""
    optional = {
        "tied_units": Fields.integer, "out_of_range": Fields.texts, "data_fingerprint": Fields.text,
        "plan_ignored": Fields.integers, "engine_builds": Fields.integer, "engine_builds_scope": Fields.text,
        "reference_evaluations": Fields.integer, "image_norm": _image_norm, "data_path": _nullable_text,
        "calibration_file": _nullable_text, "search_space": lambda space: space.kind(dict, str),
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

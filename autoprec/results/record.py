"""The result record's typed parts, read from and written to the result files here: the model a search was
given, the search's facts a reader is shown, the chosen plan's speed-ups, its units and how best/ ships it.
Views (terminal, report, plots, compare, the build card) take these values, never the JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from autoprec.analysis.model import ModelInfo
from autoprec.measure.confirmation import ADVICE, HeldOut
from autoprec.measure.deployment import PointCheck, ProfileTiming
from autoprec.study.optimize import TrialRecord

DRIFT_WORTH_SAYING = 10.0  # percent


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


@dataclass(frozen=True)
class SearchFacts:
    """What a reader is shown of how the search ran (pareto.json's ``search``)."""

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

    @classmethod
    def from_json(cls, search: dict[str, Any]) -> SearchFacts:
        max_loss, timing = search["max_loss"], search.get("profile_timing")
        return cls(
            search["metric"], float(max_loss) if max_loss is not None else None, search["budget"], search["trials"],
            len(search.get("rejected") or ()), search["sampler"], search["seed"], search["calibration"],
            search["study_name"], search["storage"], search["data"],
            (search["batches"]["calibration"], search["batches"]["evaluation"]), search["random_data"],
            float(search["wall_seconds"]), dict(search.get("fp32_on_labels") or {}),
            tuple(search.get("metric_notes") or ()), tuple(search.get("decision_changes") or ()),
            Drift.from_json(search.get("timing_drift")), ProfileTiming.from_json(timing) if timing else None,
            str((search.get("spec") or {}).get("inputs", {}).get("model") or "") or None,
            HeldOut.from_json(search["held_out"]) if search.get("held_out") else None,
            search.get("limit_in_decisions"),
        )

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
    def from_json(cls, model: dict[str, Any]) -> ModelRecord:
        def tensors(which: str) -> dict[str, tuple[list, str]]:
            return {name: (spec["shape"], spec["dtype"]) for name, spec in model[which].items()}

        return cls(Path(model["path"]), model["sha256"], tensors("inputs"), tensors("outputs"), model["units"],
                   model["searchable_units"], tuple(model["preparation"]), model.get("weight_bytes"),
                   bool(model.get("external_data")))

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

    @classmethod
    def from_json(cls, unit: dict[str, Any]) -> ChosenUnit:
        return cls(unit["name"], unit["op_type"], tuple(unit["fused"]), unit["precision"])


@dataclass(frozen=True)
class ShippedAs:
    """What best/model.onnx is: the plan on the source's dims, or the measured fixed-shape model and why; with
    its checks against the given model across the profile (best/plan.json's ``deployment``)."""

    fixed_because: str | None
    checks: tuple[PointCheck, ...]

    @classmethod
    def from_json(cls, deployment: dict[str, Any]) -> ShippedAs:
        return cls(deployment["fixed_because"], tuple(map(PointCheck.from_json, deployment["checked_against_source"])))

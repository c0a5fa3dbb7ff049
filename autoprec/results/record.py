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
from autoprec.measure.speedup import METHOD, Speedup, Steadiness, interval_text, ratio_text
from autoprec.study.optimize import TrialRecord


def noise_verdict(beyond: bool | None, short: bool = False) -> str:
    """What a speed-up's verdict on timing noise says (None: not re-timed, so there is none)."""
    if beyond is None:
        return "not re-timed" if short else "not re-timed: no verdict on timing noise"
    if beyond:
        return "beyond timing noise"
    return "within timing noise" if short else "WITHIN timing noise: no real gain measured"


@dataclass(frozen=True)
class Claim:
    """A speed-up as a result states it: the ratio, its interval where the final timing measured one (None:
    it stands on the re-timing's rounds), and whether it beats timing noise (None: not re-timed)."""

    speedup: float
    beyond_timing_noise: bool | None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None
    rounds: int | None = None
    retimed: bool = False
    blocks: int | None = None  # the sessions each model was built in (None: a result older than that method)
    unsteady: bool = False  # the machine's load moved during the timing: the interval holds at either load

    @classmethod
    def measured(cls, found: Speedup) -> Claim:
        return cls(found.speedup, found.beyond_timing_noise, found.low, found.high, found.confidence, found.rounds,
                   True, found.blocks, found.unsteady)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Claim:
        def number(key: str) -> float | None:
            return float(data[key]) if data.get(key) is not None else None

        return cls(float(data["speedup"]), data["beyond_timing_noise"], number("low"), number("high"),
                   number("confidence"), data.get("rounds"), bool(data.get("retimed") or data.get("rounds")),
                   data.get("blocks"), bool(data.get("unsteady")))

    def to_json(self) -> dict[str, Any]:
        interval = {} if self.low is None else {"low": self.low, "high": self.high, "confidence": self.confidence,
                                                "rounds": self.rounds, "blocks": self.blocks,
                                                "unsteady": self.unsteady, "method": METHOD}
        return {"speedup": self.speedup, **interval, "beyond_timing_noise": self.beyond_timing_noise,
                "retimed": self.retimed}

    def text(self) -> str:
        """``1.30× (1.25–1.34, 95 %)``, or the bare ratio where no interval was measured."""
        if self.low is None:
            return f"{ratio_text(self.speedup)}×"
        return interval_text(self.speedup, self.low, self.high, self.confidence)

    def verdict(self, short: bool = False) -> str:
        return noise_verdict(self.beyond_timing_noise, short)

    def how(self) -> str:
        """How it was timed, for the terminal's line."""
        if self.rounds and self.blocks:
            return f", {self.rounds} interleaved rounds in {self.blocks} sessions each"
        if self.rounds:
            return f", {self.rounds} interleaved rounds"
        return ", re-timed in interleaved rounds" if self.retimed else ""


@dataclass(frozen=True)
class NotShipped:
    """The fastest plan within the limit, left out of best/ for want of a gain beyond timing noise."""

    trial: int
    claim: Claim
    why: str


@dataclass(frozen=True)
class Rival:
    """A plan the final timing ran beside the chosen one (the re-timing could not tell them apart), and its
    speed-up over all-FP32 in the same rounds."""

    trial: int
    claim: Claim


@dataclass(frozen=True)
class Versus:
    """The chosen plan's speed-ups: over all-FP32 (trial ``fp32_trial``) and over the given model as it is, of
    which ``preparation`` is autoprec's FP32 folding alone; the plan not shipped, if one was not; and the
    rivals it was timed against and outran."""

    fp32: Claim | None = None
    fp32_trial: int | None = None
    source: Claim | None = None
    preparation: Claim | None = None
    not_shipped: NotShipped | None = None
    rivals: tuple[Rival, ...] = ()
    steadiness: Steadiness | None = None  # the machine during the final timing (None: an older result)

    def rivals_said(self) -> str | None:
        """``trial 2 1.38× (1.35–1.41, 95 %), trial 9 …``: what the rivals ran at in the chosen plan's rounds."""
        return ", ".join(f"trial {r.trial} {r.claim.text()}" for r in self.rivals) or None

    def to_json(self) -> dict[str, Any]:
        source = None
        if self.source is not None:
            source = {**self.source.to_json(), "preparation": self.preparation.to_json() if self.preparation else None}
        unproven = self.not_shipped
        return {
            "chosen_vs_fp32": {"fp32_trial": self.fp32_trial, **self.fp32.to_json()} if self.fp32 else None,
            "chosen_vs_source": source,
            "not_shipped": {"trial": unproven.trial, **unproven.claim.to_json(), "why": unproven.why}
            if unproven else None,
            "final_rivals": [{"trial": r.trial, **r.claim.to_json()} for r in self.rivals],
            "final_timing": self.steadiness.to_json() if self.steadiness else None,
        }

    @classmethod
    def from_json(cls, pareto: dict[str, Any]) -> Versus:
        fp32, source, unproven = (pareto.get(k) for k in ("chosen_vs_fp32", "chosen_vs_source", "not_shipped"))
        return cls(
            Claim.from_json(fp32) if fp32 else None,
            fp32["fp32_trial"] if fp32 else None,
            Claim.from_json(source) if source else None,
            Claim.from_json(source["preparation"]) if source and source.get("preparation") else None,
            NotShipped(unproven["trial"], Claim.from_json(unproven), unproven["why"]) if unproven else None,
            tuple(Rival(r["trial"], Claim.from_json(r)) for r in pareto.get("final_rivals") or ()),
            Steadiness.from_json(pareto.get("final_timing")),
        )


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

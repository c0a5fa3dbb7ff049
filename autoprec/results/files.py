"""The result directory: pareto.json, trials.json, best/plan.json, best/model.onnx — written atomically.

JSON only (never pickle), so results can be read by anything and loaded without running code.
Non-finite numbers (an overflowed candidate's loss, an exact match's SNR) are written as the
strings "inf" and "-inf", which ``float()`` reads back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoprec.analysis.images import ImageOptions
from autoprec.analysis.model import ModelInfo, model_sha256
from autoprec.backends.base import EngineInfo
from autoprec.core import atomic
from autoprec.core.errors import AutoprecError
from autoprec.core.escape import printable
from autoprec.core.plan import Plan
from autoprec.core.profile import POINTS, ShapeProfile
from autoprec.core.stored import save_models
from autoprec.core.timing import Timing
from autoprec.measure.deployment import Deployment
from autoprec.measure.speedup import Claim, faster_beyond_noise
from autoprec.results import coherence
from autoprec.results.record import ChosenUnit, ModelRecord, SearchFacts, ShippedAs
from autoprec.study.choice import Versus
from autoprec.study.optimize import TrialRecord, uniform_trials

PARETO_SCHEMA = "autoprec.pareto/1"
PLAN_SCHEMA = "autoprec.plan/1"
WEIGHTS_FILE = "model.data"  # best/'s weights, where they are kept beside its models (large, or given so)


@dataclass(frozen=True)
class SearchResult:
    """What a search found: every finished trial, the Pareto front, and the chosen plan."""

    out_dir: Path
    model: ModelRecord
    engine: EngineInfo
    search: dict[str, Any]
    trials: tuple[TrialRecord, ...]
    front: tuple[TrialRecord, ...]
    chosen: TrialRecord | None
    units: tuple[dict[str, Any], ...] = field(default=())
    # The chosen plan's speed-ups with their intervals and the plan not shipped for want of a proven gain,
    # from the final timing (see autoprec.measure.speedup); empty where it did not run.
    versus: Versus = field(default_factory=Versus)

    def stated_versus(self) -> Versus:
        """The speed-ups the result states: the final timing's, else (where it failed) the chosen plan against
        all-FP32 from the re-timing's rounds."""
        fp32 = self.uniform().get("fp32")
        if self.versus != Versus() or fp32 is None or self.chosen is None:
            return self.versus
        retimed = bool(self.chosen.retimed_ms and fp32.retimed_ms)
        claim = Claim(fp32.latency_ms / self.chosen.latency_ms,
                      faster_beyond_noise(self.chosen.retimed_ms, fp32.retimed_ms), retimed=retimed)
        return replace(self.versus, fp32=claim, fp32_trial=fp32.number)

    def uniform(self) -> dict[str, TrialRecord]:
        """The all-fp32 / all-fp16 / all-int8 trials, where the study has them."""
        return uniform_trials(self.trials)


def json_safe(value: Any) -> Any:
    """Strict JSON has no infinities: write them as "inf" / "-inf" (``float()`` reads them back)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def trial_json(trial: TrialRecord) -> dict[str, Any]:
    m = trial.measurement
    return {
        "trial": trial.number,
        "latency_ms": m.latency.to_json(),
        "final_latency_ms": trial.latency_ms,
        "retimed_ms": list(trial.retimed_ms),
        "latency_unstable": m.unstable,
        "retimes": m.retimes,
        "accuracy_loss": m.loss,
        "feasible": trial.feasible,
        "metrics": m.metrics,
        "seconds": m.seconds,
        "duplicate_of": trial.duplicate_of,
        "plan": trial.plan.to_json(),
        "build": m.build,
    }


def plan_ignored(trial: TrialRecord) -> bool:
    """The engine's build report says it did not run some unit at its planned precision."""
    fidelity = (trial.measurement.build or {}).get("plan_fidelity") or {}
    return bool(fidelity.get("plan_ignored"))


def recorded_profile(pareto: dict[str, Any]) -> ShapeProfile:
    """The shape profile a search recorded (an older result's: its one measured shape)."""
    if pareto["search"].get("profile"):
        return ShapeProfile.from_json(pareto["search"]["profile"])
    return ShapeProfile.fixed({name: spec["shape"] for name, spec in pareto["model"]["inputs"].items()})


def units_json(info: ModelInfo) -> tuple[dict[str, Any], ...]:
    return tuple(
        {"name": u.name, "op_type": u.op_type, "fused": list(u.nodes[1:]), "allowed": [p.value for p in u.allowed],
         "tied_to": u.tied_to}
        for u in info.units
    )


def write_results(result: SearchResult, deployment: Deployment | None) -> list[Path]:
    """Write every result file atomically; returns the paths written. The chosen plan's models
    (``deployment``'s) are self-contained in best/ (their weights in one data file both share where they
    are large)."""
    out = result.out_dir
    header = {"model": result.model.to_json(), "engine": result.engine.to_json(), "search": result.search}
    written = [
        atomic.write_json(
            out / "pareto.json",
            json_safe(
                {
                    "schema": PARETO_SCHEMA,
                    **header,
                    "front": [trial_json(t) for t in result.front],
                    "chosen": result.chosen.number if result.chosen else None,
                    **result.stated_versus().to_json(),
                    "uniform": {p: t.number for p, t in result.uniform().items()},
                }
            ),
        ),
        atomic.write_json(
            out / "trials.json",
            json_safe({"schema": PARETO_SCHEMA, **header, "trials": [trial_json(t) for t in result.trials]}),
        ),
    ]
    if result.chosen is not None and deployment is not None:
        best = out / "best"
        chosen_model, tensorrt_model = deployment.model, deployment.tensorrt_model
        files = {
            "model.onnx": f"lowered for {result.engine.backend} ({result.engine.qdq_form} Q/DQ form); "
            + (
                "the model that was measured, at its fixed input shapes"
                if deployment.fixed_because
                else "the measured plan on the source's input dims (dynamic ones kept), checked against the "
                "measured model at opt and against the given model across the profile"
            )
        }
        if tensorrt_model is not None:
            files["model.tensorrt.onnx"] = (
                "the same plan in TensorRT's Q/DQ form (signed symmetric, inputs only) for a strongly typed "
                "build; NOT measured here"
            )
        chosen = trial_json(result.chosen)
        plan_doc = {
            "schema": PLAN_SCHEMA,
            **header,
            **chosen,
            "units": [
                {**unit, "precision": result.chosen.plan[unit["name"]].value} for unit in result.units
            ],
            "files": files,
            "deployment": deployment.to_json(),
        }
        models = {best / "model.onnx": chosen_model}
        if tensorrt_model is not None:
            models[best / "model.tensorrt.onnx"] = tensorrt_model
        else:  # a resumed search may have chosen another plan: no stale artifact of the old one
            (best / "model.tensorrt.onnx").unlink(missing_ok=True)
        written += save_models(models, data=WEIGHTS_FILE, external=result.model.external_weights)
        if (best / WEIGHTS_FILE).is_file():
            files[WEIGHTS_FILE] = "the weights of the models beside it (ONNX external data): keep it with them"
        plan_doc["sha256"] = {path.name: model_sha256(path) for path in models}  # what check and export ship
        written.append(atomic.write_json(best / "plan.json", json_safe(plan_doc)))
    else:  # nothing chosen this time: an earlier run's best/ must not pass for this run's result
        _remove_best(out)
    return written


BEST_FILES = ("plan.json", "model.onnx", "model.tensorrt.onnx", WEIGHTS_FILE)
# A result folder's own: what the search writes and keeps there (see ResultFiles.owns).
OWN_FOLDERS = ("best", "cache", "artifacts", ".autoprec-locks")
OWN_FILES = ("pareto.json", "trials.json", "sensitivity.json", "study.db", "pareto.png", "layers.png",
             "sensitivity.png")


def _remove_best(out: Path) -> None:
    for name in BEST_FILES:
        (out / "best" / name).unlink(missing_ok=True)


def withdraw_result(out: Path) -> list[str]:
    """Remove an earlier run's result from ``out`` (pareto.json, trials.json, best/, the figures of them): for a
    run that began its trials there and stopped without a result of its own, which must not leave the earlier
    one passing for it. Returns the names removed."""
    found = [name for name in ("pareto.json", "trials.json", "pareto.png", "layers.png",
                               *(f"best/{b}" for b in BEST_FILES)) if (out / name).is_file()]
    for name in found:
        (out / name).unlink()
    return found


# What a trial decides, as the task metrics say (see autoprec.measure.accuracy): key, label, as a percentage.
DECISIONS = (
    ("equal", "values same"),
    ("top1", "top-1 same"),
    ("cer", "CER vs FP32"),
    ("map50", "mAP50 vs FP32"),
    ("nn_agreement", "NN same"),
    ("region_f", "text regions F vs FP32"),
    ("miou", "mIoU vs FP32"),
    ("top1_labels", "top-1 vs labels"),
    ("cer_labels", "CER vs labels"),
    ("map50_labels", "mAP50 vs labels"),
    ("region_f_labels", "text regions F vs labels"),
)


def decisions(metrics: dict[str, dict[str, Any]]) -> str:
    """The task metrics of one trial in a few words (each output's, named when there are several)."""
    parts = []
    for name, values in metrics.items():
        found = [f"{label} {float(values[key]):.1%}" for key, label in DECISIONS if key in values]
        if found:
            parts.append((f"{printable(name)}: " if len(metrics) > 1 else "") + ", ".join(found))
    return "; ".join(parts)


def load_json(path: Path) -> dict[str, Any]:
    """Read a result file (plain JSON; nothing is unpickled or executed)."""
    return json.loads(Path(path).read_text())


# --- the result files' structure, checked once on reading: plots, tables, report and exports can then
# index them without meeting a value of the wrong type (a hand-edited or damaged file is refused) ---

NUMBER = "a number"  # int or float, or "inf"/"-inf"/"nan" as json_safe writes them


@dataclass(frozen=True)
class Nullable:
    schema: Any


@dataclass(frozen=True)
class Optional_:
    schema: Any  # the key may be absent (older result files)


@dataclass(frozen=True)
class MapOf:
    schema: Any  # an object with any keys, each value of this schema


@dataclass(frozen=True)
class OneOf:
    values: tuple


PRECISION = OneOf(("int8", "fp16", "fp32"))
TIMING = {"median_ms": NUMBER, "p10_ms": NUMBER, "p90_ms": NUMBER, "runs": int, "warmup": int}
PLAN = {"calibration": str, "counts": {"int8": int, "fp16": int, "fp32": int}, "precisions": MapOf(PRECISION)}
TRIAL = {
    "trial": int, "latency_ms": TIMING, "final_latency_ms": NUMBER, "retimed_ms": [NUMBER], "latency_unstable": bool,
    "accuracy_loss": NUMBER, "feasible": bool, "metrics": MapOf(MapOf(NUMBER)), "duplicate_of": Nullable(int),
    "plan": PLAN, "build": Nullable(dict),
}
ENGINE = {
    "backend": str,
    "engine": str,
    "version": str,
    "provider": str,
    "device": str,
    "qdq_form": str,
    "measured": bool,
    "caveat": Optional_(str),
    "timing": Optional_(str),
}
MODEL = {"path": str, "sha256": str, "inputs": MapOf({"shape": [int], "dtype": str}),
         "outputs": MapOf({"shape": list, "dtype": str}), "units": int, "searchable_units": int, "preparation": [str],
         "weight_bytes": Optional_(int), "external_data": Optional_(bool)}
SHAPES = Nullable(MapOf([int]))
# pareto.json search.spec: the option groups of autoprec.app.specs as their to_json writes them
SPEC = {
    "inputs": {"model": str, "data": Nullable(str), "shapes": SHAPES, "min_shapes": SHAPES, "max_shapes": SHAPES,
               "constants": Nullable(MapOf(NUMBER)), "image_mean": [NUMBER], "image_std": [NUMBER],
               "image_order": Optional_(str), "image_scale": Optional_(NUMBER), "image_resize": Optional_(str)},
    "engine": {"backend": str, "device": int, "threads": int},
    "judge": {"metric": str, "max_loss": Nullable(NUMBER),
              "head": {"blank": int, "charset": Nullable([str]), "layout": Nullable(str), "conf": NUMBER, "iou": NUMBER,
                       "output": Nullable(str), "db_thresh": Optional_(NUMBER), "db_box_thresh": Optional_(NUMBER),
                       "image": Optional_(Nullable([int]))}},
    "space": {"search_space": Nullable(str), "overrides": [str], "precisions": Nullable([str]), "calibration": str,
              "tie_repeats": bool},
    "study": {"budget": int, "seed": int, "sampler": str, "storage": Nullable(str), "study_name": Nullable(str),
              "artifacts": Nullable(str), "heartbeat": int, "warm_start": bool, "early_reject": bool,
              "proposals": Nullable(int)},
    "isolation": {"isolate": bool, "trial_timeout": NUMBER, "trial_memory_gb": Nullable(NUMBER),
                  "build_workers": Nullable(int)},
}
SEARCH = {
    "spec": Optional_(SPEC),
    "run": Optional_(str),
    "rejected": Optional_(list),
    "tied_units": Optional_(int),
    "budget": int,
    "trials": int,
    "metric": str,
    "max_loss": Nullable(NUMBER),
    "seed": int,
    "calibration": str,
    "study_name": str,
    "storage": str,
    "data": str,
    "random_data": bool,
    "sampler": str,
    "wall_seconds": NUMBER,
    "batches": {"calibration": int, "evaluation": int},
    "image_norm": Optional_({"mean": [NUMBER], "std": [NUMBER], "order": Optional_(str), "scale": Optional_(NUMBER),
                             "resize": Optional_(str)}),
    "constants": Optional_(MapOf(NUMBER)),
    "out_of_range": Optional_([str]),
    "data_path": Optional_(Nullable(str)),
    "data_fingerprint": Optional_(str),
    "calibration_file": Optional_(Nullable(str)),
    "search_space": Optional_((dict, str)),
    "plan_ignored": Optional_([int]),
    "fp32_on_labels": Optional_(MapOf(MapOf(NUMBER))),
    "metric_notes": Optional_([str]),
    "limit_in_decisions": Optional_(Nullable(str)),
    "decision_changes": Optional_([str]),
    "metric_tasks": Optional_({"tasks": [str], "options": dict}),
    "held_out": Optional_({"batches": int, "max_loss": Nullable(NUMBER), "engine": str,
                           "judged": [{"trial": int, "loss": NUMBER}]}),
    "timing_drift": Optional_(Nullable({"plans": int, "largest_percent": NUMBER, "outside_trial_spread": int})),
    "engine_builds": Optional_(int),
    "engine_builds_by_phase": Optional_(MapOf(int)), "engine_builds_scope": Optional_(str),
    "reference_evaluations": Optional_(int),
    "reference": Optional_({"executor": str, "proposals_per_build": int}),
    "profile": Optional_(
        {"inputs": [{"name": str, "declared": [(int, str, type(None))], "min": [int], "opt": [int], "max": [int]}]}
    ),
    "profile_timing": Optional_(
        {
            "ms": MapOf({p: Nullable(NUMBER) for p in POINTS}),
            "feasible": [int],
            "fastest": MapOf(Nullable(int)),
            "across_range": Nullable(int),
            "how": str,
            "failed": Optional_(MapOf(str)),
        }
    ),
}
SPEEDUP = {
    "speedup": NUMBER,
    "beyond_timing_noise": Nullable(bool),
    "low": Optional_(NUMBER),
    "high": Optional_(NUMBER),
    "confidence": Optional_(NUMBER),
    "rounds": Optional_(int),
    "blocks": Optional_(Nullable(int)),
    "unsteady": Optional_(bool),
}
HEADER = {"schema": OneOf((PARETO_SCHEMA,)), "model": MODEL, "engine": ENGINE, "search": SEARCH}
PARETO = {**HEADER, "front": [TRIAL], "chosen": Nullable(int), "uniform": MapOf(int),
          "chosen_vs_fp32": Nullable({"fp32_trial": int, **SPEEDUP}),
          "chosen_vs_source": Optional_(Nullable({**SPEEDUP, "preparation": Optional_(SPEEDUP)})),
          "not_shipped": Optional_(Nullable({"trial": int, **SPEEDUP, "why": str})),
          "final_rivals": Optional_([{"trial": int, **SPEEDUP}]),
          "final_timing": Optional_(Nullable({"others_cores": Nullable([NUMBER]), "fp32_level_moved": NUMBER,
                                              "cores": int, "moved": bool}))}
TRIALS = {**HEADER, "trials": [TRIAL]}
DEPLOYMENT = {
    "keeps_source_dims": bool,
    "fixed_because": Nullable(str),
    "checked_against_source": [
        {
            "point": OneOf((*POINTS, "data")),
            "shapes": MapOf([int]),
            "same_output_shapes": bool,
            "cosine_loss": Nullable(NUMBER),
            "error": Nullable(str),
            "items": Optional_(int),
            "outside_profile": Optional_(bool),
        }
    ],
}
CHOSEN_PLAN = {**TRIAL, "schema": OneOf((PLAN_SCHEMA,)), "files": MapOf(str), "deployment": Optional_(DEPLOYMENT),
               "sha256": Optional_(MapOf(str)),
               "units": [{"name": str, "op_type": str, "fused": [str], "allowed": [PRECISION], "precision": PRECISION}]}
SENSITIVITY = {"engine": str, "batches": int, "evaluations": int, "seconds": NUMBER,
               "unattributed_share": Nullable(NUMBER), "units": [{"unit": str, "op_type": str, "share": Nullable(NUMBER),
                                                          "loss": MapOf(NUMBER), "gain": MapOf(NUMBER)}]}


def _problem(value: Any, schema: Any, where: str) -> str | None:
    """Where ``value`` departs from ``schema``, in words; None when it fits."""
    name = where or "the top level"
    if isinstance(schema, Optional_):
        return _problem(value, schema.schema, where)
    if isinstance(schema, Nullable):
        return None if value is None else _problem(value, schema.schema, where)
    if schema is NUMBER:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in ("inf", "-inf", "nan")
        return None if ok else f"{name} is {value!r:.60}, not a number"
    if isinstance(schema, OneOf):
        return (
            None
            if value in schema.values
            else f"{name} is {value!r:.60}, not one of {', '.join(map(str, schema.values))}"
        )
    if isinstance(schema, (type, tuple)):
        kinds = schema if isinstance(schema, tuple) else (schema,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        return None if ok else f"{name} is {value!r:.60}, not {' or '.join(k.__name__ for k in kinds)}"
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{name} is not a list"
        return next((p for i, item in enumerate(value) if (p := _problem(item, schema[0], f"{where}[{i}]"))), None)
    if isinstance(schema, MapOf):
        if not isinstance(value, dict):
            return f"{name} is not an object"
        return next((p for k, item in value.items() if (p := _problem(item, schema.schema, f"{where}.{k}"))), None)
    if not isinstance(value, dict):
        return f"{name} is not an object"
    for key, sub in schema.items():
        if key not in value:
            if not isinstance(sub, Optional_):
                return f"{where}.{key} is missing".lstrip(".")
            continue
        if (problem := _problem(value[key], sub, f"{where}.{key}".lstrip("."))) is not None:
            return problem
    return None


def validated(document: Any, schema: Any, path: Path) -> Any:
    """``document`` when it has the structure autoprec wrote; else one line naming the file and the field."""
    problem = _problem(document, schema, "")
    if problem is not None:
        raise AutoprecError(f"{path}: {problem}; it is not as autoprec wrote it (edited or damaged): rerun the search "
                            "to rewrite the result files")
    return document


@dataclass(frozen=True)
class ShownTrial:
    """A trial as every view shows it (terminal, report, plots): read from the result files once, so
    that no view indexes raw JSON. The final latency is the re-timing rounds' median when the trial was
    re-timed, else its own; the range behind it is those rounds' span, else its own p10–p90."""

    number: int
    final_ms: float
    rounds: tuple[float, ...]
    timing: Timing  # the trial's own timed runs
    loss: float
    counts: dict[str, int]
    precisions: dict[str, str]
    metrics: dict[str, dict[str, float]]
    unstable: bool

    @classmethod
    def from_json(cls, trial: dict[str, Any]) -> ShownTrial:
        return cls(trial["trial"], trial["final_latency_ms"], tuple(trial.get("retimed_ms") or ()),
                   Timing.from_json(trial["latency_ms"]), float(trial["accuracy_loss"]), trial["plan"]["counts"],
                   trial["plan"]["precisions"], trial["metrics"], bool(trial.get("latency_unstable")))

    @property
    def low_ms(self) -> float:
        return min(self.rounds) if self.rounds else self.timing.p10_ms

    @property
    def high_ms(self) -> float:
        return max(self.rounds) if self.rounds else self.timing.p90_ms

    def faster_beyond_noise_than(self, other: ShownTrial) -> bool | None:
        return faster_beyond_noise(self.rounds, other.rounds)

    @property
    def mix(self) -> str:
        return f"{self.counts['int8']}/{self.counts['fp16']}/{self.counts['fp32']}"


@dataclass(frozen=True)
class HowMeasured:
    """What a search recorded of how it measured (pareto.json's ``model`` and ``search``, or best/plan.json's
    header), read here once: enough to re-create its analysis exactly (:func:`autoprec.app.recorded.recreate`)
    and the option groups it was asked (``spec``; see :mod:`autoprec.app.specs`). A field an older result
    does not record is refused, naming it."""

    model_path: Path
    model_sha256: str
    shapes: dict[str, tuple[int, ...]]
    search_space: dict[str, Any] | str
    data_path: str | None
    data_fingerprint: str
    seed: int
    image: ImageOptions
    constants: dict[str, float]
    out_of_range: tuple[str, ...]
    calibration_file: str | None  # None: no INT8 was searched
    profile: ShapeProfile | None  # None: an older result, measured at one shape
    spec: dict[str, Any] | None  # None: a result written before the option groups were recorded
    backend: str
    metric: str
    max_loss: float | None

    @classmethod
    def from_record(cls, record: dict[str, Any], where: Path) -> HowMeasured:
        facts, model = record["search"], record["model"]

        def recorded(key: str, within: dict[str, Any], nullable: bool = False) -> Any:
            if key not in within or (within[key] is None and not nullable):
                raise AutoprecError(f"{where}: its result files do not record {key!r} (written by an older autoprec); "
                                    "rerun the search to re-create, check or export its plans")
            return within[key]

        path, sha256 = Path(recorded("path", model)), recorded("sha256", model)
        space, inputs = recorded("search_space", facts), recorded("inputs", model)
        fingerprint, seed = recorded("data_fingerprint", facts), recorded("seed", facts)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise AutoprecError(f"{where}: its recorded seed {seed!r} is not a whole number of 0 or more "
                                "(pareto.json damaged?); rerun the search")
        return cls(
            path, sha256, {name: tuple(spec["shape"]) for name, spec in inputs.items()}, space,
            facts.get("data_path"), fingerprint, seed, ImageOptions.from_json(facts.get("image_norm")),
            dict(facts.get("constants") or {}), tuple(facts.get("out_of_range", [])),
            recorded("calibration_file", facts, nullable=True),
            ShapeProfile.from_json(facts["profile"]) if facts.get("profile") else None, facts.get("spec"),
            record.get("engine", {}).get("backend", "ort-cpu"), facts.get("metric", "cosine"), facts.get("max_loss"),
        )


@dataclass(frozen=True)
class ResultFiles:
    """A result directory as written by a search: what plots, reports and comparisons read."""

    out_dir: Path
    pareto: dict[str, Any]
    trials: dict[str, Any]
    plan: dict[str, Any] | None
    sensitivity: dict[str, Any] | None = None  # sensitivity.json, when the search ran its sensitivity pass

    def trial(self, number: int) -> dict[str, Any] | None:
        return next((t for t in self.trials["trials"] if t["trial"] == number), None)

    def plan_of(self, number: int) -> Plan | None:
        """Trial ``number``'s plan (None: the study has no such finished trial)."""
        found = self.trial(number)
        return Plan.from_json(found["plan"]) if found else None

    @property
    def best_plan(self) -> tuple[Plan, int] | None:
        """best/'s plan and its trial (None: no plan was chosen)."""
        return (Plan.from_json(self.plan["plan"]), self.plan["trial"]) if self.plan else None

    def how_measured(self) -> HowMeasured:
        return HowMeasured.from_record(self.pareto, self.out_dir)

    @property
    def engine(self) -> EngineInfo:
        """The engine every trial of the result was measured on."""
        return EngineInfo.from_json(self.pareto["engine"])

    @property
    def model_path(self) -> Path:
        """The model the search was given."""
        return Path(self.pareto["model"]["path"])

    @property
    def chosen_number(self) -> int | None:
        return self.pareto["chosen"]

    def uniform_trial(self, precision: str) -> ShownTrial | None:
        """The all-``precision`` trial, where the study has one."""
        return self.shown_trial(self.pareto["uniform"].get(precision))

    @property
    def versus(self) -> Versus:
        """The chosen plan's speed-ups with their intervals, and the plan not shipped, if one was not."""
        return Versus.from_json(self.pareto)

    @property
    def model(self) -> ModelRecord:
        return ModelRecord.from_json(self.pareto["model"])

    @property
    def model_name(self) -> str:
        """What to call the model in titles: ``zoo:NAME`` as the user named it, else its file's name."""
        given = self.facts.given_model
        return given if given and given.startswith("zoo:") else self.model.path.name

    @property
    def facts(self) -> SearchFacts:
        """How the search ran, as a reader is shown it."""
        return SearchFacts.from_json(self.pareto["search"])

    @property
    def profile(self) -> ShapeProfile:
        """The shape profile the search recorded (see :func:`recorded_profile`)."""
        return recorded_profile(self.pareto)

    @property
    def chosen_units(self) -> list[ChosenUnit]:
        """The chosen plan's units in graph order (none where no plan was chosen)."""
        return [ChosenUnit.from_json(u) for u in self.plan["units"]] if self.plan else []

    @property
    def best_files(self) -> dict[str, str]:
        """best/'s files and what each is."""
        return dict(self.plan["files"]) if self.plan else {}

    def owns(self, path: str | Path) -> bool:
        """Whether ``path`` is (or would overwrite) one of the result's own files: what the search wrote, best/, its
        cache and study (a report or export written there would replace them)."""
        where, root = Path(path).resolve(), self.out_dir.resolve()
        if not where.is_relative_to(root) or where == root:
            return where == root
        parts = where.relative_to(root).parts
        return parts[0] in OWN_FOLDERS or (len(parts) == 1 and parts[0] in OWN_FILES)

    def check_shipped(self) -> None:
        """Every model best/ holds is the file the search wrote there (see :meth:`shipped_model`)."""
        for name in (self.plan or {}).get("sha256") or {"model.onnx": None}:
            self.shipped_model(name)

    def shipped_model(self, name: str = "model.onnx") -> Path:
        """best/``name`` checked to be the file the search wrote there (its sha256, external data included, against
        best/plan.json's record): what check passes and export ships is the model the result describes."""
        path = self.out_dir / "best" / name
        recorded = ((self.plan or {}).get("sha256") or {}).get(name)
        if self.plan is None:
            raise AutoprecError(f"{self.out_dir}: no chosen plan, so no best/{name}; see autoprec show {self.out_dir}")
        if recorded is None:
            raise AutoprecError(f"{self.out_dir / 'best' / 'plan.json'}: records no sha256 of best/{name} (written by "
                                "an older autoprec, or edited); rerun the search to check or export what it ships")
        if not path.is_file():
            raise AutoprecError(f"{path}: missing; the search wrote it beside best/plan.json: restore it, or rerun the "
                                "search")
        try:
            found = model_sha256(path)
        except Exception as exc:  # noqa: BLE001 - not an ONNX file any more (onnx raises several types)
            found = f"unreadable ({type(exc).__name__})"
        if found != recorded:
            raise AutoprecError(f"{path}: not the model the search wrote there (sha256 {found[:12]}…, recorded "
                                f"{recorded[:12]}…; replaced or changed, its weights included): restore it, or rerun "
                                "the search")
        return path

    @property
    def shipped_as(self) -> ShippedAs | None:
        """How best/model.onnx ships (None: no plan chosen, or a result older than the record of it)."""
        deployment = (self.plan or {}).get("deployment")
        return ShippedAs.from_json(deployment) if deployment else None

    def shown_front(self) -> list[ShownTrial]:
        return [ShownTrial.from_json(t) for t in self.pareto["front"]]

    def shown_chosen(self) -> ShownTrial | None:
        return next((t for t in self.shown_front() if t.number == self.chosen_number), None)

    def shown_trial(self, number: int | None) -> ShownTrial | None:
        found = self.trial(number) if number is not None else None
        return ShownTrial.from_json(found) if found else None

    def shown_trials(self) -> list[ShownTrial]:
        return [ShownTrial.from_json(t) for t in self.trials["trials"]]


def read_result_dir(out_dir: str | Path) -> ResultFiles:
    """Load a result directory, every file checked against the structure autoprec writes, or say
    plainly why it is not one: everything downstream reads result files through here."""
    out_dir = Path(out_dir)
    pareto_path = out_dir / "pareto.json"
    if not pareto_path.is_file():
        raise AutoprecError(f"{out_dir}: no pareto.json there; give the --out folder of a finished autoprec search")
    files = {"pareto": pareto_path, "trials": out_dir / "trials.json", "plan": out_dir / "best" / "plan.json",
             "sensitivity": out_dir / "sensitivity.json"}
    read: dict[str, Any] = {}
    for name, path in files.items():
        if name in ("plan", "sensitivity") and not path.is_file():
            read[name] = None
            continue
        try:
            read[name] = load_json(path)
        except (OSError, ValueError) as exc:
            raise AutoprecError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc}); rerun the search "
                                "to rewrite the result files") from None
    if isinstance(read["pareto"], dict) and read["pareto"].get("schema") != PARETO_SCHEMA:
        raise AutoprecError(
            f"{pareto_path}: schema {read['pareto'].get('schema')!r} is not {PARETO_SCHEMA!r}; rerun the search"
        )
    pareto = validated(read["pareto"], PARETO, pareto_path)
    trials = validated(read["trials"], TRIALS, files["trials"])
    plan = validated(read["plan"], CHOSEN_PLAN, files["plan"]) if read["plan"] is not None else None
    sensitivity = (
        validated(read["sensitivity"], SENSITIVITY, files["sensitivity"]) if read["sensitivity"] is not None else None
    )
    _check_consistent(out_dir, pareto, trials, plan)
    coherence.check(out_dir, pareto, trials, plan)
    return ResultFiles(out_dir, pareto, trials, plan, sensitivity)


def _check_consistent(out_dir: Path, pareto: dict, trials: dict, plan: dict | None) -> None:
    """The files agree with each other: the chosen trial is on the front, best/ is the chosen one, the
    uniform plans are trials, every front plan names the same units."""
    numbers = {t["trial"] for t in trials["trials"]}
    front = {t["trial"] for t in pareto["front"]}
    problem = None
    if pareto["chosen"] is not None and pareto["chosen"] not in front:
        problem = f"pareto.json chooses trial {pareto['chosen']}, which is not on its front"
    elif plan is not None and plan["trial"] != pareto["chosen"]:
        problem = (f"best/plan.json holds trial {plan['trial']}, but pareto.json chose {pareto['chosen']} "
                   "(best/ is from another run)")
    elif any(n not in numbers for n in pareto["uniform"].values()):
        problem = "pareto.json names a uniform plan that trials.json does not have"
    elif len({tuple(t["plan"]["precisions"]) for t in pareto["front"]}) > 1:
        problem = "the front's plans do not name the same units"
    if problem:
        raise AutoprecError(f"{out_dir}: {problem}; rerun the search to rewrite the result files")

"""The result directory: pareto.json, trials.json, best/plan.json, best/model.onnx — written
atomically.

JSON only (never pickle), so results can be read by anything and loaded without running code.
Non-finite numbers (an overflowed candidate's loss, an exact match's SNR) are written as the
strings "inf" and "-inf", which ``float()`` reads back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, NoReturn

from autoprec.analysis.images import ImageOptions
from autoprec.analysis.model import model_sha256
from autoprec.analysis.model_info import ModelInfo
from autoprec.core import atomic, untrusted
from autoprec.core.errors import AutoprecError
from autoprec.core.fields import Fields
from autoprec.core.plan import Plan
from autoprec.core.profile import ShapeProfile
from autoprec.core.stored import save_models
from autoprec.lower.int4 import valid_kernels
from autoprec.record.documents import (
    PARETO_SCHEMA,
    Header,
    ParetoFile,
    PlanFile,
    TrialsFile,
    sensitivity_of,
)
from autoprec.record.facts import Deployment, ModelRecord, SearchFacts, ShapePoint, ShippedAs
from autoprec.record.per_unit import ChosenUnit, Sensitivity
from autoprec.record.trial import EngineInfo, TrialRecord
from autoprec.record.verdict import Speedup, Versus
from autoprec.study.reading import uniform_trials

# best/'s weights, where they are kept beside its models (large, or given so)
WEIGHTS_FILE = "model.data"


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
    # The chosen plan's speed-ups with their intervals and the plan not shipped for want of a proven
    # gain, from the final timing (see autoprec.measure.speedup); empty where it did not run.
    versus: Versus = field(default_factory=Versus)

    def stated_versus(self) -> Versus:
        """The speed-ups the result states: the final timing's, else (where it failed) the chosen
        plan against all-FP32 from the re-timing's rounds."""
        fp32 = self.uniform().get("fp32")
        if self.versus != Versus() or fp32 is None or self.chosen is None:
            return self.versus
        claim = Speedup.from_retiming(fp32.latency_ms / self.chosen.latency_ms,
                                      self.chosen.retimed_ms, fp32.retimed_ms)
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


def plan_ignored(trial: TrialRecord) -> bool:
    """The engine's build report says it did not run some unit at its planned precision."""
    fidelity = (trial.measurement.build or {}).get("plan_fidelity") or {}
    return bool(fidelity.get("plan_ignored"))


def units_json(info: ModelInfo) -> tuple[dict[str, Any], ...]:
    return tuple(
        {"name": u.name, "op_type": u.op_type, "fused": list(u.nodes[1:]),
         "allowed": [p.value for p in u.allowed],
         "tied_to": u.tied_to}
        for u in info.units
    )


def model_record(info: ModelInfo) -> ModelRecord:
    """The model a search was given, as its result records it."""
    return ModelRecord(Path(info.path).resolve(), info.sha256,
                       {i.name: (list(i.shape), i.dtype) for i in info.inputs},
                       {o.name: (list(o.shape), o.dtype) for o in info.outputs}, len(info.units),
                       len(info.searchable_units), tuple(info.notes), info.stored.weight_bytes(),
                       info.external_data)


def write_results(result: SearchResult, deployment: Deployment | None) -> list[Path]:
    """Write every result file atomically; returns the paths written. The chosen plan's models
    (``deployment``'s) are self-contained in best/ (their weights in one data file both share where
    they are large)."""
    out = result.out_dir
    # as written: checked as every reader reads it
    recorded = json.loads(atomic.json_text(json_safe(result.search)))
    header = Header(result.model, result.engine,
                    SearchFacts.from_json(Fields(recorded, out / "pareto.json", "search")))
    pareto = ParetoFile(header, result.front, result.chosen.number if result.chosen else None,
                        result.stated_versus(),
                        {p: t.number for p, t in result.uniform().items()})
    written = [
        atomic.write_json(out / "pareto.json", json_safe(pareto.to_json())),
        atomic.write_json(out / "trials.json",
                          json_safe(TrialsFile(header, result.trials).to_json())),
    ]
    if result.chosen is not None and deployment is not None:
        best = out / "best"
        chosen_model, tensorrt_model = deployment.model, deployment.tensorrt_model
        files = {
            "model.onnx": f"lowered for {result.engine.backend} ({result.engine.qdq_form} Q/DQ "
                          "form); "
            + (
                "the model that was measured, at its fixed input shapes"
                if deployment.fixed_because
                else "the measured plan on the source's input dims (dynamic ones kept), checked "
                     "against the "
                "measured model at opt and against the given model across the profile"
            )
        }
        if tensorrt_model is not None:
            files["model.tensorrt.onnx"] = (
                "the same plan in TensorRT's Q/DQ form (signed symmetric, inputs only) for a "
                "strongly typed build; NOT measured here"
            )
        units = tuple(ChosenUnit(u["name"], u["op_type"], tuple(u["fused"]),
                                 result.chosen.plan[u["name"]].value,
                                 tuple(u["allowed"]), u["tied_to"]) for u in result.units)
        shipped = ShippedAs(deployment.fixed_because, tuple(deployment.checks),
                            deployment.fixed_because is None)
        models = {best / "model.onnx": chosen_model}
        if tensorrt_model is not None:
            models[best / "model.tensorrt.onnx"] = tensorrt_model
        else:  # a resumed search may have chosen another plan: no stale artifact of the old one
            (best / "model.tensorrt.onnx").unlink(missing_ok=True)
        written += save_models(models, data=WEIGHTS_FILE, external=result.model.external_weights)
        if (best / WEIGHTS_FILE).is_file():
            files[WEIGHTS_FILE] = "the weights of the models beside it (ONNX external data): keep it with them"
        sha256 = {path.name: model_sha256(path) for path in models}  # what check and export ship
        plan = PlanFile(header, result.chosen, units, files, shipped, sha256)
        written.append(atomic.write_json(best / "plan.json", json_safe(plan.to_json())))
    else:  # nothing chosen this time: an earlier run's best/ must not pass for this run's result
        _remove_best(out)
    return written


BEST_FILES = ("plan.json", "model.onnx", "model.tensorrt.onnx", WEIGHTS_FILE)
# A result folder's own: what the search writes and keeps there (see ResultFiles.owns).
OWN_FOLDERS = ("best", "cache", "artifacts", ".autoprec-locks")
OWN_FILES = ("pareto.json", "trials.json", "sensitivity.json", "study.db", "study.db-wal", "study.db-shm",
             "pareto.png", "layers.png", "sensitivity.png")


def result_owns(out_dir: Path, path: str | Path) -> bool:
    """Whether ``path`` is (or would overwrite) one of the files a search writes in ``out_dir``:
    pareto.json and the others, best/, its cache and study (or the folder itself)."""
    where, root = Path(path).resolve(), Path(out_dir).resolve()
    if not where.is_relative_to(root) or where == root:
        return where == root
    parts = where.relative_to(root).parts
    return parts[0] in OWN_FOLDERS or (len(parts) == 1 and parts[0] in OWN_FILES)


def _remove_best(out: Path) -> None:
    for name in BEST_FILES:
        (out / "best" / name).unlink(missing_ok=True)


def withdraw_result(out: Path) -> list[str]:
    """Remove an earlier run's result from ``out`` (pareto.json, trials.json, best/, the figures of
    them): for a run that began its trials there and stopped without a result of its own, which must
    not leave the earlier one passing for it. Returns the names removed."""
    found = [name for name in ("pareto.json", "trials.json", "pareto.png", "layers.png",
                               *(f"best/{b}" for b in BEST_FILES)) if (out / name).is_file()]
    for name in found:
        (out / name).unlink()
    return found


def load_json(path: Path) -> dict[str, Any]:
    """Read a result file (plain JSON; nothing is unpickled or executed): a regular file of the
    folder it lies in, bounded in size and nesting (see :mod:`autoprec.core.untrusted`)."""
    return untrusted.read_json(Path(path), f"the folder {Path(path).parent}")


# --- one typed value per result file, whose from_json checks what it reads (autoprec.core.fields): plots, tables,
# report and exports read these, never the JSON, and a hand-edited or damaged file is refused in one
# line ---


def _read(path: Path, reader: Callable[[Fields], Any]) -> Any:
    """The file read into its typed value (checked as it is read)."""
    try:
        document = load_json(path)
    except (OSError, ValueError) as exc:
        raise AutoprecError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc}); "
                            "rerun the search to rewrite the result files") from None
    return reader(Fields(document, path))


def _in_cache(name: str) -> bool:
    """A recorded file name that stays in the result's cache/ (no absolute path, no '..')."""
    path = PurePosixPath(name)
    return path.parts[:1] == ("cache",) and ".." not in path.parts


@dataclass(frozen=True)
class HowMeasured:
    """What a search recorded of how it measured (pareto.json's ``model`` and ``search``, or
    best/plan.json's header), read here once: enough to re-create its analysis exactly
    (:func:`autoprec.app.recorded.recreate`) and the option groups it was asked (``spec``; see
    :mod:`autoprec.app.specs`). A field an older result does not record is refused, naming it."""

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
    # the shapes every trial was judged at (None: an older one)
    judged_shapes: tuple[ShapePoint, ...] | None = None
    # the MatMulNBits kernel INT4 units took (autoprec.measure.int4_kernels; None: none measured)
    int4_kernels: dict[str, Any] | None = None

    @classmethod
    def of(cls, header: Header, where: Path) -> HowMeasured:
        facts, search = header.search.recorded, header.search

        def recorded(key: str, nullable: bool = False) -> Any:
            if key not in facts or (facts[key] is None and not nullable):
                raise AutoprecError(f"{where}: its result files do not record {key!r} (written by "
                                    "an older autoprec); rerun the search to re-create, check or "
                                    "export its plans")
            return facts[key]

        space, fingerprint = recorded("search_space"), recorded("data_fingerprint")
        calibration = recorded("calibration_file", nullable=True)
        if calibration is not None and not _in_cache(calibration):
            raise AutoprecError(f"{where}: its recorded calibration_file {calibration!r} lies "
                                "outside its cache/ (pareto.json damaged?); rerun the search")
        if search.seed < 0:
            raise AutoprecError(f"{where}: its recorded seed {search.seed!r} is not a whole number "
                                "of 0 or more (pareto.json damaged?); rerun the search")
        model = header.model
        return cls(
            model.path, model.sha256,
            {name: tuple(shape) for name, (shape, _) in model.inputs.items()}, space,
            facts.get("data_path"), fingerprint, search.seed,
            ImageOptions.from_json(facts.get("image_norm")),
            dict(facts.get("constants") or {}), tuple(facts.get("out_of_range", [])),
            calibration, search.profile, facts.get("spec"), header.engine.backend,
            search.metric, search.max_loss, search.judged_shapes,
            valid_kernels(facts.get("int4_kernels")),
        )


@dataclass(frozen=True)
class ResultFiles:
    """A result directory as written by a search, each file its typed value: what plots, reports and
    comparisons read."""

    out_dir: Path
    pareto: ParetoFile
    trials: TrialsFile
    plan: PlanFile | None
    # sensitivity.json, when the search ran its sensitivity pass
    sensitivity: Sensitivity | None = None

    def trial(self, number: int | None) -> TrialRecord | None:
        """Trial ``number`` (None: the study has no such finished trial)."""
        return next((t for t in self.trials.trials if t.number == number), None)

    def plan_of(self, number: int) -> Plan | None:
        """Trial ``number``'s plan (None: the study has no such finished trial)."""
        found = self.trial(number)
        return found.plan if found else None

    @property
    def best_plan(self) -> tuple[Plan, int] | None:
        """best/'s plan and its trial (None: no plan was chosen)."""
        return (self.plan.trial.plan, self.plan.trial.number) if self.plan else None

    def how_measured(self) -> HowMeasured:
        return HowMeasured.of(self.pareto.header, self.out_dir)

    @property
    def engine(self) -> EngineInfo:
        """The engine every trial of the result was measured on."""
        return self.pareto.header.engine

    @property
    def model_path(self) -> Path:
        """The model the search was given."""
        return self.model.path

    @property
    def chosen_number(self) -> int | None:
        return self.pareto.chosen

    def uniform_trial(self, precision: str) -> TrialRecord | None:
        """The all-``precision`` trial, where the study has one."""
        return self.trial(self.pareto.uniform.get(precision))

    @property
    def versus(self) -> Versus:
        """The chosen plan's speed-ups with their intervals, and the plan not shipped, if one was
        not."""
        return self.pareto.versus

    @property
    def model(self) -> ModelRecord:
        return self.pareto.header.model

    @property
    def model_name(self) -> str:
        """What to call the model in titles: ``zoo:NAME`` as the user named it, else its file's
        name."""
        given = self.facts.given_model
        return given if given and given.startswith("zoo:") else self.model.path.name

    @property
    def facts(self) -> SearchFacts:
        """How the search ran, as a reader is shown it."""
        return self.pareto.header.search

    @property
    def profile(self) -> ShapeProfile:
        """The shape profile the search recorded (an older result's: its one measured shape)."""
        return self.facts.profile or ShapeProfile.fixed({name: shape for name, (shape, _) in self.model.inputs.items()})

    @property
    def chosen_units(self) -> list[ChosenUnit]:
        """The chosen plan's units in graph order (none where no plan was chosen)."""
        return list(self.plan.units) if self.plan else []

    @property
    def best_files(self) -> dict[str, str]:
        """best/'s files and what each is."""
        return dict(self.plan.files) if self.plan else {}

    def owns(self, path: str | Path) -> bool:
        """Whether ``path`` is (or would overwrite) one of the result's own files (see
        :func:`result_owns`)."""
        return result_owns(self.out_dir, path)

    def check_shipped(self) -> None:
        """Every model best/ holds is the file the search wrote there (see
        :meth:`shipped_model`)."""
        for name in (self.plan.sha256 if self.plan else None) or {"model.onnx": None}:
            self.shipped_model(name)

    def shipped_model(self, name: str = "model.onnx") -> Path:
        """best/``name`` checked to be the file the search wrote there (its sha256, external data
        included, against best/plan.json's record): what check passes and export ships is the model
        the result describes."""
        path = self.out_dir / "best" / name
        recorded = ((self.plan.sha256 if self.plan else None) or {}).get(name)
        if self.plan is None:
            raise AutoprecError(f"{self.out_dir}: no chosen plan, so no best/{name}; see autoprec "
                                f"show {self.out_dir}")
        if recorded is None:
            raise AutoprecError(f"{self.out_dir / 'best' / 'plan.json'}: records no sha256 of "
                                f"best/{name} (written by an older autoprec, or edited); rerun the "
                                "search to check or export what it ships")
        if not path.is_file():
            raise AutoprecError(f"{path}: missing; the search wrote it beside best/plan.json: "
                                "restore it, or rerun the search")
        try:
            found = model_sha256(path)
        except AutoprecError:  # its external data is not where a model's may be: said as it is
            raise
        except Exception as exc:  # noqa: BLE001 - not an ONNX file any more (onnx raises several types)
            found = f"unreadable ({type(exc).__name__})"
        if found != recorded:
            raise AutoprecError(f"{path}: not the model the search wrote there (sha256 "
                                f"{found[:12]}…, recorded {recorded[:12]}…; replaced or changed, "
                                "its weights included): restore it, or rerun the search")
        return path

    @property
    def shipped_as(self) -> ShippedAs | None:
        """How best/model.onnx ships (None: no plan chosen, or a result older than the record of
        it)."""
        return self.plan.deployment if self.plan else None

    def shown_front(self) -> list[TrialRecord]:
        return list(self.pareto.front)

    def shown_chosen(self) -> TrialRecord | None:
        return next((t for t in self.pareto.front if t.number == self.chosen_number), None)

    def shown_trial(self, number: int | None) -> TrialRecord | None:
        return self.trial(number)

    def shown_trials(self) -> list[TrialRecord]:
        return list(self.trials.trials)


def read_plan_file(plan: Path, document: dict[str, Any], model: Path | None = None) -> ResultFiles:
    """A result's best/plan.json read on its own (MODEL + --plan), checked: the result as far as it
    records it, its model at ``model`` where given (re-creation checks it against the recorded
    sha256)."""
    found = PlanFile.from_json(Fields(document, plan))
    header = found.header if model is None else replace(found.header,
                                                        model=replace(found.header.model, path=model))
    pareto = ParetoFile(header, (), found.trial.number, Versus(), {})
    untrusted.distrust(plan.resolve().parent.parent)
    return ResultFiles(plan.resolve().parent.parent, pareto, TrialsFile(header, ()),
                       replace(found, header=header))


def read_result_dir(out_dir: str | Path) -> ResultFiles:
    """Load a result directory, every file checked as it is read into its typed value, or say
    plainly why it is not one: everything downstream reads result files through here."""
    out_dir = Path(out_dir)
    pareto_path = out_dir / "pareto.json"
    what = f"the result folder {out_dir}"
    untrusted.checked_tree(out_dir, (*OWN_FOLDERS, *OWN_FILES, "export"), what)
    untrusted.distrust(out_dir)
    if not pareto_path.is_file():
        raise AutoprecError(f"{out_dir}: no pareto.json there; give the --out folder of a finished "
                            "autoprec search")
    try:
        schema = load_json(pareto_path).get("schema")
    except (OSError, ValueError, AttributeError):
        schema = PARETO_SCHEMA  # said as the file is read below
    if schema != PARETO_SCHEMA:
        newer = isinstance(schema, str) and schema.startswith("autoprec.pareto/") and schema > PARETO_SCHEMA
        raise AutoprecError(f"{pareto_path}: schema {schema!r} is not {PARETO_SCHEMA!r}; "
                            + ("written by a newer autoprec: upgrade it (pip install -U autoprec) "
                               "to read this result"
                               if newer else "rerun the search"))
    pareto = _read(pareto_path, ParetoFile.from_json)
    trials = _read(out_dir / "trials.json", TrialsFile.from_json)
    plan = _read(out_dir / "best" / "plan.json", PlanFile.from_json) if (out_dir / "best" / "plan.json").is_file() else None
    sensitivity = (_read(out_dir / "sensitivity.json", sensitivity_of)
                   if (out_dir / "sensitivity.json").is_file() else None)
    result = ResultFiles(out_dir, pareto, trials, plan, sensitivity)
    _check_coherent(result)
    return result


def _check_coherent(result: ResultFiles) -> None:
    """The files agree with each other (each file's own figures were checked as it was read): one
    run's, the front and best/ trials.json's very trials, the chosen trial on the front and within
    the limit, the uniform plans and every claim's trial the study's."""
    out, pareto, plan = result.out_dir, result.pareto, result.plan
    by_number = {t.number: t for t in result.trials.trials}

    def refuse(file: str, problem: str) -> NoReturn:
        Fields(None, out / file).refuse(problem)

    if pareto.header.search.trials != len(by_number):
        refuse("pareto.json", f"search.trials says {pareto.header.search.trials}, but trials.json "
                              f"holds {len(by_number)} trial(s)")
    if (differs := _run_differs(result.trials.header, pareto.header)) is not None:
        refuse("trials.json", differs)
    for trial in pareto.front:
        _same_trial(trial, by_number, lambda problem: refuse("pareto.json", "front trial "
                                                                            f"{trial.number}{problem}"))
    front = {t.number for t in pareto.front}
    if pareto.chosen is not None and pareto.chosen not in front:
        refuse("pareto.json", f"it chooses trial {pareto.chosen}, which is not on its front")
    if pareto.chosen is not None and not by_number[pareto.chosen].feasible:
        refuse("pareto.json", f"chosen trial {pareto.chosen} is not within --max-loss (loss "
                              f"{by_number[pareto.chosen].loss:g}), yet the chosen plan is the "
                              "fastest within it")
    for precision, number in pareto.uniform.items():
        if number not in by_number:
            refuse("pareto.json", f"uniform.{precision} names trial {number}, which trials.json "
                                  "lacks")
        if by_number[number].plan.counts().get(precision) != len(by_number[number].plan.precisions):
            refuse("pareto.json", f"uniform.{precision} names trial {number}, whose plan is not "
                                  f"all {precision}")
    for where, number in _claimed_trials(pareto):
        if number not in by_number:
            refuse("pareto.json", f"{where} names trial {number}, which trials.json lacks")
    if len({tuple(t.precisions) for t in pareto.front}) > 1:
        refuse("pareto.json", "the front's plans do not name the same units")
    if plan is not None:
        _check_best(plan, pareto, by_number, lambda problem: refuse("best/plan.json", problem))


def _check_best(plan: PlanFile, pareto: ParetoFile, by_number: dict[int, TrialRecord],
                refuse: Callable[[str], NoReturn]) -> None:
    """best/plan.json is the chosen trial of this very run."""
    if (differs := _run_differs(plan.header, pareto.header)) is not None:
        refuse(differs)
    if plan.trial.number != pareto.chosen:
        refuse(f"it holds trial {plan.trial.number}, but pareto.json chose {pareto.chosen} (best/ "
               "is from another run)")
    _same_trial(plan.trial, by_number, lambda problem: refuse(f"trial "
                                                              f"{plan.trial.number}{problem}"))


def _run_differs(header: Header, other: Header) -> str | None:
    """How a result file is not of pareto.json's search (``other``): another run (an older result's
    files record none: None) or model, or another limit (what each trial's feasible is judged by)."""
    if (header.search.run, header.model.sha256) != (other.search.run, other.model.sha256):
        return "it is of another run than pareto.json (their search.run or model differ)"
    if header.search.max_loss != other.search.max_loss:
        return (f"its search.max_loss {header.search.max_loss} is not pareto.json's "
                f"{other.search.max_loss}, by which each trial's feasible is judged")
    return None


def _same_trial(entry: TrialRecord, by_number: dict[int, TrialRecord],
                refuse: Callable[[str], NoReturn]) -> None:
    """``entry`` (a front member, best/plan.json's) is trials.json's trial of its number, field for
    field."""
    theirs = by_number.get(entry.number)
    if theirs is None:
        refuse(" is not in trials.json")
    ours, recorded = entry.to_json(), theirs.to_json()
    differs = [key for key in recorded if not _same(ours.get(key), recorded[key])]
    if differs:
        refuse(f": its {', '.join(differs[:3])} {'differs' if len(differs) == 1 else 'differ'} "
               f"from trial {entry.number}'s in trials.json (the figures are that plan's, as "
               "measured)")


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, NaN equal to NaN (a metric may be undefined on every plan alike)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _claimed_trials(pareto: ParetoFile) -> list[tuple[str, int]]:
    """Every trial pareto.json's claims and search facts name, with where it names it."""
    versus, held_out = pareto.versus, pareto.header.search.held_out
    named = [("chosen_vs_fp32", versus.fp32_trial)] if versus.fp32_trial is not None else []
    if versus.not_shipped is not None:
        named.append(("not_shipped", versus.not_shipped.trial))
    named += [(f"final_rivals[{i}]", rival.trial) for i, rival in enumerate(versus.rivals)]
    named += [("search.held_out", trial) for trial in (held_out.losses if held_out else ())]
    return named

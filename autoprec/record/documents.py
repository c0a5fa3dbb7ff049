"""The result files as typed values, each writing and reading its own JSON, checked field by field
as it reads (:mod:`autoprec.core.fields`): a hand-edited or damaged file is refused in one line.
pareto.json, trials.json and best/plan.json begin with one header (the model, the engine, the
search's facts); sensitivity.json is the pass's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoprec.core.fields import Fields
from autoprec.record.facts import ModelRecord, SearchFacts, ShippedAs
from autoprec.record.per_unit import ChosenUnit, Sensitivity
from autoprec.record.trial import EngineInfo, TrialRecord
from autoprec.record.verdict import Versus

PARETO_SCHEMA = "autoprec.pareto/1"


PLAN_SCHEMA = "autoprec.plan/1"


def engine_of(f: Fields) -> EngineInfo:
    for key in ("backend", "engine", "version", "provider", "device", "qdq_form"):
        f[key].text()
    f["measured"].flag()
    for key in ("caveat", "timing"):
        if (found := f.get(key)) is not None:
            found.text()
    return EngineInfo.from_json(f.value)


@dataclass(frozen=True)
class Header:
    """What every result file begins with: the model, the engine, the search's record."""

    model: ModelRecord
    engine: EngineInfo
    search: SearchFacts

    @classmethod
    def from_json(cls, f: Fields) -> Header:
        return cls(ModelRecord.from_json(f["model"]), engine_of(f["engine"]),
                   SearchFacts.from_json(f["search"]))

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model.to_json(), "engine": self.engine.to_json(),
                "search": self.search.to_json()}


def _schema(f: Fields, schema: str) -> None:
    f["schema"].one_of((schema,))


def _trials(header: Header, found: list[Fields]) -> tuple[TrialRecord, ...]:
    """Trials as their file has them, each held to the search's limit and metric (see
    :meth:`TrialRecord.checked_against`)."""
    facts = header.search
    labels = facts.metric.endswith("@labels")
    return tuple(TrialRecord.from_json(f).checked_against(f, facts.max_loss, labels) for f in found)


@dataclass(frozen=True)
class TrialsFile:
    """trials.json: every finished trial of the study."""

    header: Header
    trials: tuple[TrialRecord, ...]

    @classmethod
    def from_json(cls, f: Fields) -> TrialsFile:
        _schema(f, PARETO_SCHEMA)
        header = Header.from_json(f)
        trials = _trials(header, f["trials"].items())
        if len({t.number for t in trials}) != len(trials):
            f.refuse("a trial number appears twice")
        return cls(header, trials)

    def to_json(self) -> dict[str, Any]:
        return {"schema": PARETO_SCHEMA, **self.header.to_json(),
                "trials": [t.to_json() for t in self.trials]}


@dataclass(frozen=True)
class ParetoFile:
    """pareto.json: the Pareto front, the chosen trial, its speed-ups and the uniform plans'
    trials."""

    header: Header
    front: tuple[TrialRecord, ...]
    chosen: int | None
    versus: Versus
    uniform: dict[str, int]

    @classmethod
    def from_json(cls, f: Fields) -> ParetoFile:
        _schema(f, PARETO_SCHEMA)
        header = Header.from_json(f)
        chosen, versus = f["chosen"].nullable(), Versus.from_json(f)
        uniform = {precision: number.integer() for precision, number in f["uniform"].mapping().items()}
        if versus.fp32 is not None and uniform.get("fp32", versus.fp32_trial) != versus.fp32_trial:
            f.refuse(f"chosen_vs_fp32 is against trial {versus.fp32_trial}, but uniform.fp32 names "
                     f"the all-FP32 trial {uniform['fp32']}")
        return cls(header, _trials(header, f["front"].items()),
                   chosen.integer() if chosen else None, versus, uniform)

    def to_json(self) -> dict[str, Any]:
        return {"schema": PARETO_SCHEMA, **self.header.to_json(),
                "front": [t.to_json() for t in self.front],
                "chosen": self.chosen, **self.versus.to_json(), "uniform": self.uniform}


@dataclass(frozen=True)
class PlanFile:
    """best/plan.json: the chosen trial, its units, best/'s files and how its model ships."""

    header: Header
    trial: TrialRecord
    units: tuple[ChosenUnit, ...]
    files: dict[str, str]
    deployment: ShippedAs | None  # None: a result older than the record of it
    # best/'s models' sha256 (None: a result older than the record of them)
    sha256: dict[str, str] | None

    @classmethod
    def from_json(cls, f: Fields) -> PlanFile:
        _schema(f, PLAN_SCHEMA)
        deployment, sha256 = f.get("deployment"), f.get("sha256")
        header = Header.from_json(f)
        found = cls(header, _trials(header, [f])[0],
                    tuple(map(ChosenUnit.from_json, f["units"].items())),
                    {name: what.text() for name, what in f["files"].mapping().items()},
                    ShippedAs.from_json(deployment) if deployment else None,
                    {name: digest.text() for name, digest in sha256.mapping().items()} if sha256 else None)
        found._check_units(f)
        return found

    def _check_units(self, f: Fields) -> None:
        """Its unit table is its trial's plan, unit for unit."""
        precisions = self.trial.precisions
        units = {u.name: u.precision for u in self.units}
        if set(units) != set(precisions):
            f.refuse("its units are not the units its plan names")
        wrong = [name for name, precision in units.items() if precisions[name] != precision]
        if wrong:
            f.refuse(f"unit {wrong[0]} is {units[wrong[0]]} in its unit table but "
                     f"{precisions[wrong[0]]} in its plan")

    def to_json(self) -> dict[str, Any]:
        return {"schema": PLAN_SCHEMA, **self.header.to_json(), **self.trial.to_json(),
                "units": [u.to_json() for u in self.units], "files": self.files,
                **({"deployment": self.deployment.to_json()} if self.deployment else {}),
                **({"sha256": self.sha256} if self.sha256 is not None else {})}


def sensitivity_of(f: Fields) -> Sensitivity:
    """sensitivity.json (see :class:`autoprec.study.sensitivity.Sensitivity`), checked: its figures can
    be true (shares of FP32's time within 0-1, a gain at most the whole time, a loss a number)."""
    f["engine"].text(), f["batches"].integer(), f["evaluations"].integer(), f["seconds"].number()
    if (share := f["unattributed_share"].nullable()) is not None:
        _share(share)
    for unit in f["units"].items():
        unit["unit"].text(), unit["op_type"].text()
        if (share := unit["share"].nullable()) is not None:
            _share(share)
        for precision, value in unit["loss"].mapping().items():
            if math.isnan(value.number()):
                value.refuse(f"{value.path} is nan, not a loss")
        for precision, value in unit["gain"].mapping().items():
            if not value.number() <= 1:
                value.refuse(f"{value.path} is {value.value!r}, not a share of FP32's time saved (at most 1)")
    return Sensitivity.from_json(f.value)


def _share(f: Fields) -> float:
    share = f.number()
    if not 0 <= share <= 1:
        f.refuse(f"{f.path} is {f.value!r}, not a share of FP32's time (0 to 1)")
    return share

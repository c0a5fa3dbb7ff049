"""Builds spent where they decide: plans proposed and judged before any is built on the target.

Before each build the proposer lets a second Optuna study (beside the search's, in the same
storage, so a killed search resumes it) propose ``per_build`` plans; each is lowered in the
target's form and its loss computed by the reference executor (ONNX Runtime on the CPU running
that same explicit-precision graph), its latency predicted by the :class:`LatencyModel`. Of the
plans proposed so far and not built, the one that decides most is built next: the fastest
predicted within ``--max-loss``, or without a limit, the one whose predicted point adds most to
the measured front's hypervolume. The front and the choice stay on measured numbers.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping

import optuna
from optuna.trial import TrialState

from autoprec.core.plan import Plan
from autoprec.measure.measurers import Measuring
from autoprec.record.per_unit import Sensitivity
from autoprec.record.trial import Features
from autoprec.study.joining import Joined
from autoprec.study.latency_model import LatencyModel, median_error_percent
from autoprec.study.opening import make_sampler, open_study
from autoprec.study.optimize import StudyContext, distributions, plan_from_params, planned_params
from autoprec.study.reading import built_trials, finished_records, record, uniform_trials

log = logging.getLogger("autoprec")

# Without --max-loss the proposer, like benchmarks/search_quality.py, scores a front by its
# hypervolume in latency / FP32 latency and loss / LOSS_SCALE (capped at 1), against
# REFERENCE_POINT.
REFERENCE_POINT = (1.5, 1.0)
LOSS_SCALE = 0.05


def hypervolume(points: list[tuple[float, float]], reference: tuple[float, float] = REFERENCE_POINT) -> float:
    """The area two minimised objectives dominate below ``reference`` (2-D: a sweep)."""
    inside = sorted((x, y) for x, y in points if x < reference[0] and y < reference[1])
    area, ceiling = 0.0, reference[1]
    for x, y in inside:
        if y < ceiling:
            area += (reference[0] - x) * (ceiling - y)
            ceiling = y
    return area


def front_hypervolume(points: list[tuple[float, float]], fp32_ms: float) -> float:
    """The hypervolume of (latency ms, loss) points, normalised by the all-FP32 latency and
    LOSS_SCALE."""
    return hypervolume([(ms / fp32_ms, min(loss / LOSS_SCALE, 1.0)) for ms, loss in points])


@dataclass
class Proposer:
    """``reference_loss``: a lowered plan's loss on the reference executor, as ``--max-loss``
    constrains it."""

    ctx: StudyContext
    reference: optuna.Study
    reference_loss: Callable[[Plan], float]  # lowered and judged on the reference executor
    # the sensitivity's: unit -> precision -> FP32 time saved
    gains: Mapping[str, Mapping[str, float]]
    per_build: int
    model: LatencyModel | None = None  # made once the all-FP32 plan is measured
    _features: dict[str, Features] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        storage: str | optuna.storages.BaseStorage,
        study_name: str,
        identity: dict,
        seed: int,
        ctx: StudyContext,
        reference_loss: Callable[[Plan], float],
        gains: Mapping[str, Mapping[str, float]],
        per_build: int,
    ) -> Proposer:
        """The reference study beside the search's, in its storage (a resumed search keeps its
        proposals)."""
        reference = open_study(storage, f"{study_name}/reference", identity,
                               make_sampler("tpe", seed))
        return cls(ctx, reference, reference_loss, gains, per_build)

    def features(self, plan: Plan) -> Features:
        """What the latency model reads of a plan: its lowered graph's conversions (lowering edits
        the graph alone, in milliseconds) and its units' profiled savings."""
        key = plan.key()
        if key not in self._features:
            lowered = self.ctx.backend.lower(self.ctx.info, plan, self.ctx.ranges)
            self._features[key] = self.model.features(plan, lowered.proto, self.ctx.info.model)
        return self._features[key]

    def _fit(self, study: optuna.Study) -> list | None:
        """The latency model refitted on every trial of ``study`` measured so far (those trials);
        None until the all-FP32 plan is measured (the model starts from its latency)."""
        built = finished_records(study)
        fp32 = uniform_trials(built).get("fp32")
        if fp32 is None:
            return None
        if self.model is None:
            self.model = LatencyModel(fp32.latency_ms, self.gains)
        self.model.refit([(self.features(r.plan), r.latency_ms) for r in built if r.duplicate_of is None])
        return built

    def __call__(self, study: optuna.Study) -> tuple[dict[str, str], dict] | None:
        """The next plan to build (its parameters and what was predicted of it), or None where no
        proposal is left that was not built (the sampler of ``study`` then proposes as before)."""
        built = self._fit(study)
        if built is None:
            return None
        tried = {t.user_attrs.get("plan_key") for t in study.get_trials(deepcopy=False)}
        for _ in range(self.per_build):
            self._propose()
        candidates = []
        for trial in self.reference.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            key = trial.user_attrs.get("plan_key")
            if key in tried or not math.isfinite(trial.user_attrs.get("reference_loss", math.inf)):
                continue
            tried.add(key)
            predicted = self.model.predict(Features.from_json(trial.user_attrs["features"]))
            candidates.append((predicted, trial.user_attrs["reference_loss"], trial))
        best = self._decides_most(candidates, built)
        if best is None:
            return None
        predicted, loss, trial = best
        return dict(trial.params), {"predicted_ms": predicted, "reference_loss": loss}

    def _propose(self) -> None:
        """One plan from the reference study's sampler, judged by the reference executor (once per
        plan)."""
        trial = self.reference.ask(distributions(self.ctx.info, self.ctx.calibration))
        attrs, values, constraints = self._judged(trial.params)
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        for name, value in constraints.items():
            trial.set_constraint(name, value)
        self.reference.tell(trial, values)

    def judge(self, study: optuna.Study, params: dict[str, str]) -> tuple[float, float] | None:
        """A plan's predicted latency (ms) and reference loss, judged as any proposal is and kept as
        one (built later where it decides most); None until the all-FP32 plan of ``study`` is
        measured."""
        if self._fit(study) is None:
            return None
        attrs, values, constraints = self._judged(params)
        # not judged before: kept in the reference study like a sampled proposal
        if "evaluated" in attrs:
            dists = distributions(self.ctx.info, self.ctx.calibration)
            self.reference.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: dists[k] for k in params}, values=values,
                user_attrs=attrs,
                constraints=constraints or None))
        return values[0], attrs["reference_loss"]

    def _judged(self, params: dict[str, str]) -> tuple[dict, list[float], dict[str, float]]:
        """A plan's user attributes, objective values (predicted ms, loss) and constraint, by the
        reference executor and the latency model; a plan judged before is not evaluated again."""
        plan = plan_from_params(self.ctx.info, params, self.ctx.calibration)
        key = plan.key()
        earlier = next((t for t in self.reference.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                        if t.user_attrs.get("plan_key") == key), None)
        attrs: dict = {"plan_key": key}
        if earlier is not None:
            features, loss = Features.from_json(earlier.user_attrs["features"]), earlier.user_attrs["reference_loss"]
        else:
            try:
                features = self.features(plan)
                loss = self.reference_loss(plan)
            except Exception:  # noqa: BLE001 - a plan the reference cannot run is not proposed for a build
                features, loss = Features(0.0, 0.0, 0), math.inf
            attrs["evaluated"] = True
        if not math.isfinite(loss):
            loss = math.inf  # NaN too: never proposed for a build
        attrs.update(features=features.to_json(), reference_loss=loss)
        told = loss if loss < math.inf else 1e9  # Optuna takes no inf: a loss far past any limit
        constraints = {"max_loss": told - self.ctx.max_loss} if self.ctx.max_loss is not None else {}
        return attrs, [self.model.predict(features), told], constraints

    def enqueue(self, plans: list[dict[str, str]]) -> None:
        """Plans to judge first (the warm start's), each once."""
        queued = [planned_params(t) for t in self.reference.get_trials(deepcopy=False)]
        for params in plans:
            if params not in queued:
                self.reference.enqueue_trial(params)

    def report(self, study: optuna.Study) -> dict:
        """For each plan built on a proposal: the latency predicted and the reference loss beside
        what the target measured; the latency model's median error and the reference's loss gap over
        them."""
        rows = []
        for trial in built_trials(study):
            measured = record(trial)
            if measured is not None and "predicted_ms" in trial.user_attrs:
                rows.append({"trial": trial.number,
                             "predicted_ms": round(trial.user_attrs["predicted_ms"], 4),
                             "measured_ms": round(measured.measurement.latency.median_ms, 4),
                             "reference_loss": trial.user_attrs["reference_loss"],
                             "loss": measured.loss})
        gaps = [abs(r["loss"] - r["reference_loss"]) for r in rows if math.isfinite(r["loss"])]
        model = self.model
        fitted = {"fp32_ms": round(model.fp32_ms, 4),
                  "coefficients": [round(c, 5) for c in model.coefficients],
                  "fitted_on": model.fitted_on} if model else None
        return {"latency_model": fitted,
                "median_abs_error_percent": median_error_percent([(r["predicted_ms"], r["measured_ms"]) for r in rows]),
                "loss_gap": {"median_abs": statistics.median(gaps), "max_abs": max(gaps)} if gaps else None,
                "predictions": rows}

    def evaluated(self) -> int:
        """Plans the reference executor evaluated for this study (every worker's, a resumed run's
        too)."""
        return sum("evaluated" in t.user_attrs for t in self.reference.get_trials(deepcopy=False))

    def _decides_most(self, candidates: list, built: list):
        if not candidates:
            return None
        if self.ctx.max_loss is not None:
            feasible = [c for c in candidates if c[1] <= self.ctx.max_loss]
            return min(feasible, key=lambda c: c[0]) if feasible else None
        front = [(r.latency_ms, r.loss) for r in built if math.isfinite(r.loss)]
        return max(candidates,
                   key=lambda c: (front_hypervolume([*front, (c[0], c[1])], self.model.fp32_ms),
                                  -c[0]))


def open_proposer(joined: Joined, measuring: Measuring, sensitivity: Sensitivity | None,
                  engine: str, evaluations: int,
              seed: int, ctx: StudyContext) -> Proposer | None:
    """Plans judged before each build (``--proposals``), where the engine's profiles can predict
    latency; their loss on the ``evaluations`` batches by the reference executor."""
    per_build = measuring.per_build
    if not per_build:
        return None
    gains = {u.unit: dict(u.gain) for u in sensitivity.units} if sensitivity is not None else {}
    if not any(gains.values()):
        log.warning(f"--proposals {per_build}: no per-unit profile of {engine} to predict latency "
                    "from (no sensitivity pass, or the engine has no profiler): every trial is "
                    "built")
        return None
    with joined.locks.hold("identity"):
        proposer = Proposer.open(joined.storage_url, joined.name, joined.identity, seed, ctx,
                                 lambda plan: measuring.reference.accuracy_loss(plan, evaluations, constraint=True),
                                 gains, per_build)
    log.info(f"proposals: {per_build} plan(s) judged before each build, their loss by "
             f"{measuring.executor}, their latency by a model fitted to {engine}'s profiles "
             "(refitted on every build)")
    return proposer

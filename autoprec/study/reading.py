"""A study's trials read as the search sees them: each finished one's record, which count against
the budget, the uniform plans' trials, those rejected early or built, and why none was measured."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autoprec.core.errors import StudyError, first_line
from autoprec.core.plan import Plan
from autoprec.record.trial import Measurement, TrialRecord

log = logging.getLogger("autoprec")


def record(trial: FrozenTrial | optuna.trial.BaseTrial) -> TrialRecord | None:
    attrs = trial.user_attrs
    if "measurement" not in attrs:
        return None
    try:
        return TrialRecord(
            number=trial.number,
            plan=Plan.from_json(attrs["plan"]),
            measurement=Measurement.from_json(attrs["measurement"]),
            feasible=all(v <= 0.0 for v in trial.constraints.values()),
            duplicate_of=attrs.get("duplicate_of"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StudyError(f"trial {trial.number} of the study: its stored plan or measurement is "
                         f"damaged ({type(exc).__name__}: {exc}); search into a new --out (or "
                         "--study-name)") from None


def counted(trial: FrozenTrial) -> bool:
    """Trials that count against the budget: finished ones, real failures (which carry an error) and
    candidates rejected early (pruned, with their screened loss).

    A trial failed by :func:`recover_interrupted` has no error and is re-run instead.
    """
    return (
        trial.state == TrialState.COMPLETE
        or (trial.state == TrialState.FAIL and "error" in trial.user_attrs)
        or (trial.state == TrialState.PRUNED and "rejected" in trial.user_attrs)
    )


def uniform_trials(trials: Sequence[TrialRecord]) -> dict[str, TrialRecord]:
    """The first all-fp32 / all-fp16 / all-int8 trial of each kind, where the study has one."""
    found: dict[str, TrialRecord] = {}
    for trial in trials:
        for precision, n in trial.plan.counts().items():
            if n == len(trial.plan.precisions):
                found.setdefault(precision, trial)
    return found


def uniform_measured(study: optuna.Study) -> dict[str, tuple[float, float]]:
    """(latency ms, loss) of each uniform plan the study has measured, by its precision."""
    return {p: (t.latency_ms, t.loss) for p, t in uniform_trials(finished_records(study)).items()}


def rejected_trials(study: optuna.Study) -> list[dict[str, Any]]:
    """Candidates stopped by cheap rejection: trial number and what their screening measured."""
    return [
        {"trial": t.number, **t.user_attrs["rejected"], "plan": t.user_attrs.get("plan")}
        for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)) if "rejected" in t.user_attrs
    ]


def nothing_measured(study: optuna.Study, out_dir: Path, max_loss: float | None = None) -> str:
    """Why a study has no measured trial: how its trials ended and the first error, in one line
    (where every one was rejected for its loss, the least seen against ``max_loss`` and what to
    change)."""
    trials = [t for t in study.get_trials(deepcopy=False) if counted(t)]
    errors = [(t.number, first_line(t.user_attrs["error"])) for t in trials
              if t.state == TrialState.FAIL and "error" in t.user_attrs]
    rejected = sum(t.state == TrialState.PRUNED for t in trials)
    least = min((r["loss"] for r in rejected_trials(study)), default=None)
    cause = (f"all {len(errors)} failed ({'; '.join(f'trial {n}: {e}' for n, e in errors[:1])})" if errors else
             f"{rejected} rejected early for their loss"
             + (f" (the least {least:.3g} on the first evaluation batches, far past --max-loss {max_loss:g}: "
                "raise the limit, or let the units keep FP32, which an --override without fp32 takes "
                "from them)" if least is not None and max_loss is not None else ""))
    return (f"no candidate was measured: of {len(trials)} trial(s), {cause}"
            + (f", {rejected} rejected early" if errors and rejected else "")
            + f". The study and {out_dir} are kept; fix the cause and search again into a new "
              f"--out "
            "(this study's budget is spent)")


def built_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials whose plan the target engine built: measured, rejected after screening, or failed
    (a duplicate reuses an earlier build)."""
    return [t for t in study.get_trials(deepcopy=False) if counted(t) and "duplicate_of" not in t.user_attrs]


def on_node_time_build(trial: FrozenTrial) -> bool:
    """Whether the trial was timed on the engine built for the sensitivity pass's profile of the
    same graph (so it is no build of its own; see the TensorRT backend's NodeTimedEngines)."""
    return bool(((trial.user_attrs.get("measurement") or {}).get("build") or {}).get("reused_build"))


def finished_records(study: optuna.Study) -> list[TrialRecord]:
    return [r for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if (r := record(t))]

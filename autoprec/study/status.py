"""Where a (shared) study stands, as its storage holds it: for ``autoprec status``."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autoprec.study.coordination import WORKER_ATTR, retried_trial
from autoprec.study.reading import counted
from autoprec.study.retiming import pareto_front


def study_status(study: optuna.Study) -> dict:
    """Where a shared study stands: trials per worker and state, what is queued, the current front
    (as the storage holds it: trial latencies, not the final re-timing)."""
    trials = study.get_trials(deepcopy=False)
    workers: dict[str, dict[str, int]] = {}
    for trial in trials:
        if trial.state == TrialState.WAITING:
            continue
        who = trial.user_attrs.get(WORKER_ATTR, {}).get("id", "—")
        tally = workers.setdefault(who,
                                   {"done": 0, "running": 0, "failed": 0, "rejected": 0, "died": 0})
        if trial.state == TrialState.RUNNING:
            tally["running"] += 1
        elif trial.state == TrialState.PRUNED:
            tally["rejected"] += 1
        elif trial.state == TrialState.FAIL:
            tally["failed" if counted(trial) else "died"] += 1
        else:
            tally["done"] += 1
    attrs = study.user_attrs
    return {
        "study": study.study_name,
        "model_sha256": attrs.get("model_sha256"),
        "backend": attrs.get("backend"),
        "budget": attrs.get("budget"),
        "counted": sum(counted(t) for t in trials),
        "waiting": sum(t.state == TrialState.WAITING for t in trials),
        "retried": sorted(n for t in trials if (n := retried_trial(t)) is not None),
        "workers": workers,
        "front": [
            {"trial": r.number, "latency_ms": r.latency_ms, "loss": r.loss,
             "counts": r.plan.counts(),
             "worker": study.trials[r.number].user_attrs.get(WORKER_ATTR, {}).get("id")}
            for r in pareto_front(study)
        ],
    }

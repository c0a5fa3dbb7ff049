"""Engine builds counted over the whole study: by phase, over every run and worker that wrote to it,
and the plans the reference executor evaluated instead."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import optuna

from autoprec.record.per_unit import Sensitivity
from autoprec.study.reading import built_trials, on_node_time_build

log = logging.getLogger("autoprec")


# + a run of one worker: the builds it made outside the study's trials
BUILDS_ATTR = "autoprec:builds:"


@dataclass(frozen=True)
class BuildCounts:
    """The target engine's builds (or sessions) by phase over the study's ``runs``; of the trials,
    those timed on the engine built for their profile; and the plans the reference executor
    evaluated instead."""

    by_phase: dict[str, int]
    reference_evaluations: int
    trials_on_profile_builds: int
    runs: int

    @property
    def total(self) -> int:
        return sum(self.by_phase.values())


def note_builds(study: optuna.Study, run: str, sensitivity: Sensitivity | None, retimed: int = 0) -> None:
    """This ``run``'s builds outside the study's trials, kept in the study: once its sensitivity pass
    is done (a run stopped after it is one of the study's), and again with its re-timing's.
    ``sensitivity``: the pass this run made (None where it read the study's)."""
    study.set_user_attr(BUILDS_ATTR + run,
                        {"profiles": sensitivity.node_time_builds if sensitivity else 0,
                         "retiming": retimed,
                         "evaluations": sensitivity.evaluations if sensitivity else 0})


def count_builds(study: optuna.Study, run: str, sensitivity: Sensitivity | None, retimed: int,
                 proposed: int,
                 judged_on_target: bool) -> BuildCounts:
    """Builds (or sessions) of the target engine in every phase of the study, over every run and
    worker that noted them (:func:`note_builds`: this ``run``'s first), and the plans the reference
    executor evaluated instead (counted as builds where the target had to be the reference).
    ``proposed``: the proposals the reference executor judged."""
    note_builds(study, run, sensitivity, retimed)
    runs = [v for k, v in study.user_attrs.items() if k.startswith(BUILDS_ATTR)]
    built = built_trials(study)
    on_node_timed = sum(map(on_node_time_build, built))
    by_phase = {
        "profiles": sum(r["profiles"] for r in runs),
        "trials": len(built) - on_node_timed,
        "retiming": sum(r["retiming"] for r in runs),
    }
    evaluations = sum(r["evaluations"] for r in runs) + proposed
    if judged_on_target:
        by_phase["accuracy"], evaluations = evaluations, 0
    return BuildCounts(by_phase, evaluations, on_node_timed, len(runs))


def builds_facts(builds: BuildCounts, executor: str, proposals_per_build: int,
                 predicted: dict | None) -> dict[str, Any]:
    return {
        "engine_builds": builds.total,
        "engine_builds_by_phase": builds.by_phase,
        "engine_builds_scope": f"the study: its {builds.runs} run(s) past their sensitivity pass, workers "
                               "included",
        "trials_on_profile_builds": builds.trials_on_profile_builds,
        "reference_evaluations": builds.reference_evaluations,
        "reference": {"executor": executor, "proposals_per_build": proposals_per_build,
                      **(predicted or {})},
    }


def say_builds(engine: str, builds: BuildCounts, predicted: dict | None) -> None:
    log.info(
        f"{engine} builds in the study ({builds.runs} run(s)): {builds.total} ("
        + ", ".join(f"{k} {v}" for k, v in builds.by_phase.items())
        + (
            f"; {builds.trials_on_profile_builds} trial(s) timed on the engine built for their "
            "profile"
            if builds.trials_on_profile_builds
            else ""
        )
        + "); "
        f"reference evaluations: {builds.reference_evaluations}"
        + (
            f"; latency model error {predicted['median_abs_error_percent']} % (median of "
            f"{len(predicted['predictions'])} prediction(s) made before the build)"
            if predicted and predicted["predictions"]
            else ""
        )
    )

"""What a search records of how it ran: the sensitivity pass's outcome, the study's, and from them
pareto.json's ``search`` facts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoprec.analysis.calibrate import calibration_cache
from autoprec.analysis.model_info import ModelInfo
from autoprec.app.config import SearchConfig
from autoprec.app.search_setup import Setup, Shared
from autoprec.app.specs import recorded
from autoprec.measure import confirmation
from autoprec.measure.measurers import Measuring
from autoprec.record.facts import Drift
from autoprec.record.per_unit import Sensitivity
from autoprec.record.trial import Retiming, TrialRecord
from autoprec.record.verdict import Versus
from autoprec.results.files import plan_ignored
from autoprec.study.coordination import redacted
from autoprec.study.joining import Joined
from autoprec.study.proposals import Proposer
from autoprec.study.reading import rejected_trials
from autoprec.study.retiming import RETIME_ROUNDS


@dataclass(frozen=True)
class WarmStart:
    """The sensitivity pass and what it decided: the model information the study searches."""

    info: ModelInfo
    sensitivity: Sensitivity | None
    from_cache: bool
    sensitive_units: dict[str, int]


@dataclass(frozen=True)
class Outcome:
    """What the study found, re-timed, and the plan chosen."""

    trials: list[TrialRecord]
    front: list[TrialRecord]
    chosen: TrialRecord | None
    versus: Versus
    retiming: Retiming
    warm_plans: int
    proposer: Proposer | None
    held_out: confirmation.HeldOut | None = None


def search_facts(config: SearchConfig, setup: Setup, joined: Joined, shared: Shared,
                  measuring: Measuring,
                  warm: WarmStart, outcome: Outcome) -> dict[str, Any]:
    """pareto.json's ``search``: how the search was asked and what it did."""
    info, dataset, sensitivity = warm.info, setup.dataset, warm.sensitivity
    fingerprint = dataset.fingerprint()
    return {
        "spec": recorded(config.groups()),
        # which run wrote the result files: each carries it, so no file of another passes
        "run": joined.run,
        "budget": config.study.budget,
        "trials": len(outcome.trials),
        "metric": setup.metric.name,
        **shared.judged,
        "timing_drift": drift.to_json() if (drift := Drift.of(outcome.trials)) else None,
        "max_loss": config.judge.max_loss,
        "seed": config.study.seed,
        "calibration": config.space.calibration,
        "study_name": joined.name,
        "storage": redacted(joined.storage_url),
        "data": dataset.source,
        "data_path": str(Path(setup.data).resolve()) if setup.data is not None else None,
        "data_fingerprint": fingerprint,
        "calibration_file": (
            str(calibration_cache(info, fingerprint, setup.cache).relative_to(setup.out_dir))
            if shared.baseline.ranges is not None
            else None
        ),
        "image_norm": asdict(config.inputs.image),  # (read back by ImageOptions.from_json)
        "constants": dict(config.inputs.constants or {}),
        "out_of_range": list(info.out_of_range),
        "random_data": dataset.random,
        "batches": {"calibration": len(dataset.calibration), "evaluation": len(dataset.evaluation)},
        "search_space": setup.space.to_json(),
        "precisions": setup.searched,
        "dimensions": len(info.dimensions),
        "tied_units": len(info.searchable_units) - len(info.dimensions),
        "tie_repeats": config.space.tie_repeats,
        "sensitive_units": warm.sensitive_units,
        "left_out": setup.left_out,
        "one_time_seconds": {k: round(v, 3) for k, v in measuring.one_time.items()},
        "sampler": type(joined.study.sampler).__name__,
        "build_workers": setup.workers,
        "sensitivity": None if sensitivity is None else {
            "evaluations": sensitivity.evaluations, "batches": sensitivity.batches,
            "seconds": round(sensitivity.seconds, 2),
            "evaluation_seconds": round(sensitivity.evaluation_seconds, 2),
            "from_cache": warm.from_cache, "warm_start_plans": outcome.warm_plans,
            "ranked_by": shared.ranking.metric.name,
        },
        "early_reject": None
        if shared.screen is None
        else {"batches": shared.screen.batches, "reject_above": shared.screen.reject_above},
        "retiming": {"rounds": RETIME_ROUNDS, **outcome.retiming.to_json()},
        "profile": info.shape_profile.to_json(),
        # [] where the data's one shape was
        "judged_shapes": [point.to_json() for point in dataset.points],
        "int4_kernels": shared.int4_kernels,
        "rejected": rejected_trials(joined.study),
        "plan_ignored": [t.number for t in outcome.trials if plan_ignored(t)],
    }

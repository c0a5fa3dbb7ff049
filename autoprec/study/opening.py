"""A study opened or joined: its sampler, its storage, and the identity a resumed or shared study
must match (what makes latencies and losses comparable); a study a refused run made and asked
nothing of is forgotten."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna

from autoprec.core.errors import AutoprecError, StudyError, first_line
from autoprec.study.coordination import (
    DEFAULT_HEARTBEAT,
    driver_missing,
    redacted,
    storage_for,
    storage_hint,
    without_password,
)

log = logging.getLogger("autoprec")


def default_sampler(seed: int, parallel: bool = False) -> optuna.samplers.BaseSampler:
    """Multi-objective TPE: models the categorical choices jointly, honours the loss constraint.
    With trials in flight at once, the constant liar keeps it from proposing the same region
    twice."""
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10,
                                      constant_liar=parallel)


def make_sampler(name: str, seed: int, parallel: bool = False) -> optuna.samplers.BaseSampler:
    """``--sampler``: tpe (default), nsga2, gp (needs torch) or random; all Optuna's own."""
    if name == "tpe":
        return default_sampler(seed, parallel)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        try:
            import torch  # noqa: F401 - Optuna's GPSampler needs it
        except ImportError:
            raise AutoprecError(
                "--sampler gp: Optuna's GPSampler needs PyTorch; pip install torch, or use "
                "--sampler tpe"
            ) from None
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=10)
    raise AutoprecError(f"--sampler {name!r}: choose one of {', '.join(SAMPLERS)}")


SAMPLERS = ("tpe", "nsga2", "gp", "random")


def open_study(
    storage: str | optuna.storages.BaseStorage,
    study_name: str,
    identity: dict[str, Any],
    sampler: optuna.samplers.BaseSampler,
    heartbeat: int = DEFAULT_HEARTBEAT,
) -> optuna.Study:
    """Create or join the study (a storage URL gets heartbeats, see
    :mod:`autoprec.study.coordination`); refuse one that was made for another model, data or engine:
    every field of ``identity`` (what makes latencies and losses comparable) must match what the
    study recorded."""
    shown = redacted(storage) if isinstance(storage, str) else type(storage).__name__
    try:
        study = optuna.create_study(
            storage=storage_for(storage, heartbeat) if isinstance(storage, str) else storage,
            study_name=study_name,
            directions=["minimize", "minimize"],
            sampler=sampler,
            load_if_exists=True,
        )
    except ImportError as exc:
        raise driver_missing(str(storage), exc.__cause__ or exc) from None
    except Exception as exc:  # SQLAlchemy/Optuna raise many types for a bad URL or file
        cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ else exc
        first = without_password(first_line(cause, None, empty=""), str(storage))
        said = any(word in first.lower() for word in ("disk", "connect", "malformed", "database"))
        hint = storage_hint(first) if said else ("give a valid Optuna storage URL, e.g. "
                                                 "sqlite:///study.db or "
                                                 "postgresql://user:password@host/db")
        raise StudyError(f"--storage {shown}: cannot be opened ({type(exc).__name__}: {first}); "
                         f"{hint}") from None
    existing = study.user_attrs
    if not any(k in existing for k in identity):
        for key, value in identity.items():
            study.set_user_attr(key, value)
        return study
    differs = [k for k in identity if k in existing and existing[k] != identity[k]]
    if differs == ["metric"] and not study.get_trials(deepcopy=False):
        # nothing measured yet (a run refused for its metric's options, say): the study takes the
        # new metric
        study.set_user_attr("metric", identity["metric"])
        return study
    if differs:
        detail = "; ".join(f"{k}: study has {existing[k]!r}, this run {identity.get(k)!r}" for k in differs[:3])
        raise StudyError(
            f"study {study_name!r} in {shown} was made for a different search ({detail}); "
            "use another --study-name or --out, or rerun with the original settings"
        )
    return study


def forget_if_unused(study: optuna.Study, storage: str) -> None:
    """Delete ``study`` where no trial was ever asked of it: what a run refused before its first
    trial leaves (bad labels, a metric that does not agree with itself), which would refuse the
    corrected run as made for a different search."""
    if not study.get_trials(deepcopy=False):
        optuna.delete_study(study_name=study.study_name, storage=storage)


def default_study_name(model_path: Path, backend: str) -> str:
    return f"autoprec-{model_path.stem}-{backend}"

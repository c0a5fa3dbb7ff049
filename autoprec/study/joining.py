"""Joining a study: created, resumed, or shared with other workers through its storage, refused
where it was made for another search."""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autoprec.study.coordination import (
    SharedInputs,
    StudyLocks,
    check_storage,
    default_artifacts,
    worker_id,
)
from autoprec.study.opening import make_sampler, open_study
from autoprec.study.reading import counted


@dataclass(frozen=True)
class Joined:
    """The study this process works on, and what it shares with the study's other workers."""

    study: optuna.Study
    name: str
    storage_url: str
    identity: dict[str, Any]
    locks: StudyLocks
    me: str
    shared: SharedInputs
    done: int  # trials the study counted when this process joined it
    running: list[int]  # and those running elsewhere then
    run: str  # this run of this worker, among the study's runs
    fresh: bool = False  # this run made the study
    asked: int = 0  # trials the study held when this process joined it, finished or not


def join_study(identity: dict[str, Any], storage: str | None, out_dir: Path, name: str,
               sampler: str, seed: int,
               heartbeat: int, budget: int, artifacts: str | os.PathLike | None, parallel: bool,
               device: int | None) -> Joined:
    """Create or join the study ``name`` (in ``storage``; default: SQLite in ``out_dir``) made for
    ``identity``, with a sampler of its own where it joins; ``parallel``: trials in flight at once
    (TPE's constant liar); ``device``: the GPU this worker holds (None: none)."""
    storage_url = storage or f"sqlite:///{(out_dir / 'study.db').resolve()}"
    check_storage(storage_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    locks = StudyLocks(storage_url, name)
    me = worker_id(device)
    with locks.hold("identity"):  # two workers starting a new study at once agree on one identity
        study = open_study(storage_url, name, identity, make_sampler(sampler, seed, parallel),
                           heartbeat)
        fresh = not (study.get_trials(deepcopy=False) or "budget" in study.user_attrs)
        if not fresh:
            # joining (or resuming) a study: a seed of its own, or workers sharing one history
            # propose alike
            study.sampler = make_sampler(sampler, zlib.crc32(f"{seed}:{me}".encode()), parallel)
        # for `autoprec status`; each worker stops at its own --budget
        study.set_user_attr("budget", budget)
    shared = SharedInputs(study, Path(artifacts) if artifacts else default_artifacts(storage_url))
    trials_now = study.get_trials(deepcopy=False)
    done = sum(counted(t) for t in trials_now)
    running = [t.number for t in trials_now if t.state == optuna.trial.TrialState.RUNNING]
    return Joined(study, name, storage_url, identity, locks, me, shared, done, running,
                  f"{me}:{time.time_ns()}",
                  fresh, len(trials_now))

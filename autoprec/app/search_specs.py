"""The groups only a search (and its sensitivity pass) is asked: the space a unit may take, the
Optuna study, the isolation of the candidates' measurements."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from autoprec.analysis.calibrate import CALIBRATION_METHODS
from autoprec.app.specs import Group
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import AUTO_CALIBRATION, DEFAULT_CALIBRATION, calibration_method
from autoprec.study.coordination import DEFAULT_HEARTBEAT, GRACE_BEATS


@dataclass(frozen=True)
class SpaceSpec(Group):
    """What a unit may take: the search-space file and overrides, the precisions searched, the INT8
    calibration method, and whether repeated blocks are decided together."""

    search_space: str | os.PathLike | None = None
    overrides: Sequence[str] = ()
    precisions: Sequence[str] | None = None
    calibration: str = DEFAULT_CALIBRATION
    tie_repeats: bool = True

    DESTS = {"overrides": "override", "tie_repeats": "not separate_repeats"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
        group = parser.add_argument_group("search space")
        group.add_argument("--precisions", type=lambda text: text.split(","), metavar="LIST",
                           help=f"precisions the {verb} may use, e.g. fp16,fp32 (default: those "
                                "the engine runs faster than FP32 — all on ort-cpu; fp16,fp32 on "
                                "ort-cuda, whose Q/DQ INT8 runs as float ops)")
        group.add_argument("--separate-repeats", action="store_true",
                           help="decide every unit on its own (default: the units of a repeated "
                                "block at the same position — a transformer's 12 query projections "
                                "— are decided together, one dimension for all)")
        group.add_argument("--calibration", default=DEFAULT_CALIBRATION,
                           choices=(*CALIBRATION_METHODS, AUTO_CALIBRATION),
                           help=f"INT8 activation range method (default {DEFAULT_CALIBRATION}); "
                                "auto: the study chooses per trial (entropy costs ~0.7 s per "
                                "tensor once)")
        group.add_argument("--search-space", help="search-space YAML (default: the bundled "
                                                  "search_spaces/default.yaml)")
        group.add_argument("--override", action="append", default=[], metavar="PATTERN=PRECISIONS",
                           help="restrict layers whose name matches PATTERN (fnmatch), e.g. "
                                "'/head/*=fp32' (repeatable)")

    def checked(self) -> SpaceSpec:
        if self.calibration not in (*CALIBRATION_METHODS, AUTO_CALIBRATION):
            raise AutoprecError(f"--calibration {self.calibration!r}: choose auto or one of "
                                f"{', '.join(CALIBRATION_METHODS)}")
        return self

    @property
    def method(self) -> str:
        """The INT8 range method a plan starts with (``auto``: the study chooses per trial)."""
        return calibration_method(self.calibration)


@dataclass(frozen=True)
class StudySpec(Group):
    """The Optuna study: its budget, seed and sampler, where it is stored and shared, and how it
    starts (the sensitivity warm start, cheap rejection, plans judged before each build)."""

    REDACTED: ClassVar[tuple[str, ...]] = ("storage",)  # a password in its URL is never recorded

    budget: int = 50
    seed: int = 0
    sampler: str = "tpe"
    storage: str | None = None
    study_name: str | None = None
    artifacts: str | os.PathLike | None = None
    heartbeat: int = DEFAULT_HEARTBEAT
    warm_start: bool = True
    early_reject: bool = True
    proposals: int | None = None

    DESTS = {"warm_start": "not no_warm_start", "early_reject": "not no_early_reject"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from autoprec.study.opening import SAMPLERS

        group = parser.add_argument_group("study")
        group.add_argument("--budget", type=int, default=50, help="number of trials (default 50)")
        group.add_argument("--seed", type=int, default=0, help="sampler and data-split seed "
                                                               "(default 0)")
        group.add_argument("--sampler", default="tpe", choices=SAMPLERS,
                           help="Optuna sampler after the warm start (default tpe: multi-objective "
                                "TPE; gp needs torch)")
        group.add_argument("--no-warm-start", action="store_true",
                           help="skip the sensitivity pass and its warm-start plans (the study "
                                "starts from the uniform plans)")
        group.add_argument("--no-early-reject", action="store_true",
                           help="evaluate and time every candidate fully, even one far past "
                                "--max-loss on the first batches")
        group.add_argument("--storage", help="Optuna storage URL (default "
                                             "sqlite:///<out>/study.db); workers given the same "
                                             "postgresql://… URL and --study-name share one study "
                                             "and its --budget")
        group.add_argument("--study-name", help="Optuna study name (default autoprec-<model "
                                                "stem>-<backend>)")
        group.add_argument("--artifacts", metavar="DIR",
                           help="Optuna artifact store where the first worker leaves calibration, "
                                "reference and sensitivity for the others (default: beside a "
                                "SQLite storage, else ~/.cache/autoprec/artifacts; across hosts: a "
                                "shared directory)")
        group.add_argument("--heartbeat", type=int, default=DEFAULT_HEARTBEAT, metavar="SECONDS",
                           help=f"a running trial's heartbeat; one silent for {GRACE_BEATS} beats "
                                "(dead worker) is re-run once by another worker (default "
                                f"{DEFAULT_HEARTBEAT})")
        group.add_argument("--proposals", type=int, metavar="N",
                           help="plans judged before each build: ONNX Runtime on the CPU computes "
                                "each one's loss on the graph the engine would build, a latency "
                                "model fitted to the engine's profiles predicts its latency, and "
                                "only the plan that decides most is built and timed (0: every "
                                "trial is built; default 8 on tensorrt, where builds are slow, 0 "
                                "on ONNX Runtime)")

    def checked(self) -> StudySpec:
        for option, value in (("--study-name", self.study_name), ("--artifacts", self.artifacts),
                              ("--storage", self.storage)):
            if value is not None and not str(value).strip():
                raise AutoprecError(f"{option} '': empty; give a value or leave the option out for "
                                    "the default")
        for option, value, what in (("--budget", self.budget, " (the number of trials to run)"),
                                    ("--heartbeat", self.heartbeat, "")):
            if _bad_whole(value) or value < 1:
                raise AutoprecError(f"{option} {value}: must be "
                                    f"{'a whole number, ' if _bad_whole(value) else ''}at least "
                                    f"1{what}")
        if self.proposals is not None and (_bad_whole(self.proposals) or self.proposals < 0):
            raise AutoprecError(f"--proposals {self.proposals}: must be 0 (every trial built) or "
                                "more")
        if _bad_whole(self.seed) or not 0 <= self.seed < 2**32:
            raise AutoprecError(f"--seed {self.seed}: must be a whole number from 0 to {2**32 - 1} "
                                "(NumPy's and Optuna's samplers take 32-bit seeds)")
        return self


def _bad_whole(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


MIN_TRIAL_SECONDS = 1.0  # below this no candidate could be measured within its limit


@dataclass(frozen=True)
class IsolationSpec(Group):
    """Where candidates run: worker processes limited in time and memory (a crash fails one trial),
    how many."""

    isolate: bool = True
    trial_timeout: float = 600.0
    trial_memory_gb: float | None = None
    build_workers: int | None = None

    DESTS = {"isolate": "not no_isolation", "trial_memory_gb": "trial_memory"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("isolation")
        group.add_argument("--trial-timeout", type=float, default=600.0, metavar="SECONDS",
                           help="time limit to build and measure one candidate (default 600)")
        group.add_argument("--trial-memory", type=float, metavar="GB",
                           help="memory limit of the worker measuring candidates (default 75%% of "
                                "RAM)")
        group.add_argument("--build-workers", type=int, metavar="N",
                           help="worker processes measuring candidates side by side: builds "
                                "overlap, evaluation and timing take the device one at a time "
                                "(default 2 on tensorrt, 1 on ONNX Runtime)")
        group.add_argument("--no-isolation", action="store_true",
                           help="measure candidates in this process (debugging; an engine crash "
                                "then ends the search)")

    def checked(self) -> IsolationSpec:
        if self.build_workers is not None and (_bad_whole(self.build_workers) or self.build_workers < 1):
            raise AutoprecError(f"--build-workers {self.build_workers}: must be at least 1")
        if self.build_workers and self.build_workers > 1 and not self.isolate:
            raise AutoprecError(f"--build-workers {self.build_workers} needs worker processes; "
                                "drop --no-isolation")
        given = (("--trial-timeout", self.trial_timeout, IsolationSpec.trial_timeout),
                 ("--trial-memory", self.trial_memory_gb, None))
        limited = [option for option, value, default in given if value != default]
        if limited and not self.isolate:
            raise AutoprecError(f"{' and '.join(limited)} need(s) worker processes: with "
                                "--no-isolation a candidate runs in this process, which cannot "
                                "stop or limit it; drop one or the other")
        for option, value in (("--trial-timeout", self.trial_timeout),
                              ("--trial-memory", self.trial_memory_gb)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise AutoprecError(f"{option} {value!r}: a number (the API was given a {type(value).__name__})")
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise AutoprecError(f"{option} {value}: must be a finite number more than 0")
        if self.trial_timeout < MIN_TRIAL_SECONDS:
            raise AutoprecError(f"--trial-timeout {self.trial_timeout:g}: a candidate is built, "
                                "then timed for at least 0.2 s of runs; give "
                                f"{MIN_TRIAL_SECONDS:g} second(s) or more")
        return self

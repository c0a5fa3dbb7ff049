"""What a search is asked, checked once, whether it came from the command line or the Python API."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from autoprec.analysis.calibrate import CALIBRATION_METHODS
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import DEFAULT_CALIBRATION
from autoprec.measure.accuracy import HeadOptions
from autoprec.study.coordination import DEFAULT_HEARTBEAT


@dataclass(frozen=True)
class SearchConfig:
    """The options of ``autoprec search`` (see :func:`autoprec.app.search.search` for what each does)."""

    model: str | os.PathLike
    budget: int = 50
    data: str | os.PathLike | None = None
    out: str | os.PathLike | None = None
    backend: str = "ort-cpu"
    max_loss: float | None = None
    seed: int = 0
    storage: str | None = None
    study_name: str | None = None
    shapes: Mapping[str, Sequence[int]] | None = None
    min_shapes: Mapping[str, Sequence[int]] | None = None
    max_shapes: Mapping[str, Sequence[int]] | None = None
    time_shapes: bool = False
    retime_seconds: float = 20.0
    ship_within_noise: bool = False
    threads: int = 0
    metric: str = "cosine"
    search_space: str | os.PathLike | None = None
    overrides: Sequence[str] = ()
    calibration: str = DEFAULT_CALIBRATION
    image_mean: Sequence[float] = (0.0,)
    image_std: Sequence[float] = (1.0,)
    constants: Mapping[str, float] | None = None
    progress: bool = False
    isolate: bool = True
    trial_timeout: float = 600.0
    trial_memory_gb: float | None = None
    precisions: Sequence[str] | None = None
    device: int = 0
    sampler: str = "tpe"
    warm_start: bool = True
    tie_repeats: bool = True
    early_reject: bool = True
    build_workers: int | None = None
    proposals: int | None = None
    heartbeat: int = DEFAULT_HEARTBEAT
    artifacts: str | os.PathLike | None = None
    head: HeadOptions | None = None

    def checked(self) -> SearchConfig:
        """This configuration, or one line naming the option that cannot be used and why."""
        for option, value in (
            ("--study-name", self.study_name),
            ("--artifacts", self.artifacts),
            ("--storage", self.storage),
        ):
            if value is not None and not str(value).strip():
                raise AutoprecError(f"{option} '': empty; give a value or leave the option out for the default")
        at_least_one = {
            "--budget": (self.budget, " (the number of trials to run)"),
            "--heartbeat": (self.heartbeat, ""),
            "--build-workers": (self.build_workers, ""),
        }
        for option, (value, what) in at_least_one.items():
            if value is not None and value < 1:
                raise AutoprecError(f"{option} {value}: must be at least 1{what}")
        if self.proposals is not None and self.proposals < 0:
            raise AutoprecError(f"--proposals {self.proposals}: must be 0 (every trial built) or more")
        if self.build_workers and self.build_workers > 1 and not self.isolate:
            raise AutoprecError(f"--build-workers {self.build_workers} needs worker processes; drop --no-isolation")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise AutoprecError(f"--threads {self.threads}: a whole number of threads (0: ONNX Runtime's default)")
        for option, value in (("--trial-timeout", self.trial_timeout), ("--trial-memory", self.trial_memory_gb),
                              ("--retime-seconds", self.retime_seconds)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise AutoprecError(f"{option} {value}: must be a finite number more than 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise AutoprecError(f"--seed {self.seed}: must be a whole number from 0 to {2**32 - 1} (NumPy's and "
                                "Optuna's samplers take 32-bit seeds)")
        if self.max_loss is not None and not (math.isfinite(self.max_loss) and self.max_loss >= 0):
            raise AutoprecError(f"--max-loss {self.max_loss}: must be a loss of 0 or more")
        if self.calibration not in (*CALIBRATION_METHODS, "auto"):
            raise AutoprecError(
                f"--calibration {self.calibration!r}: choose auto or one of {', '.join(CALIBRATION_METHODS)}"
            )
        if self.time_shapes and self.backend.startswith("tensorrt"):
            raise AutoprecError(
                f"--time-shapes on {self.backend}: autoprec's TensorRT backends build for one shape (no "
                "optimisation profile yet); time the exported engine with trtexec --shapes at min, opt "
                "and max, or search with --backend ort-cpu / ort-cuda"
            )
        return self

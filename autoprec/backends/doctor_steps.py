"""What ``autoprec doctor`` checks of an engine: every call a search makes, as named steps each
engine lists for itself (:meth:`autoprec.backends.base.Backend.doctor_steps`), run on a small model
with an FP32, an FP16 and an INT8 unit. A step that needs hardware this machine lacks says so
instead of failing."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.data import Batch
from autoprec.analysis.model_info import ModelInfo
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Plan

# The lowered plan against FP32 on ONNX Runtime's CPU: an INT8 and an FP16 unit of a small MLP stay
# well within this (relative L2 error); beyond it the engine computes something else.
AGREEMENT = 0.05


class NotHere(AutoprecError):
    """The step needs hardware this machine does not have (a GPU of some compute capability)."""


@dataclass(frozen=True)
class DoctorCase:
    """The generated model, analysed, with the plan the doctor lowers and one batch with its FP32
    outputs."""

    info: ModelInfo
    plan: Plan
    ranges: ActivationRanges
    batch: Batch
    reference: dict[str, np.ndarray]


@dataclass(frozen=True)
class Step:
    """One engine call: ``run`` returns what it found, raises what went wrong (:class:`NotHere`: the
    machine lacks what it needs); ``fix`` is what to do when it fails; a search cannot run without a
    ``needed`` step."""

    name: str
    run: Callable[[], str]
    fix: str
    needs: tuple[str, ...] = ()
    needed: bool = True


@dataclass
class Made:
    """What the steps made, for the steps after them; ``stack`` closes engines and runners at the
    end, ``folder`` holds their files (caches)."""

    stack: contextlib.ExitStack
    folder: Path
    things: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.things[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.things[key] = value


def agreement(case: DoctorCase, outputs: dict[str, np.ndarray]) -> str:
    """The engine's outputs against ONNX Runtime CPU's FP32 ones, output by output (relative L2
    error)."""
    said = []
    for name, want in case.reference.items():
        if name not in outputs:
            raise AutoprecError(f"output {name} is missing (the engine gave "
                                f"{', '.join(outputs) or 'none'})")
        got = np.asarray(outputs[name], np.float64)
        if got.shape != want.shape:
            raise AutoprecError(f"output {name} is shaped {list(got.shape)}, ONNX Runtime's "
                                f"{list(want.shape)}")
        error = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        if not error <= AGREEMENT:
            raise AutoprecError(f"output {name} differs from ONNX Runtime CPU's FP32 by "
                                f"{error:.3g} (relative L2 error; at most {AGREEMENT:g} expected "
                                "of this plan)")
        said.append(f"{name}: relative L2 error {error:.2g} against ONNX Runtime CPU FP32")
    return "; ".join(said)


def running_steps(made: Made, case: DoctorCase, runner_step: str) -> list[Step]:
    """Execute, compare and time on the runner ``made["runner"]`` (made by ``runner_step``): the
    steps every engine shares once a lowered plan is loaded."""

    def execute() -> str:
        made["outputs"] = made["runner"].run(case.batch)
        return ", ".join(f"{k} {list(np.shape(v))}" for k, v in made["outputs"].items())

    def timed() -> str:
        timing = made["runner"].time(case.batch)
        return f"median {timing.median_ms:.3f} ms (p10–p90 {timing.p10_ms:.3f}–{timing.p90_ms:.3f}, {timing.runs} runs)"

    return [
        Step("execute", execute, "the engine cannot run the plan: run again with --verbose for its "
                                 "log",
             (runner_step,)),
        Step("compare with ONNX Runtime CPU", lambda: agreement(case, made["outputs"]),
             "the engine computes other values than FP32 ONNX Runtime: report it with the engine's "
             "version",
             ("execute",)),
        Step("time", timed, "the engine cannot be timed: run again with --verbose", ("execute",)),
    ]

"""The one interface every inference engine implements: lower, make a runner, run, time,
describe."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.data import Batch
from autoprec.analysis.model_info import ModelInfo
from autoprec.backends.doctor_steps import DoctorCase, Made, Step, running_steps
from autoprec.core import engines
from autoprec.core.plan import Plan, Precision
from autoprec.core.stored import StoredModel
from autoprec.core.timing import TRIAL, Runs, Timing
from autoprec.lower import Int4Form, QDQForm, lower_plan
from autoprec.record.trial import EngineInfo

# judges plans without building them on the target (see core.engines)
REFERENCE_BACKEND = engines.REFERENCE


class Runner(abc.ABC):
    """A prepared candidate (session or engine). Use as a context manager."""

    @abc.abstractmethod
    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        """Outputs by name, as host NumPy arrays."""

    @abc.abstractmethod
    def time(self, batch: Batch, runs: Runs = TRIAL) -> Timing:
        """Latency of ``batch``: warm-up, then the median of repeated runs, as many as ``runs`` asks (an
        engine that times a fixed count says so in its timing text)."""

    def build_report(self) -> dict[str, Any] | None:
        """What the engine made of the candidate (e.g. TensorRT's per-layer precisions and whether
        the plan was followed), stored with the trial. None: the engine does not say."""
        return None

    def close(self) -> None:
        pass

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(abc.ABC):
    """An inference engine. Adding one is one module under ``backends/`` plus its tests."""

    name: str
    qdq_form: QDQForm = QDQForm.TENSORRT
    # INT4 units' form (see autoprec.lower.int4)
    int4_form: ClassVar[Int4Form] = Int4Form.DEQUANTIZE
    timing: ClassVar[str] = ""  # what its latencies are (see EngineInfo.timing)
    # Precisions this engine runs no faster than FP32, with why: left out of the search unless asked
    # for.
    slow_precisions: ClassVar[dict[Precision, str]] = {}
    # Op types this engine runs in FP32 only, with why: their units are kept FP32.
    float32_ops: ClassVar[dict[str, str]] = {}
    # Op types whose INT8 this engine runs as float between Q/DQ (no integer kernel), with why: no
    # INT8 for them.
    float_int8_ops: ClassVar[dict[str, str]] = {}
    # Why this engine keeps the search space's sensitive ops (softmax, normalisations) FP32; "": it
    # searches them.
    sensitive_ops_fp32: ClassVar[str] = ""
    # Candidates measured side by side by default (--build-workers): worth it where builds are slow
    # next to running a candidate, and safe only where a build does not disturb the timed run.
    default_build_workers: ClassVar[int] = 1
    # Plans judged on the reference executor (ONNX Runtime, CPU) per build of this engine
    # (--proposals): worth it where a build costs far more than evaluating a plan there.
    default_proposals: ClassVar[int] = 0
    # Whether it runs on a GPU chosen by --device (a worker of a shared study is named by it).
    uses_device: ClassVar[bool] = True
    # Whether a graph cut before a node computes from there what the whole graph computes, kernel by kernel (ONNX
    # Runtime's CPU and CUDA providers; not TensorRT, whose fusions a cut moves): the sensitivity pass then runs
    # each one-unit plan from its first change (autoprec.measure.downstream).
    runs_from_a_cut: ClassVar[bool] = False
    # Why it cannot time a plan across a shape profile (--time-shapes); "": it can.
    one_shape_only: ClassVar[str] = ""
    # Whether --threads sets its intra-op threads.
    has_threads: ClassVar[bool] = False

    @classmethod
    def create(cls, device: int, cache_dir: Path | None, threads: int) -> Backend:
        """The engine for ``get_backend``'s settings (each takes those it has)."""
        return cls()

    @property
    def is_reference(self) -> bool:
        """Whether it is the reference executor itself: its plans' losses need no other engine."""
        return self.name == REFERENCE_BACKEND

    @abc.abstractmethod
    def info(self) -> EngineInfo:
        ...

    @abc.abstractmethod
    def runner(self, model: StoredModel) -> Runner:
        """A runner of an explicit-precision model: its session or engine built (loaded from a file
        beside its weights), run and timed through the runner, released when the runner closes."""

    def judging_runner(self, model: StoredModel) -> Runner:
        """A runner whose outputs are judged and never timed (the sensitivity pass's one-unit
        plans): :meth:`runner`, unless the engine builds one that starts faster and computes the
        same graph at the same precisions."""
        return self.runner(model)

    def node_times(self, model: StoredModel, batch: Batch, runs: int = 10) -> dict[str, float] | None:
        """Seconds per run spent in each node of ``model`` (keyed by its node names; time the engine
        cannot attribute to one is under ``""``), from the engine's own profiler. None: no
        profiler."""
        return None

    def drop_kept_builds(self) -> None:
        """Forget builds kept for a later trial of the same graph that never came (TensorRT keeps
        the engines it profiled); nothing to forget where a build is not kept."""

    def lower(self, info: ModelInfo, plan: Plan, ranges: ActivationRanges | None) -> StoredModel:
        """The plan in the Q/DQ form this engine turns into fast kernels."""
        return lower_plan(info, plan, ranges, self.qdq_form, self.int4_form)

    @classmethod
    def doctor_steps(cls, device: int, case: DoctorCase, made: Made) -> list[Step]:
        """Every call a search makes of this engine, in order, on ``case`` (see
        :mod:`autoprec.backends.doctor_steps`). Engines with more to check (a build without the
        device, a cache, an inspector) list their own."""

        def create() -> str:
            made["engine"] = engine = cls.create(device, None, 0)
            return engine.info().label()

        def lower() -> str:
            made["lowered"] = lowered = made["engine"].lower(case.info, case.plan, case.ranges)
            return f"{len(lowered.proto.graph.node)} nodes in the {cls.qdq_form.value} Q/DQ form"

        def load() -> str:
            made["runner"] = made.stack.enter_context(made["engine"].runner(made["lowered"]))
            return "loaded"

        def profile() -> str:
            times = made["engine"].node_times(made["lowered"], case.batch, runs=3)
            return "no profiler (the search ranks units by loss alone)" if times is None else \
                f"{len(times)} nodes timed by the engine's profiler"

        return [
            Step("engine", create, "install the engine (see the message), or choose another "
                                   "--backend / --device"),
            Step("lower the plan", lower, "a bug in autoprec's lowering: report it with "
                                          "--verbose", ("engine",)),
            Step("load", load, "the engine cannot load the lowered plan: run again with --verbose "
                               "for its log",
                 ("lower the plan",)),
            *running_steps(made, case, "load"),
            Step("profile", profile, "the engine's profiler fails: the search still runs, without "
                                     "its ranking by time",
                 ("lower the plan",), needed=False),
        ]

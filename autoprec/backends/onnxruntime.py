"""ONNX Runtime on its CPU execution provider: the embedded default engine."""

from __future__ import annotations

import platform
from functools import lru_cache

import numpy as np
import onnx

from autoprec.backends.base import Backend, EngineInfo, Runner, Timing, time_calls
from autoprec.data import Batch
from autoprec.errors import BackendError
from autoprec.lower import QDQForm


@lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class OrtRunner(Runner):
    def __init__(self, session):
        self.session = session
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(self.output_names, batch)))

    def time(self, batch: Batch) -> Timing:
        return time_calls(lambda: self.session.run(self.output_names, batch))


class OrtCpuBackend(Backend):
    """CPU execution provider, all graph optimisations on.

    Lowers INT8 in the ``ort-cpu`` Q/DQ form (whole node units, uint8 activations): the only
    form ORT's CPU kernels run as integer QLinearConv/QLinearMatMul (see autoprec.lower.qdq).
    """

    name = "ort-cpu"
    qdq_form = QDQForm.ORT_CPU
    provider = "CPUExecutionProvider"

    def __init__(self, threads: int = 0):
        import onnxruntime as ort

        self._ort = ort
        self.threads = threads

    def info(self) -> EngineInfo:
        return EngineInfo(
            backend=self.name,
            engine="onnxruntime",
            version=self._ort.__version__,
            provider=self.provider,
            device=f"{cpu_name()} ({self._thread_label()})",
            qdq_form=self.qdq_form.value,
        )

    def _thread_label(self) -> str:
        import os

        return f"{self.threads} threads" if self.threads else f"{os.cpu_count()} cores, default threads"

    def prepare(self, model: onnx.ModelProto) -> OrtRunner:
        options = self._ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.threads:
            options.intra_op_num_threads = self.threads
        try:
            session = self._ort.InferenceSession(model.SerializeToString(), options, providers=[self.provider])
        except Exception as exc:  # ORT raises its own exception types
            raise BackendError(f"onnxruntime cannot load the candidate: {exc}") from None
        return OrtRunner(session)

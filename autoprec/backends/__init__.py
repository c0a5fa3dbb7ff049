"""Inference engines behind one interface. Engines are imported only when selected."""

from __future__ import annotations

from autoprec.backends.base import Backend, EngineInfo, Runner, Timing
from autoprec.errors import BackendError

BACKENDS = ("ort-cpu",)

__all__ = ["BACKENDS", "Backend", "EngineInfo", "Runner", "Timing", "get_backend"]


def get_backend(name: str) -> Backend:
    if name == "ort-cpu":
        from autoprec.backends.onnxruntime import OrtCpuBackend

        return OrtCpuBackend()
    raise BackendError(f"--backend {name!r} is not available; choose one of: {', '.join(BACKENDS)}")

"""Inference engines behind one interface. Engines are imported only when selected."""

from __future__ import annotations

from autoprec.backends.base import Backend, EngineInfo, Runner, Timing
from autoprec.errors import BackendError

BACKENDS = ("ort-cpu", "ort-cuda")

__all__ = ["BACKENDS", "Backend", "EngineInfo", "Runner", "Timing", "get_backend"]


def get_backend(name: str, device: int = 0) -> Backend:
    """The engine ``name``; ``device`` picks the GPU for GPU engines."""
    if name == "ort-cpu":
        from autoprec.backends.onnxruntime import OrtCpuBackend

        return OrtCpuBackend()
    if name == "ort-cuda":
        from autoprec.backends.onnxruntime import OrtCudaBackend

        return OrtCudaBackend(device)
    raise BackendError(f"--backend {name!r} is not available; choose one of: {', '.join(BACKENDS)}")

"""Inference engines behind one interface. Engines are imported only when selected."""

from __future__ import annotations

from pathlib import Path

from autoprec.backends.base import Backend, EngineInfo, Runner, Timing
from autoprec.core.errors import BackendError

BACKENDS = ("ort-cpu", "ort-cuda", "tensorrt", "tensorrt-rtx")

__all__ = ["BACKENDS", "Backend", "EngineInfo", "Runner", "Timing", "get_backend"]


def get_backend(name: str, device: int = 0, cache_dir: Path | None = None) -> Backend:
    """The engine ``name``; ``device`` picks the GPU for GPU engines; ``cache_dir`` keeps what an
    engine reuses across candidates and runs (TensorRT's timing cache, TensorRT for RTX's runtime cache)."""
    if name == "ort-cpu":
        from autoprec.backends.onnxruntime import OrtCpuBackend

        return OrtCpuBackend()
    if name == "ort-cuda":
        from autoprec.backends.onnxruntime import OrtCudaBackend

        return OrtCudaBackend(device)
    if name == "tensorrt":
        from autoprec.backends.tensorrt import TensorRTBackend

        return TensorRTBackend(device, cache_dir)
    if name == "tensorrt-rtx":
        from autoprec.backends.tensorrt import TensorRTRtxBackend

        return TensorRTRtxBackend(device, cache_dir)
    raise BackendError(f"--backend {name!r} is not available; choose one of: {', '.join(BACKENDS)}")

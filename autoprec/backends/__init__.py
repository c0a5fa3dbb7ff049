"""Inference engines behind one interface. Engines are imported only when selected."""

from __future__ import annotations

from pathlib import Path

from autoprec.backends.base import REFERENCE_BACKEND, Backend, EngineInfo, Runner, Timing
from autoprec.core.errors import BackendError

BACKENDS = ("ort-cpu", "ort-cuda", "tensorrt", "tensorrt-rtx")

__all__ = ["BACKENDS", "REFERENCE_BACKEND", "Backend", "EngineInfo", "Runner", "Timing", "get_backend"]


def get_backend(name: str, device: int = 0, cache_dir: Path | None = None, threads: int = 0) -> Backend:
    """The engine ``name``; ``device`` picks the GPU for GPU engines; ``cache_dir`` keeps what an
    engine reuses across candidates and runs (TensorRT's timing cache, TensorRT for RTX's runtime cache);
    ``threads``: ONNX Runtime's intra-op threads (0: its default)."""
    if threads and not name.startswith("ort-"):
        raise BackendError(
            f"--threads {threads}: sets ONNX Runtime's intra-op threads; --backend {name} has no such setting"
        )
    if name == "ort-cpu":
        from autoprec.backends.onnxruntime import OrtCpuBackend

        return OrtCpuBackend(threads)
    if name == "ort-cuda":
        from autoprec.backends.onnxruntime import OrtCudaBackend

        return OrtCudaBackend(device, threads)
    if name == "tensorrt":
        from autoprec.backends.tensorrt import TensorRTBackend

        return TensorRTBackend(device, cache_dir)
    if name == "tensorrt-rtx":
        from autoprec.backends.tensorrt import TensorRTRtxBackend

        return TensorRTRtxBackend(device, cache_dir)
    raise BackendError(f"--backend {name!r} is not available; choose one of: {', '.join(BACKENDS)}")

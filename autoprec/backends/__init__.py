"""Inference engines behind one interface. Engines are imported only when selected."""

from __future__ import annotations

import importlib
from pathlib import Path

from autoprec.backends.base import REFERENCE_BACKEND, Backend, Runner
from autoprec.core import engines
from autoprec.core.errors import BackendError
from autoprec.record.trial import EngineInfo

# name -> (module, class): an engine's module is imported only when it is chosen. Adding an engine
# is one module under backends/, one line here, and a Way in tests/test_backend_contract.py (the
# suite every engine runs).
REGISTRY = {
    engines.ORT_CPU: ("autoprec.backends.onnxruntime", "OrtCpuBackend"),
    engines.ORT_CUDA: ("autoprec.backends.onnxruntime", "OrtCudaBackend"),
    engines.ORT_TENSORRT: ("autoprec.backends.onnxruntime", "OrtTensorRTBackend"),
    engines.TENSORRT: ("autoprec.backends.tensorrt", "TensorRTBackend"),
    engines.TENSORRT_RTX: ("autoprec.backends.tensorrt", "TensorRTRtxBackend"),
}
BACKENDS = tuple(REGISTRY)

__all__ = ["BACKENDS", "REFERENCE_BACKEND", "Backend", "EngineInfo", "Runner", "backend_class",
           "get_backend"]


def backend_class(name: str) -> type[Backend]:
    """The class of engine ``name``, for what it can do before one is made (its capabilities)."""
    if name not in REGISTRY:
        raise BackendError(f"--backend {name!r} is not available; choose one of: "
                           f"{', '.join(BACKENDS)}")
    module, cls = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def get_backend(name: str, device: int = 0, cache_dir: Path | None = None, threads: int = 0) -> Backend:
    """The engine ``name``; ``device`` picks the GPU for GPU engines; ``cache_dir`` keeps what an
    engine reuses across candidates and runs (TensorRT's timing cache, TensorRT for RTX's runtime
    cache); ``threads``: the engine's intra-op threads where it has them (0: its default)."""
    engine = backend_class(name)
    if threads and not engine.has_threads:
        raise BackendError(
            f"--threads {threads}: sets ONNX Runtime's intra-op threads; --backend {name} has no "
            "such setting"
        )
    return engine.create(device, cache_dir, threads)

"""A built engine run and timed on a GPU: CUDA through cuda-python (or PyCUDA), CUDA-event timing,
the per-layer profiler, TensorRT for RTX's runtime cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

import numpy as np

from autoprec.analysis.data import Batch
from autoprec.backends.base import Runner
from autoprec.backends.tensorrt.layers import (
    parse_engine_layers,
    plan_fidelity,
)
from autoprec.backends.tensorrt.loader import (
    TENSORRT,
    BuiltEngine,
    Flavour,
    capturing_logger,
    fidelity_report,
)
from autoprec.core import atomic
from autoprec.core.errors import BackendError
from autoprec.core.timing import TRIAL, Runs, Timing

WARMUP_RUNS = 10


TIMED_RUNS = 100


class CudaPython:
    """Device memory, copies and events through cuda-python's runtime bindings."""

    def __init__(self, device: int):
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart  # cuda-python < 12.6
        self.rt = cudart
        self._check(cudart.cudaSetDevice(device))
        self.stream = self._check(cudart.cudaStreamCreate())

    def _check(self, result):
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise BackendError(f"CUDA runtime error {err}")
        return values[0] if len(values) == 1 else values

    def stream_handle(self) -> int:
        return int(self.stream)

    def alloc(self, nbytes: int) -> int:
        return int(self._check(self.rt.cudaMalloc(max(nbytes, 1))))

    def free(self, pointer: int) -> None:
        self.rt.cudaFree(pointer)

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        self._check(
            self.rt.cudaMemcpy(pointer, array.ctypes.data, array.nbytes,
                               self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice)
        )

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        self._check(
            self.rt.cudaMemcpy(array.ctypes.data, pointer, array.nbytes,
                               self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        )

    def synchronize(self) -> None:
        self._check(self.rt.cudaStreamSynchronize(self.stream))

    def elapsed_ms(self, enqueue) -> float:
        """Milliseconds between CUDA events recorded around ``enqueue()`` on the stream."""
        start, end = self._check(self.rt.cudaEventCreate()), self._check(self.rt.cudaEventCreate())
        self._check(self.rt.cudaEventRecord(start, self.stream))
        enqueue()
        self._check(self.rt.cudaEventRecord(end, self.stream))
        self._check(self.rt.cudaEventSynchronize(end))
        ms = float(self._check(self.rt.cudaEventElapsedTime(start, end)))
        self.rt.cudaEventDestroy(start)
        self.rt.cudaEventDestroy(end)
        return ms


class PyCuda:
    """The same through pycuda (its own context on ``device``)."""

    def __init__(self, device: int):
        import pycuda.driver as cuda

        cuda.init()
        self.cuda = cuda
        self.context = cuda.Device(device).make_context()
        self.stream = cuda.Stream()
        self.allocations: dict[int, Any] = {}

    def stream_handle(self) -> int:
        return self.stream.handle

    def alloc(self, nbytes: int) -> int:
        allocation = self.cuda.mem_alloc(max(nbytes, 1))
        self.allocations[int(allocation)] = allocation
        return int(allocation)

    def free(self, pointer: int) -> None:
        self.allocations.pop(pointer).free()

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        self.cuda.memcpy_htod(pointer, array)

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        self.cuda.memcpy_dtoh(array, pointer)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def elapsed_ms(self, enqueue) -> float:
        start, end = self.cuda.Event(), self.cuda.Event()
        start.record(self.stream)
        enqueue()
        end.record(self.stream)
        end.synchronize()
        return float(end.time_since(start))


def cuda_importable(flavour: Flavour = TENSORRT) -> None:
    """cuda-python or PyCUDA can be imported (without touching the GPU: a search's parent process
    must not make a CUDA context its workers would inherit); else the one line that says how to get
    it."""
    if not any(_findable(name) for name in ("cuda.bindings", "cuda.cudart", "pycuda")):
        raise BackendError(flavour.install + " (no cuda-python, no pycuda: pip install "
                                             "cuda-python)")


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def cuda_api(device: int, flavour: Flavour = TENSORRT):
    try:
        return CudaPython(device)
    except ImportError:
        pass
    try:
        return PyCuda(device)
    except ImportError:
        raise BackendError(flavour.install + " (no cuda-python, no pycuda: pip install "
                                             "cuda-python)") from None


def layer_timer(trt):
    """An ``IProfiler`` whose ``ms`` holds milliseconds per engine layer, summed over the profiled
    runs (defined here because its base class comes with the lazily imported module)."""

    class LayerTimes(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)
            self.ms: dict[str, float] = {}

        def report_layer_time(self, layer_name, ms):
            self.ms[layer_name] = self.ms.get(layer_name, 0.0) + ms

    return LayerTimes()


class RuntimeCache:
    """TensorRT for RTX's cache of just-in-time compiled kernels: one file per study, loaded into
    each engine's runtime config and written back (atomically) when the engine is done, so later
    candidates and a resumed search compile only kernels not seen before."""

    def __init__(self, path: Path | None):
        self.path = path

    def context(self, engine):
        config = engine.create_runtime_config()
        cache = config.create_runtime_cache()
        if self.path is not None and self.path.is_file():
            cache.deserialize(self.path.read_bytes())
        config.set_runtime_cache(cache)
        return engine.create_execution_context(config), cache

    def save(self, cache) -> None:
        if self.path is not None and cache is not None:
            atomic.write_bytes(self.path, bytes(cache.serialize()))


class TensorRTRunner(Runner):
    """One engine, its context, and device buffers for every I/O tensor (inputs copied once per
    batch)."""

    def __init__(self, trt, cuda: Callable[[], Any], built: BuiltEngine,
                 runtime_cache: RuntimeCache | None = None):
        """``cuda`` gives the device-memory API once the engine is loaded (a machine that cannot
        load it is told so first, not that it lacks cuda-python)."""
        self.trt, self.built = trt, built
        self.logger = capturing_logger(trt)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(built.serialized)
        if self.engine is None:
            raise BackendError(
                "TensorRT could not load the engine it just built "
                f"({self.logger.last_error() or 'no reason given'})"
            )
        self.cuda = cuda()
        self.runtime_cache = runtime_cache
        self.cache = None
        if runtime_cache is not None:
            self.context, self.cache = runtime_cache.context(self.engine)
        else:
            self.context = self.engine.create_execution_context()
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in self.names if n not in self.inputs]
        self.buffers: dict[str, tuple[int, np.ndarray]] = {}
        inspector = self.engine.create_engine_inspector()
        self.layer_json = inspector.get_engine_information(trt.LayerInformationFormat.JSON)

    def _bind(self, batch: Batch) -> None:
        for name in self.inputs:
            array = np.ascontiguousarray(batch[name],
                                         dtype=self.trt.nptype(self.engine.get_tensor_dtype(name)))
            self.context.set_input_shape(name, array.shape)
            pointer = self._buffer(name, array)
            self.cuda.to_device(pointer, array)
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            self._buffer(name,
                         np.empty(shape, dtype=self.trt.nptype(self.engine.get_tensor_dtype(name))))

    def _buffer(self, name: str, like: np.ndarray) -> int:
        held = self.buffers.get(name)
        if held is None or held[1].nbytes != like.nbytes or held[1].shape != like.shape:
            if held is not None:
                self.cuda.free(held[0])
            held = (self.cuda.alloc(like.nbytes), like)
            self.buffers[name] = held
            self.context.set_tensor_address(name, held[0])
        return held[0]

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.cuda.stream_handle()):
            raise BackendError("TensorRT's execute_async_v3 failed")

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        self._bind(batch)
        self._enqueue()
        self.cuda.synchronize()
        result = {}
        for name in self.outputs:
            pointer, host = self.buffers[name]
            out = np.empty_like(host)
            self.cuda.to_host(out, pointer)
            result[name] = out
        return result

    def time(self, batch: Batch, runs: Runs = TRIAL) -> Timing:
        """CUDA-event time of ``execute_async_v3`` alone, TIMED_RUNS runs whatever ``runs`` asks:
        I/O stays on the device between runs. (On
        TensorRT for RTX the first runs also compile kernels just in time: the warm-up absorbs
        them.)"""
        self._bind(batch)
        for _ in range(WARMUP_RUNS):
            self._enqueue()
        self.cuda.synchronize()
        samples = np.array([self.cuda.elapsed_ms(self._enqueue) for _ in range(TIMED_RUNS)])
        return Timing(float(np.median(samples)), float(np.percentile(samples, 10)),
                      float(np.percentile(samples, 90)),
                      len(samples), WARMUP_RUNS)

    def layer_times(self, batch: Batch, runs: int) -> dict[str, float]:
        """Milliseconds per run in each engine layer, from TensorRT's own profiler."""
        self._bind(batch)
        self._enqueue()  # warm-up, not profiled
        self.cuda.synchronize()
        profiler = layer_timer(self.trt)
        self.context.profiler = profiler
        for _ in range(runs):
            self._enqueue()
            self.cuda.synchronize()
        return {name: ms / runs for name, ms in profiler.ms.items()}

    def build_report(self) -> dict[str, Any]:
        report = dict(self.built.report)
        layers = parse_engine_layers(self.layer_json, "engine inspector")
        checks = dict(report.get("fidelity_checks") or {})
        if self.built.planned and (fidelity := plan_fidelity(layers, self.built.planned)) is not None:
            checks["engine inspector"] = fidelity.to_json()
        return {**report, "engine_layers": layers.summary(), **fidelity_report(checks)}

    def close(self) -> None:
        for pointer, _ in self.buffers.values():
            self.cuda.free(pointer)
        self.buffers.clear()
        if self.runtime_cache is not None:
            self.runtime_cache.save(self.cache)

"""TensorRT: strongly typed builds of the explicit-precision ONNX, timed with CUDA events.

NEVER EXECUTED by autoprec's developers: TensorRT's libraries come only from NVIDIA's package
index, which no machine of this project reaches. This module is written from TensorRT's
documented Python API (10.12+ and 11.x) and verified without the library: every TensorRT name it
uses is checked against TensorRT 11.4's bindings and the 10.x type stubs, and its build/time flow
against a recording fake ``tensorrt`` module (tests/test_tensorrt.py). Numbers it produces on a
machine with TensorRT are real measurements; none are shown in this project's README.

Why TensorRT's API directly and not Polygraphy's: the search needs (1) one timing cache shared by
every candidate and persisted across runs, (2) latency from CUDA events around ``execute_async_v3``
with inputs and outputs resident on the device, and (3) the engine inspector's JSON after each
build. Polygraphy's runner times host wall-clock around copies; its loaders add a layer whose
TensorRT 11 behaviour we could not run either. The TensorRT surface used here is small (parser,
builder config, runtime, execution context, inspector) and is name-checked against 11.4.

Device memory and events come from cuda-python (``cuda.bindings.runtime``, NVIDIA's own) or, if
that is missing, pycuda.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from autoprec import atomic
from autoprec.backends.base import Backend, EngineInfo, Runner, Timing
from autoprec.calibrate import ActivationRanges
from autoprec.data import Batch
from autoprec.engine_layers import parse_engine_layers, plan_fidelity
from autoprec.errors import BackendError
from autoprec.lower import QDQForm
from autoprec.model import ModelInfo
from autoprec.plan import Plan

INSTALL_HINT = ("--backend tensorrt needs TensorRT's Python package (10.12 or newer) and cuda-python: "
                "pip install 'autoprec[tensorrt]' --extra-index-url https://pypi.nvidia.com")
NEVER_EXECUTED = ("the TensorRT backend has never been executed by autoprec's developers (no TensorRT where it "
                  "was written); it follows TensorRT's documented API — check its first results with trtexec")
PLAN_METADATA_KEY = "autoprec.plan_units"
WORKSPACE_BYTES = 4 << 30
OPTIMIZATION_LEVEL = 3
WARMUP_RUNS = 10
TIMED_RUNS = 100


def import_tensorrt():
    try:
        import tensorrt
    except ImportError:
        raise BackendError(INSTALL_HINT) from None
    return tensorrt


def major_version(trt) -> int:
    return int(str(trt.__version__).split(".")[0])


def network_flags(trt) -> int:
    """Strongly typed: always on (and the flag deprecated) in TensorRT 11; opt-in on 10.x."""
    if major_version(trt) >= 11:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def parse_onnx(trt, network, logger, model_bytes: bytes) -> None:
    parser = trt.OnnxParser(network, logger)
    if parser.parse(model_bytes):
        return
    errors = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        where = f"node {error.node_name()!r} ({error.node_operator()})" if error.node_name() else f"node #{error.node()}"
        errors.append(f"{where}: {error.desc()}")
    raise BackendError("TensorRT's ONNX parser rejected the candidate: " + "; ".join(errors or ["no error reported"]))


class TimingCache:
    """One timing cache for every build of a study, read at start and written back after each build
    (atomically), so a resumed search and later candidates reuse the kernels already timed."""

    def __init__(self, path: Path | None):
        self.path = path

    def attach(self, config) -> None:
        data = self.path.read_bytes() if self.path is not None and self.path.is_file() else b""
        config.set_timing_cache(config.create_timing_cache(data), False)

    def save(self, config) -> None:
        if self.path is not None:
            atomic.write_bytes(self.path, bytes(config.get_timing_cache().serialize()))


def build_serialized_engine(trt, logger, model: onnx.ModelProto, timing_cache: TimingCache,
                            workspace_bytes: int = WORKSPACE_BYTES, optimization_level: int = OPTIMIZATION_LEVEL) -> bytes:
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt))
    parse_onnx(trt, network, logger, model.SerializeToString())
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    config.builder_optimization_level = optimization_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    # No optimization profile: autoprec's analysis fixed every input to the data's shapes, so each
    # engine is built for exactly the shapes it is timed at (the exports carry min/opt/max shapes
    # for deploying the original dynamic model).
    timing_cache.attach(config)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendError("TensorRT could not build the candidate (see the worker's stderr for TensorRT's log)")
    timing_cache.save(config)
    return bytes(serialized)


def engine_information(serialized: bytes) -> str:
    """The inspector's JSON for a serialized engine (needs TensorRT and a GPU)."""
    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    if engine is None:
        raise BackendError("TensorRT could not deserialize the engine (built by another TensorRT version or GPU?)")
    return engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)


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
        self._check(self.rt.cudaMemcpy(pointer, array.ctypes.data, array.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice))

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        self._check(self.rt.cudaMemcpy(array.ctypes.data, pointer, array.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))

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


def cuda_api(device: int):
    try:
        return CudaPython(device)
    except ImportError:
        pass
    try:
        return PyCuda(device)
    except ImportError:
        raise BackendError(INSTALL_HINT + " (no cuda-python, no pycuda)") from None


def layer_profiler(trt):
    """An ``IProfiler`` whose ``ms`` holds milliseconds per engine layer, summed over the profiled runs
    (defined here because its base class comes with the lazily imported module)."""

    class LayerTimes(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)
            self.ms: dict[str, float] = {}

        def report_layer_time(self, layer_name, ms):
            self.ms[layer_name] = self.ms.get(layer_name, 0.0) + ms

    return LayerTimes()


class TensorRTRunner(Runner):
    """One engine, its context, and device buffers for every I/O tensor (inputs copied once per batch)."""

    def __init__(self, trt, cuda, serialized: bytes, planned: dict | None):
        self.trt, self.cuda = trt, cuda
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(serialized)
        if self.engine is None:
            raise BackendError("TensorRT could not deserialize the engine it just built")
        self.context = self.engine.create_execution_context()
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in self.names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in self.names if n not in self.inputs]
        self.buffers: dict[str, tuple[int, np.ndarray]] = {}
        inspector = self.engine.create_engine_inspector()
        self.layer_json = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
        self.planned = planned

    def _bind(self, batch: Batch) -> None:
        for name in self.inputs:
            array = np.ascontiguousarray(batch[name], dtype=self.trt.nptype(self.engine.get_tensor_dtype(name)))
            self.context.set_input_shape(name, array.shape)
            pointer = self._buffer(name, array)
            self.cuda.to_device(pointer, array)
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            self._buffer(name, np.empty(shape, dtype=self.trt.nptype(self.engine.get_tensor_dtype(name))))

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

    def time(self, batch: Batch) -> Timing:
        """CUDA-event time of ``execute_async_v3`` alone: I/O stays on the device between runs."""
        self._bind(batch)
        for _ in range(WARMUP_RUNS):
            self._enqueue()
        self.cuda.synchronize()
        samples = np.array([self.cuda.elapsed_ms(self._enqueue) for _ in range(TIMED_RUNS)])
        return Timing(float(np.median(samples)), float(np.percentile(samples, 10)), float(np.percentile(samples, 90)),
                      len(samples), WARMUP_RUNS)

    def layer_times(self, batch: Batch, runs: int) -> dict[str, float]:
        """Milliseconds per run in each engine layer, from TensorRT's own profiler."""
        self._bind(batch)
        self._enqueue()  # warm-up, not profiled
        self.cuda.synchronize()
        profiler = layer_profiler(self.trt)
        self.context.profiler = profiler
        for _ in range(runs):
            self._enqueue()
            self.cuda.synchronize()
        return {name: ms / runs for name, ms in profiler.ms.items()}

    def build_report(self) -> dict[str, Any]:
        layers = parse_engine_layers(self.layer_json, "engine inspector")
        fidelity = plan_fidelity(layers, self.planned) if self.planned else None
        return {"engine_layers": layers.summary(), "plan_fidelity": fidelity.to_json() if fidelity else None}

    def close(self) -> None:
        for pointer, _ in self.buffers.values():
            self.cuda.free(pointer)
        self.buffers.clear()


class TensorRTBackend(Backend):
    """Strongly typed TensorRT builds of the TensorRT Q/DQ form (signed symmetric, inputs only)."""

    name = "tensorrt"
    qdq_form = QDQForm.TENSORRT
    default_build_workers = 2  # an engine build takes seconds to minutes: build the next one while one is timed

    def __init__(self, device: int = 0, cache_dir: Path | None = None):
        self._trt = import_tensorrt()
        self.device = device
        self.logger = self._trt.Logger(self._trt.Logger.WARNING)
        self.timing_cache = TimingCache(Path(cache_dir) / "tensorrt.timing-cache" if cache_dir else None)
        self._cuda = None

    @property
    def cuda(self):
        if self._cuda is None:
            self._cuda = cuda_api(self.device)
        return self._cuda

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, "tensorrt", str(self._trt.__version__), "strongly typed", f"CUDA device {self.device}",
                          self.qdq_form.value, caveat=NEVER_EXECUTED)

    def lower(self, info: ModelInfo, plan: Plan, ranges: ActivationRanges | None) -> onnx.ModelProto:
        """The TensorRT Q/DQ form, stamped with the plan (unit → precision, nodes) so each build can be
        checked against what the engine runs."""
        model = super().lower(info, plan, ranges)
        return stamp_plan(model, info, plan)

    def prepare(self, model: onnx.ModelProto) -> TensorRTRunner:
        serialized = build_serialized_engine(self._trt, self.logger, model, self.timing_cache)
        return TensorRTRunner(self._trt, self.cuda, serialized, stamped_plan(model))

    def node_times(self, model: onnx.ModelProto, batch: Batch, runs: int = 10) -> dict[str, float]:
        """Seconds per run per ONNX node: each engine layer's time split evenly over the ONNX nodes it
        was built from (Metadata, else its name); layers naming none go to ``""``."""
        with self.prepare(model) as runner:
            layers = {layer.name: layer for layer in parse_engine_layers(runner.layer_json).layers}
            per_layer = runner.layer_times(batch, runs)
        nodes = {n.name for n in model.graph.node}
        times: dict[str, float] = {}
        for name, ms in per_layer.items():
            layer = layers.get(name)
            owners = [n for n in (layer.fused_from if layer else ()) if n in nodes] or [""]
            for owner in owners:
                times[owner] = times.get(owner, 0.0) + ms * 1e-3 / len(owners)
        return times


def stamp_plan(model: onnx.ModelProto, info: ModelInfo, plan: Plan) -> onnx.ModelProto:
    precisions = plan.as_dict()
    planned = {u.name: {"precision": str(precisions.get(u.name, "fp32")), "nodes": list(u.nodes)} for u in info.units}
    entry = model.metadata_props.add()
    entry.key, entry.value = PLAN_METADATA_KEY, json.dumps(planned)
    return model


def stamped_plan(model: onnx.ModelProto) -> dict | None:
    for entry in model.metadata_props:
        if entry.key == PLAN_METADATA_KEY:
            return json.loads(entry.value)
    return None

"""TensorRT and TensorRT for RTX: strongly typed builds of the explicit-precision ONNX, timed with CUDA events.

One code path for both: their Python APIs agree on everything used here but for what
:class:`Flavour` names (the module, strong typing, build-time timing cache versus runtime cache,
the GPUs an engine runs on).

What has run (2026-11-23):

- The **build half** — ONNX parsing with the parser's errors, the network's strongly typed layer
  types checked against the plan, the builder, its verbose layer log — runs against the real
  TensorRT for RTX 1.7 builder on CPU-only machines, in every CI run (tests/test_tensorrt_rtx.py).
- The **run half** — deserializing, the engine inspector, ``execute_async_v3``, CUDA-event timing,
  the layer profiler, the runtime cache — has NEVER run: TensorRT proper cannot be installed on this
  project's machines, and TensorRT for RTX refuses their only GPU (an H100, compute capability 9.0).
  It is checked against a recording fake (tests/fake_tensorrt.py) and every TensorRT name it uses
  against TensorRT 11.4's bindings, the 10.x stubs and the installed TensorRT for RTX module.

Why TensorRT's API directly and not Polygraphy's: the search needs (1) one timing cache shared by
every candidate and persisted across runs (a runtime cache on RTX), (2) latency from CUDA events
around ``execute_async_v3`` with inputs and outputs resident on the device, and (3) what the
builder and the engine inspector say of each build.

Device memory and events come from cuda-python (``cuda.bindings.runtime``, NVIDIA's own) or, if
that is missing, pycuda.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from autoprec.analysis import subgraphs
from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.data import Batch
from autoprec.analysis.model import RECURRENT_OPS, ModelInfo
from autoprec.backends.base import Backend, EngineInfo, Runner, Timing
from autoprec.backends.gpus import gpu_facts
from autoprec.backends.tensorrt.layers import (
    EngineLayers,
    PlanFidelity,
    onnx_nodes,
    parse_builder_layers,
    parse_engine_layers,
    plan_fidelity,
)
from autoprec.core import atomic
from autoprec.core.errors import AutoprecError, BackendError
from autoprec.core.plan import Plan
from autoprec.core.profile import ShapeProfile
from autoprec.core.stored import StoredModel
from autoprec.lower import QDQForm

PLAN_METADATA_KEY = "autoprec.plan_units"
WORKSPACE_BYTES = 4 << 30
OPTIMIZATION_LEVEL = 3
WARMUP_RUNS = 10
TIMED_RUNS = 100


@dataclass(frozen=True)
class Flavour:
    """What differs between TensorRT and TensorRT for RTX where their Python APIs otherwise agree."""

    backend: str  # the --backend name
    modules: tuple[str, ...]  # import names, tried in order
    install: str  # the one line that says how to get it
    always_strongly_typed: bool  # RTX: every network, no flag; TensorRT: from 11 on (10.12+ opt-in)
    # TensorRT times tactics at build time and keeps them in a timing cache. TensorRT for RTX compiles
    # its kernels just in time, at the first run: its timing cache has no effect (deprecated since 1.2)
    # and makes the CPU-only build query a GPU, so it uses a runtime cache of compiled kernels instead.
    timing_cache: bool
    runtime_cache: bool
    # Compute capabilities its engines run on (None: whatever the installed TensorRT supports).
    gpus: tuple[str, ...] | None = None
    # Said with every number the backend produces: what of it has never run.
    caveat: str = ""


TENSORRT = Flavour(
    "tensorrt", ("tensorrt",),
    "--backend tensorrt needs TensorRT's Python package (10.12 or newer) and cuda-python: "
    "pip install 'autoprec[tensorrt]' --extra-index-url https://pypi.nvidia.com",
    always_strongly_typed=False, timing_cache=True, runtime_cache=False,
    caveat="TensorRT proper has never been executed by autoprec's developers (its libraries cannot be installed "
           "where autoprec is made); its build code runs in CI against TensorRT for RTX, its run half (engine "
           "execution, timing, inspector, profiler) never ran — check its first results with trtexec",
)
TENSORRT_RTX = Flavour(
    "tensorrt-rtx",
    ("tensorrt_rtx", "tensorrt_rtx_bindings"),
    "--backend tensorrt-rtx needs TensorRT for RTX and cuda-python (PyPI, no extra index): pip install 'autoprec[tensorrt-rtx]'",
    always_strongly_typed=True,
    timing_cache=False,
    runtime_cache=True,
    gpus=("8.0", "8.6", "8.9", "12.0", "12.1"),
    caveat="the run half of the TensorRT for RTX backend (engine execution, CUDA-event timing, inspector, profiler, "
    "runtime cache) has never been executed by autoprec's developers (no GPU it runs on where it was made); "
    "its build half runs in every CI run",
)
FLAVOURS = {f.backend: f for f in (TENSORRT, TENSORRT_RTX)}


def import_tensorrt(flavour: Flavour = TENSORRT):
    for name in flavour.modules:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise BackendError(flavour.install)


def installed() -> tuple[Flavour, Any] | None:
    """The TensorRT this machine has (TensorRT proper first), with its module; None when there is none."""
    for flavour in (TENSORRT, TENSORRT_RTX):
        try:
            return flavour, import_tensorrt(flavour)
        except BackendError:
            continue
    return None


def major_version(trt) -> int:
    return int(str(trt.__version__).split(".")[0])


def network_flags(trt, flavour: Flavour) -> int:
    """Strongly typed: always on (and the flag deprecated) in TensorRT 11 and in TensorRT for RTX; opt-in on 10.x."""
    if flavour.always_strongly_typed or major_version(trt) >= 11:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def capturing_logger(trt):
    """An ``ILogger`` keeping every message: the builder's verbose layer list is read from them, its
    warnings go into the build report and its last error into autoprec's message."""

    class Captured(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.messages: list[tuple[int, str]] = []

        def log(self, severity, message):
            self.messages.append((int(severity), message))

        def text(self) -> str:
            return "\n".join(message for _, message in self.messages)

        def warnings(self) -> list[str]:
            return [m for s, m in self.messages if s == int(trt.ILogger.WARNING)][:20]

        def last_error(self) -> str:
            errors = [m for s, m in self.messages if s <= int(trt.ILogger.ERROR)]
            return (errors[-1].strip().splitlines() or [""])[0][:300] if errors else ""

    return Captured()


def parse_onnx(trt, network, logger, path: Path):
    """The parser that read ``path`` (its external weights beside it) into ``network``: kept by the caller
    until the build is done, since the network's weights live in it."""
    parser = trt.OnnxParser(network, logger)
    if parser.parse_from_file(str(path)):
        return parser
    errors = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        where = (
            f"node {error.node_name()!r} ({error.node_operator()})" if error.node_name() else f"node #{error.node()}"
        )
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


# Network layers where a unit's arithmetic runs, and the type names TensorRT gives its tensors.
# The layers a unit's main node becomes: compute layers, and those of sensitive units (softmax,
# reductions, normalisations, unary math, Pow).
_COMPUTE_LAYERS = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "SOFTMAX", "REDUCE", "NORMALIZATION", "UNARY",
                   "ELEMENTWISE")
_NETWORK_TYPES = {"FLOAT": "fp32", "HALF": "fp16", "BF16": "bf16", "INT8": "int8", "FP8": "fp8"}


def _enum_name(value) -> str:
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1]


def network_precisions(network) -> dict[str, list[tuple[str, str]]]:
    """ONNX node -> (layer, the type its compute layers run in) for every convolution, matrix multiply and
    sensitive-unit layer (softmax, reduction, normalisation, unary math, Pow) of a parsed, strongly
    typed network: int8 when its input comes through a DequantizeLinear from INT8, else its output's
    type. Read before any build, so it needs no GPU."""
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    producer = {layer.get_output(j).name: layer for layer in layers for j in range(layer.num_outputs)}
    found: dict[str, list[tuple[str, str]]] = {}
    for layer in layers:
        if _enum_name(layer.type) not in _COMPUTE_LAYERS:
            continue
        source = producer.get(layer.get_input(0).name) if layer.num_inputs else None
        if (
            source is not None
            and _enum_name(source.type) == "DEQUANTIZE"
            and _enum_name(source.get_input(0).dtype) == "INT8"
        ):
            precision = "int8"
        else:
            precision = _NETWORK_TYPES.get(
                _enum_name(layer.get_output(0).dtype), _enum_name(layer.get_output(0).dtype).lower()
            )
        for node in onnx_nodes(layer.metadata or "") or [layer.name]:
            found.setdefault(node, []).append((layer.name, precision))
    return found


def network_fidelity(network, planned: dict) -> PlanFidelity:
    """Every unit's compute layers in the parsed network against the plan: FP16 units in HALF, FP32 units
    in FLOAT, INT8 units fed from INT8 through DequantizeLinear. A unit whose node made no compute layer
    is reported as not found."""
    precisions = network_precisions(network)
    ignored, checked = [], 0
    for unit, spec in planned.items():
        checked += 1
        layers = next((precisions[n] for n in spec.get("main", spec["nodes"][:1]) if n in precisions), [])
        ran = sorted({p for _, p in layers})
        if spec["precision"] not in ran:
            ignored.append({"unit": unit, "planned": spec["precision"], "ran": ran or ["not found"],
                            "layers": [name for name, _ in layers]})
    return PlanFidelity(checked, tuple(ignored), "network types")


@dataclass(frozen=True)
class BuiltEngine:
    """A serialized engine and what the build said of it (needs no GPU to know)."""

    serialized: bytes
    report: dict[str, Any] = field(default_factory=dict)
    planned: dict | None = None  # the plan stamped in the model: unit -> precision, ONNX nodes
    layers: EngineLayers | None = None  # the fused layers the builder listed (TensorRT for RTX's verbose log)


def build_engine(trt, flavour: Flavour, model: StoredModel, timing_cache: TimingCache | None = None,
                 workspace_bytes: int = WORKSPACE_BYTES, optimization_level: int = OPTIMIZATION_LEVEL,
                 profile: ShapeProfile | None = None) -> BuiltEngine:
    """Parse, check the network's types against the stamped plan, build; the report holds both checks
    (network types; the builder's own layer list where it writes one) and the build's seconds. A network
    with dynamic inputs is built for ``profile`` (one optimisation profile: its min, opt and max)."""
    started = time.perf_counter()
    logger = capturing_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, flavour))
    with model.file() as path:  # parsed from a file, its weights read from beside it: never one 2 GB protobuf
        parser = parse_onnx(trt, network, logger, path)
    planned = stamped_plan(model.proto)
    checks = {"network types": network_fidelity(network, planned).to_json()} if planned else {}
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    config.builder_optimization_level = optimization_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    # A search's candidates have every input fixed (the shapes they are timed at): no profile. An export
    # keeps the source's dynamic dims: one profile, the search's min / opt / max.
    dynamic = [
        network.get_input(i) for i in range(network.num_inputs) if any(d < 0 for d in network.get_input(i).shape)
    ]
    if dynamic:
        config.add_optimization_profile(optimization_profile(builder, dynamic, profile))
    if flavour.timing_cache and timing_cache is not None:
        timing_cache.attach(config)
    serialized = builder.build_serialized_network(network, config)
    del parser  # the network's weights were the parser's until the build
    if serialized is None:
        raise BackendError(
            f"TensorRT could not build the candidate ({logger.last_error() or 'see its log in the worker stderr'})"
        )
    if flavour.timing_cache and timing_cache is not None:
        timing_cache.save(config)
    report: dict[str, Any] = {
        "built_with": f"{trt.__name__} {trt.__version__}",
        "build_seconds": time.perf_counter() - started,
        "warnings": logger.warnings(),
    }
    layers = parse_builder_layers(logger.text())
    if layers is not None:
        report["builder_layers"] = layers.summary()
        if planned and (fidelity := plan_fidelity(layers, planned)) is not None:
            checks["builder log"] = fidelity.to_json()
    report.update(fidelity_report(checks))
    return BuiltEngine(bytes(serialized), report, planned, layers)


def optimization_profile(builder, inputs: list, profile: ShapeProfile | None):
    """TensorRT's optimisation profile for the network's dynamic ``inputs``, from ``profile``."""
    ranges = {i.name: i for i in (profile.inputs if profile is not None else ())}
    missing = [tensor.name for tensor in inputs if tensor.name not in ranges]
    if missing:
        raise BackendError(f"input {missing[0]} has dynamic dims and no shape profile to build it for; export a result "
                           "(it records --shape, --min-shape, --max-shape) rather than a bare model")
    made = builder.create_optimization_profile()
    for tensor in inputs:
        found = ranges[tensor.name]
        made.set_shape(tensor.name, found.min, found.opt, found.max)
    return made


# The more a check saw of what the engine runs, the more it is trusted: the inspector reads the loaded
# engine, the builder log its fused layers, the network types only what the parser made of the model.
FIDELITY_SOURCES = ("engine inspector", "builder log", "network types")


def fidelity_report(checks: dict[str, dict]) -> dict[str, Any]:
    """``plan_fidelity``: the most informed check's verdict (see FIDELITY_SOURCES); ``fidelity_checks``: all."""
    best = next((checks[s] for s in FIDELITY_SOURCES if s in checks), None)
    return {"plan_fidelity": best, "fidelity_checks": checks}


def engine_information(serialized: bytes) -> str:
    """The inspector's JSON for a serialized engine, with whichever TensorRT is installed (needs a GPU it runs on)."""
    found = installed()
    if found is None:
        raise BackendError(TENSORRT.install + " (or TensorRT for RTX: pip install 'autoprec[tensorrt-rtx]')")
    flavour, trt = found
    logger = capturing_logger(trt)
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    if engine is None:
        raise BackendError(
            f"{trt.__name__} {trt.__version__} could not load the engine ({logger.last_error() or 'no reason given'}); "
            "inspect it on a GPU it was built for, with the TensorRT that built it"
        )
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
        self._check(
            self.rt.cudaMemcpy(pointer, array.ctypes.data, array.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice)
        )

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        self._check(
            self.rt.cudaMemcpy(array.ctypes.data, pointer, array.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
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


def cuda_api(device: int, flavour: Flavour = TENSORRT):
    try:
        return CudaPython(device)
    except ImportError:
        pass
    try:
        return PyCuda(device)
    except ImportError:
        raise BackendError(flavour.install + " (no cuda-python, no pycuda: pip install cuda-python)") from None


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


class RuntimeCache:
    """TensorRT for RTX's cache of just-in-time compiled kernels: one file per study, loaded into each
    engine's runtime config and written back (atomically) when the engine is done, so later
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
    """One engine, its context, and device buffers for every I/O tensor (inputs copied once per batch)."""

    def __init__(self, trt, cuda: Callable[[], Any], built: BuiltEngine, runtime_cache: RuntimeCache | None = None):
        """``cuda`` gives the device-memory API once the engine is loaded (a machine that cannot load it is
        told so first, not that it lacks cuda-python)."""
        self.trt, self.built = trt, built
        self.logger = capturing_logger(trt)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(built.serialized)
        if self.engine is None:
            raise BackendError(
                f"TensorRT could not load the engine it just built ({self.logger.last_error() or 'no reason given'})"
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
        """CUDA-event time of ``execute_async_v3`` alone: I/O stays on the device between runs. (On TensorRT
        for RTX the first runs also compile kernels just in time: the warm-up absorbs them.)"""
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


def check_gpu(flavour: Flavour, device: int) -> dict[str, str]:
    """The GPU ``device`` when this TensorRT runs engines on it; else one line: no GPU, no such index, or
    a compute capability it does not run (naming what to use instead)."""
    gpus = gpu_facts()
    if not gpus:
        raise BackendError(
            f"--backend {flavour.backend}: no NVIDIA GPU on this machine (nvidia-smi finds none), and a search times "
            "every candidate on one; builds alone run on the CPU: autoprec export RESULT --format python --build")
    if not 0 <= device < len(gpus):
        raise BackendError(f"--device {device}: this machine has GPU(s) 0..{len(gpus) - 1}; choose one of them")
    gpu = gpus[device]
    capability = gpu.get("compute_capability", "")
    if flavour.gpus is not None and capability and capability not in flavour.gpus and not capability.startswith("12."):
        raise BackendError(
            f"--backend {flavour.backend}: GPU {device} ({gpu['name']}) has compute capability {capability}, on which "
            f"TensorRT for RTX does not run engines (it runs {', '.join(flavour.gpus)}: A100, RTX 30/40/50, L4/L40, "
            "RTX PRO); use --backend tensorrt (TensorRT proper) or --backend ort-cuda on this GPU")
    return gpu


class ProfiledEngines:
    """Engines built to be profiled, kept in the study's cache folder (where the worker processes look)
    until a trial of the same graph loads one instead of building it again: the sensitivity pass
    profiles the FP32 model and the all-units plans, which are the study's first trials, so each of
    them costs one build, not two. A trial takes its engine (the files go with it)."""

    REUSED = "built once for the sensitivity pass's profile of this same graph, then timed here"

    def __init__(self, folder: Path | None):
        self.folder = folder

    def _paths(self, model: StoredModel) -> tuple[Path, Path]:
        key = hashlib.sha256(model.proto.SerializeToString()).hexdigest()[
            :32
        ]  # the graph; its weights are the folder's
        return self.folder / f"{key}.engine", self.folder / f"{key}.json"

    def keep(self, model: StoredModel, built: BuiltEngine) -> None:
        if self.folder is None:
            return
        engine, facts = self._paths(model)
        atomic.write_bytes(engine, built.serialized)
        atomic.write_json(
            facts, {"report": built.report, "planned": built.planned}
        )  # written last: the engine is whole

    def take(self, model: StoredModel) -> BuiltEngine | None:
        if self.folder is None:
            return None
        engine, facts = self._paths(model)
        try:
            kept, serialized = json.loads(facts.read_text()), engine.read_bytes()
        except (OSError, ValueError):
            return None
        facts.unlink(missing_ok=True)
        engine.unlink(missing_ok=True)
        return BuiltEngine(serialized, {**kept["report"], "reused_build": self.REUSED}, kept["planned"])

    def drop(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


class TensorRTBackend(Backend):
    """Strongly typed TensorRT builds of the TensorRT Q/DQ form (signed symmetric, inputs only)."""

    name = "tensorrt"
    flavour = TENSORRT
    qdq_form = QDQForm.TENSORRT
    default_build_workers = 2  # an engine build takes seconds to minutes: build the next one while one is timed
    default_proposals = 8  # and evaluating a plan on ONNX Runtime's CPU takes a fraction of one
    one_shape_only = ("autoprec's TensorRT backends build for one shape (no optimisation profile yet); time the "
                      "exported engine with trtexec --shapes at min, opt and max")

    def __init__(self, device: int = 0, cache_dir: Path | None = None):
        self._trt = import_tensorrt(self.flavour)
        self.device = device
        folder = Path(cache_dir) if cache_dir else None
        self.timing_cache = TimingCache(folder / f"{self.name}.timing-cache" if folder else None)
        self.runtime_cache = RuntimeCache(folder / f"{self.name}.runtime-cache" if folder else None)
        self.profiled = ProfiledEngines(folder / f"{self.name}-profiled-engines" if folder else None)
        self._cuda = None

    @property
    def cuda(self):
        if self._cuda is None:
            self._cuda = cuda_api(self.device, self.flavour)
        return self._cuda

    def device_label(self) -> str:
        return f"CUDA device {self.device}"

    def info(self) -> EngineInfo:
        return EngineInfo(
            self.name,
            self.name,
            str(self._trt.__version__),
            "strongly typed",
            self.device_label(),
            self.qdq_form.value,
            caveat=self.flavour.caveat,
            timing=f"CUDA-event time of one execute_async_v3 on one batch, bindings on the GPU; median of "
            f"{TIMED_RUNS} runs after {WARMUP_RUNS} warm-up runs (never executed by autoprec's developers)",
        )

    def lower(self, info: ModelInfo, plan: Plan, ranges: ActivationRanges | None) -> StoredModel:
        """The TensorRT Q/DQ form, stamped with the plan (unit → precision, nodes) so each build can be
        checked against what the network and the engine run."""
        return stamp_plan(super().lower(info, plan, ranges), info, plan)

    def build(self, model: StoredModel) -> BuiltEngine:
        """Parse and build (no GPU needed): the serialized engine and the build's own report."""
        return build_engine(self._trt, self.flavour, model, self.timing_cache)

    def prepare(self, model: StoredModel) -> TensorRTRunner:
        return self._runner(self.profiled.take(model) or self.build(model))

    def _runner(self, built: BuiltEngine) -> TensorRTRunner:
        return TensorRTRunner(
            self._trt, lambda: self.cuda, built, self.runtime_cache if self.flavour.runtime_cache else None
        )

    def drop_kept_builds(self) -> None:
        self.profiled.drop()

    def node_times(self, model: StoredModel, batch: Batch, runs: int = 10) -> dict[str, float]:
        """Seconds per run per ONNX node: each engine layer's time split evenly over the ONNX nodes it
        was built from (Metadata, else its name); layers naming none go to ``""``. The engine is kept
        for the trial of the same graph (:class:`ProfiledEngines`)."""
        built = self.build(model)
        self.profiled.keep(model, built)
        with self._runner(built) as runner:
            layers = {layer.name: layer for layer in parse_engine_layers(runner.layer_json).layers}
            per_layer = runner.layer_times(batch, runs)
        nodes = {
            subgraphs.label(scope, n.name) for scope, graph in subgraphs.graphs(model.proto.graph) for n in graph.node
        }
        times: dict[str, float] = {}
        for name, ms in per_layer.items():
            layer = layers.get(name)
            owners = [n for n in (layer.fused_from if layer else ()) if n in nodes] or [""]
            for owner in owners:
                times[owner] = times.get(owner, 0.0) + ms * 1e-3 / len(owners)
        return times


class TensorRTRtxBackend(TensorRTBackend):
    """TensorRT for RTX (PyPI): the same builds, engines that run on compute capability 8.0/8.6/8.9/12.x,
    kernels compiled at the first run and kept in a runtime cache."""

    name = "tensorrt-rtx"
    flavour = TENSORRT_RTX

    def __init__(self, device: int = 0, cache_dir: Path | None = None):
        super().__init__(device, cache_dir)
        self.gpu = check_gpu(self.flavour, device)  # refused now, before any candidate is built

    def device_label(self) -> str:
        return (
            f"{self.gpu['name']} (cuda:{self.device}, compute capability {self.gpu.get('compute_capability') or '?'})"
        )


def stamp_plan(model: StoredModel, info: ModelInfo, plan: Plan) -> StoredModel:
    """The plan (unit → precision and its ONNX nodes) kept in the model's metadata, for the build checks."""
    precisions = plan.as_dict()
    # A node inside an If branch is named by its path in TensorRT's layer metadata, one in a Loop body by
    # its own name: "main" holds both, tried in that order. A recurrent op becomes a loop of layers no
    # check reads a precision from: not stamped, so not checked.
    planned = {u.name: {"precision": str(precisions.get(u.name, "fp32")),
                        "nodes": [subgraphs.label(u.scope, n) for n in u.nodes],
                        "main": list(dict.fromkeys([subgraphs.label(u.scope, u.nodes[0]), u.nodes[0]]))}
               for u in info.units if u.op_type not in RECURRENT_OPS}
    entry = model.proto.metadata_props.add()
    entry.key, entry.value = PLAN_METADATA_KEY, json.dumps(planned)
    return model


def stamped_plan(model: onnx.ModelProto) -> dict | None:
    for entry in model.metadata_props:
        if entry.key == PLAN_METADATA_KEY:
            return json.loads(entry.value)
    return None


def read_engine_layers(path: str | Path) -> EngineLayers:
    """A layer-information JSON file, or a serialized engine (``.plan``/``.engine``: needs TensorRT)."""
    path = Path(path)
    if not path.is_file():
        raise AutoprecError(f"{path}: no such file; give an engine (.plan) or its layer-information JSON")
    if path.suffix.lower() == ".onnx":
        raise AutoprecError(
            f"{path}: an ONNX model, not an engine; build it first (e.g. autoprec export RESULT --format "
            "trtexec, then its build.sh) and inspect the engine or its layers.json"
        )
    raw = path.read_bytes()
    if raw.lstrip()[:1] in (b"{", b"["):
        return parse_engine_layers(raw.decode("utf-8", errors="replace"), str(path))
    if not raw.strip() or (b"\0" not in raw[:4096] and _is_text(raw[:4096])):
        raise AutoprecError(
            f"{path}: {'empty' if not raw.strip() else 'text, but not JSON'}: neither layer-information "
            "JSON nor a serialized engine; give the engine (.plan) or trtexec --exportLayerInfo's JSON"
        )
    return parse_engine_layers(engine_information(raw), str(path))


def _is_text(head: bytes) -> bool:
    """Readable text (a cut multi-byte character at the end of ``head`` allowed), as a serialized engine never is."""
    try:
        text = head.decode("utf-8") if len(head) < 4096 else head[:-3].decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\r\t" for c in text)

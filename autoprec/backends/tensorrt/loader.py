"""TensorRT and TensorRT for RTX: imported, an ONNX model parsed from its file and built strongly
typed, the network's types and the builder's layers checked against the plan stamped in the model.
Needs no GPU."""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from autoprec.analysis import subgraphs
from autoprec.analysis.model_info import ModelInfo
from autoprec.analysis.units import RECURRENT_OPS
from autoprec.backends.tensorrt.layers import (
    EngineLayers,
    PlanFidelity,
    onnx_nodes,
    parse_builder_layers,
    plan_fidelity,
)
from autoprec.backends.tensorrt.optimization_profile import optimization_profile
from autoprec.core import atomic, engines
from autoprec.core.errors import BackendError, first_line
from autoprec.core.plan import Plan
from autoprec.core.profile import ShapeProfile
from autoprec.core.stored import StoredModel

PLAN_METADATA_KEY = "autoprec.plan_units"


WORKSPACE_BYTES = 4 << 30


OPTIMIZATION_LEVEL = 3


@dataclass(frozen=True)
class Flavour:
    """What differs between TensorRT and TensorRT for RTX where their Python APIs otherwise
    agree."""

    backend: str  # the --backend name
    modules: tuple[str, ...]  # import names, tried in order
    install: str  # the one line that says how to get it
    always_strongly_typed: bool  # RTX: every network, no flag; TensorRT: from 11 on (10.12+ opt-in)
    # TensorRT times tactics at build time and keeps them in a timing cache. TensorRT for RTX
    # compiles its kernels just in time, at the first run: its timing cache has no effect
    # (deprecated since 1.2) and makes the CPU-only build query a GPU, so it uses a runtime cache of
    # compiled kernels instead.
    timing_cache: bool
    runtime_cache: bool
    # Compute capabilities its engines run on (None: whatever the installed TensorRT supports).
    gpus: tuple[str, ...] | None = None
    # Said with every number the backend produces: what of it has never run.
    caveat: str = ""


TENSORRT = Flavour(
    engines.TENSORRT, ("tensorrt",),
    "--backend tensorrt needs TensorRT's Python package (10.12 or newer) and cuda-python: "
    "pip install 'autoprec[tensorrt]' --extra-index-url https://pypi.nvidia.com",
    always_strongly_typed=False, timing_cache=True, runtime_cache=False,
    caveat="TensorRT proper has never been executed by autoprec's developers (its libraries cannot "
           "be installed where autoprec is made); its build code runs in CI against TensorRT for "
           "RTX, its run half (engine execution, timing, inspector, profiler) never ran — check "
           "its first results with trtexec",
)


TENSORRT_RTX = Flavour(
    engines.TENSORRT_RTX,
    ("tensorrt_rtx", "tensorrt_rtx_bindings"),
    "--backend tensorrt-rtx needs TensorRT for RTX and cuda-python (PyPI, no extra index): pip "
    "install 'autoprec[tensorrt-rtx]'",
    always_strongly_typed=True,
    timing_cache=False,
    runtime_cache=True,
    gpus=("8.0", "8.6", "8.9", "12.0", "12.1"),
    caveat="the run half of the TensorRT for RTX backend (engine execution, CUDA-event timing, "
           "inspector, profiler, "
    "runtime cache) has never been executed by autoprec's developers (no GPU it runs on where it "
    "was made); "
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
    """The TensorRT this machine has (TensorRT proper first), with its module; None when there is
    none."""
    for flavour in (TENSORRT, TENSORRT_RTX):
        try:
            return flavour, import_tensorrt(flavour)
        except BackendError:
            continue
    return None


def major_version(trt) -> int:
    return int(str(trt.__version__).split(".")[0])


def network_flags(trt, flavour: Flavour) -> int:
    """Strongly typed: always on (and the flag deprecated) in TensorRT 11 and in TensorRT for RTX;
    opt-in on 10.x."""
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
            return first_line(errors[-1]) if errors else ""

    return Captured()


def parse_onnx(trt, network, logger, path: Path):
    """The parser that read ``path`` (its external weights beside it) into ``network``: kept by the
    caller until the build is done, since the network's weights live in it."""
    parser = trt.OnnxParser(network, logger)
    if parser.parse_from_file(str(path)):
        return parser
    errors = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        where = (
            f"node {error.node_name()!r} ({error.node_operator()})" if error.node_name() else "node "
                                                                                              f"#{error.node()}"
        )
        errors.append(f"{where}: {error.desc()}")
    raise BackendError("TensorRT's ONNX parser rejected the candidate: " + "; ".join(errors or ["no "
                                                                                                "error "
                                                                                                "reported"]))


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
_COMPUTE_LAYERS = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "SOFTMAX", "REDUCE",
                   "NORMALIZATION", "UNARY",
                   "ELEMENTWISE", "GATHER")


_NETWORK_TYPES = {"FLOAT": "fp32", "HALF": "fp16", "BF16": "bf16", "INT8": "int8", "FP8": "fp8"}


def _enum_name(value) -> str:
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1]


def network_precisions(network) -> dict[str, list[tuple[str, str]]]:
    """ONNX node -> (layer, the type its compute layers run in) for every convolution, matrix
    multiply, gather and sensitive-unit layer (softmax, reduction, normalisation, unary math, Pow)
    of a parsed, strongly typed network: int8 when its input comes through a DequantizeLinear from
    INT8, int4 when its weight (a gather's table) comes so from INT4, else its output's type. Read
    before any build, so it needs no GPU."""
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    producer = {layer.get_output(j).name: layer for layer in layers for j in range(layer.num_outputs)}
    found: dict[str, list[tuple[str, str]]] = {}
    for layer in layers:
        if _enum_name(layer.type) not in _COMPUTE_LAYERS:
            continue
        source = producer.get(layer.get_input(0).name) if layer.num_inputs else None
        # (an embedding's Gather reads its table first)
        weight = 0 if _enum_name(layer.type) == "GATHER" else 1
        weights = _through_shuffles(producer, layer.get_input(weight)) if layer.num_inputs > 1 else None
        if _dequantized_from(source, "INT8"):
            precision = "int8"
        elif _dequantized_from(weights, "INT4"):  # weight-only: the activations keep their type
            precision = "int4"
        else:
            precision = _NETWORK_TYPES.get(
                _enum_name(layer.get_output(0).dtype), _enum_name(layer.get_output(0).dtype).lower()
            )
        for node in onnx_nodes(layer.metadata or "") or [layer.name]:
            found.setdefault(node, []).append((layer.name, precision))
    return found


def _through_shuffles(producer: dict, tensor):
    """The layer making ``tensor``, past the shuffles TensorRT puts between a weight and its matrix
    multiply (a 2-D weight broadcast to the activations' rank)."""
    layer = producer.get(tensor.name) if tensor is not None else None
    while layer is not None and _enum_name(layer.type) == "SHUFFLE":
        layer = producer.get(layer.get_input(0).name)
    return layer


def _dequantized_from(layer, dtype: str) -> bool:
    """Whether ``layer`` is a DequantizeLinear of a tensor of ``dtype`` (INT8, INT4)."""
    return layer is not None and _enum_name(layer.type) == "DEQUANTIZE" and _enum_name(layer.get_input(0).dtype) == dtype


def network_fidelity(network, planned: dict) -> PlanFidelity:
    """Every unit's compute layers in the parsed network against the plan: FP16 units in HALF, FP32
    units in FLOAT, INT8 units fed from INT8 through DequantizeLinear, INT4 units' weights from INT4
    so. A unit whose node made no compute layer is reported as not found."""
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
    # the fused layers the builder listed (TensorRT for RTX's verbose log)
    layers: EngineLayers | None = None


def build_engine(trt, flavour: Flavour, model: StoredModel, timing_cache: TimingCache | None = None,
                 workspace_bytes: int = WORKSPACE_BYTES,
                 optimization_level: int = OPTIMIZATION_LEVEL,
                 profile: ShapeProfile | None = None) -> BuiltEngine:
    """Parse, check the network's types against the stamped plan, build; the report holds both
    checks (network types; the builder's own layer list where it writes one) and the build's
    seconds. A network with dynamic inputs is built for ``profile`` (one optimisation profile: its
    min, opt and max)."""
    started = time.perf_counter()
    logger = capturing_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, flavour))
    # parsed from a file, its weights read from beside it: never one 2 GB protobuf
    with model.file() as path:
        parser = parse_onnx(trt, network, logger, path)
    planned = stamped_plan(model.proto)
    checks = {"network types": network_fidelity(network, planned).to_json()} if planned else {}
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    config.builder_optimization_level = optimization_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    # A search's candidates have every input fixed (the shapes they are timed at): no profile. An
    # export keeps the source's dynamic dims: one profile, the search's min / opt / max.
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
            "TensorRT could not build the candidate "
            f"({logger.last_error() or 'see its log in the worker stderr'})"
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


# The more a check saw of what the engine runs, the more it is trusted: the inspector reads the
# loaded engine, the builder log its fused layers, the network types only what the parser made of
# the model.
FIDELITY_SOURCES = ("engine inspector", "builder log", "network types")


def fidelity_report(checks: dict[str, dict]) -> dict[str, Any]:
    """``plan_fidelity``: the most informed check's verdict (see FIDELITY_SOURCES);
    ``fidelity_checks``: all."""
    best = next((checks[s] for s in FIDELITY_SOURCES if s in checks), None)
    return {"plan_fidelity": best, "fidelity_checks": checks}


def stamp_plan(model: StoredModel, info: ModelInfo, plan: Plan) -> StoredModel:
    """The plan (unit → precision and its ONNX nodes) kept in the model's metadata, for the build
    checks."""
    precisions = plan.as_dict()
    # A node inside an If branch is named by its path in TensorRT's layer metadata, one in a Loop
    # body by its own name: "main" holds both, tried in that order. A recurrent op becomes a loop of
    # layers no check reads a precision from: not stamped, so not checked.
    planned = {u.name: {"precision": str(precisions.get(u.name, "fp32")),
                        "nodes": [subgraphs.label(u.scope, n) for n in u.nodes],
                        "main": list(dict.fromkeys([subgraphs.label(u.scope, u.nodes[0]),
                                                    u.nodes[0]]))}
               for u in info.units if u.op_type not in RECURRENT_OPS}
    entry = model.proto.metadata_props.add()
    entry.key, entry.value = PLAN_METADATA_KEY, atomic.json_text(planned)
    return model


def stamped_plan(model: onnx.ModelProto) -> dict | None:
    for entry in model.metadata_props:
        if entry.key == PLAN_METADATA_KEY:
            return json.loads(entry.value)
    return None

"""A recording FAKE of the ``tensorrt`` module and of CUDA memory — not TensorRT.

It stands in for TensorRT in contract tests: every attribute the code under test touches on it
is recorded as (TensorRT class, name), so a test can check each against TensorRT's real API
tables (tests/fixtures/tensorrt). Its "engine" runs the ONNX model with ONNX Runtime on the CPU,
so outputs are real; its inspector JSON follows TensorRT 10's detailed layout, computing a layer's
precision from the Q/DQ and Casts in the model (unless told to ignore the plan).
"""

from __future__ import annotations

import json
import types

import numpy as np
import onnx
import onnxruntime as ort

ACCESSED: set[tuple[str, str]] = set()
CALLS: list[tuple] = []
IGNORE_NODES: set[str] = set()  # compute nodes the fake engine runs in FP32 whatever the model says
PARSER_REJECTS: set[str] = set()  # op types the fake parser fails on
MEMORY: dict[int, np.ndarray] = {}
# The GPU the fake's engines "run" on, as nvidia-smi would list it (autoprec.backends.gpus.gpu_facts).
GPUS = [{"name": "the fake's GPU", "driver": "fake", "compute_capability": "9.0"}]


def reset(version: str = "11.4.0.106") -> types.ModuleType:
    ACCESSED.clear()
    CALLS.clear()
    IGNORE_NODES.clear()
    PARSER_REJECTS.clear()
    MEMORY.clear()
    module = _Module("tensorrt")
    for name, value in _EXPORTS.items():
        setattr(module, name, value)
    module.__version__ = version
    return module


class _Module(types.ModuleType):
    def __getattribute__(self, name):
        if not name.startswith("__"):
            ACCESSED.add(("tensorrt", name))
        return super().__getattribute__(name)


class _RecordingMeta(type):
    def __getattribute__(cls, name):
        if not name.startswith("_"):
            ACCESSED.add((type.__getattribute__(cls, "__name__"), name))
        return type.__getattribute__(cls, name)


def _trt_class(obj) -> str | None:
    """The TensorRT class an object of the fake stands for (None for the caller's own subclasses)."""
    cls = type(obj)
    return cls.__name__ if cls.__module__ == __name__ else None


class _Recorded(metaclass=_RecordingMeta):
    def __getattribute__(self, name):
        if not name.startswith("_") and _trt_class(self):
            ACCESSED.add((_trt_class(self), name))
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value):
        if not name.startswith("_") and _trt_class(self):
            ACCESSED.add((_trt_class(self), name))
            CALLS.append((_trt_class(self), name, value))
        object.__setattr__(self, name, value)


class _Enum(_Recorded):
    def __init__(self, name: str, value: int):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_value", value)

    def __int__(self):
        return self._value

    def __repr__(self):
        return self._name


def _enum(class_name: str, **members: int) -> type:
    cls = _RecordingMeta(class_name, (_Enum,), {})
    for name, value in members.items():
        type.__setattr__(cls, name, cls(f"{class_name}.{name}", value))
    return cls


NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", EXPLICIT_BATCH=0, STRONGLY_TYPED=1)
MemoryPoolType = _enum("MemoryPoolType", WORKSPACE=0)
ProfilingVerbosity = _enum("ProfilingVerbosity", LAYER_NAMES_ONLY=0, NONE=1, DETAILED=2)
LayerInformationFormat = _enum("LayerInformationFormat", ONELINE=0, JSON=1)
TensorIOMode = _enum("TensorIOMode", NONE=0, INPUT=1, OUTPUT=2)
DataType = _enum("DataType", FLOAT=0, HALF=1, INT8=2)
LayerType = _enum("LayerType", CONVOLUTION=0, MATRIX_MULTIPLY=1, DEQUANTIZE=2, QUANTIZE=3, CAST=4, ELEMENTWISE=5)


class ILogger(_Recorded):
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self):
        pass

    def log(self, severity, message):
        raise NotImplementedError


class Logger(ILogger):
    def __init__(self, severity=2):
        object.__setattr__(self, "_severity", severity)


class IProfiler(_Recorded):
    def __init__(self):
        pass

    def report_layer_time(self, layer_name, ms):
        raise NotImplementedError


def nptype(dtype) -> type:
    return {0: np.float32, 1: np.float16, 2: np.int8}[int(dtype)]


class ITensor(_Recorded):
    def __init__(self, name, shape, dtype=None):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_shape", shape)
        object.__setattr__(self, "_dtype", dtype)

    @property
    def name(self):
        return self._name

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype


_LAYER_TYPES = {
    "Conv": "CONVOLUTION",
    "MatMul": "MATRIX_MULTIPLY",
    "Gemm": "MATRIX_MULTIPLY",
    "DequantizeLinear": "DEQUANTIZE",
    "QuantizeLinear": "QUANTIZE",
    "Cast": "CAST",
}
_TYPES = {onnx.TensorProto.FLOAT: "FLOAT", onnx.TensorProto.FLOAT16: "HALF", onnx.TensorProto.INT8: "INT8"}


class ILayer(_Recorded):
    """One layer per ONNX node, typed as ONNX's type inference types its tensors (strongly typed, as TensorRT would)."""

    def __init__(self, node, types):
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_types", types)

    @property
    def name(self):
        return self._node.name

    @property
    def type(self):
        return getattr(LayerType, _LAYER_TYPES.get(self._node.op_type, "ELEMENTWISE"))

    @property
    def metadata(self):
        return f"[ONNX Layer: {self._node.name}]"

    @property
    def num_inputs(self):
        return len(self._node.input)

    @property
    def num_outputs(self):
        return len(self._node.output)

    def _tensor(self, name):
        return ITensor(name, (), getattr(DataType, _TYPES.get(self._types.get(name), "FLOAT")))

    def get_input(self, index):
        return self._tensor(self._node.input[index])

    def get_output(self, index):
        return self._tensor(self._node.output[index])


class INetworkDefinition(_Recorded):
    def __init__(self, flags):
        object.__setattr__(self, "_flags", flags)
        object.__setattr__(self, "_model", None)

    @property
    def num_inputs(self):
        return len(self._inputs())

    def get_input(self, index):
        return self._inputs()[index]

    @property
    def num_layers(self):
        return len(self._model.graph.node)

    def get_layer(self, index):
        inferred = onnx.shape_inference.infer_shapes(self._model)
        types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input,
                                                                 *inferred.graph.output]}
        types.update({i.name: i.data_type for i in self._model.graph.initializer})
        return ILayer(self._model.graph.node[index], types)

    def _inputs(self):
        initializers = {i.name for i in self._model.graph.initializer}
        return [
            ITensor(v.name, tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim))
            for v in self._model.graph.input
            if v.name not in initializers
        ]


class ParserError(_Recorded):
    def __init__(self, index, node):
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_node", node)

    def node(self):
        return self._index

    def node_name(self):
        return self._node.name

    def node_operator(self):
        return self._node.op_type

    def desc(self):
        return f"No importer registered for op: {self._node.op_type}"


class OnnxParser(_Recorded):
    def __init__(self, network, logger):
        object.__setattr__(self, "_network", network)
        object.__setattr__(self, "_errors", [])

    def parse(self, model_bytes):
        CALLS.append(("OnnxParser", "parse", len(model_bytes)))
        return self._read(onnx.load_from_string(model_bytes))

    def parse_from_file(self, path):
        CALLS.append(("OnnxParser", "parse_from_file", str(path)))
        from autoprec.core import stored

        return self._read(
            stored.inlined(stored.load(path))
        )  # its external weights read from beside it, as TensorRT does

    def _read(self, model):
        object.__setattr__(self._network, "_model", model)
        self._errors.extend(ParserError(i, n) for i, n in enumerate(model.graph.node) if n.op_type in PARSER_REJECTS)
        return not self._errors

    @property
    def num_errors(self):
        return len(self._errors)

    def get_error(self, index):
        return self._errors[index]


class IOptimizationProfile(_Recorded):
    def set_shape(self, name, minimum, optimum, maximum):
        CALLS.append(("IOptimizationProfile", "set_shape", name, tuple(minimum), tuple(optimum), tuple(maximum)))
        return True


class ITimingCache(_Recorded):
    def __init__(self, data: bytes):
        object.__setattr__(self, "_data", bytes(data))

    def serialize(self):
        return self._data


class IBuilderConfig(_Recorded):
    def __init__(self):
        object.__setattr__(self, "_cache", None)

    def set_memory_pool_limit(self, pool, size):
        CALLS.append(("IBuilderConfig", "set_memory_pool_limit", repr(pool), size))

    def add_optimization_profile(self, profile):
        CALLS.append(("IBuilderConfig", "add_optimization_profile"))
        return 0

    def create_timing_cache(self, data):
        CALLS.append(("IBuilderConfig", "create_timing_cache", bytes(data)))
        return ITimingCache(data)

    def set_timing_cache(self, cache, ignore_mismatch):
        object.__setattr__(self, "_cache", cache)
        return True

    def get_timing_cache(self):
        return self._cache


class IHostMemory(bytes):
    """TensorRT's serialized engine; here the ONNX model's bytes."""


class Builder(_Recorded):
    def __init__(self, logger):
        pass

    def create_network(self, flags=0):
        CALLS.append(("Builder", "create_network", flags))
        return INetworkDefinition(flags)

    def create_builder_config(self):
        return IBuilderConfig()

    def create_optimization_profile(self):
        return IOptimizationProfile()

    def build_serialized_network(self, network, config):
        cache = config.get_timing_cache()
        if cache is not None:  # "timing" each build adds an entry to the cache, as TensorRT's does for new kernels
            object.__setattr__(cache, "_data", cache.serialize() + f"build-{len(network._model.graph.node)};".encode())
        CALLS.append(("Builder", "build_serialized_network"))
        return IHostMemory(network._model.SerializeToString())


class Runtime(_Recorded):
    def __init__(self, logger):
        pass

    def deserialize_cuda_engine(self, serialized):
        return ICudaEngine(onnx.load_from_string(bytes(serialized)))


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: n for n in model.graph.node for out in n.output}


# Layers the fake's inspector lists: compute layers, and the reductions and normalisations TensorRT runs
# as layers of their own (a real engine also lists element-wise and shuffle layers).
_INSPECTED = {"Conv": "CaskConvolution", "MatMul": "CaskGemm", "Gemm": "CaskGemm", "Softmax": "Softmax",
              "LogSoftmax": "Softmax", "ReduceMean": "Reduce", "ReduceSum": "Reduce", "ReduceMax": "Reduce",
              "LayerNormalization": "Normalization", "InstanceNormalization": "Normalization"}


def inspector_json(model: onnx.ModelProto) -> str:
    """TensorRT-10-style detailed layer JSON: one layer per inspected node, typed as the model says
    (INT8 after a DequantizeLinear, else the type ONNX infers for its input)."""
    producers = _producers(model)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.input)}
    layers = []
    for node in model.graph.node:
        if node.op_type not in _INSPECTED:
            continue
        source = producers.get(node.input[0])
        kind = "Int8" if source is not None and source.op_type == "DequantizeLinear" else "Float"
        if kind == "Float" and types.get(node.input[0]) == onnx.TensorProto.FLOAT16:
            kind = "Half"
        if node.name in IGNORE_NODES:
            kind = "Float"
        layers.append(
            {
                "Name": f"{node.name} + fused",
                "LayerType": _INSPECTED[node.op_type],
                "Inputs": [
                    {
                        "Name": node.input[0],
                        "Location": "Device",
                        "Dimensions": [],
                        "Format/Datatype": f"Row major linear {'FP32' if kind == 'Float' else kind} format",
                    }
                ],
                "Outputs": [
                    {
                        "Name": node.output[0],
                        "Location": "Device",
                        "Dimensions": [],
                        "Format/Datatype": "Row major linear FP32",
                    }
                ],
                "Metadata": f"[ONNX Layer: {node.name}]",
            }
        )
    return json.dumps(
        {"Layers": layers, "Bindings": [v.name for v in model.graph.input] + [v.name for v in model.graph.output]}
    )


class EngineInspector(_Recorded):
    def __init__(self, model):
        object.__setattr__(self, "_model", model)

    def get_engine_information(self, fmt):
        assert int(fmt) == 1, "JSON format expected"
        return inspector_json(self._model)


class IExecutionContext(_Recorded):
    def __init__(self, engine):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_addresses", {})
        object.__setattr__(self, "_shapes", {})
        object.__setattr__(self, "profiler", None)

    def set_input_shape(self, name, shape):
        self._shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name):
        return self._engine._output_shapes[name]

    def set_tensor_address(self, name, pointer):
        self._addresses[name] = pointer
        return True

    def execute_async_v3(self, stream_handle):
        engine = self._engine
        feeds = {n: MEMORY[self._addresses[n]] for n in engine._inputs}
        outputs = engine._session.run(engine._outputs, feeds)
        for name, value in zip(engine._outputs, outputs):
            MEMORY[self._addresses[name]] = np.asarray(value)
        if self.profiler is not None:
            for layer in json.loads(inspector_json(engine._model))["Layers"]:
                self.profiler.report_layer_time(layer["Name"], 0.5)
        CALLS.append(("IExecutionContext", "execute_async_v3", stream_handle))
        return True


class ICudaEngine(_Recorded):
    def __init__(self, model):
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_inputs", [i.name for i in session.get_inputs()])
        object.__setattr__(self, "_outputs", [o.name for o in session.get_outputs()])
        inferred = onnx.shape_inference.infer_shapes(model)
        object.__setattr__(self, "_output_shapes", {
            v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in inferred.graph.output})

    @property
    def num_io_tensors(self):
        return len(self._inputs) + len(self._outputs)

    def get_tensor_name(self, index):
        return (self._inputs + self._outputs)[index]

    def get_tensor_mode(self, name):
        return TensorIOMode.INPUT if name in self._inputs else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        return DataType.FLOAT

    def create_execution_context(self, runtime_config=None):
        CALLS.append(("ICudaEngine", "create_execution_context", runtime_config is not None))
        return IExecutionContext(self)

    def create_runtime_config(self):
        return IRuntimeConfig()

    def create_engine_inspector(self):
        return EngineInspector(self._model)


class IRuntimeCache(_Recorded):
    """TensorRT for RTX's cache of kernels compiled just in time; here each engine that ran adds an entry."""

    def __init__(self):
        object.__setattr__(self, "_data", b"")

    def deserialize(self, blob):
        CALLS.append(("IRuntimeCache", "deserialize", bytes(blob)))
        object.__setattr__(self, "_data", bytes(blob))
        return True

    def serialize(self):
        return self._data + b"kernels;"


class IRuntimeConfig(_Recorded):
    def create_runtime_cache(self):
        return IRuntimeCache()

    def set_runtime_cache(self, cache):
        CALLS.append(("IRuntimeConfig", "set_runtime_cache"))
        return True


class FakeCuda:
    """Device memory as host arrays; events as a counter (1 ms per enqueue)."""

    def __init__(self):
        self.next = 1

    def stream_handle(self) -> int:
        return 7

    def alloc(self, nbytes: int) -> int:
        pointer, self.next = self.next, self.next + 1
        MEMORY[pointer] = None
        return pointer

    def free(self, pointer: int) -> None:
        MEMORY.pop(pointer, None)

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        MEMORY[pointer] = array.copy()

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        array[...] = MEMORY[pointer]

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, enqueue) -> float:
        enqueue()
        return 1.0


_EXPORTS = {
    name: value
    for name, value in globals().items()
    if name
    in {
        "NetworkDefinitionCreationFlag",
        "MemoryPoolType",
        "ProfilingVerbosity",
        "LayerInformationFormat",
        "TensorIOMode",
        "DataType",
        "LayerType",
        "ILogger",
        "Logger",
        "IProfiler",
        "nptype",
        "Builder",
        "OnnxParser",
        "Runtime",
    }
}

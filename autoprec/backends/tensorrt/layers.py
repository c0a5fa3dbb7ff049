"""What a TensorRT engine actually runs: per-layer precision from engine-inspector / trtexec JSON.

Reads, without TensorRT installed, the JSON of ``IEngineInspector.get_engine_information``
(``LayerInformationFormat.JSON``) and of ``trtexec --exportLayerInfo``:

- TensorRT 8.4-10.x: tensors carry one ``"Format/Datatype"`` string ("Thirty-two wide channel
  vectorized row major Int8 format"); the engine's I/O is a flat ``"Bindings"`` list; 10.x adds
  ``"Metadata"`` with the ONNX nodes a layer came from (``[ONNX Layer: name]``, separated by
  ``\\x1f`` or ``\\x1e``).
- TensorRT 11.x: ``"Bindings"`` became ``"I/O Tensors"`` (objects), and the combined field was
  split into ``"Format"`` and ``"DataType"`` (NVIDIA's 10.x→11.x IEngineInspector migration guide).
- Engines built without ``ProfilingVerbosity.DETAILED`` list layer names only: no precision.
- TensorRT for RTX's builder writes the same information as text in its verbose log ("Layers:",
  one ``Name: …, LayerType: …, Inputs: [ … ], Constants: [ … ], Outputs: [ … ], …, Metadata: …``
  line per fused layer): read by :func:`parse_builder_layers`, without a GPU.

A layer's precision is the type it computes in: its first non-boolean input's type (an INT8
convolution may write FP16 or FP32 when a DQ was fused into it), else its first output's.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from autoprec.analysis import subgraphs
from autoprec.core import untrusted
from autoprec.core.errors import AutoprecError

# Type words as the inspector writes them, in the order they are tried (longest first).
_TYPE_WORDS = (
    ("bfloat16", "bf16"), ("bf16", "bf16"), ("float16", "fp16"), ("half", "fp16"), ("fp16", "fp16"),
    ("fp8", "fp8"), ("int8", "int8"), ("uint8", "uint8"), ("int32", "int32"), ("int64", "int64"),
    ("fp32", "fp32"), ("float", "fp32"), ("bool", "bool"), ("int4", "int4"), ("fp4", "fp4"),
)
_REDUCED = ("int8", "fp16", "bf16", "fp8", "int4", "fp4")
_FLOATS = ("fp32", "fp16", "bf16")
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]]*)\]")
_PATH_STEP = re.compile(r"^(.*) \(([^()]*)\)$")  # "then (then_branch)", "If_1 (If)"


def onnx_nodes(metadata: str) -> list[str]:
    """The ONNX nodes a layer's metadata names, as autoprec names them: ``[ONNX Layer: a | then
    (then_branch) | If_1 (If)]`` (a node inside an If branch, innermost first) is
    ``If_1/then/a``."""
    nodes = []
    for entry in _ONNX_LAYER.findall(metadata):
        node, *path = entry.split(" | ")
        steps = [_PATH_STEP.match(step) for step in path]
        if len(path) % 2 or not all(steps):
            nodes.append(entry)  # not the form above: the text as it is
            continue
        scope: tuple[str, ...] = ()
        for graph_step, node_step in reversed(list(zip(steps[::2], steps[1::2]))):
            scope += (node_step.group(1), graph_step.group(2))
        nodes.append(subgraphs.label(scope, node))
    return nodes


def data_type(text: str) -> str:
    """Normalise an inspector type or format string ("Half", "Row major linear FP32", "Int8") to
    fp16/fp32/int8/..."""
    lowered = text.lower()
    for word, name in _TYPE_WORDS:  # a word is matched whole: "int8" is not found in "uint8"
        if re.search(rf"(?<![a-z0-9]){word}(?![0-9])", lowered):
            return name
    return "unknown"


@dataclass(frozen=True)
class TensorFormat:
    name: str
    dtype: str  # normalised: fp32, fp16, int8, ...
    format: str  # as TensorRT wrote it
    dimensions: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineLayer:
    name: str
    layer_type: str
    precision: str  # the type it computes in; "unknown" without detailed verbosity
    inputs: tuple[TensorFormat, ...] = ()
    outputs: tuple[TensorFormat, ...] = ()
    # ONNX nodes (Metadata) or, failing that, the names the layer name joins
    fused_from: tuple[str, ...] = ()
    origin: str = ""  # "QDQ" for a quantize/dequantize reformat, "REFORMAT", ...
    tactic: str = ""
    # weights the layer holds (TensorRT for RTX's builder log lists them)
    constants: tuple[TensorFormat, ...] = ()

    @property
    def possible_precisions(self) -> frozenset[str]:
        """What it may compute in: its precision, and for a fused kernel that converts (a Cast fused
        in, as Myelin fuses a region's border into a softmax: its name says Cast, or its inputs and
        outputs differ in float type) every float type it touches: the log does not say on which
        side of the Cast the arithmetic runs. A kernel named for Casts whose tensors all have one
        float type converts to a type the log never shows (an FP16 softmax between FP32 neighbours,
        Cast in and Cast out): any float."""
        floats = {t.dtype for t in (*self.inputs, *self.outputs, *self.constants) if t.dtype in _FLOATS}
        ends = {t.dtype for t in (*self.inputs, *self.outputs) if t.dtype in _FLOATS}
        if "Cast" in self.name and len(floats) <= 1:
            return frozenset({self.precision, *_FLOATS})
        if "Cast" in self.name or len(ends) > 1:
            return frozenset({self.precision, *floats})
        return frozenset({self.precision})

    @property
    def is_bookkeeping(self) -> bool:
        """Layout copies, Q/DQ reformats, no-ops, constants and stream synchronisation: not where
        the model's arithmetic runs."""
        return (self.layer_type in {"Reformat", "NoOp", "Constant", "Shuffle", "Identity", "signal",
                                    "wait"}
                or self.origin in {"QDQ", "REFORMAT"})


@dataclass(frozen=True)
class EngineLayers:
    """The layers of one engine, as its inspector JSON describes them."""

    layers: tuple[EngineLayer, ...]
    # 11.x: the "I/O Tensors" objects; 10.x: {"Name": ...} per binding
    io_tensors: tuple[dict[str, Any], ...]
    schema: str  # "tensorrt-11", "tensorrt-10" (or 8.x, same fields), "names-only"
    source: str = ""

    @property
    def detailed(self) -> bool:
        return self.schema != "names-only"

    @property
    def compute_layers(self) -> tuple[EngineLayer, ...]:
        return tuple(layer for layer in self.layers if not layer.is_bookkeeping)

    def precision_counts(self) -> dict[str, int]:
        return dict(Counter(layer.precision for layer in self.compute_layers))

    def reduced_precision(self) -> bool:
        return any(layer.precision in _REDUCED for layer in self.compute_layers)

    def ordered(self) -> list[EngineLayer]:
        """Compute layers that stayed FP32 first when the engine runs anything in reduced precision
        (what a precision review looks for), then the rest in engine order."""
        layers = list(self.compute_layers)
        if not self.reduced_precision():
            return layers
        return [x for x in layers if x.precision == "fp32"] + [x for x in layers if x.precision != "fp32"]

    def layers_of_node(self, node: str) -> list[EngineLayer]:
        return [layer for layer in self.compute_layers if node in layer.fused_from]

    def summary(self) -> dict[str, Any]:
        counts = self.precision_counts()
        total = sum(counts.values())
        return {
            "schema": self.schema,
            "source": self.source,
            "layers": len(self.layers),
            "compute_layers": total,
            "precision_counts": counts,
            "precision_shares": {p: n / total for p, n in counts.items()} if total else {},
            "fp32_in_reduced_precision_engine": [x.name for x in self.compute_layers if x.precision == "fp32"]
            if self.reduced_precision() else [],
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "io_tensors": list(self.io_tensors),
                "layer_table": [asdict(layer) for layer in self.ordered()]}


def _entries(value: Any, what: str, source: str) -> list:
    """A list of JSON objects or names, as the inspector writes them; anything else is refused in
    one line."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, (dict, str)) for v in value):
        raise AutoprecError(
            f"{source or 'layer information'}: {what} is not a list of objects; give the file "
            "written by trtexec --exportLayerInfo or by the engine inspector"
        )
    return value


def _tensor(entry: Mapping[str, Any] | str) -> TensorFormat:
    if isinstance(entry, str):
        return TensorFormat(entry, "unknown", "")
    if "Format/Datatype" in entry:  # 8.4-10.x
        fmt = str(entry["Format/Datatype"])
        dtype = data_type(fmt)
    else:  # 11.x: split fields
        fmt = str(entry.get("Format", ""))
        dtype = data_type(str(entry.get("DataType", ""))) if "DataType" in entry else data_type(fmt)
    dims = entry.get("Dimensions", ())
    dims = tuple(d for d in dims if isinstance(d, int)) if isinstance(dims, list) else ()
    return TensorFormat(str(entry.get("Name", "")), dtype, fmt, dims)


def _compute_precision(inputs: Iterable[TensorFormat], outputs: Iterable[TensorFormat],
                       constants: Iterable[TensorFormat] = ()) -> str:
    """The type a layer computes in: its weights' (its largest constant: a convolution's INT8 or
    FP16 filters, not a normalisation's FP32 scale fused beside them), else its inputs', else its
    outputs'."""
    weights = sorted((t for t in constants if math.prod(t.dimensions) > 1),
                     key=lambda t: -math.prod(t.dimensions))[:1]
    for group in (weights, inputs, outputs):
        types = [t.dtype for t in group if t.dtype not in ("bool", "unknown", "int32", "int64")]
        if types:
            return types[0]
    return "unknown"


def split_layer_name(name: str) -> tuple[str, ...]:
    """The pieces a fused layer's name joins: "w + QuantizeLinear_8 + Conv_12 + PWN(Clip_16)" →
    (w, QuantizeLinear_8, Conv_12, Clip_16). Used where no Metadata names the ONNX nodes."""
    pieces = []
    for part in name.split(" + "):
        part = part.strip()
        while part.startswith("PWN(") and part.endswith(")"):
            part = part[4:-1]
        pieces.extend(p.strip() for p in part.split(", ") if p.strip())
    return tuple(pieces)


def _layer(entry: Mapping[str, Any] | str, source: str) -> EngineLayer:
    if isinstance(entry, str):
        return EngineLayer(entry, "", "unknown", fused_from=split_layer_name(entry))
    inputs = tuple(_tensor(t) for t in _entries(entry.get("Inputs"), "a layer's Inputs", source))
    outputs = tuple(_tensor(t) for t in _entries(entry.get("Outputs"), "a layer's Outputs", source))
    name = str(entry.get("Name", ""))
    metadata = onnx_nodes(str(entry.get("Metadata", "")))
    return EngineLayer(
        name=name,
        layer_type=str(entry.get("LayerType", "")),
        precision=_compute_precision(inputs, outputs),
        inputs=inputs,
        outputs=outputs,
        fused_from=tuple(metadata) if metadata else split_layer_name(name),
        origin=str(entry.get("Origin", "")),
        tactic=str(entry.get("TacticName", "")),
    )


def parse_engine_layers(document: Mapping[str, Any] | str, source: str = "") -> EngineLayers:
    """Parse inspector / ``--exportLayerInfo`` JSON (a dict, or its text)."""
    if isinstance(document, str):
        try:
            document = untrusted.parse_json(document)
        except ValueError as exc:
            raise AutoprecError(f"{source or 'layer information'}: not JSON ({exc}); give the file "
                                "written by trtexec --exportLayerInfo or by "
                                "IEngineInspector.get_engine_information") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("Layers"), list):
        raise AutoprecError(f"{source or 'layer information'}: no \"Layers\" list; give the file "
                            "written by trtexec --exportLayerInfo (with "
                            "--profilingVerbosity=detailed) or by the engine inspector")
    raw_layers = _entries(document["Layers"], '"Layers"', source)
    layers = tuple(_layer(entry, source) for entry in raw_layers)
    if "I/O Tensors" in document:
        io = tuple(t for t in _entries(document["I/O Tensors"], '"I/O Tensors"', source) if isinstance(t, dict))
        schema = "tensorrt-11"
    else:
        io, schema = (
            tuple({"Name": str(n)} for n in _entries(document.get("Bindings"), '"Bindings"', source)),
            "tensorrt-10",
        )
    if raw_layers and all(isinstance(entry, str) for entry in raw_layers):
        schema = "names-only"
    return EngineLayers(layers, io, schema, source)


_LOG_KEYS = ("Name", "LayerType", "Inputs", "Constants", "Outputs", "TacticName", "StreamId",
             "Metadata")
_LOG_TENSOR = re.compile(r"\{ Name: (?P<name>.*?), Dimensions: \[(?P<dims>[^\]]*)\].*?Datatype: "
                         r"(?P<dtype>\w+), "
                         r"Format: (?P<format>.*?) \}")


def _log_fields(line: str) -> dict[str, str]:
    """``Key: value, Key: value, …`` of one builder-log layer line, split at the known keys in
    order."""
    marks = []
    for key in _LOG_KEYS:
        at = line.find(f"{key}: ", marks[-1][1] if marks else 0)
        if at >= 0:
            marks.append((key, at + len(key) + 2, at))
    fields = {}
    for i, (key, start, _) in enumerate(marks):
        end = marks[i + 1][2] - 2 if i + 1 < len(marks) else len(line)
        fields[key] = line[start:end].strip()
    return fields


def _log_tensors(text: str) -> tuple[TensorFormat, ...]:
    return tuple(TensorFormat(m["name"], data_type(m["dtype"]), m["format"],
                              tuple(int(d) for d in m["dims"].split(",") if d.strip().lstrip("-").isdigit()))
                 for m in _LOG_TENSOR.finditer(text))


def parse_builder_layers(log: str, source: str = "builder log") -> EngineLayers | None:
    """The fused layers TensorRT for RTX's builder lists in its verbose log ("Layers:" block,
    written with ``ProfilingVerbosity.DETAILED``); None when the log has none."""
    lines = log.splitlines()
    if "Layers:" not in (line.strip() for line in lines):
        return None
    start = next(i for i, line in enumerate(lines) if line.strip() == "Layers:") + 1
    layers = []
    for line in lines[start:]:
        if not line.startswith("Name: "):
            break
        fields = _log_fields(line)
        inputs, outputs = _log_tensors(fields.get("Inputs", "")), _log_tensors(fields.get("Outputs", ""))
        constants = _log_tensors(fields.get("Constants", ""))
        layers.append(EngineLayer(
            name=fields.get("Name", ""), layer_type=fields.get("LayerType", ""),
            precision=_compute_precision(inputs, outputs, constants), inputs=inputs,
            outputs=outputs,
            fused_from=tuple(onnx_nodes(fields.get("Metadata", ""))),
            tactic=fields.get("TacticName", ""),
            constants=constants,
        ))
    return EngineLayers(tuple(layers), (), "builder-log", source)


@dataclass(frozen=True)
class PlanFidelity:
    """Which planned units did not run at their planned precision, and what said so (``source``: the
    engine inspector, the builder's log, the network's types)."""

    checked: int
    ignored: tuple[dict[str, Any], ...] = field(default=())  # {unit, planned, ran, layers}
    source: str = ""

    @property
    def plan_ignored(self) -> bool:
        return bool(self.ignored)

    def to_json(self) -> dict[str, Any]:
        return {"checked_units": self.checked, "plan_ignored": self.plan_ignored,
                "ignored_units": list(self.ignored),
                "source": self.source}


def plan_fidelity(layers: EngineLayers, planned: Mapping[str, Mapping[str, Any]]) -> PlanFidelity | None:
    """Compare ``{unit: {"precision": p, "nodes": [onnx node names]}}`` with what the engine runs.

    A unit passes when a compute layer built from its main node computes in its planned precision
    (FP32 units included: a strongly typed engine must not run them in FP16). A unit whose node is
    in no compute layer (eliminated or renamed) is reported as such. None when the JSON has no
    precisions (built without detailed profiling verbosity).
    """
    if not layers.detailed:
        return None
    ignored, checked = [], 0
    for unit, spec in planned.items():
        precision = spec["precision"]
        checked += 1
        found = next(
            (found for node in spec.get("main", spec["nodes"][:1]) if (found := layers.layers_of_node(node))), []
        )
        ran = sorted({p for layer in found for p in layer.possible_precisions})
        if precision not in ran:
            ignored.append({"unit": unit, "planned": precision, "ran": ran or ["not found"],
                            "layers": [layer.name for layer in found]})
    return PlanFidelity(checked, tuple(ignored), layers.source)

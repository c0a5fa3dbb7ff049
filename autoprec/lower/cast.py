"""FP16 units: run them on FP16 weights and activations, with Casts only where precision changes.

Around FP16 units, precision-neutral ops (data movement, element-wise arithmetic and activations,
resize, pooling) join the units' FP16 region where that converts less (see :func:`grow_region`): a
run of FP16 units becomes one region with Casts only at its borders, placed on its smallest
tensors, instead of islands that pay two conversions around every reshape or add.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from autoprec.core.groups import connected, min_cut
from autoprec.core.search_space import NEUTRAL_OPS
from autoprec.core.stored import StoredModel
from autoprec.lower.edit import GraphEdit

# Inputs ONNX types as float32 whatever the data's type (Resize's roi and scales): never converted.
FLOAT32_INPUTS = {"Resize": {1, 2}}
# A Cast's cost beyond its elements, in elements: a kernel launch (on a GPU, about what converting a
# million elements takes), so that fewer Casts win unless a tensor is far larger.
CAST_LAUNCH_ELEMENTS = 1 << 20
FP16, FP32 = "fp16", "fp32"  # the two sides of the cut
# Readers of a tensor's shape alone: outside an FP16 region they read the FP16 tensor, not a Cast of
# it back (a deployable model's shape paths, kept where its dims are dynamic, read many region
# tensors: the all-FP16 plan of a ViT-S/16 export cast 25 activations back to FP32 for their Shape
# alone).
TYPE_BLIND = {"Shape", "Size"}
INTEGER_TYPES = {TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16,
                 TensorProto.UINT16,
                 TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64}


def _is_float32(tensor: gs.Tensor) -> bool:
    return tensor.dtype is not None and np.dtype(tensor.dtype) == np.float32


def grow_region(graph: gs.Graph, region: set[str], units: set[str]) -> set[str]:
    """``region`` (node names) and the precision-neutral nodes that run cheaper in FP16 with it;
    ``units``: the nodes of every unit, which keep their unit's precision.

    Each neutral node goes where its conversions cost least (a minimum cut between the region and
    everything else that stays FP32, the graph's inputs and outputs included): a tensor read across
    the border costs one Cast (:data:`CAST_LAUNCH_ELEMENTS` plus its elements), a neutral node left
    in FP32 its output's elements. So a run of neutral ops between FP16 units joins them, and one
    between the region and an FP32 op (or a graph output) runs in FP16 as far as its smallest
    tensor, where the Cast goes: after a pooling, not before it.
    """
    if not region:
        return region
    own = {id(n) for n in graph.nodes}
    candidates = {id(n): n for n in graph.nodes if n.name not in units and n.op in NEUTRAL_OPS and _floats(n)}
    links = [
        (node, c) for node in candidates.values() for out in node.outputs for c in out.outputs if id(c) in candidates
    ]
    touching = [group for group in connected(list(candidates.values()), links)
                if any(t.inputs and t.inputs[0].name in region for n in group for t in _converted_inputs(n))
                or any(c.name in region for n in group for out in n.outputs for c in out.outputs)]
    # the others have no FP16 neighbour
    candidates = {id(n): n for group in touching for n in group}
    if not candidates:
        return region

    def side(node: gs.Node | None):
        """A candidate's own key, or the side a fixed node is on."""
        if node is None or id(node) not in own:
            return FP32  # a graph input, or a reader inside a subgraph
        if id(node) in candidates:
            return id(node)
        return FP16 if node.name in region else FP32

    network: dict = {FP16: {}}
    tensors = {id(t): t for n in candidates.values() for t in (*_converted_inputs(n), *n.outputs)}
    for key, tensor in tensors.items():
        producer = side(tensor.inputs[0] if tensor.inputs else None)
        readers = {side(c) for c in tensor.outputs if any(t is tensor for t in _converted_inputs(c))}
        if tensor in graph.outputs:
            readers.add(FP32)
        cost = CAST_LAUNCH_ELEMENTS + _elements(tensor)
        # cast once where the producer is FP16 and any reader FP32 (through "down"), or the reverse
        # ("up")
        down, up = ("down", key), ("up", key)
        network.setdefault(producer, {})[down] = cost
        network[up] = {producer: cost}
        for reader in readers - {producer}:
            network.setdefault(down, {})[reader] = math.inf
            network.setdefault(reader, {})[up] = math.inf
    for key, node in candidates.items():
        network[FP16][key] = sum(_elements(t) for t in node.outputs)  # what leaving it FP32 costs
    fp16_side = min_cut(network, FP16, FP32)
    return region | {node.name for key, node in candidates.items() if key in fp16_side}


def _floats(node: gs.Node) -> bool:
    """Whether a neutral node computes on float32 tensors that FP16 could hold: a float32 input (a
    tensor, or a constant beside a tensor: an embedding table that a Gather reads by its indices)
    and float32 outputs only."""
    computed = any(isinstance(t, gs.Variable) for t in node.inputs)
    return computed and any(_is_float32(t) for t in node.inputs) and all(_is_float32(t) for t in node.outputs)


def _converted_inputs(node: gs.Node) -> list[gs.Variable]:
    """The float32 tensors a node reads that FP16 would convert (not Resize's roi and scales)."""
    return [t for i, t in enumerate(node.inputs) if isinstance(t, gs.Variable) and _is_float32(t)
            and i not in FLOAT32_INPUTS.get(node.op, ())]


def _elements(tensor: gs.Variable) -> int:
    """Elements of a tensor, its unknown dimensions counted as 1."""
    return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in (tensor.shape or ()))


def _cast_source(edit: GraphEdit, name: str) -> str:
    """What to cast to FP16 for tensor ``name``: the integer or boolean tensor it was cast from,
    where the model makes it by a Cast (a one-hot of bytes), so the FP32 copy is never written; else
    itself."""
    index = edit.index
    producer = index.graph.node[index.producer[name]] if name in index.producer else None
    if producer is not None and producer.op_type == "Cast" and producer.input[0] not in index.initializers:
        source = producer.input[0]
        if index.dtypes.get(source) in INTEGER_TYPES:
            return source
    return name


FP16_BLOCK = 1 << 22  # elements converted at once (16 MB of float32)


def _to_fp16(values: np.ndarray) -> np.ndarray:
    """A constant in FP16, its finite values held to FP16's range: a mask's float32 minimum
    (-3.4e38, as exporters write ``finfo(float32).min``) becomes FP16's lowest (-65504), not -inf,
    so that a fully masked row still softmaxes to numbers, as it does in FP32. Converted a block at
    a time: a weight costs its FP16 copy and no float32 temporaries (held to the range whole, a 2.3
    GB model's all-FP16 lowering peaked at 1.69x its weights)."""
    limit = np.finfo(np.float16).max
    flat = values.reshape(-1)
    half = np.empty(flat.shape, np.float16)
    for start in range(0, flat.size, FP16_BLOCK):
        part = flat[start:start + FP16_BLOCK]
        with np.errstate(over="ignore"):
            converted = part.astype(np.float16)
        overflowed = np.isinf(converted) & np.isfinite(part)
        converted[overflowed] = np.copysign(limit, part[overflowed])
        half[start:start + FP16_BLOCK] = converted
    return half.reshape(values.shape)


def apply_fp16(edit: GraphEdit, model: StoredModel, region: set[str], prefix: str = "") -> None:
    """Put the nodes named in ``region`` (FP16 units and their fused neighbours) of one graph in
    FP16.

    Each FP32 tensor entering the region is cast once; each region output keeps its name and
    FP32 type for every consumer outside the region (and for graph outputs), through one Cast
    back. Tensors passed between FP16 nodes stay FP16. Float constants get FP16 copies (made once
    per model, kept in its folder), so a constant shared with an FP32 node is left as it was.
    ``prefix`` starts the names of the Casts and copies of tensors from outside (a subgraph's path:
    names stay unique across If branches).
    """
    index = edit.index
    positions = sorted(index.position[name] for name in region)
    half: dict[str, str] = {}  # FP32 tensor name -> the FP16 tensor a region node now produces
    for position in positions:
        node = edit.node(position)
        for i, out in enumerate(edit.outs[id(node)]):
            if index.is_float32(out):
                half[out] = f"{out}_fp16"
                edit.set_output(node, i, half[out])
    constants: dict[str, str] = {}
    casts_in: dict[str, str] = {}
    for position in positions:
        node = edit.node(position)
        for i, name in enumerate(edit.ins[id(node)]):
            if not name or i in FLOAT32_INPUTS.get(node.op_type, ()):
                continue
            tensor = index.initializers.get(name)
            if tensor is not None:
                if tensor.data_type == TensorProto.FLOAT:
                    if name not in constants:
                        copy = model.derived(
                            f"{prefix}{name}_fp16",
                            lambda n=name: _to_fp16(index.values(n, model.folder)),
                            2 * math.prod(tensor.dims),
                        )
                        constants[name] = edit.add_initializer(copy)
                    edit.set_input(node, i, constants[name])
            elif name in half:
                edit.set_input(node, i, half[name])
            elif index.is_float32(name):
                if name not in casts_in:
                    casts_in[name] = f"{prefix}{name}_to_fp16"
                    edit.add("Cast", f"{prefix}{name}_cast_fp16", [_cast_source(edit, name)],
                             [casts_in[name]],
                             to=TensorProto.FLOAT16)
                edit.set_input(node, i, casts_in[name])
    _cast_back(edit, half, set(positions))


def _cast_back(edit: GraphEdit, half: dict[str, str], inside: set[int]) -> None:
    """Each region output (FP32 name -> its FP16 tensor) cast back once for the readers outside the
    region and the graph's outputs; a reader of its shape alone (TYPE_BLIND) reads the FP16 tensor
    instead."""
    index = edit.index
    for original, fp16 in half.items():
        implicit = index.implicit.get(original, ())
        outside = [p for p in (*index.readers.get(original, ()), *implicit) if p not in inside]
        for position in [p for p in outside if index.graph.node[p].op_type in TYPE_BLIND and p not in implicit]:
            node = edit.node(position)
            edit.set_input(node, list(edit.ins[id(node)]).index(original), fp16)
            outside.remove(position)
        if outside or original in index.outputs:
            edit.add("Cast", f"{original}_cast_fp32", [fp16], [original], to=TensorProto.FLOAT)

"""FP16 units: run them on FP16 weights and activations, with Casts only where precision changes.

Around FP16 units, precision-neutral ops (data movement, element-wise arithmetic and activations,
resize, pooling) join the units' FP16 region where that converts less (see :func:`grow_region`): a
run of FP16 units becomes one region with Casts only at its borders, placed on its smallest
tensors, instead of islands that pay two conversions around every reshape or add.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from autoprec.core.groups import connected, min_cut
from autoprec.core.search_space import NEUTRAL_OPS

# Inputs ONNX types as float32 whatever the data's type (Resize's roi and scales): never converted.
FLOAT32_INPUTS = {"Resize": {1, 2}}
# A Cast's cost beyond its elements, in elements: a kernel launch (on a GPU, about what converting a
# million elements takes), so that fewer Casts win unless a tensor is far larger.
CAST_LAUNCH_ELEMENTS = 1 << 20
FP16, FP32 = "fp16", "fp32"  # the two sides of the cut


def _is_float32(tensor: gs.Tensor) -> bool:
    return tensor.dtype is not None and np.dtype(tensor.dtype) == np.float32


def _cast_source(tensor: gs.Variable) -> gs.Variable:
    """What to cast to FP16 for ``tensor``: the integer or boolean tensor it was cast from, where the
    model makes it by a Cast (a one-hot of bytes), so the FP32 copy is never written; else itself."""
    producer = tensor.inputs[0] if tensor.inputs else None
    if producer is not None and producer.op == "Cast" and isinstance(producer.inputs[0], gs.Variable):
        source = producer.inputs[0]
        if source.dtype is not None and np.dtype(source.dtype).kind in "biu":
            return source
    return tensor


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
    candidates = {id(n): n for n in graph.nodes if n.name not in units and n.op in NEUTRAL_OPS
                  and any(_is_float32(t) for t in n.inputs if isinstance(t, gs.Variable))
                  and all(_is_float32(t) for t in n.outputs)}
    links = [(node, c) for node in candidates.values() for out in node.outputs for c in out.outputs if id(c) in candidates]
    touching = [group for group in connected(list(candidates.values()), links)
                if any(t.inputs and t.inputs[0].name in region for n in group for t in _converted_inputs(n))
                or any(c.name in region for n in group for out in n.outputs for c in out.outputs)]
    candidates = {id(n): n for group in touching for n in group}  # the others have no FP16 neighbour
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
        # cast once where the producer is FP16 and any reader FP32 (through "down"), or the reverse ("up")
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


def _converted_inputs(node: gs.Node) -> list[gs.Variable]:
    """The float32 tensors a node reads that FP16 would convert (not Resize's roi and scales)."""
    return [t for i, t in enumerate(node.inputs) if isinstance(t, gs.Variable) and _is_float32(t)
            and i not in FLOAT32_INPUTS.get(node.op, ())]


def _elements(tensor: gs.Variable) -> int:
    """Elements of a tensor, its unknown dimensions counted as 1."""
    return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in (tensor.shape or ()))


def apply_fp16(graph: gs.Graph, region: set[str], prefix: str = "") -> None:
    """Put the nodes named in ``region`` (FP16 units and their fused neighbours) in FP16.

    Each FP32 tensor entering the region is cast once; each region output keeps its name and
    FP32 type for every consumer outside the region (and for graph outputs), through one Cast
    back. Tensors passed between FP16 nodes stay FP16. Float constants get FP16 copies, so a
    constant shared with an FP32 node is left as it was. ``prefix`` starts the names of the Casts
    and copies of tensors from outside (a subgraph's path: names stay unique across If branches).
    """
    nodes = [n for n in graph.nodes if n.name in region]
    half: dict[str, gs.Variable] = {}  # FP32 tensor name -> the FP16 tensor a region node now produces
    originals: list[gs.Variable] = []
    for node in nodes:
        for i, out in enumerate(node.outputs):
            if _is_float32(out):
                half[out.name] = gs.Variable(f"{out.name}_fp16", np.float16, out.shape)
                originals.append(out)
                node.outputs[i] = half[out.name]
    constants: dict[str, gs.Constant] = {}
    casts_in: dict[str, gs.Variable] = {}
    for node in nodes:
        for i, inp in enumerate(node.inputs):
            if i in FLOAT32_INPUTS.get(node.op, ()):
                continue
            if isinstance(inp, gs.Constant):
                if inp.values.dtype == np.float32:
                    if inp.name not in constants:
                        constants[inp.name] = gs.Constant(f"{prefix}{inp.name}_fp16", inp.values.astype(np.float16))
                    node.inputs[i] = constants[inp.name]
            elif inp.name in half:
                node.inputs[i] = half[inp.name]
            elif _is_float32(inp):
                if inp.name not in casts_in:
                    casts_in[inp.name] = gs.Variable(f"{prefix}{inp.name}_to_fp16", np.float16, inp.shape)
                    graph.nodes.append(gs.Node("Cast", f"{prefix}{inp.name}_cast_fp16", {"to": onnx.TensorProto.FLOAT16},
                                               [_cast_source(inp)], [casts_in[inp.name]]))
                node.inputs[i] = casts_in[inp.name]
    for original in originals:
        if original.outputs or original in graph.outputs:
            graph.nodes.append(
                gs.Node("Cast", f"{original.name}_cast_fp32", {"to": onnx.TensorProto.FLOAT}, [half[original.name]], [original])
            )

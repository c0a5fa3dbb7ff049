"""FP16 units: run them on FP16 weights and activations, with Casts only where precision changes.

Between FP16 units, precision-neutral ops (data movement, element-wise arithmetic and activations,
resize, pooling) join the units' FP16 region when every float tensor they read comes from it and
every consumer of what they make belongs to it: a run of FP16 units becomes one region with Casts
only at its borders, instead of islands that pay two conversions around every reshape or add.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from autoprec.core.groups import connected
from autoprec.core.search_space import NEUTRAL_OPS

# Inputs ONNX types as float32 whatever the data's type (Resize's roi and scales): never converted.
FLOAT32_INPUTS = {"Resize": {1, 2}}


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


def grow_region(graph: gs.Graph, region: set[str]) -> set[str]:
    """``region`` (node names) and the precision-neutral nodes around its nodes: each connected group
    of NEUTRAL_OPS nodes joins when all the float32 tensors it reads are made by region nodes or are
    graph inputs, all it makes are read by region nodes only or are graph outputs (not read from
    inside a subgraph), and it touches the region. A group between the region and the graph's inputs
    or outputs joins too: the Cast moves to the input or output, and the group runs in FP16."""
    if not region:
        return region
    own = {id(n) for n in graph.nodes}
    candidates = [n for n in graph.nodes if n.name not in region and n.op in NEUTRAL_OPS
                  and any(_is_float32(t) for t in n.inputs if isinstance(t, gs.Variable))
                  and all(_is_float32(t) for t in n.outputs)]
    keys = {id(n) for n in candidates}
    links = [(node, c) for node in candidates for out in node.outputs for c in out.outputs if id(c) in keys]
    grown = set(region)
    for nodes in connected(candidates, links):
        inside = {id(n) for n in nodes}
        reads = [t for n in nodes for i, t in enumerate(n.inputs)
                 if isinstance(t, gs.Variable) and _is_float32(t) and i not in FLOAT32_INPUTS.get(n.op, ())
                 and not (t.inputs and id(t.inputs[0]) in inside)]
        makes = [out for n in nodes for out in n.outputs]
        readers = [c for out in makes for c in out.outputs if id(c) not in inside]
        fed = all(t.inputs[0].name in region if t.inputs else t in graph.inputs for t in reads)
        read = all(id(c) in own and c.name in region for c in readers)
        touches = any(t.inputs for t in reads) or bool(readers)
        if fed and read and touches:
            grown |= {n.name for n in nodes}
    return grown


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

"""FP16 units: run them on FP16 weights and activations, with Casts only where precision changes."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs


def _is_float32(tensor: gs.Tensor) -> bool:
    return tensor.dtype is not None and np.dtype(tensor.dtype) == np.float32


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
                    graph.nodes.append(
                        gs.Node("Cast", f"{prefix}{inp.name}_cast_fp16", {"to": onnx.TensorProto.FLOAT16}, [inp], [casts_in[inp.name]])
                    )
                node.inputs[i] = casts_in[inp.name]
    for original in originals:
        if original.outputs or original in graph.outputs:
            graph.nodes.append(
                gs.Node("Cast", f"{original.name}_cast_fp32", {"to": onnx.TensorProto.FLOAT}, [half[original.name]], [original])
            )

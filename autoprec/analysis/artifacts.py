"""What exporters write differently for the same computation, written one way before units are
found.

PyTorch's ``x.float()`` on a float tensor, ``.to(x.dtype)`` after a norm computed in float32 and
``type_as`` write a Cast to the type the tensor already has; ``x.double()`` then ``.float()`` writes
a round trip through a wider type. In FP32 they cost a copy each; inside an FP16 region each one
would turn the tensor back to FP32 and split the region (one ResNet-50 export held 298 such Casts).
The dynamo exporter writes a global average pooling (``adaptive_avg_pool2d(x, 1)``, ``x.mean((2, 3),
keepdim=True)``) as a ReduceMean, where TorchScript and tf2onnx write GlobalAveragePool: a reduction
autoprec keeps FP32 by default, splitting every squeeze-and-excitation block's FP16 region. Each
rewrite computes what the graph computed (preparation checks every step against the model's
outputs).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

# Types that hold every value of the types listed with them: a Cast to one and back is the identity.
_HOLDS = {
    np.dtype(np.float64): {np.dtype(np.float32), np.dtype(np.float16)},
    np.dtype(np.float32): {np.dtype(np.float16)},
    np.dtype(np.int64): {np.dtype(t) for t in (np.int32, np.int16, np.int8, np.uint32, np.uint16,
                                               np.uint8, bool)},
    np.dtype(np.int32): {np.dtype(t) for t in (np.int16, np.int8, np.uint16, np.uint8, bool)},
}


def _cast_type(node: gs.Node) -> np.dtype | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(node.attrs["to"]))
    # a type NumPy has no name for (bfloat16, float8): left alone
    except (KeyError, TypeError, ValueError):
        return None


def _dtype(tensor: gs.Tensor) -> np.dtype | None:
    try:
        return None if tensor.dtype is None else np.dtype(tensor.dtype)
    except TypeError:
        return None


def _bypass(graph: gs.Graph, cast: gs.Node, source: gs.Tensor, read_elsewhere: set[str]) -> bool:
    """The readers of ``cast``'s output read ``source`` instead; False where that cannot be done
    exactly: the output is read by a subgraph (by name), or it is a graph output that ``source``
    cannot become."""
    out = cast.outputs[0]
    if out.name in read_elsewhere:
        return False
    # the producer writes the output's name itself, where nothing else reads ``source``
    if out in graph.outputs:
        producer = source.inputs[0] if len(source.inputs) == 1 else None
        if (producer is None or source in graph.outputs or source.name in read_elsewhere
                or any(reader is not cast for reader in source.outputs)):
            return False
        producer.outputs[producer.outputs.index(source)] = out
        cast.inputs.clear()
        cast.outputs.clear()
        return True
    for reader in list(out.outputs):
        for position, tensor in enumerate(reader.inputs):
            if tensor is out:
                reader.inputs[position] = source
    cast.outputs.clear()
    return True


def _names_read_by_subgraphs(graph: gs.Graph) -> set[str]:
    return {t.name for sub in graph.subgraphs(recursive=True) for n in sub.nodes for t in n.inputs}


def drop_idle_casts(graph: gs.Graph) -> int:
    """Casts to the type their input already has, and round trips through a type that holds every
    value of the first (float32 → float64 → float32): their readers read the input. Returns how many
    were taken out."""
    read_elsewhere = _names_read_by_subgraphs(graph)
    dropped = 0
    for cast in [n for n in graph.nodes if n.op == "Cast" and n.inputs and n.outputs]:
        source, to = cast.inputs[0], _cast_type(cast)
        if to is None or _dtype(source) is None:
            continue
        if _dtype(source) == to:
            dropped += _bypass(graph, cast, source, read_elsewhere)
            continue
        # Cast(A -> wide) then this Cast(wide -> A)
        first = source.inputs[0] if len(source.inputs) == 1 else None
        origin = first.inputs[0] if first is not None and first.op == "Cast" and first.inputs else None
        if origin is not None and _dtype(origin) == to and to in _HOLDS.get(_dtype(source), ()):
            dropped += _bypass(graph, cast, origin, read_elsewhere)
    if dropped:
        graph.cleanup().toposort()
    return dropped


def _reduced_axes(node: gs.Node) -> list[int] | None:
    """A ReduceMean's axes (attribute before opset 18, a constant input from it), or None where not
    constant."""
    if len(node.inputs) > 1:
        axes = node.inputs[1]
        return [int(a) for a in np.ravel(axes.values)] if isinstance(axes, gs.Constant) else None
    return [int(a) for a in node.attrs["axes"]] if "axes" in node.attrs else None


def pools_from_means(graph: gs.Graph) -> int:
    """``ReduceMean(x, axes=[2, 3], keepdims=1)`` on an N×C×H×W tensor (or N×C×D×H×W) written as
    ``GlobalAveragePool(x)``, the op it is. (Not on N×T×C: a mean over a sequence's last axis is a
    norm's, a unit of its own.) Returns how many were rewritten."""
    rewritten = 0
    for node in [n for n in graph.nodes if n.op == "ReduceMean" and n.inputs and n.outputs]:
        rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else 0
        axes = _reduced_axes(node)
        if rank < 4 or axes is None or not node.attrs.get("keepdims", 1) or node.attrs.get("noop_with_empty_axes"):
            continue
        if sorted(a % rank for a in axes) != list(range(2, rank)):
            continue
        node.op, node.attrs = "GlobalAveragePool", {}
        while len(node.inputs) > 1:
            node.inputs.pop()
        rewritten += 1
    if rewritten:
        graph.cleanup()
    return rewritten

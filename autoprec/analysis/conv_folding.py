"""Per-channel steps after a Conv folded into its weights and bias, as engines fuse them before
quantizing: BatchNormalization, and the scale Muls and bias Adds some exporters write in its
place."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs


def fold_batchnorm(graph: gs.Graph) -> int:
    """Fold BatchNormalization into the Conv before it, as TensorRT and ORT do before quantizing.

    Quantizing the folded weights per channel is what the engine will run; quantizing the
    unfolded conv would measure an error no engine has.
    """
    folded = 0
    for bn in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        x = bn.inputs[0]
        if len(x.inputs) != 1 or len(x.outputs) != 1 or len(bn.outputs) != 1 or x in graph.outputs:
            continue
        conv = x.inputs[0]
        if conv.op != "Conv" or not isinstance(conv.inputs[1], gs.Constant):
            continue
        params = bn.inputs[1:5]
        if not all(isinstance(p, gs.Constant) for p in params) or (
            len(conv.inputs) > 2 and not isinstance(conv.inputs[2], gs.Constant)
        ):
            continue
        scale, bias, mean, var = (p.values.astype(np.float64) for p in params)
        factor = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        weight = conv.inputs[1].values
        old_bias = conv.inputs[2].values if len(conv.inputs) > 2 else np.zeros(weight.shape[0])
        new_weight = (weight * factor.reshape(-1, *([1] * (weight.ndim - 1)))).astype(weight.dtype)
        new_bias = ((old_bias - mean) * factor + bias).astype(weight.dtype)
        conv.inputs[1] = gs.Constant(f"{conv.name}_weight_bnfolded", new_weight)
        _absorb(conv, gs.Constant(f"{conv.name}_bias_bnfolded", new_bias), bn)
        folded += 1
    return folded


def _absorb(conv: gs.Node, bias: gs.Constant, after: gs.Node) -> None:
    """``conv`` takes ``bias`` and the place of the node ``after`` it, whose work it now does."""
    if len(conv.inputs) > 2:
        conv.inputs[2] = bias
    else:
        conv.inputs.append(bias)
    conv.outputs = [after.outputs[0]]
    after.outputs.clear()


def _per_channel(constant: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """An Add's or Mul's constant as one value per output channel of an N×C×… Conv output, or None
    where it is not one."""
    if constant.size == 1:
        return np.full(channels, constant.item(), constant.dtype)
    shape = (1,) * (rank - constant.ndim) + constant.shape
    if constant.ndim > rank or shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return constant.reshape(channels)


def _conv_and_constant(node: gs.Node, graph: gs.Graph) -> tuple[gs.Node, np.ndarray] | None:
    """The Conv (all its weights constant) that alone feeds a two-input ``node``, and ``node``'s
    other input as one value per output channel; None where ``node`` is not such a per-channel step
    after a Conv."""
    for x, constant in (node.inputs, node.inputs[::-1]):
        if not (isinstance(constant, gs.Constant) and len(x.inputs) == 1 and len(x.outputs) == 1):
            continue
        conv = x.inputs[0]
        if conv.op != "Conv" or x in graph.outputs or not all(isinstance(i, gs.Constant) for i in conv.inputs[1:]):
            continue
        weight = conv.inputs[1].values
        values = _per_channel(constant.values, weight.shape[0], weight.ndim)
        if values is not None and values.dtype == weight.dtype:
            return conv, values
    return None


def fold_channel_steps(graph: gs.Graph) -> tuple[int, int]:
    """Fold a Mul by a per-channel constant (tf2onnx's BatchNorm scale after a depthwise Conv), then
    an Add of one (PaddlePaddle exports every Conv bias as one), into the Conv before it. Unfolded,
    the Q that ends an INT8 Conv sits before them, and they, the activation and a second Q/DQ run in
    float: ONNX Runtime's QLinearConv takes a bias; exact in FP32 but for rounding. Returns the
    scales and the biases folded."""
    folded = {"Mul": 0, "Add": 0}
    for op in ("Mul", "Add"):
        for node in [n for n in graph.nodes if n.op == op and len(n.inputs) == 2]:
            found = _conv_and_constant(node, graph)
            if found is None:
                continue
            conv, values = found
            weight = conv.inputs[1].values
            bias = conv.inputs[2].values if len(conv.inputs) > 2 else np.zeros(weight.shape[0], weight.dtype)
            if op == "Mul":
                scaled = weight * values.reshape(-1, *([1] * (weight.ndim - 1)))
                conv.inputs[1] = gs.Constant(f"{conv.name}_weight_scaled",
                                             scaled.astype(weight.dtype))
                bias = bias * values
            _absorb(conv,
                    gs.Constant(f"{conv.name}_bias_{op.lower()}",
                                (bias if op == "Mul" else bias + values)
                                      .astype(weight.dtype)), node)
            folded[op] += 1
    return folded["Mul"], folded["Add"]

"""INT8 units: Q/DQ pairs on activations (calibrated) and per-channel symmetric INT8 weights.

Two forms of the same plan, because engines read Q/DQ differently:

- ``tensorrt`` — what TensorRT's explicit quantization wants: Q/DQ only on the *inputs* of
  quantized layers, signed INT8, symmetric, zero point 0. TensorRT fuses the DQ into the layer
  and decides output types itself.
- ``ort-cpu`` — what ONNX Runtime's CPU provider needs to pick integer kernels (QLinearConv,
  QLinearMatMul): whole node units (DQ on every input, Q on the output) with *unsigned*
  activations (U8S8 on x86). Relu/Clip between the layer and its output Q are absorbed by ORT.
  The unit's output is quantized too, so its consumers see INT8-rounded values: that error is real
  on this engine and is measured as such. Q/DQ inputs alone would run as float ops (slower than FP32).
"""

from __future__ import annotations

import enum

import numpy as np
import onnx_graphsurgeon as gs

from autoprec.analysis.calibrate import ActivationRanges, TensorRange
from autoprec.analysis.model import Unit

# Ops ORT folds into the Q that follows a quantized layer (zero point at the range minimum).
_ORT_ABSORBED = {"Relu", "Clip"}


class QDQForm(str, enum.Enum):
    TENSORRT = "tensorrt"
    ORT_CPU = "ort-cpu"


def weight_axis(node: gs.Node, weight: np.ndarray) -> int | None:
    """The output-channel axis of a layer's weight, or None for per-tensor."""
    if node.op == "Conv":
        return 0
    if node.op == "ConvTranspose":
        return 1
    if node.op == "Gemm":
        return 0 if node.attrs.get("transB", 0) else 1
    if node.op == "MatMul" and weight.ndim >= 2:
        return weight.ndim - 1
    return None


def quantize_weight(weight: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT8 (range ±127, zero point 0), one scale per output channel."""
    if axis is None:
        amax = np.abs(weight).max(keepdims=True).reshape(1)
    else:
        reduce = tuple(a for a in range(weight.ndim) if a != axis)
        amax = np.abs(weight).max(axis=reduce)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    shape = [1] * weight.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.round(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


class _Quantizer:
    """Collects the Q/DQ nodes for one lowering; one Q/DQ pair per activation tensor."""

    def __init__(self, graph: gs.Graph, ranges: ActivationRanges, method: str, form: QDQForm, prefix: str):
        self.graph, self.ranges, self.method, self.form, self.prefix = graph, ranges, method, form, prefix
        self.tensors = graph.tensors()
        self.new_nodes: list[gs.Node] = []
        self.dequantized: dict[str, gs.Variable] = {}

    def activation(self, name: str) -> gs.Variable:
        """The Q→DQ output for an activation tensor, made once and shared."""
        if name not in self.dequantized:
            tensor = self.tensors[name]
            scale, zero_point = _activation_params(self.ranges[name], self.method, self.form)
            base = self.prefix + name
            scale_c = gs.Constant(f"{base}_scale", scale)
            zp_c = gs.Constant(f"{base}_zp", zero_point)
            quantized = gs.Variable(f"{base}_q", zero_point.dtype, tensor.shape)
            out = gs.Variable(f"{base}_dq", np.float32, tensor.shape)
            self.new_nodes.append(gs.Node("QuantizeLinear", f"{base}_quantize", {}, [tensor, scale_c, zp_c], [quantized]))
            self.new_nodes.append(gs.Node("DequantizeLinear", f"{base}_dequantize", {}, [quantized, scale_c, zp_c], [out]))
            self.dequantized[name] = out
        return self.dequantized[name]

    def weight(self, unit: Unit, node: gs.Node, weight: gs.Constant) -> gs.Variable:
        axis = weight_axis(node, weight.values)
        q, scale = quantize_weight(weight.values.astype(np.float32), axis)
        prefix = f"{weight.name}_{unit.name}"
        if axis is None:
            scale, zero = scale.reshape(()), np.zeros((), np.int8)
        else:
            zero = np.zeros(scale.shape, np.int8)
        inputs = [gs.Constant(f"{prefix}_int8", q), gs.Constant(f"{prefix}_scale", scale), gs.Constant(f"{prefix}_zp", zero)]
        out = gs.Variable(f"{prefix}_dq", np.float32, weight.shape)
        attrs = {"axis": axis} if axis is not None else {}
        self.new_nodes.append(gs.Node("DequantizeLinear", f"{prefix}_dequantize", attrs, inputs, [out]))
        return out


def _activation_params(r: TensorRange, method: str, form: QDQForm) -> tuple[np.ndarray, np.ndarray]:
    if form is QDQForm.TENSORRT:
        amax = r.amax(method)
        return np.array(amax / 127.0 if amax > 0 else 1.0, np.float32), np.array(0, np.int8)
    lo, hi = r.bounds(method)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zero_point = int(np.clip(round(-lo / scale), 0, 255))
    return np.array(scale, np.float32), np.array(zero_point, np.uint8)


def _ort_output_tensor(unit: Unit, nodes: dict[str, gs.Node]) -> gs.Variable:
    """The layer's output after the activations ORT can absorb into the output Q."""
    tensor = nodes[unit.nodes[0]].outputs[0]
    for name in unit.nodes[1:]:
        node = nodes[name]
        if node.op not in _ORT_ABSORBED or node.inputs[0] is not tensor:
            break
        tensor = node.outputs[0]
    return tensor


def apply_int8(graph: gs.Graph, units: list[Unit], ranges: ActivationRanges, method: str, form: QDQForm,
               prefix: str = "") -> None:
    """Quantize the given units in place, in the Q/DQ form the target engine needs. ``prefix`` starts the
    names of what it adds: in a subgraph, its path, since an outer tensor quantized in two If branches
    would otherwise give two nodes one name (which TensorRT refuses)."""
    quantizer = _Quantizer(graph, ranges, method, form, prefix)
    nodes = {n.name: n for n in graph.nodes}
    for unit in units:
        node = nodes[unit.nodes[0]]
        for i, inp in enumerate(node.inputs):
            if inp.name in unit.activations:
                node.inputs[i] = quantizer.activation(inp.name)
            elif unit.weight is not None and inp.name == unit.weight:
                node.inputs[i] = quantizer.weight(unit, node, inp)
    if form is QDQForm.ORT_CPU:
        # Whole node units: the unit's output passes through Q/DQ and *every* consumer reads the
        # dequantized value; a second consumer of the raw output would stop ORT's fusion. Nodes
        # inside an If/Loop body keep reading the raw value: ONNX Runtime 1.32 aborts the process on
        # a DQ output read only from inside a subgraph.
        own = {id(n) for n in graph.nodes}
        for unit in units:
            out = _ort_output_tensor(unit, nodes)
            if out in graph.outputs:
                continue
            dq = quantizer.activation(out.name)
            for consumer in list(out.outputs):
                if id(consumer) not in own:
                    continue
                if consumer.op == "QuantizeLinear" and consumer.outputs[0].name == f"{prefix}{out.name}_q":
                    continue
                for i, inp in enumerate(consumer.inputs):
                    if inp is out:
                        consumer.inputs[i] = dq
    graph.nodes.extend(quantizer.new_nodes)

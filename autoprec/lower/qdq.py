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
import hashlib
import math
from typing import Callable

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from autoprec.analysis.calibrate import ActivationRanges, TensorRange
from autoprec.analysis.model_info import Unit
from autoprec.core import engines
from autoprec.core.stored import StoredModel
from autoprec.lower.edit import GraphEdit


class QDQForm(str, enum.Enum):
    # the form of both TensorRT backends, and of ort-cuda (to build the same there)
    TENSORRT = engines.TENSORRT
    ORT_CPU = engines.ORT_CPU

    @property
    def fp16_regions(self) -> bool:
        """Whether FP16 units grow into regions (the precision-neutral ops between them run in FP16
        too): GPU engines gain from them; ONNX Runtime's CPU provider has no FP16 kernels to gain
        from."""
        return self is not QDQForm.ORT_CPU

    @property
    def sums_before_layer_norms(self) -> bool:
        """Whether an Add a LayerNormalization reads is written as a Sum: ONNX Runtime's CPU
        provider would fuse the two into its slow SkipLayerNormalization (see
        autoprec.lower.layernorm)."""
        return self is QDQForm.ORT_CPU


# Elements quantized at a time: a weight of any size costs a bounded amount of memory beyond its
# INT8 copy.
CHUNK_ELEMENTS = 1 << 22


def weight_axis(node: NodeProto, ndim: int) -> int | None:
    """The output-channel axis of a layer's weight, or None for per-tensor."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    if node.op_type == "MatMul" and ndim >= 2:
        return ndim - 1
    return None


def _chunks(flat: np.ndarray) -> list[slice]:
    """Slices along the first axis of at most CHUNK_ELEMENTS values each (one row at least)."""
    rows = max(1, CHUNK_ELEMENTS // max(1, flat[0].size))
    return [slice(start, start + rows) for start in range(0, len(flat), rows)]


def weight_amax(weight: np.ndarray, axis: int | None) -> np.ndarray:
    """Each output channel's largest magnitude (one value per tensor), read in chunks along the first
    axis, so a memory-mapped weight of any size is never loaded whole."""
    flat = weight.reshape(1) if weight.ndim == 0 else weight
    chunks = _chunks(flat)
    if axis is None:
        return np.array([max(float(np.abs(flat[c]).max(initial=0.0)) for c in chunks)])
    if axis == 0:
        return np.concatenate([np.abs(flat[c]).reshape(len(flat[c]), -1).max(axis=1, initial=0.0) for c in chunks])
    reduce = tuple(a for a in range(flat.ndim) if a != axis)
    return np.max([np.abs(flat[c]).max(axis=reduce) for c in chunks], axis=0)


def quantize_weight(weight: np.ndarray, axis: int | None, least: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT8 (range ±127, zero point 0), one scale per output channel (:func:`weight_amax`),
    none below ``least`` (see :meth:`_Quantizer.bias_floor`); quantized in chunks along the first
    axis, so a memory-mapped weight of any size is never loaded whole."""
    flat = weight.reshape(1) if weight.ndim == 0 else weight
    chunks = _chunks(flat)
    amax = weight_amax(flat, axis)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    if least is not None:
        scale = np.maximum(scale, least).astype(np.float32)
    shape = [1] * flat.ndim
    if axis is not None:
        shape[axis] = -1
    per_channel = scale.reshape(shape)
    if len(chunks) == 1:  # small: one pass
        return np.clip(np.rint(flat / per_channel), -127, 127).astype(np.int8).reshape(weight.shape), scale
    q = np.empty(flat.shape, np.int8)
    for c in chunks:
        q[c] = np.clip(np.rint(flat[c].astype(np.float32) / (per_channel[c] if axis == 0 else per_channel)), -127, 127)
    return q.reshape(weight.shape), scale


class _Quantizer:
    """The Q/DQ nodes of one graph's lowering: one Q/DQ pair per activation tensor, one DQ per
    weight."""

    def __init__(self, edit: GraphEdit, model: StoredModel, ranges: ActivationRanges, method: str,
                 form: QDQForm,
                 prefix: str):
        self.edit, self.model, self.ranges, self.method, self.form, self.prefix = (
            edit,
            model,
            ranges,
            method,
            form,
            prefix,
        )
        self.dequantized: dict[str, str] = {}
        self.quantize_nodes: dict[str, NodeProto] = {}  # tensor -> the Q reading it
        self.scales: dict[str, float] = {}  # an activation's dequantized tensor -> its scale

    def activation(self, name: str) -> str:
        """The Q→DQ output for an activation tensor, made once and shared."""
        if name not in self.dequantized:
            scale, zero_point = _activation_params(self.ranges[name], self.method, self.form)
            base = self.prefix + name
            self.scales[f"{base}_dq"] = float(scale)
            scale_name = self.edit.add_initializer(_scalar(scale, f"{base}_scale"))
            zp_name = self.edit.add_initializer(_scalar(zero_point, f"{base}_zp"))
            self.quantize_nodes[name] = self.edit.add("QuantizeLinear", f"{base}_quantize",
                                                      [name, scale_name, zp_name],
                                                      [f"{base}_q"])
            self.edit.add("DequantizeLinear", f"{base}_dequantize",
                          [f"{base}_q", scale_name, zp_name], [f"{base}_dq"])
            self.dequantized[name] = f"{base}_dq"
        return self.dequantized[name]

    def weight(self, unit: Unit, node: NodeProto, name: str) -> str:
        """A DQ of the weight's INT8 copy (made once per model, kept in its folder) in place of the
        weight."""
        tensor = self.edit.index.initializers[name]
        axis = weight_axis(node, len(tensor.dims))
        least = self.bias_floor(node, name, axis)
        # (a scale raised for the bias: a copy of its own)
        prefix = f"{name}_{unit.name}" + ("" if least is None else f"_bias{_digest(least)}")
        made: list = []  # quantized once, only where a copy is not there yet

        def quantized() -> tuple[np.ndarray, np.ndarray]:
            if not made:
                made.append(quantize_weight(self.edit.index.values(name, self.model.folder), axis, least))
            return made[0]

        zero = np.zeros(tensor.dims[axis] if axis is not None else (), np.int8)
        copies = (self.model.derived(f"{prefix}_int8", lambda: quantized()[0],
                                     math.prod(tensor.dims)),
                  self.model.derived(f"{prefix}_scale", lambda: quantized()[1].reshape(zero.shape),
                                     4 * zero.size),
                  self.model.derived(f"{prefix}_zp", lambda: zero, zero.size))
        attrs = {"axis": axis} if axis is not None else {}
        self.edit.add("DequantizeLinear", f"{prefix}_dequantize",
                      [self.edit.add_initializer(t) for t in copies],
                      [f"{prefix}_dq"], **attrs)
        return f"{prefix}_dq"

    def bias_floor(self, node: NodeProto, weight: str, axis: int | None) -> np.ndarray | None:
        """The least weight scale per channel at which ONNX Runtime's QLinearConv holds the Conv's
        bias in int32 (the bias over the input's scale times the weight's, with half its range left
        for the products), where a channel's weights alone would give less; None where none would.
        A channel of near-zero weights and a bias (what BatchNorm folding makes of a near-zero gamma)
        overflowed it, and the channel's output was wrong (its weights round to 0 now: its output is
        its bias, as it was in float)."""
        inputs = self.edit.ins[id(node)]
        if (self.form is not QDQForm.ORT_CPU or node.op_type != "Conv" or len(inputs) < 3
                or inputs[2] not in self.edit.index.initializers or self.scales.get(inputs[0], 0.0) <= 0):
            return None
        bias = np.abs(self.edit.index.values(inputs[2], self.model.folder)).astype(np.float64)
        least = (bias / (self.scales[inputs[0]] * 2.0**30)).astype(np.float32)
        amax = self.model.derived(f"{weight}_amax", lambda: weight_amax(
            self.edit.index.values(weight, self.model.folder), axis).astype(np.float32), 4 * len(bias))
        scale = np.maximum(numpy_helper.to_array(amax), 0.0) / 127.0
        return least if len(scale) == len(least) and bool((least > scale).any()) else None


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, np.float32).tobytes()).hexdigest()[:12]


def _scalar(value: np.ndarray, name: str) -> TensorProto:
    """A 0-d tensor (numpy_helper.from_array, without its checks: a lowering makes hundreds)."""
    return TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
                       raw_data=value.tobytes())


def _activation_params(r: TensorRange, method: str, form: QDQForm) -> tuple[np.ndarray, np.ndarray]:
    if form is QDQForm.TENSORRT:
        amax = r.amax(method)
        return np.array(amax / 127.0 if amax > 0 else 1.0, np.float32), np.array(0, np.int8)
    lo, hi = r.bounds(method)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    # plain Python: NumPy's clip of one number costs 0.1 ms
    zero_point = min(max(round(-lo / scale), 0), 255)
    return np.array(scale, np.float32), np.array(zero_point, np.uint8)


def apply_int8(edit: GraphEdit, model: StoredModel, units: list[Unit], ranges: ActivationRanges,
               method: str,
               form: QDQForm, prefix: str = "", unit_nodes: frozenset[str] = frozenset()) -> None:
    """Quantize the given units of one graph, in the Q/DQ form the target engine needs. ``prefix``
    starts the names of what it adds: in a subgraph, its path, since an outer tensor quantized in
    two If branches would otherwise give two nodes one name (which TensorRT refuses).
    ``unit_nodes``: the nodes of every unit of the graph, whatever its precision (an FP32 or FP16
    unit keeps reading the raw tensors)."""
    quantizer = _Quantizer(edit, model, ranges, method, form, prefix)
    for unit in units:
        node = edit.node(edit.index.position[unit.nodes[0]])
        for i, name in enumerate(edit.ins[id(node)]):
            if name in unit.activations:
                edit.set_input(node, i, quantizer.activation(name))
            elif unit.weight is not None and name == unit.weight:
                edit.set_input(node, i, quantizer.weight(unit, node, name))
    if form is QDQForm.TENSORRT:
        _quantize_skip_inputs(edit, quantizer, units)
    if form is QDQForm.ORT_CPU:
        # The precision-neutral ops reading a quantized input (a residual Add, a Concat, a pooling)
        # read its dequantized value too: ORT then sees them between Q/DQ and runs them on INT8
        # (QLinearAdd, QLinearConcat, ...) where it has the kernel, instead of breaking the chain in
        # float. One that makes a graph output keeps the raw value: no Q follows it there, so it
        # would run in float all the same, its output (an Identity's copy of an input) changed.
        added = {id(node) for node in edit.added}
        for name, dequantized in list(quantizer.dequantized.items()):
            _read_dequantized(edit, name, dequantized,
                              lambda node: id(node) in added or node.name in unit_nodes
                              or any(o in edit.index.outputs for o in node.output))
        # Whole node units: the unit's output passes through Q/DQ and *every* consumer reads the
        # dequantized value; a second consumer of the raw output would stop ORT's fusion. Nodes
        # inside an If/Loop body keep reading the raw value: ONNX Runtime 1.32 aborts the process on
        # a DQ output read only from inside a subgraph (an output read there alone takes no Q/DQ).
        for unit in units:
            out = unit.quantized_output(lambda name: edit.index.graph.node[edit.index.position[name]])
            if out not in edit.index.outputs and edit.readers(out):
                dequantized = quantizer.activation(out)
                _read_dequantized(edit, out, dequantized,
                                  lambda node: node is quantizer.quantize_nodes[out])


def _read_dequantized(edit: GraphEdit, name: str, dequantized: str,
                      keeps_raw: Callable[[NodeProto], bool]) -> None:
    """Every node of the graph reading ``name`` reads ``dequantized`` instead, but those
    ``keeps_raw`` names."""
    for reader in edit.readers(name):
        if not keeps_raw(reader):
            for i, read in enumerate(edit.ins[id(reader)]):
                if read == name:
                    edit.set_input(reader, i, dequantized)


def _quantize_skip_inputs(edit: GraphEdit, quantizer: _Quantizer, units: list[Unit]) -> None:
    """NVIDIA's placement for a residual block: where an Add joins an INT8 convolution's output
    (read by it alone) with a skip connection, the skip input gets the Q/DQ and the convolution's
    output none, so TensorRT fuses the Add into the convolution's epilogue and reads the skip tensor
    as INT8 (ModelOpt's residual-Add rule: ``build_non_residual_input_map``). Where both inputs are
    such outputs, the second."""
    index = edit.index
    fusible = set()
    for unit in units:
        node = index.graph.node[index.position[unit.nodes[0]]]
        if node.op_type in ("Conv", "ConvTranspose") and len(index.readers.get(node.output[0], ())) == 1:
            fusible.add(node.output[0])
    adds = {p for name in fusible for p in index.readers[name] if index.graph.node[p].op_type == "Add"}
    for position in sorted(adds):
        add = edit.node(position)
        inputs = edit.ins[id(add)]
        if len(inputs) != 2:
            continue
        slot = 1 if inputs[0] in fusible else 0
        skip = inputs[slot]
        if skip in index.initializers or skip not in quantizer.ranges.tensors:
            continue
        edit.set_input(add, slot, quantizer.activation(skip))

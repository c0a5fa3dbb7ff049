"""INT4 units: a MatMul's or Gemm's constant weight in 4-bit blocks, its activations as they are
(weight-only).

At one token a decoder's MatMuls read each weight once per run: their time is the weights' bytes,
and 4-bit blocks cut them by 8 against FP32. Two forms of the same plan, as engines run them:

- ``matmul_nbits`` — ONNX Runtime's ``MatMulNBits`` (com.microsoft), its own packing and kernels (CPU and CUDA);
  ``accuracy_level`` 4 computes against the activations in INT8 blocks (the CPU's fastest);
- ``dequantize`` — TensorRT's weight-only form: a block-quantized ``DequantizeLinear`` (opset 21) of INT4
  weights feeding the MatMul, which a strongly typed build fuses into an INT4 weight GEMM.

The weights are ONNX Runtime's quantizer's (round to nearest, symmetric, one scale per
``BLOCK_SIZE`` values of a column along K), made once per model and kept beside it as the INT8
copies are; where the calibration data makes an activation-aware scaling the lesser error, the
weight is scaled first and its input scaled back by a Mul (autoprec.lower.awq).
"""

from __future__ import annotations

import enum

import numpy as np
from onnx import NodeProto, TensorProto

from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.model_info import Unit
from autoprec.analysis.units import INT4_BLOCK
from autoprec.core.atomic import digest
from autoprec.core.stored import StoredModel
from autoprec.lower.awq import chosen_scales
from autoprec.lower.edit import GraphEdit

BLOCK_SIZE = INT4_BLOCK
ACCURACY_LEVEL = 4
DEQUANTIZE_OPSET = 21  # DequantizeLinear's block_size


class Int4Form(str, enum.Enum):
    MATMUL_NBITS = "matmul_nbits"
    DEQUANTIZE = "dequantize"


def apply_int4(edit: GraphEdit, model: StoredModel, units: list[Unit], form: Int4Form,
               ranges: ActivationRanges | None = None, prefix: str = "") -> None:
    """Each unit's compute node rewritten to read its weight in 4-bit blocks, in ``form``; scaled
    first where the calibration's channel power (``ranges``) makes that the lesser error (see
    autoprec.lower.awq)."""
    for unit in units:
        node = edit.node(edit.index.position[unit.nodes[0]])
        weight = edit.ins[id(node)][1]
        values = edit.index.values(weight, model.folder)
        transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
        matrix = np.asarray(values, np.float32).T if transposed else values  # [K, N]
        k, n = matrix.shape
        rows = _scales(model, f"{weight}_{unit.name}", matrix, _power(ranges, unit))
        scaled = f"_awq{digest(rows.tolist())}" if rows is not None else ""
        name = f"{prefix}{weight}_{unit.name}_int4_{form.value}{scaled}"
        made: list = []  # quantized once, only where the copies are not there yet

        def quantized() -> tuple[np.ndarray, np.ndarray]:
            if not made:
                made.append(_blocks(matrix * rows[:, None] if rows is not None else matrix, form))
            return made[0]

        if rows is not None:  # the input channels scaled back: the product as it was
            inverse = model.derived(f"{name}_inverse", lambda: (1.0 / rows).astype(np.float32),
                                    4 * k)
            activation = edit.ins[id(node)][0]
            edit.add("Mul", f"{name}_scaled", [activation, edit.add_initializer(inverse)],
                     [f"{name}_x"])
            edit.set_input(node, 0, f"{name}_x")

        packed = model.derived(f"{name}_packed", lambda: quantized()[0], k * n // 2)
        blocks = model.derived(f"{name}_scales", lambda: quantized()[1], 4 * n * (k // BLOCK_SIZE))
        if form is Int4Form.MATMUL_NBITS:
            _matmul_nbits(edit, node, packed, blocks, k, n)
        else:
            _dequantized(edit, node, _as_int4(packed, (k, n)), blocks, name)


# (model folder, unit, power digest) -> scales
_chosen: dict[tuple[str, str, str], np.ndarray | None] = {}


def _power(ranges: ActivationRanges | None, unit: Unit) -> np.ndarray | None:
    found = ranges.tensors.get(unit.activations[0]) if ranges is not None and unit.activations else None
    return found.channel_power if found is not None else None


def _scales(model: StoredModel, unit: str, matrix: np.ndarray, power: np.ndarray | None) -> np.ndarray | None:
    """The unit's activation-aware scales, chosen once per process for these weights and this
    power."""
    key = (str(model.folder), unit, digest(power.tolist()) if power is not None else "")
    if key not in _chosen:
        _chosen[key] = chosen_scales(matrix, power, _rounded)
    return _chosen[key]


def _blocks(weight: np.ndarray, form: Int4Form) -> tuple[np.ndarray, np.ndarray]:
    """A [K, N] weight's 4-bit values and scales, packed and shaped as ``form`` reads them (ONNX
    Runtime's quantizer: round to nearest, symmetric, a scale per BLOCK_SIZE values of a column)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_qdq_matmul_4bits

    k, n = weight.shape
    blocks = k // BLOCK_SIZE  # (a unit takes INT4 only where K is a whole number of blocks)
    weight = np.ascontiguousarray(weight, np.float32)
    zero_points = np.zeros(n * blocks, np.uint8)  # (written only by an asymmetric quantization)
    if form is Int4Form.MATMUL_NBITS:
        packed, scales = np.zeros((n, blocks, BLOCK_SIZE // 2), np.uint8), np.zeros((n, blocks), np.float32)
        quantize_matmul_4bits(packed, weight, scales, zero_points, BLOCK_SIZE, n, k, True)
    else:
        packed, scales = np.zeros(k * n // 2, np.uint8), np.zeros((blocks, n), np.float32)
        quantize_qdq_matmul_4bits(packed, weight, scales, zero_points, BLOCK_SIZE, n, k, True)
    return packed, scales


def _rounded(weight: np.ndarray) -> np.ndarray:
    """A [K, N] weight as engines read it back from its 4-bit blocks (the DequantizeLinear form's
    layout: two values a byte, low nibble first, signed)."""
    packed, scales = _blocks(weight, Int4Form.DEQUANTIZE)
    nibbles = np.stack([packed & 0x0F, packed >> 4], axis=1).reshape(-1).astype(np.int8)
    values = np.where(nibbles > 7, nibbles - 16, nibbles).reshape(weight.shape).astype(np.float32)
    return values * np.repeat(scales, BLOCK_SIZE, axis=0)


def _matmul_nbits(edit: GraphEdit, node: NodeProto, packed: TensorProto, scales: TensorProto,
                  k: int, n: int) -> None:
    inputs = [edit.ins[id(node)][0], edit.add_initializer(packed), edit.add_initializer(scales)]
    bias = edit.ins[id(node)][2:3] if node.op_type == "Gemm" else []
    inputs += ["", "", bias[0]] if bias and bias[0] else []  # (no zero points: symmetric; no g_idx)
    edit.retype(node, "MatMulNBits", "com.microsoft", inputs,
                dict(K=k, N=n, bits=4, block_size=BLOCK_SIZE, accuracy_level=ACCURACY_LEVEL))


def _dequantized(edit: GraphEdit, node: NodeProto, packed: TensorProto, scales: TensorProto,
                 name: str) -> None:
    edit.add("DequantizeLinear", f"{name}_dequantize",
             [edit.add_initializer(packed), edit.add_initializer(scales)],
             [f"{name}_dq"], axis=0, block_size=BLOCK_SIZE)
    inputs = [edit.ins[id(node)][0], f"{name}_dq", *edit.ins[id(node)][2:3]]
    # a Gemm's weight now [K, N]: no transposes left
    edit.retype(node, node.op_type, "", inputs, {})


def _as_int4(tensor: TensorProto, shape: tuple[int, int]) -> TensorProto:
    """The packed bytes (two values a byte, low nibble first: ONNX's INT4 layout) as a [K, N] INT4
    tensor."""
    typed = TensorProto()
    typed.CopyFrom(tensor)
    typed.data_type = TensorProto.INT4
    del typed.dims[:]
    typed.dims.extend(shape)
    return typed


def opset_needed(form: Int4Form) -> tuple[str, int]:
    """The opset import a lowering with INT4 units needs (a domain and its least version)."""
    return ("com.microsoft", 1) if form is Int4Form.MATMUL_NBITS else ("", DEQUANTIZE_OPSET)


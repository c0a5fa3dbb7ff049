"""INT4 units: a MatMul's or Gemm's constant weight (or an embedding's table: :func:`_gathered`) in
4-bit blocks, its activations as they are (weight-only).

At one token a decoder's MatMuls read each weight once per run: their time is the weights' bytes,
and 4-bit blocks cut them by 8 against FP32. Two forms of the same plan, as engines run them:

- ``matmul_nbits`` — ONNX Runtime's ``MatMulNBits`` (com.microsoft), its own packing and kernels (CPU and CUDA);
  ``accuracy_level`` 4 computes against the activations in INT8 blocks, 0 in float: the search
  measures which runs faster on its engine (autoprec.measure.int4_kernels) and keeps the answer
  beside the model (``KERNELS_FILE``), which every lowering of it reads (4 where none is kept);
- ``dequantize`` — TensorRT's weight-only form: a block-quantized ``DequantizeLinear`` (opset 21) of INT4
  weights feeding the MatMul, which a strongly typed build fuses into an INT4 weight GEMM.

The weights are ONNX Runtime's quantizer's (round to nearest, one scale per block of a column along
K: 32 values unless the search space's ``int4_block_size`` says), made once per model and kept
beside it as the INT8 copies are; where the calibration data makes it the lesser error, the weight
is scaled first and its input scaled back by a Mul (activation-aware), and MatMulNBits' blocks take
a zero point each (asymmetric; TensorRT's INT4 weights are symmetric) where the error they cut pays
for the time they cost — both chosen per unit (autoprec.lower.awq, :func:`zero_point_margin`). A K
that is not a whole number of blocks (an MLP of 2730) is padded with zero rows: ``MatMulNBits``
reads the last block short itself; TensorRT wants whole blocks, so its form pads the input's K with
zeros too.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, numpy_helper

from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.model_info import Unit
from autoprec.analysis.subgraphs import all_nodes
from autoprec.core import atomic
from autoprec.core.atomic import digest
from autoprec.core.search_space import INT4_BLOCK_SIZE
from autoprec.core.stored import DERIVED, StoredModel
from autoprec.lower.awq import (
    ALPHAS,
    MARGIN,
    Rounded,
    activation_scales,
    chosen_rounding,
    rounding_errors,
)
from autoprec.lower.edit import GraphEdit

ACCURACY_LEVEL = 4  # where no measured level is kept
ACCURACY_LEVELS = (0, 4)  # float activations; INT8 blocks of them
KERNELS_FILE = "int4-kernels.json"  # in the prepared model's derived/
DEQUANTIZE_OPSET = 21  # DequantizeLinear's block_size


class Int4Form(str, enum.Enum):
    MATMUL_NBITS = "matmul_nbits"
    DEQUANTIZE = "dequantize"


def apply_int4(edit: GraphEdit, model: StoredModel, units: list[Unit], form: Int4Form,
               ranges: ActivationRanges | None = None, prefix: str = "") -> None:
    """Each unit's compute node rewritten to read its weight in 4-bit blocks, in ``form``; scaled
    first, or given a zero point per block, where the calibration's channel power (``ranges``) makes
    that the lesser error (see autoprec.lower.awq)."""
    kernels = kept_kernels(model.folder) if form is Int4Form.MATMUL_NBITS else None
    level = kernels["accuracy_level"] if kernels else ACCURACY_LEVEL
    for unit in units:
        node = edit.node(edit.index.position[unit.nodes[0]])
        if node.op_type == "Gather":
            _gathered(edit, node, model, unit, form, prefix)
            continue
        weight = edit.ins[id(node)][1]
        values = edit.index.values(weight, model.folder)
        transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
        matrix = np.asarray(values, np.float32).T if transposed else values  # [K, N]
        k, n = matrix.shape
        block = unit.int4_block
        rounding, rows = _chosen_for(model, f"{weight}_{unit.name}", matrix, _power(ranges, unit), form, block,
                                     zero_point_margin(kernels))
        scaled = f"_awq{digest(rows.tolist())}" if rows is not None else ""
        name = _copy_name(f"{prefix}{weight}_{unit.name}_int4_{form.value}", block, rounding, scaled)
        activation = edit.ins[id(node)][0]
        if rows is not None:  # the input channels scaled back: the product as it was
            inverse = model.derived(f"{name}_inverse", lambda: (1.0 / rows).astype(np.float32),
                                    4 * k)
            activation = edit.add("Mul", f"{name}_scaled", [activation, edit.add_initializer(inverse)],
                                  [f"{name}_x"]).output[0]
        whole = _whole_blocks(k, block)
        if whole > k and form is Int4Form.DEQUANTIZE:
            activation = _padded(edit, activation, whole - k, name)
        if activation != edit.ins[id(node)][0]:
            edit.set_input(node, 0, activation)
        tensors = _stored_blocks(model, name, matrix * rows[:, None] if rows is not None else matrix, form,
                                 block, rounding == SYMMETRIC)
        if form is Int4Form.MATMUL_NBITS:
            _matmul_nbits(edit, node, tensors, k, n, block, level)
        else:
            _dequantized(edit, node, _as_int4(tensors[0], (whole, n)), tensors[1], name, block)


def _gathered(edit: GraphEdit, node: NodeProto, model: StoredModel, unit: Unit, form: Int4Form, prefix: str) -> None:
    """An embedding's table [V, D] in 4-bit blocks along D: each row is to the quantizer what a MatMul
    weight's column is, so MatMulNBits' packing is the table's, row by row. ONNX Runtime gathers from it
    (GatherBlockQuantized, a zero point per block where that cuts the error by MARGIN: no kernel reads
    them slower at a row a token); TensorRT's form dequantizes the signed INT4 table (each value less
    8) before the Gather. The rows' loudness does not weigh the error: no activation meets them."""
    table = edit.ins[id(node)][0]
    columns = np.asarray(edit.index.values(table, model.folder), np.float32).T  # [D, V]
    block, (width, rows) = unit.int4_block, columns.shape
    rounding, _ = _chosen_for(model, f"{table}_{unit.name}", columns, None, form, block, MARGIN)
    symmetric = rounding == SYMMETRIC
    name = _copy_name(f"{prefix}{table}_{unit.name}_int4_gather_{form.value}", block, rounding)
    signed = form is Int4Form.DEQUANTIZE
    packed, scales, *zero_points = _stored_blocks(model, name, columns, Int4Form.MATMUL_NBITS, block, symmetric,
                                                  signed)
    indices = edit.ins[id(node)][1]
    if signed:
        dequantized = edit.add("DequantizeLinear", f"{name}_dequantize",
                               [edit.add_initializer(_as_int4(packed, (rows, width))), edit.add_initializer(scales)],
                               [f"{name}_dq"], axis=1, block_size=block).output[0]
        edit.retype(node, "Gather", "", [dequantized, indices], dict(axis=0))
        return
    inputs = [edit.add_initializer(_reshaped(packed, (rows, width // 2))), indices, edit.add_initializer(scales)]
    if zero_points:  # (a row's own bytes, two a byte)
        inputs.append(edit.add_initializer(_reshaped(zero_points[0], (rows, -(-(width // block) // 2)))))
    edit.retype(node, "GatherBlockQuantized", "com.microsoft", inputs,
                dict(gather_axis=0, quantize_axis=1, block_size=block, bits=4))


def _copy_name(base: str, block: int, rounding: str, scaled: str = "") -> str:
    """A 4-bit copy's name: ``base`` and what else makes it (a block size not the default, activation-aware
    scales, a zero point per block), so that each copy is made and kept once."""
    return f"{base}{'' if block == INT4_BLOCK_SIZE else f'_block{block}'}{scaled}{'' if rounding == SYMMETRIC else '_zp'}"


def _stored_blocks(model: StoredModel, name: str, matrix: np.ndarray, form: Int4Form, block: int,
                   symmetric: bool, signed: bool = False) -> list[TensorProto]:
    """The packed 4-bit values, the scales and (asymmetric) the zero points, quantized once, only
    where the copies are not kept beside the model yet; ``signed``: the values less 8, ONNX's INT4
    (symmetric blocks: 8 is their zero point)."""
    made: list = []

    def quantized() -> tuple[np.ndarray, ...]:
        if not made:
            packed, *rest = _blocks(matrix, form, block, symmetric)
            made.append((packed ^ 0x88 if signed else packed, *rest))
        return made[0]

    whole, n = _whole_blocks(matrix.shape[0], block), matrix.shape[1]
    blocks = whole // block
    tensors = [model.derived(f"{name}_packed", lambda: quantized()[0], whole * n // 2),
               model.derived(f"{name}_scales", lambda: quantized()[1], 4 * n * blocks)]
    if not symmetric:
        tensors.append(model.derived(f"{name}_zero_points", lambda: quantized()[2], _zero_point_bytes(n, blocks)))
    return tensors


def _zero_point_bytes(n: int, blocks: int) -> int:
    """MatMulNBits' zero points of ``n`` columns of ``blocks`` blocks: two a byte, a column's own bytes."""
    return n * -(-blocks // 2)


def _whole_blocks(k: int, block: int) -> int:
    """K rounded up to a whole number of blocks."""
    return -(-k // block) * block


def _padded(edit: GraphEdit, activation: str, extra: int, name: str) -> str:
    """``activation`` with ``extra`` zeros after its last axis (K), to meet the zero rows of a
    padded weight."""
    pads = edit.add_initializer(numpy_helper.from_array(np.array([0, extra], np.int64), f"{name}_pads"))
    axes = edit.add_initializer(numpy_helper.from_array(np.array([-1], np.int64), f"{name}_pad_axes"))
    return edit.add("Pad", f"{name}_pad", [activation, pads, "", axes], [f"{name}_padded"]).output[0]


SYMMETRIC, ZERO_POINT = "symmetric", "zero point"
# a zero point's cut in a unit's error must buy more than its time: the loss it frees lets another
# unit of like size go from INT8 to INT4, which at one token on ONNX Runtime's CPU saves about half
# an INT4 unit's time (a 1024-wide decoder's o_proj: QLinearMatMul 142 µs, MatMulNBits 95 µs) —
# so a zero point costing d of a unit's time must cut its error by 2 d at least
TIME_TO_ERROR = 2.0
# (model folder, unit, power digest, form, block) -> each rounding's α and error
_errors: dict[tuple[str, str, str, str, int], dict[str, Rounded]] = {}


def _power(ranges: ActivationRanges | None, unit: Unit) -> np.ndarray | None:
    found = ranges.tensors.get(unit.activations[0]) if ranges is not None and unit.activations else None
    return found.channel_power if found is not None else None


def _chosen_for(model: StoredModel, unit: str, matrix: np.ndarray, power: np.ndarray | None,
                form: Int4Form, block: int, margin: float) -> tuple[str, np.ndarray | None]:
    """The unit's rounding and activation-aware scales for these weights and this power, a zero
    point per block where it cuts the error by ``margin``. Each rounding's error is measured once
    per model and kept in its folder for every process that lowers it (seconds for a 32 000-row
    head, in each worker). A zero point per block is MatMulNBits' alone: TensorRT's INT4 weights are
    symmetric, so without channel power to weigh (an embedding's table) its form has nothing to choose."""
    if form is Int4Form.DEQUANTIZE and power is None:
        return SYMMETRIC, None
    key = (str(model.folder), unit, digest(power.tolist()) if power is not None else "", form.value, block)
    if key not in _errors:
        roundings = {SYMMETRIC: lambda w: _read_back(w, block, True)}
        if form is Int4Form.MATMUL_NBITS:
            roundings[ZERO_POINT] = lambda w: _read_back(w, block, False)
        _errors[key] = _kept_errors(model, digest(list(key[1:])), list(roundings),
                                    lambda: rounding_errors(matrix, power, roundings))
    errors = _errors[key]
    rounding = chosen_rounding(errors, {ZERO_POINT: margin})
    return rounding, activation_scales(power, len(matrix), errors[rounding].alpha)


def _kept_errors(model: StoredModel, content: str, names: list[str],
                 measure: Callable[[], dict[str, Rounded]]) -> dict[str, Rounded]:
    """``measure()``, or what a process lowering this model kept for ``content`` (a file it cannot
    have written is measured again)."""
    path = Path(model.folder) / DERIVED / f"int4-rounding-{content[:24]}.json"
    kept = (atomic.read_keyed(path, content) or {}).get("errors")
    try:
        found = {name: Rounded(*kept[name]) for name in names}
        if all(r.alpha in ALPHAS and 0 <= r.error < math.inf for r in found.values()):
            return found
    except (KeyError, TypeError):
        pass
    errors = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_keyed(path, content, {"errors": {name: [r.alpha, r.error] for name, r in errors.items()}})
    return errors


def zero_point_margin(kernels: dict | None) -> float:
    """The share of a unit's error a zero point per block must cut to ship: TIME_TO_ERROR times the
    share of time they cost in the kernel measurement (:func:`kept_kernels`), MARGIN at least (and
    where none timed them). The timing's best estimate, not a verdict beyond its noise: two near-equal
    options are traded here, and a cost the noise hides is small."""
    timed = kernels.get("zero_points") if kernels else None
    cost = max(0.0, 1 / timed["speedup"] - 1) if timed else 0.0  # (symmetric blocks' speed over theirs)
    return max(MARGIN, TIME_TO_ERROR * cost)


def _blocks(weight: np.ndarray, form: Int4Form, block: int, symmetric: bool = True) -> tuple[np.ndarray, ...]:
    """A [K, N] weight's 4-bit values, scales and zero points (asymmetric: one a block, two a
    byte), packed and shaped as ``form`` reads them (ONNX Runtime's quantizer: round to nearest,
    a scale per ``block`` values of a column), K padded with zero rows to whole blocks."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_qdq_matmul_4bits

    k, n = weight.shape
    whole = _whole_blocks(k, block)
    blocks = whole // block
    weight = np.ascontiguousarray(np.pad(np.asarray(weight, np.float32), ((0, whole - k), (0, 0))))
    zero_points = np.zeros(_zero_point_bytes(n, blocks), np.uint8)  # (written only where asymmetric)
    if form is Int4Form.MATMUL_NBITS:
        packed, scales = np.zeros((n, blocks, block // 2), np.uint8), np.zeros((n, blocks), np.float32)
        quantize_matmul_4bits(packed, weight, scales, zero_points, block, n, whole, symmetric)
    else:
        packed, scales = np.zeros(whole * n // 2, np.uint8), np.zeros((blocks, n), np.float32)
        quantize_qdq_matmul_4bits(packed, weight, scales, zero_points, block, n, whole, symmetric)
    return packed, scales, zero_points


def _read_back(weight: np.ndarray, block: int, symmetric: bool) -> np.ndarray:
    """A [K, N] weight as MatMulNBits reads it back from its blocks (per column, two values a byte
    along K, low nibble first, less the block's zero point: 8 where symmetric). The
    DequantizeLinear form rounds alike (signed, no zero point)."""
    packed, scales, zero_points = _blocks(weight, Int4Form.MATMUL_NBITS, block, symmetric)
    k, n = weight.shape
    blocks = scales.shape[1]
    values = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks, block)
    if symmetric:
        zero = np.full((n, blocks), 8, np.float32)
    else:
        zero = np.stack([zero_points & 0x0F, zero_points >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    read = (values - zero[..., None].astype(np.float32)) * scales[..., None]
    return read.reshape(n, -1)[:, :k].T


def kept_kernels(folder: str | Path) -> dict | None:
    """What :func:`keep_kernels` kept beside the model in ``folder``; None where nothing valid is."""
    return valid_kernels(atomic.read_keyed(Path(folder) / DERIVED / KERNELS_FILE, KERNELS_FILE))


def valid_kernels(found: object) -> dict | None:
    """``found`` where it is a kernel measurement as :mod:`autoprec.measure.int4_kernels` writes one (its
    level, the engine, the timed ratios; one written before zero points were timed has none, and its
    units lower as they did), else None: a file or a study attribute someone edited is measured
    again, not read into a KeyError or a level no kernel has."""
    try:
        level, engine = found["accuracy_level"], found["engine"]
        ratios = ["integer_over_float", *(["zero_points"] if "zero_points" in found else [])]
        figures = [found[ratio][k] for ratio in ratios for k in ("speedup", "low", "high")]
    except (KeyError, TypeError):
        return None
    sound = (type(level) is int and level in ACCURACY_LEVELS and isinstance(engine, str)
             and all(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < math.inf for f in figures))
    return found if sound else None


def keep_kernels(folder: str | Path, measured: dict) -> None:
    """``measured`` (its ``accuracy_level`` and the ``engine`` it was measured on among them) kept
    beside the model in ``folder`` for every process that lowers it."""
    path = Path(folder) / DERIVED / KERNELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_keyed(path, KERNELS_FILE, measured)


def with_kernel(model: StoredModel, level: int, zero_points: bool) -> StoredModel:
    """``model`` with each MatMulNBits at ``level``, reading a zero point per block or none, for
    timing the kernels: a zero point added is 8, so the product stays the symmetric one; one taken
    away leaves the blocks read off their range (the time is the same, the values are not)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    eights: dict[int, str] = {}  # zero points of 8, by size
    for node in all_nodes(proto):
        if node.op_type == "MatMulNBits":
            attributes = {a.name: a for a in node.attribute}
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", level)])
            inputs = list(node.input) + [""] * (4 - len(node.input))
            block = attributes["block_size"].i
            size = _zero_point_bytes(attributes["N"].i, _whole_blocks(attributes["K"].i, block) // block)
            if zero_points and not inputs[3]:
                if size not in eights:
                    eights[size] = f"autoprec_int4_zero_points_8_{size}"
                    proto.graph.initializer.append(numpy_helper.from_array(np.full(size, 0x88, np.uint8), eights[size]))
                inputs[3] = eights[size]
            elif not zero_points:
                inputs[3] = ""
            while inputs and not inputs[-1]:
                inputs.pop()
            del node.input[:]
            node.input.extend(inputs)
    return model.with_proto(proto)


def _matmul_nbits(edit: GraphEdit, node: NodeProto, tensors: list[TensorProto], k: int, n: int,
                  block: int, accuracy_level: int) -> None:
    """``tensors``: the packed values, the scales and (asymmetric) the zero points."""
    inputs = [edit.ins[id(node)][0], *(edit.add_initializer(t) for t in tensors)]
    bias = edit.ins[id(node)][2:3] if node.op_type == "Gemm" else []
    if bias and bias[0]:  # (zero points or none: symmetric; no g_idx)
        inputs += [""] * (5 - len(inputs)) + [bias[0]]
    edit.retype(node, "MatMulNBits", "com.microsoft", inputs,
                dict(K=k, N=n, bits=4, block_size=block, accuracy_level=accuracy_level))


def _dequantized(edit: GraphEdit, node: NodeProto, packed: TensorProto, scales: TensorProto,
                 name: str, block: int) -> None:
    edit.add("DequantizeLinear", f"{name}_dequantize",
             [edit.add_initializer(packed), edit.add_initializer(scales)],
             [f"{name}_dq"], axis=0, block_size=block)
    inputs = [edit.ins[id(node)][0], f"{name}_dq", *edit.ins[id(node)][2:3]]
    # a Gemm's weight now [K, N]: no transposes left
    edit.retype(node, node.op_type, "", inputs, {})


def _as_int4(tensor: TensorProto, shape: tuple[int, int]) -> TensorProto:
    """The packed bytes (two values a byte, low nibble first: ONNX's INT4 layout) as a [K, N] INT4
    tensor."""
    typed = _reshaped(tensor, shape)
    typed.data_type = TensorProto.INT4
    return typed


def _reshaped(tensor: TensorProto, shape: tuple[int, int]) -> TensorProto:
    """``tensor``'s bytes read as ``shape`` (a copy of its proto; its data where it was)."""
    typed = TensorProto()
    typed.CopyFrom(tensor)
    del typed.dims[:]
    typed.dims.extend(shape)
    return typed


def opset_needed(form: Int4Form) -> tuple[str, int]:
    """The opset import a lowering with INT4 units needs (a domain and its least version)."""
    return ("com.microsoft", 1) if form is Int4Form.MATMUL_NBITS else ("", DEQUANTIZE_OPSET)


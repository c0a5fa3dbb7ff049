"""How this CPU's ONNX Runtime sums INT8 products: exactly in int32 (VNNI, AMX, Arm's dot products), or in int16
pairs first (x86 without VNNI: ``vpmaddubsw``), which saturate where both products of a pair are large — ONNX
Runtime's quantization docs say so. It moves a quantized model's accuracy far beyond a kernel's rounding (one
Conv's INT8 loss 6.7e-8 summed in int32, 1.31e-5 in int16 pairs): an INT8 loss holds for CPUs that sum as the one
that judged it. Read by running it, not by CPU flags: a Q/DQ MatMul and a Q/DQ Conv, each summing 64 products of
255 and 127, which int16 pairs cannot hold."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXACT = "int32"
PAIRS = "int16-pairs"
SAID = {EXACT: "sums INT8 products in int32 (VNNI, AMX, Arm)",
        PAIRS: "sums INT8 products in int16 pairs, which saturate (x86 without VNNI)"}

_PRODUCTS = 64
_SCALE = float(_PRODUCTS * 255 * 127 // 200)  # the output's step: room for the exact sum in uint8


def _unit(op: str, x: str, y: str) -> list[onnx.NodeProto]:
    """``op`` as ONNX Runtime's CPU provider runs it in integers: activations and output quantized, weights int8."""
    return [helper.make_node("QuantizeLinear", [x, "one", "u0"], [f"{y}_xq"]),
            helper.make_node("DequantizeLinear", [f"{y}_xq", "one", "u0"], [f"{y}_xd"]),
            helper.make_node("DequantizeLinear", [f"{y}_w", "one", "s0"], [f"{y}_wd"]),
            helper.make_node(op, [f"{y}_xd", f"{y}_wd"], [f"{y}_f"]),
            helper.make_node("QuantizeLinear", [f"{y}_f", "scale", "u0"], [f"{y}_q"]),
            helper.make_node("DequantizeLinear", [f"{y}_q", "scale", "u0"], [y])]


def _probe() -> onnx.ModelProto:
    weights = {"mm_w": (_PRODUCTS, 4), "conv_w": (4, _PRODUCTS, 1, 1)}
    constants = {"one": np.array(1.0, np.float32), "scale": np.array(_SCALE, np.float32),
                 "u0": np.array(0, np.uint8), "s0": np.array(0, np.int8),
                 **{name: np.full(shape, 127, np.int8) for name, shape in weights.items()}}
    graph = helper.make_graph(
        _unit("MatMul", "x", "mm") + _unit("Conv", "image", "conv"), "int8_sums",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, _PRODUCTS]),
         helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, _PRODUCTS, 2, 2])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in ("mm", "conv")],
        [numpy_helper.from_array(value, name) for name, value in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@lru_cache(maxsize=1)
def int8_sums() -> str:
    """:data:`EXACT` or :data:`PAIRS` for this CPU (see the module docstring)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(_probe().SerializeToString(), options, providers=["CPUExecutionProvider"])
    outputs = session.run(None, {"x": np.full((1, _PRODUCTS), 255, np.float32),
                                 "image": np.full((1, _PRODUCTS, 2, 2), 255, np.float32)})
    exact = round(_PRODUCTS * 255 * 127 / _SCALE) * _SCALE
    return EXACT if all(np.allclose(out, exact) for out in outputs) else PAIRS

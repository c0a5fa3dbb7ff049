"""AMD Quark's ONNX post-training quantization, as a peer's INT8 Q/DQ form for benchmarks/qdq_forms.py.

Runs in a venv of its own (Quark needs torch and caps onnx below autoprec's): activations uint8 asymmetric
per tensor, weights int8 symmetric per channel, MinMax calibration, QDQ format (Quark 0.13's U8S8_AAWS
preset with MinMax and per-channel weights), only the given op types; no equalization, smoothing, rounding
search or mixed precision (``algo_config=[]``). Quark's own defaults stay on: its float-graph clean-up
(onnxslim, ONNX Runtime's basic optimisation, BatchNorm folding), int32 biases, Relu/Clip folded into the Q.

    python quark_quantize.py SRC.onnx CALIB.npz OUT.onnx [--ops Conv,MatMul,Gemm]

CALIB.npz: one array per model input, its first axis the calibration batches (each fed as it is).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader
from quark.onnx import (
    CalibMethod,
    Int8Spec,
    ModelQuantizer,
    QConfig,
    QLayerConfig,
    QuantGranularity,
    ScaleType,
    UInt8Spec,
)


class NpzReader(CalibrationDataReader):
    def __init__(self, path: str, model: onnx.ModelProto):
        data = np.load(path)
        weights = {i.name for i in model.graph.initializer}
        inputs = [i for i in model.graph.input if i.name not in weights]
        self.items = [{i.name: data[i.name][n].astype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
                       for i in inputs} for n in range(len(data[inputs[0].name]))]
        self.position = 0

    def get_next(self):
        self.position += 1
        return self.items[self.position - 1] if self.position <= len(self.items) else None

    def rewind(self):
        self.position = 0


def config(ops: list[str], opset: int) -> QConfig:
    activation = UInt8Spec(symmetric=False, scale_type=ScaleType.Float32, calibration_method=CalibMethod.MinMax,
                           quant_granularity=QuantGranularity.Tensor)
    weight = Int8Spec(symmetric=True, scale_type=ScaleType.Float32, calibration_method=CalibMethod.MinMax,
                      quant_granularity=QuantGranularity.Channel)
    extra = {"OpTypesToQuantize": ops, "ExtraOpTypesToQuantize": [], "QuantizeAllOpTypes": False,
             "ForceQuantizeNoInputCheck": True, "EnableNPUCnn": False, "ExecutionProviders": ["CPUExecutionProvider"],
             "UseMatMulNBits": False, "Int16Bias": False, "ConvertNCHWToNHWC": False, "ConvertFP16ToFP32": False}
    if opset < 13:  # per-channel Q/DQ needs opset 13: Quark converts the float model first
        extra["ConvertOpsetVersion"] = 13
    return QConfig(global_config=QLayerConfig(input_tensors=activation, weight=weight), algo_config=[],
                   specific_layer_config=None, layer_type_config=None, exclude=[], extra_options=extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("calibration")
    parser.add_argument("output")
    parser.add_argument("--ops", default="Conv,MatMul,Gemm")
    args = parser.parse_args()
    model = onnx.load(args.source, load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    ModelQuantizer(config(args.ops.split(","), opset)).quantize_model(
        args.source, args.output, calibration_data_reader=NpzReader(args.calibration, model))


if __name__ == "__main__":
    main()

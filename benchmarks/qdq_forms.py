"""Why INT8 lowering is engine-specific: the same plan in both Q/DQ forms, timed side by side.

For each model, on ONNX Runtime's CPU provider: FP32, all-FP16 (Cast form), all-INT8 in
TensorRT's Q/DQ form (signed, inputs only) and in ORT's form (uint8, whole node units).
Variants are timed in interleaved rounds (this machine is shared and noisy); the table shows the
median over rounds of each round's median, and the ratio to FP32 from the same rounds.

    python benchmarks/qdq_forms.py [--rounds 5] [--json benchmarks/results/qdq_forms.json]
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from autoprec.analysis.calibrate import calibrate
from autoprec.analysis.data import build_dataset, item_shapes
from autoprec.analysis.model import analyse, declared_inputs, load_onnx
from autoprec.analysis.reference import reference_outputs
from autoprec.backends import get_backend
from autoprec.core import atomic
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.accuracy import compare

REPO = Path(__file__).resolve().parents[1]


def conv_stack(path: Path) -> Path:
    """6 × (Conv 3×3 64→64, Relu) on 4×64×56×56, as in shared/onnxruntime/README.md."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(6):
        inits += [numpy_helper.from_array(rng.normal(0, 0.05, (64, 64, 3, 3)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.05, 64).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], f"relu{i}")]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64, 56, 56])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, 64, 56, 56])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def bench_model(name: str, path: Path, data: Path | None, rounds: int) -> dict:
    raw = load_onnx(path)
    info = analyse(path, load_search_space(), data_shapes=item_shapes(data, declared_inputs(raw)), model=raw)
    dataset = build_dataset(data, info.inputs, random_count=4)
    ranges = calibrate(info, dataset.calibration, dataset.fingerprint())
    reference = reference_outputs(info, dataset.evaluation, dataset.fingerprint())
    backend = get_backend("ort-cpu")
    # every unit that may take the precision at it (a sensitive op such as Softmax takes no INT8), the rest FP32
    variants = {
        "fp32": lower_plan(info, info.plan_at(Precision.FP32), ranges),
        "fp16 (Cast)": lower_plan(info, info.plan_at(Precision.FP16), ranges),
        "int8 tensorrt form": lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.TENSORRT),
        "int8 ort-cpu form": lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.ORT_CPU),
    }
    runners = {k: backend.prepare(m) for k, m in variants.items()}
    cosines = {k: min(m["cosine"] for m in compare(reference, [r.run(b) for b in dataset.evaluation]).values())
               for k, r in runners.items()}
    medians = {k: [] for k in variants}
    for _ in range(rounds):
        for k, runner in runners.items():
            medians[k].append(runner.time(dataset.evaluation[0]).median_ms)
    ratios = {k: float(np.median(np.array(medians["fp32"]) / np.array(v))) for k, v in medians.items()}
    return {
        "model": name,
        "input_shapes": {i.name: list(i.shape) for i in info.inputs},
        "units": len(info.units),
        "data": dataset.source,
        "variants": {k: {"median_ms": float(np.median(v)), "round_medians_ms": v, "speedup_vs_fp32": ratios[k],
                         "min_output_cosine": cosines[k]} for k, v in medians.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "qdq_forms.json")
    args = parser.parse_args(argv)
    tmp = Path(args.json).parent
    tmp.mkdir(parents=True, exist_ok=True)
    stack = conv_stack(tmp / ".conv_stack.onnx")
    try:
        models = [
            bench_model("ppocr_cls (bundled, real text lines)", REPO / "datasets/ppocr_cls/model.onnx",
                        REPO / "datasets/ppocr_cls/textlines.npz", args.rounds),
            bench_model("conv stack 6×(Conv3×3 64→64+Relu), random data", stack, None, args.rounds),
        ]
    finally:
        stack.unlink(missing_ok=True)
    engine = get_backend("ort-cpu").info()
    report = {"engine": engine.to_json(), "python": platform.python_version(), "onnx": onnx.__version__,
              "onnxruntime": ort.__version__, "rounds": args.rounds,
              "timing": "per variant per round: median of >=10 runs and >=0.2 s after 3 warm-up runs", "models": models}
    atomic.write_json(args.json, report)
    print(f"engine: {engine.label()}; {args.rounds} interleaved rounds; JSON: {args.json}")
    print(f"{'model':<52} {'variant':<20} {'median ms':>10} {'vs fp32':>8} {'cosine':>9}")
    for m in models:
        for k, v in m["variants"].items():
            print(
                f"{m['model']:<52} {k:<20} {v['median_ms']:>10.3f} {v['speedup_vs_fp32']:>7.2f}× {v['min_output_cosine']:>9.5f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""INT8 Q/DQ forms side by side: the same all-INT8 assignment lowered by autoprec and by peer quantizers.

For each model, on ONNX Runtime's CPU provider, every unit that may take INT8 (Conv, MatMul, Gemm, …; a
sensitive op such as Softmax takes none) in INT8, the rest FP32, as:

- ``autoprec ort-cpu form``: what a search measures on this engine (whole node units, uint8 activations);
- ``autoprec tensorrt form``: the TensorRT export's form (inputs only, signed), which ORT runs as float;
- ``ort quantize_static``: ONNX Runtime's own tool on autoprec's prepared FP32 model (QDQ, U8S8, per-channel
  weights, MinMax, op types Conv/MatMul/Gemm): the same graph, its placement of Q/DQ;
- ``quark``: AMD Quark 0.13 on the given model (benchmarks/quark_quantize.py in Quark's own venv, named by
  --quark-python; U8S8 per-channel, MinMax, Conv/MatMul/Gemm, its own float clean-up before);
- with ``--search-budget N``, ``autoprec search --max-loss 1.0``: what a search of that budget ships
  (best/model.onnx, the fastest plan it measured, on the deployable graph).

A peer that fails on a model (an If subgraph it cannot take) is listed as failed, with its error.

Beside them, ``autoprec all-fp32 (ort-cpu form)``: the all-FP32 plan as the CPU form writes it (what a search's
speed-ups are against). Each is timed in interleaved rounds (this machine is shared and noisy) against the
prepared FP32 model (``fp32``, as ONNX Runtime optimises it by default):
median over rounds of each round's median, the speed-up the median of the per-round ratios, with its
range. ``kernels``: the op types of ONNX Runtime's optimised graph (which integer kernels it chose).
All calibrate on the same batches (autoprec's calibration split).

    python -m benchmarks qdq_forms [--models magika,ppocr-cls,...] [--model NAME=MODEL.onnx[:DATA.npz]]
                                   [--quark-python /path/to/venv/bin/python] [--search-budget N] [--rounds 12]
                                   [--variant NAME:LABEL=FILE.onnx ...] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from _harness import TINY, Report, model_sources, parse_arguments, run_models, time_interleaved
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

import autoprec
from autoprec.analysis.baseline import load_baseline
from autoprec.app.resolve import engine_space, resolve_model
from autoprec.backends import get_backend
from autoprec.core import stored
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.accuracy import compare

REPO = Path(__file__).resolve().parents[1]
ZOO = ("magika", "ppocr-cls", "ppocr-rec", "ppocr-det", "yolov8n", "picodet-layout", "silero-vad", "minilm")
PEER_OPS = ("Conv", "MatMul", "Gemm")
SEARCHED = "autoprec search --max-loss 1.0"
QUICK = {"models": TINY, "rounds": 2}


class Batches(CalibrationDataReader):
    def __init__(self, batches):
        self.batches = iter(batches)

    def get_next(self):
        return next(self.batches, None)


def kernels(path: Path) -> dict[str, int]:
    """The op types ONNX Runtime's optimised graph runs (QLinearConv, QLinearAdd, float Conv, ...)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(path.with_suffix(".optimized.onnx"))
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


def min_cosine(reference, outputs) -> float | None:
    """The least cosine of any output to FP32's; None where an output's shape differs from FP32's (a decoded
    sequence of another length: cosine says nothing there)."""
    if any(r[k].shape != o[k].shape for r, o in zip(reference, outputs) for k in r):
        return None
    return min(m["cosine"] for m in compare(reference, outputs).values())


def peers(baseline, source: Path, folder: Path, quark_python: str | None) -> dict[str, Path | str]:
    """The peers' INT8 models of the same units (ONNX Runtime's on the prepared graph, Quark's on the given
    one), or the error a peer failed with."""
    fp32 = folder / "fp32.onnx"
    onnx.save(stored.inlined(baseline.info.stored), str(fp32))
    ops = sorted({n.op_type for n in baseline.info.model.graph.node} & set(PEER_OPS))
    made: dict[str, Path | str] = {"ort quantize_static": folder / "ort.onnx"}
    try:
        quantize_static(str(fp32), str(made["ort quantize_static"]), Batches(baseline.dataset.calibration),
                        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=True, op_types_to_quantize=ops, calibrate_method=CalibrationMethod.MinMax)
    except Exception as exc:  # noqa: BLE001 - the peer's own failure, recorded
        made["ort quantize_static"] = f"{type(exc).__name__}: {exc}"
    if quark_python:
        calibration = folder / "calibration.npz"
        batches = baseline.dataset.calibration
        np.savez(calibration, **{k: np.stack([b[k] for b in batches]) for k in batches[0]})
        made["quark"] = folder / "quark.onnx"
        run = subprocess.run([quark_python, str(REPO / "benchmarks" / "quark_quantize.py"), str(source),
                              str(calibration), str(made["quark"]), "--ops", ",".join(ops)],
                             capture_output=True, text=True, cwd=folder)  # Quark writes quantized_info.csv there
        if run.returncode:
            made["quark"] = (run.stderr.strip().splitlines() or ["failed"])[-1]
    return made


def searched(model: str, data: Path | None, baseline, budget: int, folder: Path) -> Path:
    """What ``autoprec search MODEL --max-loss 1.0 --budget N`` ships: the fastest plan it measured, lowered
    onto the deployable graph (best/model.onnx)."""
    shapes = {i.name: tuple(i.shape) for i in baseline.info.inputs}
    autoprec.search(autoprec.SearchConfig(autoprec.InputSpec(model, data=data, shapes=shapes),
                                          judge=autoprec.JudgeSpec(max_loss=1.0),
                                          study=autoprec.StudySpec(budget=budget), out=folder / "search"))
    return folder / "search" / "best" / "model.onnx"


@dataclass(frozen=True)
class Source:
    """A model as the command line named it (a path or zoo:NAME), its file and data, prepared for ort-cpu."""

    given: str
    path: Path
    data: Path | None
    baseline: Any


def bench_model(name: str, source: Source, rounds: int, quark_python: str | None, search_budget: int,
                others: dict[str, Path]) -> dict:
    baseline = source.baseline
    info, ranges = baseline.info, baseline.ranges
    backend = get_backend("ort-cpu")
    int8 = info.plan_at(Precision.INT8)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = {"fp32": info.stored,
                  "autoprec all-fp32 (ort-cpu form)": lower_plan(info, info.plan_at(Precision.FP32), ranges,
                                                                 QDQForm.ORT_CPU),
                  "autoprec ort-cpu form": lower_plan(info, int8, ranges, QDQForm.ORT_CPU),
                  "autoprec tensorrt form": lower_plan(info, int8, ranges, QDQForm.TENSORRT)}
        if search_budget:
            chosen = searched(source.given, source.data, baseline, search_budget, folder)
            models[SEARCHED] = stored.load(chosen)
        failed = {}
        for peer, made in peers(baseline, source.path, folder, quark_python).items():
            if isinstance(made, str):
                failed[peer] = made
            else:
                models[peer] = stored.load(made)
        models.update({label: stored.load(path) for label, path in others.items()})
        files = {}
        for variant, model in models.items():
            files[variant] = folder / f"{len(files)}.onnx"
            onnx.save(stored.inlined(model), str(files[variant]))
        batch = baseline.dataset.evaluation[0]
        timings = time_interleaved(backend, list(models.values()), batch, rounds)
        outputs = {k: [backend.runner(m).run(b) for b in baseline.dataset.evaluation] for k, m in models.items()}
        graphs = {k: kernels(p) for k, p in files.items()}
    base = np.array([t.median_ms for t in timings[0]])
    variants = {}
    for (variant, model), timing in zip(models.items(), timings):
        if timing is None:
            variants[variant] = {"failed": "did not build or run on ONNX Runtime"}
            continue
        ms = np.array([t.median_ms for t in timing])
        ratio = base / ms
        quantized = collections.Counter(n.op_type for n in model.proto.graph.node)
        variants[variant] = {
            "median_ms": float(np.median(ms)), "round_medians_ms": ms.tolist(),
            "speedup_vs_fp32": float(np.median(ratio)), "speedup_range": [float(ratio.min()), float(ratio.max())],
            "min_output_cosine": min_cosine(baseline.reference, outputs[variant]),
            "q_dq": [quantized["QuantizeLinear"], quantized["DequantizeLinear"]], "kernels": graphs[variant]}
    return {"model": name, "source": str(source.path), "input_shapes": {i.name: list(i.shape) for i in info.inputs},
            "units": len(info.units), "int8_units": sum(p is Precision.INT8 for p in int8.as_dict().values()),
            "data": baseline.dataset.source, "variants": {**variants, **{k: {"failed": e} for k, e in failed.items()}}}


def variant(spec: str) -> tuple[str, str, str]:
    """``NAME:LABEL=FILE.onnx`` as (NAME, LABEL, FILE)."""
    name, _, rest = spec.partition(":")
    label, _, file = rest.partition("=")
    return name, label, file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO), help="zoo models (comma-separated; '' for none)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=MODEL.onnx[:DATA.npz]")
    parser.add_argument("--quark-python", help="the python of a venv with amd-quark (and torch): adds Quark's form")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:LABEL=FILE.onnx",
                        help="also time FILE.onnx (another quantizer's, or another lowering's) beside model NAME")
    parser.add_argument("--search-budget", type=int, default=0, metavar="N",
                        help=f"also time what 'autoprec search --max-loss 1.0 --budget N' ships ({SEARCHED!r})")
    args = parse_arguments(parser, argv, QUICK)
    backend = get_backend("ort-cpu")
    report = Report("qdq_forms", args, backend, rounds=args.rounds, quark=bool(args.quark_python),
                    search_budget=args.search_budget,
                    timing="per variant per round: median of >= 10 runs and >= 0.2 s after 3 warm-up runs, batch of "
                           "one evaluation item; speed-up: median over rounds of FP32's round median / the variant's",
                    models={})
    space, _, _ = engine_space(load_search_space(), backend, None)
    sources = model_sources(args.models, args.model)

    def run(name: str) -> dict:
        model, data = sources[name]
        path, found, shapes, _ = resolve_model(model, data, None)
        source = Source(model, Path(path), data, load_baseline(Path(path), space, found, shapes))
        others = {label: Path(file) for model, label, file in map(variant, args.variant) if model == name}
        return bench_model(name, source, args.rounds, args.quark_python, args.search_budget, others)

    run_models(report, sources, run)
    print(f"engine: {backend.info().label()}; {args.rounds} interleaved rounds; JSON: {report.path}")
    print(f"{'model':<17} {'variant':<32} {'median ms':>10} {'vs fp32':>8} {'range':>13} {'cosine':>9} {'Q/DQ':>9}  int kernels")
    for name, m in report["models"].items():
        for k, v in m["variants"].items():
            if v.get("failed"):
                print(f"{name:<17} {k:<32} failed: {v['failed']}"[:150])
                continue
            cosine = "—" if v["min_output_cosine"] is None else f"{v['min_output_cosine']:.5f}"
            integer = sum(c for op, c in v["kernels"].items() if op.startswith("QLinear") or op in ("QGemm", "MatMulInteger"))
            print(f"{name:<17} {k:<32} {v['median_ms']:>10.3f} {v['speedup_vs_fp32']:>7.2f}× "
                  f"{v['speedup_range'][0]:>6.2f}–{v['speedup_range'][1]:<5.2f} {cosine:>9} "
                  f"{v['q_dq'][0]:>4}/{v['q_dq'][1]:<4}  {integer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

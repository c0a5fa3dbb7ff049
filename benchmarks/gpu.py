"""ONNX Runtime CUDA: FP32, all-FP16 and autoprec's chosen plan, side by side, at batch 1 and 32.

Runs where there is an NVIDIA GPU and onnxruntime-gpu (gpu_payload.sh brings the zoo models to a
machine that reaches no registry).
Per zoo model and batch size:

1. a real ``autoprec.search`` on ``--backend ort-cuda`` (budget 50, ``--max-loss 0.01``, loss =
   1 - cosine against the FP32 model's outputs computed on the CPU, INT8 left out as the backend
   declares);
2. the all-FP32 plan, the all-FP16 plan and the chosen plan built once each and timed in
   interleaved rounds (IO binding, warm-up, median of >= 10 runs and >= 0.2 s per round): the
   ratios to FP32 come from the same rounds;
3. a fresh evaluation of the written ``best/model.onnx`` (new session) against the FP32 reference,
   to check the loss the search reported.

Batch 32 inputs are the zoo's real samples and their mirror images (flips and, for square images,
transposes), cycled to 64 items: 32 to calibrate (unused by FP16) and 32 to evaluate. Token
inputs are repeated. Batch 1 uses the zoo's samples as they are.

    python -m benchmarks gpu [--models ppocr-det ...] [--batches 1 32] [--budget 50] [--json OUT]
    python -m benchmarks gpu --quick      # on the CPU (ort-cpu): the same comparison, to try it
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import (  # noqa: E402
    QUICK_RETIME,
    TINY,
    Report,
    add_retime_argument,
    parse_arguments,
    resolve,
    time_interleaved,
)

import autoprec  # noqa: E402
from autoprec.analysis.baseline import load_baseline  # noqa: E402
from autoprec.analysis.model import load_onnx  # noqa: E402
from autoprec.analysis.shapes import batch_axes, declared_inputs  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.core import stored  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402
from autoprec.core.search_space import load_search_space  # noqa: E402
from autoprec.measure.accuracy import compare, loss_from_metrics  # noqa: E402
from autoprec.results.files import load_json, read_result_dir  # noqa: E402

MODELS = ("ppocr-det", "ppocr-rec", "yolov8n", "minilm")
MAX_LOSS = 0.01
QUICK = {"models": [TINY], "batches": [1], "budget": 3, "backend": "ort-cpu", "rounds": 2,
         "retime_seconds": QUICK_RETIME}


def mirrored_items(data: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """``count`` items: the samples, then their mirror images (images only), cycling when those run out."""
    def variants(x: np.ndarray) -> list[np.ndarray]:
        if x.ndim != 4:  # tokens, features: no symmetry to use
            return [x]
        flips = [x, x[..., ::-1], x[..., ::-1, :], x[..., ::-1, ::-1]]
        return flips + [np.swapaxes(f, -1, -2) for f in flips] if x.shape[-1] == x.shape[-2] else flips

    per_input = {name: variants(x) for name, x in data.items()}
    out = {}
    for name, groups in per_input.items():
        pool = np.concatenate([np.ascontiguousarray(g) for g in groups])
        out[name] = pool[np.arange(count) % len(pool)]
    return out


def batch_data(name: str, batch: int, folder: Path) -> tuple[Path, Path, dict[str, list[int]]]:
    """The zoo model, its sample data for ``batch``, and the input shapes."""
    model_path, data_path, shapes, _ = resolve(name)
    declared = {i.name: i.shape for i in declared_inputs(load_onnx(model_path))}
    axes = dict(zip(declared, batch_axes(list(declared.values()))))  # a state [2, batch, 128] batches along axis 1
    shapes = {k: [batch if i == axes.get(k) else d for i, d in enumerate(v)] for k, v in shapes.items()}
    if batch == 1:
        return model_path, Path(data_path), shapes
    with np.load(data_path) as loaded:
        items = mirrored_items({k: loaded[k] for k in loaded.files}, 2 * batch)
    path = folder / f"{name}-b{batch}.npz"
    np.savez(path, **items)
    return model_path, path, shapes


def searched(name: str, batch: int, budget: int, backend: str, device: int, tmp: Path, retime_seconds: float = 20.0):
    """``autoprec search`` of a zoo model at ``batch`` (max loss MAX_LOSS), its wall seconds, and the model
    prepared again as that search prepared it (same space, data, shapes and cache): what its plans lower on."""
    model_path, data, shapes = batch_data(name, batch, tmp)
    out = tmp / f"{name}-b{batch}"
    t0 = time.monotonic()
    result = autoprec.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model_path, data=data, shapes=shapes),
            engine=autoprec.EngineSpec(backend=backend, device=device),
            judge=autoprec.JudgeSpec(max_loss=MAX_LOSS),
            study=autoprec.StudySpec(budget=budget),
            out=out,
            retime_seconds=retime_seconds,
        )
    )
    wall = time.monotonic() - t0
    space = load_search_space().restricted([Precision(p) for p in result.search["precisions"]])
    return result, wall, load_baseline(model_path, space, data, shapes, cache=out / "cache"), out, shapes


def run_one(name: str, batch: int, args: argparse.Namespace, tmp: Path) -> dict:
    backend, device = args.backend, args.device
    result, search_wall, baseline, out, shapes = searched(name, batch, args.budget, backend, device, tmp,
                                                          args.retime_seconds)
    files = read_result_dir(out)
    uniform = result.uniform()
    chosen = result.chosen
    if chosen is None or "fp32" not in uniform or "fp16" not in uniform:
        return {
            "error": f"no chosen plan or no uniform FP32/FP16 trial; see {out} (trials.json)",
            "search_wall_s": search_wall,
        }
    engine = get_backend(backend, device)
    plans = {"fp32": uniform["fp32"].plan, "fp16": uniform["fp16"].plan, "chosen": chosen.plan}
    evaluation = baseline.dataset.evaluation
    models = [engine.lower(baseline.info, p, baseline.ranges) for p in plans.values()]
    timings = dict(zip(plans, time_interleaved(engine, models, evaluation[0], args.rounds)))
    medians = {k: [t.median_ms for t in v] for k, v in timings.items()}
    spreads = {k: [t.p90_ms - t.p10_ms for t in v] for k, v in timings.items()}
    with engine.runner(stored.load(out / "best" / "model.onnx")) as fresh:  # what the user deploys, evaluated anew
        fresh_loss = loss_from_metrics(compare(baseline.reference, [fresh.run(b) for b in evaluation]), "cosine")
    ms = {k: statistics.median(v) for k, v in medians.items()}
    return {
        "input_shapes": shapes,
        "fp32_ms": ms["fp32"], "fp16_ms": ms["fp16"], "chosen_ms": ms["chosen"],
        "fp16_speedup": ms["fp32"] / ms["fp16"], "chosen_speedup": ms["fp32"] / ms["chosen"],
        "rounds_ms": medians,
        "spread_ms": {k: statistics.median(v) for k, v in spreads.items()},
        "fp32_loss": uniform["fp32"].loss, "fp16_loss": uniform["fp16"].loss, "chosen_loss": chosen.loss,
        "chosen_loss_fresh": fresh_loss,
        "chosen_counts": chosen.plan.counts(), "chosen_trial": chosen.number,
        "chosen_is_fp32": chosen.plan.counts()["fp32"] == len(chosen.plan.precisions),
        "chosen_within_limit": chosen.loss <= MAX_LOSS,
        "chosen_faster_than_fp32_beyond_spread": max(medians["chosen"]) < min(medians["fp32"]),
        "fp16_within_limit": uniform["fp16"].loss <= MAX_LOSS,
        "chosen_at_least_as_fast_as_fp16": ms["chosen"] <= ms["fp16"] * 1.02,
        "search_wall_s": round(search_wall, 1), "trials": len(files.trials.trials),
        "front_size": len(result.front), "precisions_searched": result.search["precisions"],
    }


def fmt_loss(x: float | str) -> str:
    return "inf" if not math.isfinite(float(x)) else f"{float(x):.2e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 32])
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of FP32, all-FP16 and the chosen plan")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument(
        "--backend", default="ort-cuda", help="ort-cpu runs the same comparison on the CPU (to try the script)"
    )
    add_retime_argument(parser)
    args = parse_arguments(parser, argv, QUICK)
    engine = get_backend(args.backend, args.device)
    info = engine.info()
    report = Report(
        "gpu", args, engine,
        device=info.device, driver=info.versions.get("driver"), onnxruntime=info.version,
        budget=args.budget, max_loss=MAX_LOSS, metric="1 - cosine vs FP32 on the CPU provider",
        timing=f"IO binding; per plan {args.rounds} interleaved rounds, each the median of >= 10 runs and >= 0.2 s "
               "after 3 warm-ups; *_ms = median of the round medians; spread_ms = median p90-p10",
        models={},
    )
    if report.path.exists():  # runs split over several calls add to one file
        previous = load_json(report.path)
        if previous.get("device") == report["device"]:
            report["models"] = previous.get("models", {})
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for batch in args.batches:
                print(f"[{name} batch {batch}] …", file=sys.stderr, flush=True)
                report["models"].setdefault(name, {})[str(batch)] = run_one(name, batch, args, Path(tmp))
                report.write()
    print(f"\nONNX Runtime {info.version} {info.provider} on {info.device}, driver {info.versions.get('driver')}; "
          f"budget {args.budget}, max loss {MAX_LOSS}; JSON: {report.path}")
    print(f"{'model':<10} {'batch':>5} {'fp32 ms':>8} {'fp16 ms':>8} {'chosen':>8} {'fp16 x':>7} {'chosen x':>8} "
          f"{'fp16 loss':>9} {'chosen loss':>11} {'fresh':>9} {'int8/fp16/fp32':>14} {'search s':>8}")
    for name, batches in report["models"].items():
        for batch, r in batches.items():
            if "error" in r:
                print(f"{name:<10} {batch:>5} {r['error']}")
                continue
            c = r["chosen_counts"]
            print(f"{name:<10} {batch:>5} {r['fp32_ms']:>8.3f} {r['fp16_ms']:>8.3f} {r['chosen_ms']:>8.3f} "
                  f"{r['fp16_speedup']:>6.2f}× {r['chosen_speedup']:>7.2f}× {fmt_loss(r['fp16_loss']):>9} "
                  f"{fmt_loss(r['chosen_loss']):>11} {fmt_loss(r['chosen_loss_fresh']):>9} "
                  f"{c['int8']:>4}/{c['fp16']}/{c['fp32']:<4} {r['search_wall_s']:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

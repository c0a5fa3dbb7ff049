"""FP16 regions against FP16 islands: the same all-FP16 plan lowered both ways, timed side by side.

Islands (autoprec before regions, and still its ort-cpu lowering) cast every unit's inputs to FP16
and its output back, so every reshape, add or pooling between two FP16 units runs in FP32 and
pays two conversions. Regions (the TensorRT-form lowering, used by ort-cuda and TensorRT) let such
precision-neutral ops run in FP16 with their neighbours: Casts only at the region's borders.

Per zoo model and batch: the all-FP32 plan, the all-FP16 plan as islands and as regions, built once
each on the engine and timed in interleaved rounds (ratios from the same rounds); Casts counted in
each graph; loss = 1 - cosine of each output against the FP32 model's, on the CPU reference
executor and on the engine, mean over the evaluation batches.

    python -m benchmarks fp16_regions [--backend ort-cuda] [--models ppocr-rec ...] [--batches 1 32]
                                      [--rounds 8] [--json OUT]
    python -m benchmarks fp16_regions --quick      # on the CPU (ort-cpu), to try it
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import TINY, Report, parse_arguments, resolve, time_interleaved  # noqa: E402
from gpu import mirrored_items  # noqa: E402

from autoprec.analysis.data import build_dataset  # noqa: E402
from autoprec.analysis.model import analyse  # noqa: E402
from autoprec.analysis.reference import reference_outputs  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402
from autoprec.core.search_space import load_search_space  # noqa: E402
from autoprec.lower import QDQForm, lower_plan  # noqa: E402
from autoprec.measure.accuracy import output_metrics  # noqa: E402

MODELS = ("ppocr-det", "ppocr-rec", "ppocr-cls", "yolov8n", "magika")
QUICK = {"backend": "ort-cpu", "models": [TINY], "batches": [1], "rounds": 2}


def _loss(backend, model, batches, reference) -> float:
    with backend.runner(model) as runner:
        outputs = [runner.run(b) for b in batches]
    losses = [1 - output_metrics(r[name], o[name])["cosine"] for r, o in zip(reference, outputs) for name in r
              if r[name].dtype.kind == "f"]
    return float(np.mean(losses))


def measure_model(name: str, batch: int, backend, cpu, rounds: int) -> dict:
    path, data, shapes, _ = resolve(name)
    shapes = {k: (batch, *v[1:]) for k, v in shapes.items()}
    info = analyse(path, load_search_space(), shapes)
    with np.load(data) as npz:
        items = mirrored_items({i.name: npz[i.name] for i in info.inputs}, 2 * batch) if batch > 1 else \
            {i.name: npz[i.name] for i in info.inputs}
    with tempfile.TemporaryDirectory() as folder:
        np.savez(Path(folder) / "items.npz", **items)
        dataset = build_dataset(Path(folder) / "items.npz", info.inputs)
    batches = list(dataset.evaluation)
    reference = reference_outputs(info, batches, dataset.fingerprint())
    plan = info.plan_at(Precision.FP16)
    models = {
        "fp32": info.stored,
        "fp16_islands": lower_plan(info, plan, None, QDQForm.ORT_CPU),  # no INT8 in the plan: the pre-region lowering
        "fp16_regions": lower_plan(info, plan, None, QDQForm.TENSORRT),
    }
    timings = time_interleaved(backend, list(models.values()), batches[0], rounds)
    row = {"units": len(info.units), "fp16_units": sum(Precision.FP16 in u.allowed for u in info.units), "plans": {}}
    for (label, model), rounds_of in zip(models.items(), timings):
        medians = [t.median_ms for t in rounds_of] if rounds_of else []
        row["plans"][label] = {
            "ms": statistics.median(medians) if medians else None, "rounds_ms": medians,
            "casts": sum(n.op_type == "Cast" for n in model.graph.node),
            "loss_engine": _loss(backend, model, batches, reference),
            "loss_cpu_reference": _loss(cpu, model, batches, reference),
        }
    fp32 = row["plans"]["fp32"]["rounds_ms"]
    for label in ("fp16_islands", "fp16_regions"):
        own = row["plans"][label]["rounds_ms"]
        row["plans"][label]["speedup_per_round"] = [a / b for a, b in zip(fp32, own)] if own and fp32 else []
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ort-cuda")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[32])
    parser.add_argument("--rounds", type=int, default=8)
    args = parse_arguments(parser, argv, QUICK)
    backend, cpu = get_backend(args.backend), get_backend("ort-cpu")
    result = Report("fp16_regions_gpu", args, backend, rounds=args.rounds, models={})
    print(f"engine: {backend.info().label()}; {args.rounds} interleaved rounds; ms = median of the round medians")
    print(f"{'model':<10} {'batch':>5} {'fp32 ms':>8} {'islands':>8} {'regions':>8} {'isl ×':>6} {'reg ×':>6} "
          f"{'casts i/r':>9} {'loss isl':>9} {'loss reg':>9}")
    for name in args.models:
        for batch in args.batches:
            row = measure_model(name, batch, backend, cpu, args.rounds)
            result["models"].setdefault(name, {})[str(batch)] = row
            p = row["plans"]
            speed = {
                k: p["fp32"]["ms"] / p[k]["ms"] if p[k]["ms"] else float("nan")
                for k in ("fp16_islands", "fp16_regions")
            }
            print(
                f"{name:<10} {batch:>5} {p['fp32']['ms']:>8.3f} {p['fp16_islands']['ms']:>8.3f} {p['fp16_regions']['ms']:>8.3f} "
                f"{speed['fp16_islands']:>6.2f} {speed['fp16_regions']:>6.2f} "
                f"{p['fp16_islands']['casts']:>4}/{p['fp16_regions']['casts']:<4} "
                f"{p['fp16_islands']['loss_engine']:>9.2e} {p['fp16_regions']['loss_engine']:>9.2e}"
            )
    print(f"wrote {result.write()}")
    return 0


if __name__ == "__main__":
    main()

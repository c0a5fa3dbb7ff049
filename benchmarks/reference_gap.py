"""The reference executor against the target engine: loss gap and latency-model error, on a GPU.

Per zoo model at one batch size, ``autoprec search --backend ort-cuda --proposals K``: every plan
built on the target was first judged by the reference executor (ONNX Runtime CPU running the same
TensorRT-form graph) and its latency predicted by the latency model. Reported per model: the
target's and the reference's loss for each built proposal and their gap, the predicted and measured
latency and the model's median absolute error, and the builds and reference evaluations spent.

    python -m benchmarks reference_gap [--models ppocr-rec ppocr-cls] [--batch 32] [--budget 12] [--json OUT]
    python -m benchmarks reference_gap --quick      # on the CPU (ort-cpu, its own reference executor), to try it
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _harness import QUICK_RETIME, TINY, Report, add_retime_argument, parse_arguments  # noqa: E402
from gpu import batch_data  # noqa: E402

import autoprec  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402

QUICK = {"models": [TINY], "batch": 1, "budget": 3, "proposals": 2, "backend": "ort-cpu",
         "retime_seconds": QUICK_RETIME}


def run_one(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    batch, budget, proposals = args.batch, args.budget, args.proposals
    model_path, data, shapes = batch_data(name, batch, tmp)
    result = autoprec.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model_path, data=data, shapes=shapes),
            engine=autoprec.EngineSpec(backend=args.backend),
            judge=autoprec.JudgeSpec(max_loss=0.01),
            study=autoprec.StudySpec(budget=budget, proposals=proposals),
            out=tmp / f"{name}-b{batch}",
            retime_seconds=args.retime_seconds,
        )
    )
    search = result.search
    reference = search["reference"]
    return {"input_shapes": shapes, "budget": budget, "engine_builds": search["engine_builds"],
            "engine_builds_by_phase": search["engine_builds_by_phase"],
            "reference_evaluations": search["reference_evaluations"], "executor": reference["executor"],
            "latency_model_error_percent": reference.get("median_abs_error_percent"),
            "loss_gap": reference.get("loss_gap"), "latency_model": reference.get("latency_model"),
            "predictions": reference.get("predictions", []),
            "chosen_ms": result.chosen.latency_ms if result.chosen else None,
            "chosen_loss": result.chosen.loss if result.chosen else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["ppocr-rec", "ppocr-cls"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--budget", type=int, default=12)
    parser.add_argument("--proposals", type=int, default=8)
    parser.add_argument("--backend", default="ort-cuda")
    add_retime_argument(parser)
    args = parse_arguments(parser, argv, QUICK)
    report = Report("reference_gap_gpu", args, get_backend(args.backend), batch=args.batch, proposals=args.proposals,
                    max_loss=0.01, models={})
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            print(f"[{name}] …", file=sys.stderr, flush=True)
            report["models"][name] = run_one(name, args, Path(tmp))
            report.write()
    print(
        f"\nreference executor vs {report['engine']['engine']} {report['engine']['provider']} on {report['engine']['device']}, "
        f"batch {args.batch}, --proposals {args.proposals}; JSON: {report.path}"
    )
    print(
        f"{'model':<10} {'builds':>6} {'ref evals':>9} {'latency err %':>13} {'loss gap median':>16} {'max':>9} {'chosen ms':>9}"
    )
    for name, m in report["models"].items():
        gap = m["loss_gap"] or {}
        print(
            f"{name:<10} {m['engine_builds']:>6} {m['reference_evaluations']:>9} {str(m['latency_model_error_percent']):>13} "
            f"{gap.get('median_abs', float('nan')):>16.2e} {gap.get('max_abs', float('nan')):>9.2e} {m['chosen_ms'] or float('nan'):>9.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

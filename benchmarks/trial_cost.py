"""Where a search's time goes: per-trial split and the one-time costs, as the product runs it.

Per zoo model: a real `autoprec.search` (worker-process isolation on, default settings, budget 20),
then from its result files: each trial's wall time split into lowering (plan -> ONNX, in the worker),
session build, timing, accuracy evaluation (running the evaluation batches and comparing), and other
(sampling, sending the plan to the worker, bookkeeping); the overhead fraction
(lowering + other over the trial's wall time: what is not engine work); and the one-time costs
(analysis, calibration, FP32 reference outputs, worker start). Medians over measured trials
(duplicates excluded). With ``--proposals K`` (default 8: the plans are judged before they are
built, as on TensorRT), also the builds of the target in every phase, the reference evaluations and
the latency model's median absolute error on the plans it chose before they were built.

    python -m benchmarks trial_cost [--models ...] [--budget 20] [--proposals 0] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _harness import (  # noqa: E402
    QUICK_RETIME,
    TINY,
    Report,
    add_retime_argument,
    model_source,
    parse_arguments,
    run_models,
)

import autoprec  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.results.files import read_result_dir  # noqa: E402

MODELS = ("ppocr-cls", "magika", "yolov8n", "ppocr-rec", "minilm", "ppocr-det")
QUICK = {"models": [TINY], "budget": 3, "retime_seconds": QUICK_RETIME}
PARTS = ("lower", "build", "time", "evaluate")


def run_model(name: str, budget: int, proposals: int, retime_seconds: float) -> dict:
    model, data, shapes = model_source(name)
    with tempfile.TemporaryDirectory() as tmp:
        autoprec.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(model, data=data, shapes=shapes),
                study=autoprec.StudySpec(budget=budget, proposals=proposals),
                out=Path(tmp) / name,
                retime_seconds=retime_seconds,
            )
        )
        result = read_result_dir(Path(tmp) / name)
    trials = [t for t in result.trials.to_json()["trials"] if t["duplicate_of"] is None and "trial" in t["seconds"]]
    per_trial = {part: statistics.median(t["seconds"][part] for t in trials) for part in PARTS}
    walls = [t["seconds"]["trial"] for t in trials]
    others = [t["seconds"]["trial"] - sum(t["seconds"][p] for p in PARTS) for t in trials]
    per_trial["other"] = statistics.median(others)
    overhead = [(t["seconds"]["lower"] + o) / t["seconds"]["trial"] for t, o in zip(trials, others)]
    return {
        "trials_measured": len(trials),
        "trial_wall_s_median": round(statistics.median(walls), 4),
        "per_trial_s": {k: round(v, 4) for k, v in per_trial.items()},
        "overhead_fraction": round(statistics.median(overhead), 4),
        "one_time_s": result.facts.to_json()["one_time_seconds"],
        "search_wall_s": result.facts.to_json()["wall_seconds"],
        "engine_builds_by_phase": result.facts.to_json()["engine_builds_by_phase"],
        "reference_evaluations": result.facts.to_json()["reference_evaluations"],
        "latency_model_error_percent": result.facts.to_json()["reference"].get("median_abs_error_percent"),
        "input_shapes": {k: shape for k, (shape, _) in result.model.inputs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--budget", type=int, default=20)
    parser.add_argument("--proposals", type=int, default=8, help="plans judged per build (0: every trial built)")
    add_retime_argument(parser)
    args = parse_arguments(parser, argv, QUICK)
    report = Report("trial_cost", args, get_backend("ort-cpu"), budget=args.budget, proposals=args.proposals,
                    isolation="worker process (the default)", statistic="median over measured trials", models={})
    run_models(report, args.models, lambda name: run_model(name, args.budget, args.proposals, args.retime_seconds))
    print(f"\ntrial cost — {report['engine']['engine']} {report['engine']['version']} on {report['engine']['device']}; "
          f"budget {args.budget}; JSON: {report.path}")
    print(
        f"{'model':<10} {'trial s':>8} {'lower':>7} {'build':>7} {'time':>7} {'eval':>7} {'other':>7} {'overhead':>9} "
        f"{'builds':>7} {'ref evals':>9} {'latency err %':>13}   one-time s"
    )
    for name, m in report["models"].items():
        p = m["per_trial_s"]
        once = ", ".join(f"{k} {v:.2f}" for k, v in m["one_time_s"].items())
        print(f"{name:<10} {m['trial_wall_s_median']:>8.3f} {p['lower']:>7.3f} {p['build']:>7.3f} {p['time']:>7.3f} "
              f"{p['evaluate']:>7.3f} {p['other']:>7.3f} {m['overhead_fraction']:>8.1%} "
              f"{sum(m['engine_builds_by_phase'].values()):>7} {m['reference_evaluations']:>9} "
              f"{str(m['latency_model_error_percent']):>13}   {once}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timing noise: the same plans timed again and again in one run, and what it does to rankings.

Per zoo model, the all-FP32 plan and a reduced-precision plan (all-INT8 in ORT-CPU's form, the
one that can be faster here) are prepared once and timed alternately ``--repeats`` times, each
timing being what a trial records (the median of >= 10 runs after warm-up). Reported per plan: the
median over repeats and the spread of the repeats (p10-p90 relative to the median). Then, over
every pair of single timings (one of each plan): how often a single comparison orders the two
plans against the order of their medians (misranking), and how autoprec's rule — call one plan
faster only when its p90 beats the other's p10 (``clearly_faster``) — decides: right,
wrong, or "within noise". The front's final re-timing is the subject of the search-efficiency issue.

    python -m benchmarks timing_noise [--models ...] [--repeats 20] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import TINY, Report, parse_arguments, prepare_zoo, run_models  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402

MODELS = ("ppocr-cls", "magika", "yolov8n", "ppocr-rec", "minilm", "ppocr-det")
QUICK = {"models": [TINY], "repeats": 2}


def clearly_faster(timing, other) -> bool:
    """The rule this benchmark measured (once autoprec's Timing.clearly_faster_than): even ``timing``'s slow runs
    (p90) beat ``other``'s fast runs (p10)."""
    return timing.p90_ms < other.p10_ms


def run_model(name: str, repeats: int) -> dict:
    baseline, backend = prepare_zoo(name)
    batch = baseline.dataset.evaluation[0]
    # every unit that may take the precision at it (a sensitive op such as Softmax takes no INT8), the rest FP32
    plans = {
        p: backend.lower(baseline.info, baseline.info.plan_at(p), baseline.ranges)
        for p in (Precision.FP32, Precision.INT8)
    }
    runners = {p: backend.runner(m) for p, m in plans.items()}
    timings = {p: [] for p in plans}
    for _ in range(repeats):
        for p, runner in runners.items():  # alternate, so drift hits both plans alike
            timings[p].append(runner.time(batch))
    medians = {p: np.array([t.median_ms for t in ts]) for p, ts in timings.items()}
    truth = float(np.median(medians[Precision.INT8])) < float(np.median(medians[Precision.FP32]))  # int8 faster?
    counts = {"single_timing_misranked": 0, "rule_right": 0, "rule_wrong": 0, "rule_within_noise": 0}
    pairs = list(itertools.product(timings[Precision.FP32], timings[Precision.INT8]))
    for fp32, int8 in pairs:
        if (int8.median_ms < fp32.median_ms) != truth:
            counts["single_timing_misranked"] += 1
        if clearly_faster(int8, fp32) or clearly_faster(fp32, int8):
            counts["rule_right" if clearly_faster(int8, fp32) == truth else "rule_wrong"] += 1
        else:
            counts["rule_within_noise"] += 1
    per_plan = {
        p.value: {
            "median_ms": round(float(np.median(m)), 4),
            "repeat_spread": round(float((np.percentile(m, 90) - np.percentile(m, 10)) / np.median(m)), 4),
            "within_timing_spread_median": round(float(np.median([t.spread for t in timings[p]])), 4),
            "repeats_ms": [round(float(v), 4) for v in m],
        }
        for p, m in medians.items()
    }
    return {
        "input_shapes": {i.name: list(i.shape) for i in baseline.info.inputs},
        "plans": per_plan,
        "int8_faster_by_medians": truth,
        "speed_ratio_fp32_over_int8": round(per_plan["fp32"]["median_ms"] / per_plan["int8"]["median_ms"], 4),
        "pairs": len(pairs),
        "fractions": {k: round(v / len(pairs), 4) for k, v in counts.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parse_arguments(parser, argv, QUICK)
    report = Report("timing_noise", args, get_backend("ort-cpu"), repeats=args.repeats, models={},
                    timing="each repeat: median of >= 10 runs and >= 0.2 s after 3 warm-ups, plans alternated")
    run_models(report, args.models, lambda name: run_model(name, args.repeats))
    print(
        f"\ntiming noise — {report['engine']['engine']} {report['engine']['version']} on {report['engine']['device']}; "
        f"{args.repeats} alternated repeats per plan; JSON: {report.path}"
    )
    print(f"{'model':<10} {'fp32 ms':>9} {'spread':>7} {'int8 ms':>9} {'spread':>7} {'fp32/int8':>9} "
          f"{'single misranked':>17} {'rule right':>11} {'rule wrong':>11} {'within noise':>13}")
    for name, m in report["models"].items():
        f, i, fr = m["plans"]["fp32"], m["plans"]["int8"], m["fractions"]
        print(
            f"{name:<10} {f['median_ms']:>9.3f} {f['repeat_spread']:>6.1%} {i['median_ms']:>9.3f} {i['repeat_spread']:>6.1%} "
            f"{m['speed_ratio_fp32_over_int8']:>9.2f} {fr['single_timing_misranked']:>16.1%} {fr['rule_right']:>10.1%} "
            f"{fr['rule_wrong']:>10.1%} {fr['rule_within_noise']:>12.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How good is the front a search finds in 50 trials? autoprec vs its variants, random search and NSGA-II.

Per zoo model, on ONNX Runtime's CPU provider, in one run:
1. a dense reference: a study of >= 400 trials (exhaustive when the plan space is that small);
2. the sensitivity pass, once per model (its evaluations and seconds are reported: they are spent
   before the budget's trials, accuracy only, on a quarter of the evaluation batches);
3. at the budget (default 50) with 3 seeds each: autoprec's search (uniform plans, then the
   sensitivity warm start, then multivariate TPE; the units of a repeated pattern decided together),
   the same with every unit decided on its own (``--separate-repeats``, where the model has repeated
   patterns: its sensitivity pass is then per unit), the same warm start followed by NSGA-II or by
   Optuna's GP sampler, TPE without the warm start (autoprec before the sensitivity pass), and
   Optuna's RandomSampler and NSGAIISampler (defaults, no seeding).

Objectives are normalised as x = latency / all-FP32 latency and y = min(loss / 0.05, 1)
(loss = 1 − mean cosine vs FP32); hypervolume (``autoprec.study.proposals.front_hypervolume``, as the
proposer scores a front) is taken against (1.5, 1.0) and reported as a fraction of the reference
front's, the reference being the Pareto front of every plan measured in the run. No study uses
--max-loss (the whole front counts). Each distinct plan is measured once per run and shared by all
studies, so methods are not ranked by timing noise.

    python -m benchmarks search_quality              # all zoo models (about 1.5 hours on 2 cores)
    python -m benchmarks search_quality --models ppocr-cls magika --budget 20 --seeds 2 --reference 100
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))
from _harness import (  # noqa: E402
    TINY,
    CachedMeasure,
    Report,
    dense_reference,
    parse_arguments,
    prepare_zoo,
    run_models,
    task_metrics,
    zoo_judge,
)

from autoprec.measure.measurement import accuracy_loss, screening_batches  # noqa: E402
from autoprec.results.rows import decisions  # noqa: E402
from autoprec.study.opening import make_sampler, open_study  # noqa: E402
from autoprec.study.optimize import StudyContext, run_study  # noqa: E402
from autoprec.study.ordered import run_warm_started  # noqa: E402
from autoprec.study.proposals import LOSS_SCALE, REFERENCE_POINT, front_hypervolume  # noqa: E402
from autoprec.study.reading import finished_records  # noqa: E402
from autoprec.study.sensitivity import analyse_sensitivity  # noqa: E402

WITHIN = 0.01  # "best latency within 1 % loss"
MODELS = ("ppocr-cls", "magika", "yolov8n", "ppocr-rec", "minilm", "ppocr-det")
QUICK = {"models": [TINY], "budget": 2, "seeds": 1, "reference": 4}


def _study(sampler: optuna.samplers.BaseSampler, name: str) -> optuna.Study:
    return open_study(optuna.storages.InMemoryStorage(), name, {}, sampler)


def _points(records) -> list[tuple[float, float]]:
    return [(r.latency_ms, r.loss) for r in records if math.isfinite(r.loss)]


def hypervolume_fraction(points, reference_points, fp32_ms: float) -> float:
    return front_hypervolume(points, fp32_ms) / front_hypervolume(reference_points, fp32_ms)


def best_within(points, limit: float = WITHIN) -> float | None:
    feasible = [lat for lat, loss in points if loss <= limit]
    return min(feasible) if feasible else None


def run_model(name: str, budget: int, seeds: int, reference_trials: int) -> dict:
    baseline, backend = prepare_zoo(name)
    info = baseline.info
    judge = zoo_judge(name, baseline)
    measure = CachedMeasure(backend, baseline, judge)
    tied = {True: info, False: info.untied()}  # repeated patterns decided together, or each unit on its own
    def ctx(together=True):
        return StudyContext(tied[together], backend, baseline.ranges, measure, "percentile-99.99", None)

    started = time.monotonic()
    space = math.prod(len(u.allowed) for u in info.searchable_units)
    reference_records, reference_budget = dense_reference(ctx(False), reference_trials, name)  # the whole plan space
    all_points = _points(reference_records)
    fp32_ms = next(r.latency_ms for r in reference_records if r.plan.counts()["fp32"] == len(r.plan.precisions))

    evaluation = baseline.dataset.evaluation
    batches = screening_batches(len(evaluation))
    repeats = len(info.dimensions) < len(info.searchable_units)
    sensitivity = {together: analyse_sensitivity(
        tied[together], backend, baseline.ranges,
        lambda plan: accuracy_loss(backend, backend.lower(info, plan, baseline.ranges), evaluation[:batches], judge),
        evaluation[0], batches,
    ) for together in ((True, False) if repeats else (True,))}
    # method -> (sampler, warm start, repeats decided together): warm-started methods run autoprec's own flow.
    methods = {
        "autoprec": ("tpe", True, True),
        "separate": ("tpe", True, False),
        "warm+nsga2": ("nsga2", True, True),
        "warm+gp": ("gp", True, True),
        "tpe": ("tpe", False, True),
        "random": ("random", None, True),
        "nsga2": ("nsga2", None, True),
    }
    if not gp_available():
        methods.pop("warm+gp")
    if not repeats:
        methods.pop("separate")  # no repeated pattern: the same search as autoprec's
    runs, walls, tasks_at = {}, {}, {}
    for method, (sampler, warm, together) in methods.items():
        runs[method], walls[method], tasks_at[method] = [], [], []
        for seed in range(seeds):
            t0 = time.monotonic()
            study = _study(make_sampler(sampler, seed), f"{name}-{method}-{seed}")
            if warm is None:  # a plain sampler, as Optuna users would run it
                run_study(study, ctx(together), budget)
            else:
                run_warm_started(study, ctx(together), budget, sensitivity[together] if warm else None)
            walls[method].append(round(time.monotonic() - t0, 1))
            records = finished_records(study)
            points = _points(records)
            runs[method].append(points)
            picked = min((r for r in records if r.loss <= WITHIN), key=lambda r: r.latency_ms, default=None)
            tasks_at[method].append(task_metrics(picked.measurement.metrics) if picked else None)
            all_points += points
    results = {}
    for method, per_seed in runs.items():
        results[method] = {
            "hv_fraction": [round(hypervolume_fraction(p, all_points, fp32_ms), 4) for p in per_seed],
            "best_latency_ms_at_1pct": [round(b, 4) if (b := best_within(p)) is not None else None for p in per_seed],
            "task_metrics_at_1pct": tasks_at[method],
            "trials": budget,
            "sampler": methods[method][0],
            "warm_start": bool(methods[method][1]),
            "repeats_together": methods[method][2],
            "wall_seconds": walls[method],
        }
    return {
        "units": len(info.searchable_units),
        "dimensions": len(info.dimensions),
        "plan_space": space,
        "reference_front_trials": reference_budget,
        "reference_exhaustive": space <= reference_trials,
        "fp32_latency_ms": round(fp32_ms, 4),
        "best_latency_ms_at_1pct_reference": best_within(all_points),
        "distinct_plans_measured": measure.measured,
        "wall_seconds": round(time.monotonic() - started, 1),
        "input_shapes": {i.name: list(i.shape) for i in info.inputs},
        "task_metrics_fp32_on_labels": judge.fp32_scores(len(evaluation)),
        "sensitivity": {"evaluations": sensitivity[True].evaluations, "batches": sensitivity[True].batches,
                        "seconds": round(sensitivity[True].seconds, 1),
                        **({"separate_evaluations": sensitivity[False].evaluations,
                            "separate_seconds": round(sensitivity[False].seconds, 1)} if repeats else {})},
        "methods": results,
    }


def gp_available() -> bool:
    try:
        import torch  # noqa: F401 - Optuna's GPSampler needs it
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS), help="zoo models")
    parser.add_argument("--budget", type=int, default=50, help="trials per study")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method")
    parser.add_argument("--reference", type=int, default=400, help="reference study trials")
    args = parse_arguments(parser, argv, QUICK)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from autoprec.backends import get_backend

    report = Report(
        "search_quality", args, get_backend("ort-cpu"),
        budget=args.budget,
        seeds=args.seeds,
        reference_trials=args.reference,
        normalisation={
            "latency": "latency / all-FP32 latency",
            "loss": f"min(loss / {LOSS_SCALE}, 1), loss = 1 - mean cosine",
            "reference_point": list(REFERENCE_POINT),
            "reference_front": "Pareto front of every plan measured in the run",
        },
        timing="one batch; median of >= 10 runs and >= 0.2 s after 3 warm-ups; re-timed if p10-p90 > 25 % of median",
        models={},
    )
    run_models(report, args.models, lambda name: run_model(name, args.budget, args.seeds, args.reference))
    print(
        f"\nsearch quality — {report['engine']['engine']} {report['engine']['version']} {report['engine']['provider']} "
        f"on {report['engine']['device']}; budget {args.budget}, {args.seeds} seeds; JSON: {report.path}"
    )
    print(
        f"{'model':<10} {'ref':>5} {'method':<10} {'HV fraction (per seed)':<28} {'best ms @1% loss (per seed)':<32} {'ref best':>9} {'fp32 ms':>8}"
    )
    for name, m in report["models"].items():
        for method, r in m["methods"].items():
            hv = ", ".join(f"{v:.3f}" for v in r["hv_fraction"])
            best = ", ".join(f"{v:.3f}" if v is not None else "—" for v in r["best_latency_ms_at_1pct"])
            ref_best = m["best_latency_ms_at_1pct_reference"]
            print(f"{name:<10} {m['reference_front_trials']:>5} {method:<10} {hv:<28} {best:<32} "
                  f"{ref_best if ref_best is None else round(ref_best, 3):>9} {m['fp32_latency_ms']:>8.3f}")
    print("\ntask metrics of autoprec's fastest plan within 1 % cosine loss, per seed (FP32 against the labels):")
    for name, m in report["models"].items():
        picks = m["methods"]["autoprec"].get("task_metrics_at_1pct") or []
        print(f"{name:<10} {' | '.join(decisions(p) if p else '—' for p in picks) or '—'}"
              f"  ({decisions(m.get('task_metrics_fp32_on_labels') or {}) or 'no labels'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

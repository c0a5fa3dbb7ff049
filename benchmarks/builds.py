"""How many builds of the target engine does an answer take? autoprec with and without proposals.

Per zoo model, on ONNX Runtime's CPU provider (the only engine that runs here; it is also the
reference executor, so here a "reference evaluation" is an untimed session of the same engine and
the loss gap is zero by construction), at a 1 % loss limit (loss = 1 − mean cosine vs FP32), in one run:

1. the dense reference front of search_quality.py (exhaustive when the plan space is that small);
2. the sensitivity pass once (its profiles are builds: the FP32 model and each all-units plan);
3. per seed, ``autoprec search --proposals K`` (the all-FP32 plan built, the other uniform plans
   built only where the reference executor finds them within the limit, the warm start's and the
   sampler's plans judged on it and the latency model, only the one that decides most built) and
   ``--proposals 0`` (every trial built, as before), each for ``--builds`` builds in all
   (profiles included);
4. the bisection of Polygraphy's ``debug precision`` (peers.py) over the same units.

Builds count every build of the target engine: the sensitivity's profiles and every trial built.
``builds_to_2pct``: builds until the best measured plan within the limit is within 2 % of the
reference front's best; ``hv_at_20_builds``: hypervolume fraction (search_quality.py's) of the
plans measured within 20 builds by the same search without a loss limit (the whole front counts); ``autoprec_at_bisection_count_ms``: autoprec's best within the
limit among its first N builds, N = the bisection's evaluations. Each distinct plan is measured once
per run and shared by all methods, so they are not ranked by timing noise.

    python -m benchmarks builds                  # all zoo models (long)
    python -m benchmarks builds --models ppocr-cls magika --seeds 2 --reference 100
    python -m benchmarks builds --models ppocr-rec --reference 200
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
    zoo_judge,
)
from peers import run_polygraphy_bisect  # noqa: E402
from search_quality import best_within, hypervolume_fraction  # noqa: E402

from autoprec.measure.measurement import accuracy_loss, screening_batches  # noqa: E402
from autoprec.study.opening import make_sampler, open_study  # noqa: E402
from autoprec.study.optimize import StudyContext  # noqa: E402
from autoprec.study.ordered import run_warm_started  # noqa: E402
from autoprec.study.proposals import Proposer  # noqa: E402
from autoprec.study.reading import built_trials, record  # noqa: E402
from autoprec.study.sensitivity import analyse_sensitivity  # noqa: E402
from autoprec.zoo import ENTRIES as ZOO  # noqa: E402

MAX_LOSS = 0.01
WITHIN = 1.02  # "within 2 % of the reference front's best"
HV_BUILDS = 20  # hv_at_20_builds: the hypervolume of the first 20 builds
QUICK = {"models": [TINY], "builds": 5, "proposals": 2, "seeds": 1, "reference": 4}


def run_seed(ctx: StudyContext, sensitivity, builds: int, proposals: int, seed: int, reference_loss) -> dict:
    """One search of ``builds`` builds in all (under ``ctx.max_loss``, or none); the (latency, loss) of
    each trial in build order."""
    storage = optuna.storages.InMemoryStorage()
    study = open_study(storage, f"search-{seed}", {}, make_sampler("tpe", seed))
    proposer = None
    if proposals:
        gains = {u.unit: dict(u.gain) for u in sensitivity.units}
        proposer = Proposer.open(storage, f"search-{seed}", {}, seed, ctx, reference_loss, gains, proposals)
    started = time.monotonic()
    run_warm_started(study, ctx, builds - sensitivity.node_time_builds, sensitivity, propose=proposer)
    trials = sorted(built_trials(study), key=lambda t: t.number)
    points = [(r.latency_ms, r.loss) if (r := record(t)) else (math.inf, math.inf) for t in trials]
    report = proposer.report(study) if proposer else {"median_abs_error_percent": None, "predictions": []}
    return {
        "points": points,
        "wall": round(time.monotonic() - started, 1),
        "reference_evaluations": sensitivity.evaluations + (proposer.evaluated() if proposer else 0),
        "latency_model_error_percent": report["median_abs_error_percent"],
        "predictions": len(report["predictions"]),
    }


def builds_to(points, profiles: int, target_ms: float) -> int | None:
    """Builds (profiles first) until the best plan within the limit is within 2 % of ``target_ms``."""
    for n in range(1, len(points) + 1):
        best = best_within(points[:n], MAX_LOSS)
        if best is not None and best <= WITHIN * target_ms:
            return profiles + n
    return None


def run_model(name: str, builds: int, seeds: int, reference_trials: int, proposals: int) -> dict:
    baseline, backend = prepare_zoo(name)
    info, evaluation = baseline.info, baseline.dataset.evaluation
    judge = zoo_judge(name, baseline)
    measure = CachedMeasure(backend, baseline, judge)
    ctx = lambda limit=MAX_LOSS: StudyContext(info, backend, baseline.ranges, measure, "percentile-99.99", limit)  # noqa: E731
    started = time.monotonic()
    reference_records, reference_size = dense_reference(ctx(), reference_trials, name)
    all_points = [(r.latency_ms, r.loss) for r in reference_records if math.isfinite(r.loss)]
    fp32_ms = next(r.latency_ms for r in reference_records if r.plan.counts()["fp32"] == len(r.plan.precisions))
    batches = screening_batches(len(evaluation))
    sensitivity = analyse_sensitivity(info, backend, baseline.ranges,
                                      lambda plan: accuracy_loss(backend, backend.lower(info, plan, baseline.ranges),
                                                                 evaluation[:batches], judge.for_ranking()),
                                      evaluation[0], batches)
    bisect_model, bisect = run_polygraphy_bisect(baseline, backend, judge)
    bisect_measured = measure.measure_model(bisect_model)
    runs = {f"proposals {proposals}": proposals, "proposals 0": 0}
    per_method = {method: [run_seed(ctx(), sensitivity, builds, k, seed, measure.loss) for seed in range(seeds)]
                  for method, k in runs.items()}
    # the hypervolume counts the whole front (loss up to 5 %), as search_quality.py's: searched without a limit
    hv_builds = min(HV_BUILDS, builds)
    unlimited = {method: [run_seed(ctx(None), sensitivity, hv_builds, k, seed, measure.loss) for seed in range(seeds)]
                 for method, k in runs.items()}
    for seeds_runs in [*per_method.values(), *unlimited.values()]:
        for run in seeds_runs:
            all_points += [p for p in run["points"] if math.isfinite(p[1])]
    ref_best = best_within(all_points, MAX_LOSS)
    at_20 = hv_builds - sensitivity.node_time_builds
    methods = {}
    for method, seeds_runs in per_method.items():
        methods[method] = {
            "builds_to_2pct": [builds_to(r["points"], sensitivity.node_time_builds, ref_best) for r in seeds_runs],
            "hv_at_20_builds": [
                round(hypervolume_fraction(r["points"][:at_20], all_points, fp32_ms), 4) for r in unlimited[method]
            ],
            "best_ms_at_1pct": [round(b, 4) if (b := best_within(r["points"], MAX_LOSS)) else None for r in seeds_runs],
            "autoprec_at_bisection_count_ms": [
                round(b, 4)
                if (b := best_within(r["points"][: max(0, bisect["evaluations"] - sensitivity.node_time_builds)], MAX_LOSS))
                else None
                for r in seeds_runs
            ],
            "reference_evaluations": [r["reference_evaluations"] for r in seeds_runs],
            "latency_model_error_percent": [r["latency_model_error_percent"] for r in seeds_runs],
            "wall_seconds": [r["wall"] for r in seeds_runs],
        }
    chosen = methods[f"proposals {proposals}"]
    return {
        "units": len(info.searchable_units),
        "plan_space": math.prod(len(u.allowed) for u in info.searchable_units),
        "reference_front_trials": reference_size,
        "fp32_ms": round(fp32_ms, 4),
        "reference_best_ms_at_1pct": round(ref_best, 4) if ref_best else None,
        "profiles": sensitivity.node_time_builds,
        "builds_to_2pct": chosen["builds_to_2pct"],
        "hv_at_20_builds": chosen["hv_at_20_builds"],
        "bisection": {"evaluations": bisect["evaluations"], "latency_ms": round(bisect_measured.latency.median_ms, 4),
                      "loss": bisect_measured.loss},
        "autoprec_at_bisection_count_ms": chosen["autoprec_at_bisection_count_ms"],
        "methods": methods,
        "distinct_plans_measured": measure.measured,
        "wall_seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(ZOO), help="zoo models")
    parser.add_argument("--reference", type=int, default=400, help="reference study trials")
    parser.add_argument("--builds", type=int, default=24, help="builds per search, profiles included (default 24)")
    parser.add_argument("--proposals", type=int, default=8, help="plans judged per build (default 8)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method")
    args = parse_arguments(parser, argv, QUICK)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from autoprec.backends import get_backend

    report = Report(
        "builds", args, get_backend("ort-cpu"),
        budget=args.builds,
        seeds=args.seeds,
        reference_trials=args.reference,
        max_loss=MAX_LOSS,
        proposals=args.proposals,
        reference_executor="ONNX Runtime CPU: here the target engine itself (an untimed session); loss gap 0 by construction",
        timing="one batch; median of >= 10 runs and >= 0.2 s after 3 warm-ups; re-timed if p10-p90 > 25 % of median",
        models={},
    )
    run_models(report, args.models,
               lambda name: run_model(name, args.builds, args.seeds, args.reference, args.proposals))
    print(
        f"\nbuilds per answer — {report['engine']['engine']} {report['engine']['version']} {report['engine']['provider']} "
        f"on {report['engine']['device']}; {args.builds} builds per search, {args.seeds} seeds, --max-loss {MAX_LOSS}; "
        f"JSON: {report.path}"
    )
    print(
        f"{'model':<10} {'method':<12} {'builds to 2 %':<16} {'HV @20':<16} {'ms @bisect count':<20} {'latency err %':<16} {'ref evals':<12}"
    )
    for name, m in report["models"].items():
        for method, r in m["methods"].items():
            def cells(values):
                return ", ".join("—" if v is None else f"{v:g}" for v in values)
            print(f"{name:<10} {method:<12} {cells(r['builds_to_2pct']):<16} {cells(r['hv_at_20_builds']):<16} "
                  f"{cells(r['autoprec_at_bisection_count_ms']):<20} {cells(r['latency_model_error_percent']):<16} "
                  f"{cells(r['reference_evaluations']):<12}")
        b = m["bisection"]
        print(
            f"{name:<10} {'bisection':<12} {b['evaluations']} evaluations → {b['latency_ms']:.3f} ms (loss {b['loss']:.2g}); "
            f"reference best {m['reference_best_ms_at_1pct']} ms, FP32 {m['fp32_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

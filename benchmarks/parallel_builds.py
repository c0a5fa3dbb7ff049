"""Trials per hour with candidates built side by side (--build-workers) against one at a time.

Per zoo model and engine, in one run: the same search (budget, seed, sensitivity warm start) with
1 worker and with 2, alternating, twice each. Reported: trials per hour of the trial loop (first
trial started → last finished, from the Optuna storage), the median time a trial waited for the
device, and the all-FP32 latency each search measured (builds beside timing must not change what
is timed). This decided the defaults: 1 worker on ONNX Runtime (its builds are cheap, and a build
beside the timed candidate shares the CPU that runs or launches it), 2 on TensorRT (builds take
seconds to minutes; not measurable here).

    python benchmarks/parallel_builds.py --backend ort-cuda --models ppocr-det --batch 32
    python benchmarks/parallel_builds.py --backend ort-cpu --models ppocr-rec
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine_facts, run_models  # noqa: E402
from gpu import batch_data  # noqa: E402

import autoprec  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.results.files import load_json  # noqa: E402


def one_search(name: str, backend: str, workers: int, budget: int, batch: int, out: Path) -> dict:
    model_path, data, shapes = batch_data(name, batch, out.parent)
    result = autoprec.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model_path, data=data, shapes=shapes),
            engine=autoprec.EngineSpec(backend=backend),
            study=autoprec.StudySpec(budget=budget),
            isolation=autoprec.IsolationSpec(build_workers=workers),
            out=out,
        )
    )
    study = optuna.load_study(study_name=result.search["study_name"], storage=result.search["storage"])
    done = [t for t in study.trials if t.datetime_complete is not None]
    loop_s = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    trials = load_json(out / "trials.json")["trials"]
    waits = [t["seconds"].get("device_wait", 0.0) for t in trials if t["duplicate_of"] is None]
    fp32 = result.uniform().get("fp32")
    return {
        "workers": workers,
        "trials": len(done),
        "loop_seconds": round(loop_s, 2),
        "trials_per_hour": round(len(done) / loop_s * 3600, 1),
        "median_device_wait_s": round(statistics.median(waits), 4) if waits else None,
        "fp32_latency_ms": round(fp32.latency_ms, 4) if fp32 else None,
        "wall_seconds": result.search["wall_seconds"],
    }


def run_model(name: str, backend: str, budget: int, batch: int, repeats: int) -> dict:
    runs = []
    with tempfile.TemporaryDirectory(prefix="autoprec-parallel-") as tmp:
        for r in range(repeats):
            for workers in (1, 2):
                runs.append(one_search(name, backend, workers, budget, batch, Path(tmp) / f"{workers}-{r}"))
    by = {w: [x for x in runs if x["workers"] == w] for w in (1, 2)}
    rate = {w: statistics.median(x["trials_per_hour"] for x in by[w]) for w in by}
    return {"budget": budget, "batch": batch, "repeats": repeats, "runs": runs,
            "trials_per_hour_median": rate, "speedup_2_workers": round(rate[2] / rate[1], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="ort-cpu")
    parser.add_argument("--models", nargs="*", default=["ppocr-rec"])
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "parallel_builds.json")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    report = {**machine_facts(get_backend(args.backend)), "backend": args.backend, "models": {}}
    run_models(
        report,
        args.models,
        lambda name: run_model(name, args.backend, args.budget, args.batch, args.repeats),
        args.json,
    )
    print(
        f"\nparallel builds — {report['engine']['engine']} {report['engine']['version']} {report['engine']['provider']} "
        f"on {report['engine']['device']}; JSON: {args.json}"
    )
    print(f"{'model':<10} {'workers':>7} {'trials/h (runs)':<24} {'device wait s':>13} {'fp32 ms (runs)':<20}")
    for name, m in report["models"].items():
        for w in (1, 2):
            runs = [x for x in m["runs"] if x["workers"] == w]
            print(f"{name:<10} {w:>7} {', '.join(str(x['trials_per_hour']) for x in runs):<24} "
                  f"{statistics.median(x['median_device_wait_s'] or 0 for x in runs):>13.3f} "
                  f"{', '.join(str(x['fp32_latency_ms']) for x in runs):<20}")
        print(f"{name:<10} 2 workers / 1: {m['speedup_2_workers']:.2f}× trials per hour")
    return 0


if __name__ == "__main__":
    sys.exit(main())

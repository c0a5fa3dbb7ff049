"""Trials per hour with 1, 2 and 3 local worker processes on one study (PostgreSQL storage).

Per zoo model, in one run: a local PostgreSQL server (tests/postgres.py: Debian's server binaries,
on loopback), then for each worker count a fresh study that N ``autoprec search`` processes share
(same command, own --out, the study's --budget), ONNX Runtime's CPU provider. The workers of one
host take the device (here: the CPU) one candidate at a time for evaluation and timing, so what
runs side by side is lowering, session builds and the Optuna bookkeeping. Reported per N: the
trial loop's rate (first trial started → last finished, from the storage), the whole wall clock
(start-up, shared calibration/sensitivity and each worker's final re-timing included), how many
trials each worker ran, and the all-FP32 latency measured (workers beside the timed candidate must
not change what is timed). On this project's 2-core machines, more workers than cores only adds
contention; the figure says how much.

    python benchmarks/distributed.py                      # zoo:ppocr-cls, budget 40, 1/2/3 workers
    python benchmarks/distributed.py --models ppocr-rec --budget 30
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import postgres  # noqa: E402
from _harness import machine_facts, run_models  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402
from autoprec.study.coordination import WORKER_ATTR  # noqa: E402
from autoprec.study.search import counted, finished_records, uniform_trials  # noqa: E402

WORKER_COUNTS = (1, 2, 3)


def shared_search(url: str, model: str, workers: int, budget: int, folder: Path) -> dict:
    name = f"scale-{Path(folder).name}-{workers}"
    cmd = [sys.executable, "-m", "autoprec.app.cli", "search", f"zoo:{model}", "--storage", url, "--study-name", name,
           "--budget", str(budget), "--artifacts", str(folder / "artifacts"), "--no-progress"]
    started = time.monotonic()
    procs = [subprocess.Popen([*cmd, "--out", str(folder / f"w{workers}-{i}")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for i in range(workers)]
    errors = [p.communicate()[1] for p in procs]
    wall = time.monotonic() - started
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed:\n{errors[0][-3000:]}")
    study = optuna.load_study(study_name=name, storage=url)
    trials = study.get_trials()
    done = [t for t in trials if t.datetime_complete is not None and counted(t)]
    loop_s = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    per_worker: dict[str, int] = {}
    for t in done:
        who = t.user_attrs.get(WORKER_ATTR, {}).get("id", "?")
        per_worker[who] = per_worker.get(who, 0) + 1
    fp32 = uniform_trials(finished_records(study)).get("fp32")
    return {
        "workers": workers,
        "counted": len(done),
        "measured": sum(1 for t in done if "duplicate_of" not in t.user_attrs),
        "trial_loop_s": round(loop_s, 1),
        "trials_per_hour_loop": round(len(done) / loop_s * 3600),
        "wall_s": round(wall, 1),
        "trials_per_hour_wall": round(len(done) / wall * 3600),
        "trials_per_worker": sorted(per_worker.values(), reverse=True),
        "fp32_ms": round(fp32.latency_ms, 3) if fp32 else None,
    }


def run_model(url: str, model: str, budget: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="autoprec-scale-") as tmp:
        runs = [shared_search(url, model, n, budget, Path(tmp) / "run") for n in WORKER_COUNTS]
    base = runs[0]["trials_per_hour_loop"]
    for run in runs:
        run["speedup_loop_vs_1"] = round(run["trials_per_hour_loop"] / base, 2)
        run["speedup_wall_vs_1"] = round(run["trials_per_hour_wall"] / runs[0]["trials_per_hour_wall"], 2)
    return {"budget": budget, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["ppocr-cls"])
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "distributed.json")
    args = parser.parse_args(argv)
    binaries = postgres.server_binaries()
    if binaries is None:
        raise SystemExit("needs a PostgreSQL server installed (apt-get install postgresql)")
    report = {**machine_facts(get_backend("ort-cpu")), "storage": "PostgreSQL (local, loopback)",
              "worker_counts": list(WORKER_COUNTS), "budget": args.budget, "models": {}}
    with postgres.local_server(binaries) as url:
        report["postgresql"] = subprocess.run([str(binaries / "postgres"), "--version"], capture_output=True,
                                              text=True).stdout.strip()
        run_models(report, args.models, lambda m: run_model(url, m, args.budget), args.json)
    print(f"\n{report['engine']['engine']} {report['engine']['version']} on {report['engine']['device']}; "
          f"{report['postgresql']}; budget {args.budget}")
    print(f"{'model':<11}{'workers':>8}{'trials/h loop':>15}{'×1':>7}{'trials/h wall':>15}{'×1':>7}"
          f"{'per worker':>14}{'fp32 ms':>9}")
    for model, entry in report["models"].items():
        for run in entry["runs"]:
            print(f"{model:<11}{run['workers']:>8}{run['trials_per_hour_loop']:>15}{run['speedup_loop_vs_1']:>7.2f}"
                  f"{run['trials_per_hour_wall']:>15}{run['speedup_wall_vs_1']:>7.2f}"
                  f"{'/'.join(map(str, run['trials_per_worker'])):>14}{run['fp32_ms'] or float('nan'):>9.3f}")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

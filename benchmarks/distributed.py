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

    python -m benchmarks distributed                      # zoo:ppocr-cls, budget 40, 1/2/3 workers
    python -m benchmarks distributed --models ppocr-rec --budget 30

GPU mode (``--gpus N``): one worker per GPU (``--device i``, ort-cuda) on one study, with 1, 2, 4 … and N
GPUs in the same run, per zoo model at ``--batch`` (its real samples and their mirror images, as gpu.py makes
them), the same budget for every run; per run the trials per hour (of the trial loop, first trial started →
last finished, and of the whole wall clock), distinct plans measured, that the budget was kept, the front's
hypervolume (``autoprec.study.proposals.hypervolume``: latency over the 1-GPU run's all-FP32, loss over --max-loss)
against the 1-GPU run's at the same trial count, each worker's idle time inside the loop (gaps between its
trials) and how long after the first trial its own first one started, and the chosen plan's latency and loss
(worker 0's result). Writes distributed_gpu.json:

    python -m benchmarks distributed --gpus 4 --models ppocr-cls ppocr-det --batch 32 --budget 40
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import postgres  # noqa: E402
from _harness import (  # noqa: E402
    QUICK_RETIME,
    TINY,
    Report,
    add_retime_argument,
    model_source,
    parse_arguments,
    resolve,
    run_models,
)

from autoprec.backends import get_backend  # noqa: E402
from autoprec.study.coordination import WORKER_ATTR  # noqa: E402
from autoprec.study.optimize import planned_params  # noqa: E402
from autoprec.study.reading import (  # noqa: E402
    counted,  # noqa: E402
    finished_records,
    uniform_trials,
)

QUICK = {"models": [TINY], "budget": 3, "workers": [2], "retime_seconds": QUICK_RETIME}


def run_workers(
    url: str, name: str, commands: list[list[str]]
) -> tuple[optuna.Study, list, float, float, dict[str, int]]:
    """The worker commands side by side on study ``name``: the study, its counted trials, the wall clock,
    the trial loop's seconds (first trial started -> last finished) and the trials each worker ran."""
    started = time.monotonic()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands]
    errors = [p.communicate()[1] for p in procs]
    wall = time.monotonic() - started
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed:\n{next(e for p, e in zip(procs, errors) if p.returncode)[-3000:]}")
    study = optuna.load_study(study_name=name, storage=url)
    done = [t for t in study.get_trials() if t.datetime_complete is not None and counted(t)]
    loop_s = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    per_worker: dict[str, int] = {}
    for t in done:
        who = t.user_attrs.get(WORKER_ATTR, {}).get("id", "?")
        per_worker[who] = per_worker.get(who, 0) + 1
    return study, done, wall, loop_s, per_worker


def shared_search(url: str, model: str, workers: int, args: argparse.Namespace, folder: Path) -> dict:
    name = f"scale-{Path(folder).name}-{workers}"
    given, data, shapes = model_source(model)
    inputs = [*(["--data", str(data)] if data else []),
              *(a for k, v in (shapes or {}).items() for a in ("--shape", f"{k}={'x'.join(map(str, v))}"))]
    cmd = [sys.executable, "-m", "autoprec.app.cli", "search", given, *inputs, "--storage", url, "--study-name", name,
           "--budget", str(args.budget), "--artifacts", str(folder / "artifacts"), "--no-progress",
           "--retime-seconds", str(args.retime_seconds)]
    study, done, wall, loop_s, per_worker = run_workers(
        url, name, [[*cmd, "--out", str(folder / f"w{workers}-{i}")] for i in range(workers)])
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


def gpu_search(url: str, model: str, data: Path, shapes: dict, gpus: int, budget: int, folder: Path,
               backend: str = "ort-cuda", first_gpu: int = 0, max_loss: float = 0.01, seed: int | None = None) -> dict:
    """One study shared by one worker per GPU (GPUs ``first_gpu`` on); its rate, plans, front and answer."""
    name = f"gpu-{model}-{gpus}"
    seeded = ["--seed", str(seed)] if seed is not None else []
    shape_args = [a for k, v in shapes.items() for a in ("--shape", f"{k}={'x'.join(map(str, v))}")]
    cmd = [sys.executable, "-m", "autoprec.app.cli", "search", f"zoo:{model}", "--data", str(data), *shape_args,
           "--backend", backend, "--storage", url, "--study-name", name, "--budget", str(budget), "--max-loss", str(max_loss),
           "--artifacts", str(folder / "artifacts"), "--no-progress", *seeded]
    outs = [folder / f"{model}-g{gpus}-{i}" for i in range(gpus)]
    started_at = datetime.now()  # the trials' datetimes are this clock's (Optuna's datetime.now())
    study, done, wall, loop_s, per_worker = run_workers(
        url, name, [[*cmd, "--device", str(first_gpu + i), "--out", str(out)] for i, out in enumerate(outs)])
    plans = {json.dumps(planned_params(t), sort_keys=True) for t in done if "duplicate_of" not in t.user_attrs}
    pareto = json.loads((outs[0] / "pareto.json").read_text())
    searches = [json.loads((out / "pareto.json").read_text())["search"] for out in outs]
    steps = [v.get("worker") for k, v in study.user_attrs.items() if k.startswith("autoprec:step:sensitivity:")]
    retimed = [v.get("worker") for k, v in study.user_attrs.items() if k.startswith("autoprec:step:retiming:")]
    chosen = next((t for t in pareto["front"] if t["trial"] == pareto["chosen"]), {})
    latency = chosen.get("latency_ms")
    records = finished_records(study)
    fp32 = uniform_trials(records).get("fp32")
    return {
        "trials_per_hour": round(len(done) / loop_s * 3600),
        "trials": len(done),
        "budget_kept": len(done) == budget,
        "distinct_plans": len(plans),
        "trials_per_worker": sorted(per_worker.values(), reverse=True),
        "trial_loop_s": round(loop_s, 1),
        "wall_s": round(wall, 1),
        "trials_per_hour_wall": round(len(done) / wall * 3600),
        **idle(done),
        "points": [(r.latency_ms, r.loss) for r in records if math.isfinite(r.loss)],
        "fp32_ms": fp32.latency_ms if fp32 else None,
        "chosen_ms": chosen.get("final_latency_ms")
        or (latency.get("median_ms") if isinstance(latency, dict) else latency),
        "chosen_loss": chosen.get("accuracy_loss"),
        "chosen_trial": chosen.get("trial"),
        "gpus_used": list(range(first_gpu, first_gpu + gpus)),
        # where each worker's wall clock went outside the trial loop (its own result's record)
        "one_time_s_per_worker": [s["one_time_seconds"] for s in searches],
        "wall_s_per_worker": [s["wall_seconds"] for s in searches],
        "stage_s_per_worker": [s.get("stage_seconds") for s in searches],  # set-up … deployment checks
        "sensitivity_plans_per_worker": sorted((steps.count(w) for w in set(steps)), reverse=True),
        "retimed_plans_per_worker": sorted((retimed.count(w) for w in set(retimed)), reverse=True),
        "engine_device": pareto["engine"]["device"],
        "reference_executor": pareto["search"].get("reference", {}).get("executor"),
        **where_the_wall_went(done, wall, started_at),
        "trial_seconds": trial_seconds(done),
    }


def where_the_wall_went(done: list, wall: float, started_at: datetime) -> dict:
    """The wall clock before the study's first trial (start-up, shared inputs, sensitivity pass) and after its
    last (re-timing, final timing, writing)."""
    first = min(t.datetime_start for t in done)
    last = max(t.datetime_complete for t in done)
    before = (first - started_at).total_seconds()
    return {"before_loop_s": round(before, 1), "after_loop_s": round(wall - (last - started_at).total_seconds(), 1)}


def trial_seconds(done: list) -> dict:
    """Where a measured trial's time went, averaged (lookup, lower, build, device_wait, evaluate, time, release,
    judge; ``trial``: from its plan read to its measurement, all of them and ``round_trip``, the rest: the worker
    process's pipe and the parent's waiting), and what the trial took beyond that: the sampler's ask, the storage's
    round trips and locks, telling the result; and, for every counted trial, the seconds its worker waited for the
    study's queue lock and held it (the storage's reads and the ask)."""
    measured = [t for t in done if "duplicate_of" not in t.user_attrs and "measurement" in t.user_attrs]
    if not measured:
        return {}
    phases: dict[str, float] = {}
    for t in measured:
        for phase, seconds in t.user_attrs["measurement"].get("seconds", {}).items():
            phases[phase] = phases.get(phase, 0.0) + seconds / len(measured)
    if "trial" in phases:
        phases["round_trip"] = phases["trial"] - sum(v for k, v in phases.items() if k != "trial")
    span = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in measured) / len(measured)
    asked = [t.user_attrs["asked"] for t in done if "asked" in t.user_attrs]  # waiting for and holding the queue
    queue = {k: round(sum(a[k] for a in asked) / len(asked), 4) for k in ("queue_wait_s", "queue_held_s")} if asked else {}
    return {**{k: round(v, 3) for k, v in phases.items()}, "outside_measurement": round(span - phases.get("trial", 0.0), 3),
            **queue}


def idle(done: list) -> dict:
    """Each worker's seconds between its own trials inside the loop, and how long after the study's first trial
    its own first one started (the start-up it waited out: the shared inputs, its measurer)."""
    first = min(t.datetime_start for t in done)
    by_worker: dict[str, list] = {}
    for t in done:
        by_worker.setdefault(t.user_attrs.get(WORKER_ATTR, {}).get("id", "?"), []).append(t)
    gaps, late = [], []
    for trials in by_worker.values():
        trials.sort(key=lambda t: t.datetime_start)
        gaps.append(sum(max(0.0, (b.datetime_start - a.datetime_complete).total_seconds())
                        for a, b in zip(trials, trials[1:])))
        late.append((trials[0].datetime_start - first).total_seconds())
    return {"idle_s_per_worker": [round(g, 1) for g in gaps], "first_trial_after_s": [round(x, 1) for x in late]}


def gpu_model(url: str, model: str, args, folder: Path, report: dict) -> dict:
    """One zoo model searched with 1, 2, 4 … and ``args.gpus`` workers, one per GPU, each run on a fresh study
    (the report written after each run: a run cut short keeps the ones before it)."""
    import numpy as np
    from gpu import mirrored_items

    model, _, batch = model.partition("@")  # ppocr-det@8: this model at its own batch size
    batch = int(batch or args.batch)
    _, data, shapes, _ = resolve(model)
    shapes = {k: (batch, *v[1:]) for k, v in shapes.items()}
    samples = folder / f"{model}-samples.npz"
    with np.load(data) as npz:
        np.savez(samples, **mirrored_items({k: npz[k] for k in shapes}, 2 * batch))
    counts = args.gpu_counts or sorted({*(2**k for k in range(args.gpus.bit_length()) if 2**k <= args.gpus), args.gpus})
    runs = {}
    for gpus in counts:
        key = str(gpus) if args.seed is None else f"{gpus}s{args.seed}"  # another seed: the spread of the first's
        runs[key] = gpu_search(url, model, samples, shapes, gpus, args.budget, folder, args.backend,
                               args.first_gpu, args.max_loss, args.seed)
        print(f"{model}, {key} GPU(s): { {k: v for k, v in runs[key].items() if k != 'points'} }", flush=True)
        report["models"][model] = {"batch": batch, "budget": args.budget, "max_loss": args.max_loss, "runs": runs,
                                   "partial": True}
        report.write()
    return compared_runs(runs, batch, args.budget, args.max_loss)


def compared_runs(runs: dict, batch: int, budget: int, max_loss: float) -> dict:
    """Each run against the one-GPU run: trials per hour (loop, wall) and the front's hypervolume. Without a
    one-GPU run (a share of the runs made by one process, see --merge), the runs as they are, points kept."""
    from autoprec.study.proposals import hypervolume

    def area(run: dict, unit: float | None) -> float:  # the search's own limit as the loss unit: past it counts nothing
        return hypervolume([(ms / (unit or 1.0), min(loss / max_loss, 1.0)) for ms, loss in run["points"]])

    for run in runs.values():
        run["busy_fraction"] = busy_fraction(run)
    if "1" not in runs:
        return {"batch": batch, "budget": budget, "max_loss": max_loss, "runs": runs, "partial": True}
    one = runs["1"]
    base = area(one, one["fp32_ms"])
    for run in runs.values():
        if run["busy_fraction"] and one["busy_fraction"]:  # the rate's ratio had every trial taken the 1-GPU run's time
            run["speedup_same_trial_vs_1"] = round(
                len(run["trials_per_worker"]) * run["busy_fraction"] / one["busy_fraction"], 2)
        run["hypervolume_vs_1"] = round(area(run, one["fp32_ms"]) / base, 4) if base else None
        # each run's latencies over its own all-FP32's: the front's speed-ups, whatever load the host put on all of them
        run["hypervolume_own_fp32_vs_1"] = round(area(run, run["fp32_ms"]) / base, 4) if base else None
        run["speedup_vs_1"] = round(run["trials_per_hour"] / one["trials_per_hour"], 2)
        run["speedup_wall_vs_1"] = round(run["trials_per_hour_wall"] / one["trials_per_hour_wall"], 2)
    return {"batch": batch, "budget": budget, "max_loss": max_loss, "runs": runs}


def busy_fraction(run: dict) -> float | None:
    """The share of the workers' loop time spent in trials (from the sampler's ask to its tell): what is left is
    the loop's own cost — idle workers, late starts, the last trials' tail. Unlike the rate, it does not move with
    how long the plans of one run happen to take."""
    seconds = run.get("trial_seconds") or {}
    if "trial" not in seconds:
        return None
    span = seconds["trial"] + seconds.get("outside_measurement", 0.0)
    return round(run["trials"] * span / (len(run["trials_per_worker"]) * run["trial_loop_s"]), 3)


def gpu_main(args) -> int:
    binaries = postgres.server_binaries()
    if binaries is None:
        raise SystemExit(
            "needs PostgreSQL's server binaries (apt-get install postgresql; see docs/workers.md to carry them)"
        )
    backend = get_backend(args.backend)
    engine = backend.info()
    report = Report("distributed_gpu", args, backend, device=f"{engine.device.split(' (')[0]} × {args.gpus}",
                    batch=args.batch, budget=args.budget, storage="PostgreSQL (local, loopback)", models={})
    with tempfile.TemporaryDirectory(prefix="autoprec-gpus-") as tmp, postgres.local_server(binaries) as url:
        env = {
            **os.environ,
            **({"LD_LIBRARY_PATH": os.environ["AUTOPREC_PG_LIBS"]} if "AUTOPREC_PG_LIBS" in os.environ else {}),
        }
        report["postgresql"] = subprocess.run([str(binaries / "postgres"), "--version"], capture_output=True,
                                              text=True, env=env).stdout.strip()
        for model in args.models:
            report["models"][model.partition("@")[0]] = gpu_model(url, model, args, Path(tmp), report)
            report.write()
    print_gpu_table(report)
    print(f"wrote {report.path}")
    return 0


def merged(paths: list[Path], max_loss: float) -> dict:
    """Reports of processes that each ran some of the GPU counts (side by side, on GPUs of their own, or one after
    another) as one; a GPU count run again is kept as ``4#2`` (``max_loss``: the runs' --max-loss, for reports
    written before they recorded it)."""
    reports = [json.loads(p.read_text()) for p in paths]
    report = {**reports[0], "models": {}, "merged_from": [p.name for p in paths]}
    for part in reports:
        for model, entry in part["models"].items():
            runs = report["models"].setdefault(model, {"batch": entry["batch"], "budget": entry["budget"],
                                                       "max_loss": entry.get("max_loss", max_loss), "runs": {}})["runs"]
            for gpus, run in entry["runs"].items():
                again = 2
                key = gpus
                while key in runs:
                    key, again = f"{gpus}#{again}", again + 1
                runs[key] = run
    for model, entry in report["models"].items():
        runs = dict(sorted(entry["runs"].items(), key=lambda kv: (int(re.match(r"\d+", kv[0])[0]), kv[0])))
        report["models"][model] = compared_runs(runs, entry["batch"], entry["budget"], entry["max_loss"])
    return report


def print_gpu_table(report: dict) -> None:
    print(f"\n{report['device']}, budget {report['budget']}, {report['postgresql']}")
    print(f"{'model@batch':<14}{'GPUs':>5}{'trials/h':>10}{'×1':>6}{'wall s':>8}{'×1 wall':>8}{'trials':>7}{'plans':>6}"
          f"{'busy':>6}{'×1 same trial':>14}{'HV ×1':>7}{'own':>6}{'per worker':>13}{'idle s':>14}{'before s':>9}{'after s':>8}{'chosen ms':>10}{'loss':>10}")
    nan = float("nan")
    for model, entry in report["models"].items():
        for gpus, run in entry["runs"].items():
            print(f"{model + '@' + str(entry['batch']):<14}{gpus:>5}{run['trials_per_hour']:>10}{run.get('speedup_vs_1', nan):>6.2f}"
                  f"{run['wall_s']:>8.0f}{run.get('speedup_wall_vs_1', nan):>8.2f}{run['trials']:>7}{run['distinct_plans']:>6}"
                  f"{run.get('busy_fraction') or nan:>6.3f}{run.get('speedup_same_trial_vs_1', nan):>14.2f}"
                  f"{run.get('hypervolume_vs_1') or nan:>7.3f}{run.get('hypervolume_own_fp32_vs_1') or nan:>6.3f}"
                  f"{'/'.join(map(str, run['trials_per_worker'])):>13}"
                  f"{'/'.join(f'{x:.0f}' for x in run['idle_s_per_worker']):>14}{run.get('before_loop_s', nan):>9.0f}"
                  f"{run.get('after_loop_s', nan):>8.0f}{run['chosen_ms'] or float('nan'):>10.3f}"
                  f"{run['chosen_loss'] if run['chosen_loss'] is not None else float('nan'):>10.2e}")


def run_model(url: str, model: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="autoprec-scale-") as tmp:
        runs = [shared_search(url, model, n, args, Path(tmp) / "run") for n in args.workers]
    base = runs[0]["trials_per_hour_loop"]
    for run in runs:
        run["speedup_loop_vs_1"] = round(run["trials_per_hour_loop"] / base, 2)
        run["speedup_wall_vs_1"] = round(run["trials_per_hour_wall"] / runs[0]["trials_per_hour_wall"], 2)
    return {"budget": args.budget, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["ppocr-cls"])
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 3], help="worker processes of each run")
    parser.add_argument("--gpus", type=int, default=0, help="GPU mode: one worker per GPU, 1 and then this many")
    parser.add_argument("--batch", type=int, default=32, help="GPU mode: the batch size")
    parser.add_argument("--backend", default="ort-cuda", help="GPU mode: the engine (ort-cpu only to try the mode)")
    parser.add_argument("--gpu-counts", type=int, nargs="*", help="GPU mode: only these runs (e.g. 1 2)")
    parser.add_argument("--max-loss", type=float, default=0.01, help="GPU mode: the searches' --max-loss")
    parser.add_argument("--first-gpu", type=int, default=0, help="GPU mode: the runs' workers use GPUs from this one")
    parser.add_argument("--seed", type=int, help="GPU mode: the searches' --seed (runs named 1s<seed>, 4s<seed> …: "
                        "merged with the default seed's, their 'HV ×1' is the seeds' spread)")
    parser.add_argument("--merge", type=Path, nargs="*", help="GPU mode: join reports of --gpu-counts runs into --json")
    add_retime_argument(parser)
    args = parse_arguments(parser, argv, QUICK)
    if args.merge:
        report = Report("distributed_gpu", args, get_backend("ort-cpu"))
        report.update(merged(args.merge, args.max_loss))
        report.write()
        print_gpu_table(report)
        return 0
    # a run stopped by `timeout` (SIGTERM) still stops its PostgreSQL server: four were left on the H200 host once
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.gpus:
        return gpu_main(args)
    binaries = postgres.server_binaries()
    if binaries is None:
        raise SystemExit("needs a PostgreSQL server installed (apt-get install postgresql)")
    report = Report("distributed", args, get_backend("ort-cpu"), storage="PostgreSQL (local, loopback)",
                    worker_counts=args.workers, budget=args.budget, models={})
    with postgres.local_server(binaries) as url:
        report["postgresql"] = subprocess.run([str(binaries / "postgres"), "--version"], capture_output=True,
                                              text=True).stdout.strip()
        run_models(report, args.models, lambda m: run_model(url, m, args))
    print(f"\n{report['engine']['engine']} {report['engine']['version']} on {report['engine']['device']}; "
          f"{report['postgresql']}; budget {args.budget}")
    print(f"{'model':<11}{'workers':>8}{'trials/h loop':>15}{'×1':>7}{'trials/h wall':>15}{'×1':>7}"
          f"{'per worker':>14}{'fp32 ms':>9}")
    for model, entry in report["models"].items():
        for run in entry["runs"]:
            print(f"{model:<11}{run['workers']:>8}{run['trials_per_hour_loop']:>15}{run['speedup_loop_vs_1']:>7.2f}"
                  f"{run['trials_per_hour_wall']:>15}{run['speedup_wall_vs_1']:>7.2f}"
                  f"{'/'.join(map(str, run['trials_per_worker'])):>14}{run['fp32_ms'] or float('nan'):>9.3f}")
    print(f"wrote {report.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Models of any size: what a search costs as weights and units grow, and what one evaluation costs against
the engine's own bare cost.

For each generated model (random weights: cost and scale, not accuracy; benchmarks/synthetic.py), on ONNX
Runtime's CPU provider, in one run:
1. ``autoprec search MODEL --budget B`` in a child process, every process of its tree sampled every
   0.2 s for its peak resident memory (VmHWM: main process, measuring worker);
2. the bare cost, in a fresh process after it: an ONNX Runtime session created from the prepared FP32
   model's file and the screening batches run once (what one sensitivity evaluation needs at the
   least), median of 3, and that process's peak memory then (ONNX Runtime's own floor for the model: it
   holds the weights and, while it packs a MatMul's weight for its kernels, a packed copy of it); and the same for the candidates' extremes (every unit INT8, every unit FP16),
   saved as plain ONNX files: what the engine itself costs to load them;
3. the sensitivity pass's work on its own plans in the benchmark's process (lowered, judged from their first changed
   node on as the worker judges them) and bare sessions of the same plans, in turn, three rounds: the ratio of
   the two (``pass_vs_bare_interleaved``), which a machine whose speed moves between the search and the bare
   sessions cannot make up;
4. from the search's pareto.json: wall time by phase, evaluations, seconds per sensitivity evaluation
   (IPC, lowering in the worker, session, run, loss) and per trial (its whole cost but the timing
   loop), builds, and the disk the cache and best/ hold.

    python -m benchmarks scale                 # the ladder: about 25 minutes on 2 cores, 6 GB of disk
    python -m benchmarks scale --models chain300 encoder6
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import synthetic  # noqa: E402
from _harness import QUICK_RETIME, Report, add_retime_argument, parse_arguments  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402

BUDGET = 8
VOCAB = 1000
# name -> (generator, its arguments, search options beyond the budget)
LADDER = {
    "encoder6": (synthetic.encoder, {"layers": 6, "hidden": 256, "tokens": 64, "vocab": VOCAB}, []),
    "bert-base": (synthetic.encoder, {"layers": 12, "hidden": 768, "tokens": 128}, []),
    "wide-2.3GB": (synthetic.wide, {"width": 17000}, []),
    "chain300": (synthetic.chain, {"units": 300}, []),
    "chain300-separate": (synthetic.chain, {"units": 300}, ["--separate-repeats"]),
    "chain600": (synthetic.chain, {"units": 600}, []),
    "encoder24": (synthetic.encoder, {"layers": 24, "hidden": 256, "tokens": 64, "vocab": VOCAB}, []),
    "encoder24-separate": (
        synthetic.encoder,
        {"layers": 24, "hidden": 256, "tokens": 64, "vocab": VOCAB},
        ["--separate-repeats"],
    ),
}
# --quick's model: a chain of 8 small units
MODELS = {**LADDER, "chain8": (synthetic.chain, {"units": 8, "hidden": 16}, [])}
QUICK = {"models": ["chain8"], "budget": 2, "retime_seconds": QUICK_RETIME}
BARE = """
import json, sys, time, statistics, numpy as np, onnxruntime as ort
spec = json.loads(sys.argv[1])
batches = {which: [dict(np.load(p)) for p in paths] for which, paths in spec["batches"].items()}
found = {}
for name, (path, which, repeats) in spec["models"].items():
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        for batch in batches[which]:
            session.run(None, batch)
        runs.append(time.perf_counter() - t0)
        del session
    found[name] = statistics.median(runs)
    if name == "fp32 screening":  # what ONNX Runtime alone holds at its peak for the FP32 model (VmHWM, bytes)
        found["fp32 session peak bytes"] = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                                                if line.startswith("VmHWM:"))
print(json.dumps(found))
"""


class PeakMemory:
    """Every process of a tree sampled for its peak resident memory (VmHWM) until stopped."""

    def __init__(self, root: int, every: float = 0.2):
        self.root, self.every, self.peaks = root, every, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry))
        found, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self._tree():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                peak = next(
                    (int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0
                )
                # (measuring workers fork from a forkserver, whose command line they keep)
                measuring = "spawn_main" in command or "forkserver" in command
                role = "worker" if measuring else "main" if "autoprec" in command else "other"
                key = (pid, role)
                self.peaks[key] = max(self.peaks.get(key, 0), peak)
            time.sleep(self.every)

    def stop(self) -> dict[str, int]:
        """The largest peak of each role (main, worker, other) in bytes."""
        self._stop.set()
        self._thread.join()
        by_role: dict[str, int] = {}
        for (_, role), peak in self.peaks.items():
            by_role[role] = max(by_role.get(role, 0), peak)
        return by_role


def disk_bytes(path: Path) -> int:
    """Bytes a file or folder holds on disk (allocated blocks: a sparse file counts what it stores)."""
    return sum(p.stat().st_blocks * 512 for p in (path.rglob("*") if path.is_dir() else [path]) if p.is_file())


def _data(model: Path, folder: Path) -> Path | None:
    """Sample inputs an encoder's token ids can take (random data would draw ids past a small vocabulary)."""
    if not model.stem.startswith("encoder"):
        return None
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    tokens = graph.input[0].type.tensor_type.shape.dim[1].dim_value
    path = folder / "ids.npz"
    np.savez(path, input_ids=np.random.default_rng(0).integers(0, VOCAB, (8, 1, tokens)).astype(np.int64))
    return path


def _search(model: Path, out: Path, data: Path | None, options: list[str], budget: int) -> tuple[dict, dict, float]:
    cmd = [sys.executable, "-m", "autoprec.app.cli", "search", str(model), "--out", str(out), "--budget", str(budget),
           "--no-progress", *(["--data", str(data)] if data else []), *options]
    started = time.monotonic()
    with open(out.parent / f"{out.name}.log", "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        memory = PeakMemory(process.pid)
        code = process.wait()
    peaks = memory.stop()
    if code != 0:
        raise RuntimeError(f"search exited {code}: see {out.parent / (out.name + '.log')}")
    return json.loads((out / "pareto.json").read_text()), peaks, time.monotonic() - started


def _pass_plans(out: Path, pareto: dict, work: Path):
    """The search in ``out`` re-created as it searched (its baseline, and its units as it tied them), and the one-unit
    plans its sensitivity pass evaluated, each lowered as the search lowered it and saved under ``work`` as a plain
    ONNX file (one data file holds each weight they share once: 384 plans of a 77 MB model): {file: plan}."""
    from autoprec.app.recorded import plan_context
    from autoprec.core.plan import Precision
    from autoprec.core.stored import save_models

    baseline = plan_context(out, trial=pareto["uniform"]["fp32"]).baseline
    info = baseline.info if pareto["search"].get("tie_repeats", True) else baseline.info.untied()
    engine = get_backend("ort-cpu")
    passed = json.loads((out / "sensitivity.json").read_text())["units"]
    plans = {work / "pass" / f"{i}-{precision}.onnx": info.plan_at(Precision(precision), [unit["unit"]])
             for i, unit in enumerate(passed) for precision in unit["loss"]}
    if plans:
        shutil.rmtree(work / "pass", ignore_errors=True)
        save_models({path: engine.lower(info, plan, baseline.ranges) for path, plan in plans.items()},
                    data="pass.data", external=True)
    return baseline, info, plans


def _bare(baseline, info, plans: dict, work: Path) -> dict[str, float]:
    """Seconds a plain ONNX Runtime session takes, in a fresh process, to be created from a model's file and
    run once: the prepared FP32 model on the screening batches (what a sensitivity evaluation runs; median
    of 3) and on every evaluation batch (what a trial runs before its timing; median of 3), and each plan
    the sensitivity pass evaluated (``plans``' files; median of 3 each): what the engine itself costs."""
    from autoprec.measure.measurement import screening_batches

    evaluation = baseline.dataset.evaluation
    fp32 = str(info.folder / "model.onnx")
    models = {"fp32 screening": (fp32, "screening", 3), "fp32 evaluation": (fp32, "evaluation", 3),
              **{f"pass {path.stem}": (str(path), "screening", 3) for path in plans}}
    paths = []
    for i, batch in enumerate(evaluation):
        np.savez(work / f"batch{i}.npz", **batch)
        paths.append(str(work / f"batch{i}.npz"))
    spec = {"models": models, "batches": {"screening": paths[:screening_batches(len(paths))], "evaluation": paths}}
    done = subprocess.run([sys.executable, "-c", BARE, json.dumps(spec)], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    pass_runs = [v for k, v in found.items() if k.startswith("pass ")]
    return {"fp32_screening": found["fp32 screening"], "fp32_evaluation": found["fp32 evaluation"],
            "pass_plans_mean": statistics.mean(pass_runs) if pass_runs else None, "pass_plans": len(pass_runs),
            "fp32_session_peak_bytes": found["fp32 session peak bytes"]}


def _interleaved(baseline, info, plans: dict, rounds: int = 3) -> dict | None:
    """The sensitivity pass's work on its plans as the measuring worker does it (each plan lowered, then judged
    from its first changed node on where it can be, all-FP32's tensors captured once a pass), in this process,
    against bare sessions of the same plans (each created from its file, the screening batches run), the two in
    turn, ``rounds`` times, starting with each in turn: their ratio stands on moments a second apart, where the
    search's own figure and the bare one are minutes apart on a machine whose speed moves between them (this VM:
    2× within an hour, 2026-12-01). Not counted: the worker's messages (1-2 ms a plan) and the study's step records."""
    import onnxruntime as ort

    from autoprec.app.resolve import judge_for
    from autoprec.measure.accuracy import resolve_metric
    from autoprec.measure.downstream import Captures
    from autoprec.measure.measurement import Lowering, accuracy_loss, screening_batches

    if not plans:
        return None
    engine, lowering = get_backend("ort-cpu"), Lowering(info, baseline.ranges)
    judge = judge_for(resolve_metric("cosine"), baseline)[0].for_ranking()  # the scale searches' default metric
    evaluation = baseline.dataset.evaluation
    screened = evaluation[:screening_batches(len(evaluation))]

    def autoprec_pass() -> None:
        captures = Captures()
        for plan in plans.values():
            accuracy_loss(engine, lowering(engine, plan), screened, judge, lowering.downstream(engine, captures, screened))

    def bare_pass() -> None:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        for path in plans:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for batch in screened:
                session.run(None, batch)
            del session

    seconds: dict[str, list[float]] = {"autoprec": [], "bare": []}
    for round_ in range(rounds):
        for name, run in [("autoprec", autoprec_pass), ("bare", bare_pass)][:: 1 if round_ % 2 == 0 else -1]:
            started = time.perf_counter()
            run()
            seconds[name].append(round(time.perf_counter() - started, 4))
    return {"rounds": rounds, "plans": len(plans), "pass_seconds": seconds,
            "ratio": round(statistics.median(a / b for a, b in zip(seconds["autoprec"], seconds["bare"])), 3)}


def _trial_seconds(out: Path) -> list[dict]:
    """Where each trial's wall time went, as the study recorded it."""
    import optuna

    storage = f"sqlite:///{out / 'study.db'}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    return [(t.user_attrs.get("measurement") or {}).get("seconds") or {} for t in study.trials
            if "duplicate_of" not in t.user_attrs]


def run_model(name: str, root: Path, budget: int, retime_seconds: float) -> dict:
    generator, arguments, options = MODELS[name]
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"{name.removesuffix('-separate')}.onnx"
    if not model.exists():
        generator(model, **arguments)
    weights = synthetic.weight_bytes(model)
    out = folder / "out"
    pareto, peaks, wall = _search(model, out, _data(model, folder), [*options, "--retime-seconds", str(retime_seconds)],
                                  budget)
    baseline, info, plans = _pass_plans(out, pareto, folder)
    bare = _bare(baseline, info, plans, folder)
    bare_peak = bare.pop("fp32_session_peak_bytes")
    interleaved = _interleaved(baseline, info, plans)
    facts = pareto["search"]
    sensitivity = facts["sensitivity"] or {}
    per_eval = (
        sensitivity["evaluation_seconds"] / sensitivity["evaluations"] if sensitivity.get("evaluations") else None
    )
    # a trial's whole cost but its timing loop (>= 10 runs and 0.2 s, more where noisy): IPC, lowering, session, evaluation
    trial_cost = [s["trial"] - s.get("time", 0.0) for s in _trial_seconds(out) if "trial" in s]
    return {
        "model": {
            "kind": generator.__name__,
            **arguments,
            "weight_bytes": weights,
            "units": pareto["model"]["units"],
            "searchable_units": pareto["model"]["searchable_units"],
            "dimensions": facts.get("dimensions"),
            "options": options,
        },
        "wall_seconds": round(wall, 1),
        "phases_seconds": {
            **facts["one_time_seconds"],
            "trials_and_retiming": round(facts["wall_seconds"] - sum(facts["one_time_seconds"].values()), 2),
        },
        "sensitivity_share_of_wall": round(sensitivity.get("seconds", 0.0) / facts["wall_seconds"], 3)
        if sensitivity
        else None,
        "evaluations": sensitivity.get("evaluations"),
        "seconds_per_evaluation": round(per_eval, 4) if per_eval else None,
        "bare_seconds": {k: round(v, 4) if isinstance(v, float) else v for k, v in bare.items()},
        "evaluation_vs_bare_fp32": round(per_eval / bare["fp32_screening"], 3) if per_eval else None,
        "evaluation_vs_bare_same_plans": round(per_eval / bare["pass_plans_mean"], 3)
        if per_eval and bare["pass_plans_mean"]
        else None,
        "pass_vs_bare_interleaved": interleaved,
        "trial_seconds_but_timing_median": round(statistics.median(trial_cost), 3) if trial_cost else None,
        "trial_vs_bare_fp32": round(statistics.median(trial_cost) / bare["fp32_evaluation"], 3) if trial_cost else None,
        "engine_builds": facts.get("engine_builds"),
        "engine_builds_by_phase": facts.get("engine_builds_by_phase"),
        "retiming": facts.get("retiming"),
        "peak_memory_bytes": peaks,
        "largest_process_vs_weights": round(max(peaks.get("main", 0), peaks.get("worker", 0)) / weights, 3),
        # the engine's own floor: a process holding nothing but a bare FP32 session of the model and its run
        "bare_session_peak_bytes": bare_peak,
        "largest_process_vs_bare_session": round(max(peaks.get("main", 0), peaks.get("worker", 0)) / bare_peak, 3),
        "disk_bytes": {
            "model": sum(disk_bytes(f) for f in folder.glob(f"{model.name}*")),
            "cache": disk_bytes(out / "cache"),
            "best": disk_bytes(out / "best"),
        },
        "chosen_vs_fp32": pareto.get("chosen_vs_fp32"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", choices=list(MODELS), default=list(LADDER),
                        help="default: the whole ladder")
    parser.add_argument("--budget", type=int, default=BUDGET, help=f"trials per search (default {BUDGET})")
    parser.add_argument("--work", type=Path, help="where models and results go (default: a temporary folder)")
    add_retime_argument(parser)
    args = parse_arguments(parser, argv, QUICK)
    root = args.work or Path(tempfile.mkdtemp(prefix="autoprec-scale-"))
    report = Report("scale", args, get_backend("ort-cpu"), budget=args.budget, work=str(root), models={},
                    bare="a plain ONNX Runtime CPU session created from the model's file and the screening batches run "
                         "once, in a fresh process, median of 3",
                    evaluation="one sensitivity evaluation as the search's main process timed it: the plan sent to the "
                               "worker, lowered there, its session created, the screening batches run, the loss "
                               "computed")
    for name in args.models:
        print(f"[{name}] …", file=sys.stderr, flush=True)
        report["models"][name] = run_model(name, root, args.budget, args.retime_seconds)
        report.write()
    if not args.work:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nscale — {report['engine']['engine']} {report['engine']['version']} on {report['engine']['device']}; "
          f"budget {args.budget}; JSON: {report.path}")
    print("ratio fp32: seconds per sensitivity evaluation / bare FP32 session + screening run; ratio same: / the mean "
          "bare cost of the very plans the pass evaluated (the engine's own cost for them); in turn: the pass's work on "
          "those plans / their bare sessions, timed in turn in one process")
    print(
        f"{'model':<20} {'weights':>9} {'units':>6} {'dims':>5} {'wall s':>7} {'sens %':>6} {'evals':>6} {'s/eval':>7} "
        f"{'bare s':>7} {'ratio fp32':>10} {'ratio same':>10} {'in turn':>7} {'main GiB':>8} {'worker GiB':>10} {'max/w':>6} {'cache GB':>8}"
    )
    for name, m in report["models"].items():
        peaks = m["peak_memory_bytes"]
        print(
            f"{name:<20} {m['model']['weight_bytes'] / 1e6:>7.0f}MB {m['model']['searchable_units']:>6} "
            f"{m['model']['dimensions']:>5} {m['wall_seconds']:>7.0f} {100 * (m['sensitivity_share_of_wall'] or 0):>6.0f} "
            f"{m['evaluations'] or 0:>6} {m['seconds_per_evaluation'] or 0:>7.3f} {m['bare_seconds']['fp32_screening']:>7.3f} "
            f"{m['evaluation_vs_bare_fp32'] or 0:>10.2f} {m['evaluation_vs_bare_same_plans'] or 0:>10.2f} "
            f"{(m['pass_vs_bare_interleaved'] or {}).get('ratio', 0):>7.2f} "
            f"{peaks.get('main', 0) / 2**30:>8.2f} {peaks.get('worker', 0) / 2**30:>10.2f} "
            f"{m['largest_process_vs_weights']:>6.2f} {m['disk_bytes']['cache'] / 1e9:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Do autoprec's latencies agree with themselves and with an independent clock?

Per model (a zoo name, or ``PATH.onnx=DATA.npz``), in one run: an ``autoprec search`` (budget 12,
--max-loss 0.01), then the front's plans and all-FP32, each lowered as the search measured it, timed
again in two fresh Python processes:

- independent: nothing of autoprec, plain ``onnxruntime.InferenceSession`` with its defaults (on the
  CUDA provider with IO binding, inputs and outputs on the GPU, synchronised after every run),
  20 warm-up runs, then 10 interleaved rounds of 50 runs per model;
- autoprec's own timer (its runners' ``time``, in the interleaved rounds of ``_harness.time_interleaved``)
  outside the search.

Per plan it reports autoprec's trial median and its re-timed median (the number the choice used)
against the independent per-run median and its p10–p90, the ratios, and whether each autoprec number
falls inside the independent p10–p90; also the mean of back-to-back runs (what a throughput loop
sees). The second process tells a difference in the timer from a difference in the search around it.

    python -m benchmarks timing_agreement [--models ppocr-rec yolov8n] [--backend ort-cpu|ort-cuda] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
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

import autoprec  # noqa: E402
from autoprec.app.recorded import recreate  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.core.plan import Plan  # noqa: E402
from autoprec.core.stored import save_models  # noqa: E402
from autoprec.lower import QDQForm, lower_plan  # noqa: E402
from autoprec.results.files import read_result_dir  # noqa: E402

WARMUP, RUNS = 20, 50
QUICK = {"models": [TINY], "budget": 2, "rounds": 2, "retime_seconds": QUICK_RETIME}

# Runs in a fresh interpreter: onnxruntime and numpy only.
INDEPENDENT = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
spec = json.loads(sys.argv[1])
batch = dict(np.load(spec["batch"]))
cuda = spec["provider"] == "CUDAExecutionProvider"
if cuda:
    ort.preload_dlls()
sessions = {name: ort.InferenceSession(path, providers=[spec["provider"]]) for name, path in spec["models"].items()}
runs = {}
for name, s in sessions.items():
    if cuda:  # inputs and outputs stay on the GPU; the clock stops when the GPU is done
        binding, kept = s.io_binding(), [ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for v in batch.values()]
        for key, value in zip(batch, kept):
            binding.bind_ortvalue_input(key, value)
        for out in s.get_outputs():
            binding.bind_output(out.name, "cuda", 0)
        def run(s=s, binding=binding, kept=kept):
            s.run_with_iobinding(binding)
            binding.synchronize_outputs()
    else:
        def run(s=s):
            s.run(None, batch)
    runs[name] = run
for run in runs.values():
    for _ in range(spec["warmup"]):
        run()
per_run = {name: [] for name in sessions}
back_to_back = {name: [] for name in sessions}
round_ms = {name: [] for name in sessions}
for _ in range(spec["rounds"]):
    for name, run in runs.items():
        t_round = time.perf_counter()
        this_round = []
        for _ in range(spec["runs"]):
            t0 = time.perf_counter()
            run()
            this_round.append((time.perf_counter() - t0) * 1e3)
        per_run[name] += this_round
        round_ms[name].append(float(np.median(this_round)))
        back_to_back[name].append((time.perf_counter() - t_round) * 1e3 / spec["runs"])
print(json.dumps({name: {"median_ms": float(np.median(v)), "p10_ms": float(np.percentile(v, 10)),
                         "p90_ms": float(np.percentile(v, 90)), "runs": len(v), "round_ms": round_ms[name],
                         "back_to_back_mean_ms": float(np.median(back_to_back[name]))} for name, v in per_run.items()}))
"""

# Runs in a fresh interpreter: autoprec's timer, nothing of the search around it.
AUTOPREC_TIMER = r"""
import json, sys, numpy as np
from pathlib import Path
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["benchmarks"])
from _harness import time_interleaved
from autoprec.backends import get_backend
from autoprec.core import stored
batch = dict(np.load(spec["batch"]))
names = list(spec["models"])
timings = time_interleaved(get_backend(spec["backend"]), [stored.load(Path(spec["models"][n])) for n in names], batch,
                           spec["rounds"])
print(json.dumps({n: float(np.median([t.median_ms for t in ts])) for n, ts in zip(names, timings)}))
"""


def fresh_process(script: str, spec: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(spec)], capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_model(name: str, args: argparse.Namespace) -> dict:
    backend, rounds = args.backend, args.rounds
    engine = get_backend(backend)
    model, _, data = name.partition("=")
    model, data, shapes = (model, data, None) if data else model_source(name)
    with tempfile.TemporaryDirectory(prefix="autoprec-timing-") as folder:
        out = Path(folder) / "result"
        autoprec.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(model, data=data, shapes=shapes),
                engine=autoprec.EngineSpec(backend=backend),
                judge=autoprec.JudgeSpec(max_loss=0.01),
                study=autoprec.StudySpec(budget=args.budget),
                isolation=autoprec.IsolationSpec(isolate=args.isolate),
                out=out,
                retime_seconds=args.retime_seconds,
            )
        )
        result = read_result_dir(out)
        pareto = result.pareto.to_json()  # the file as written (the typed value's JSON form)
        fp32 = result.trial(result.pareto.uniform["fp32"]).to_json()
        plans = {f"trial {t['trial']}": t for t in pareto["front"]}
        plans.setdefault(f"trial {fp32['trial']}", fp32)
        baseline, form = recreate(result), QDQForm(result.engine.qdq_form)  # the search's analysis, once
        lowered = {}
        for label, trial in plans.items():
            path = Path(folder) / f"{label.replace(' ', '-')}.onnx"
            lowered[path] = lower_plan(baseline.info, Plan.from_json(trial["plan"]), baseline.ranges, form)
        save_models(lowered)  # self-contained files: the fresh processes load them, weights and all
        models = {label: str(path) for label, path in zip(plans, lowered)}
        models["source"] = str(resolve(name)[0] if "=" not in name else Path(model).resolve())  # the file as given
        models["best"] = str(out / "best" / "model.onnx")  # what the search shipped
        batch_path = Path(folder) / "batch.npz"
        np.savez(batch_path, **baseline.dataset.evaluation[0])  # the batch the search timed
        spec = {"models": models, "batch": str(batch_path), "provider": engine.provider, "backend": backend,
                "warmup": WARMUP, "rounds": rounds, "runs": RUNS, "benchmarks": str(Path(__file__).parent)}
        independent = fresh_process(INDEPENDENT, spec)
        own_timer = fresh_process(AUTOPREC_TIMER, spec)
    rows = {}
    for label, trial in plans.items():
        ind = independent[label]
        trial_ms, retimed = trial["latency_ms"]["median_ms"], trial.get("retimed_ms") or []
        final = statistics.median(retimed) if retimed else None

        def inside(ms):
            return ms is not None and ind["p10_ms"] <= ms <= ind["p90_ms"]

        rows[label] = {
            "counts": trial["plan"]["counts"],
            "loss": trial["accuracy_loss"],
            "autoprec_trial_ms": trial_ms,
            "autoprec_trial_p10_p90": [trial["latency_ms"]["p10_ms"], trial["latency_ms"]["p90_ms"]],
            "autoprec_retimed_ms": final,
            "independent": ind,
            "autoprec_timer_fresh_process_ms": own_timer[label],
            "trial_over_independent": trial_ms / ind["median_ms"],
            "retimed_over_independent": final / ind["median_ms"] if final else None,
            "trial_inside_independent_p10_p90": inside(trial_ms),
            "retimed_inside_independent_p10_p90": inside(final),
        }
    fp32_label = f"trial {fp32['trial']}"
    claims = {"vs_source": (pareto.get("chosen_vs_source"), "source", "best"),
              "vs_fp32": (pareto.get("chosen_vs_fp32"), fp32_label, "best")}
    # a speed-up stated with no interval (all-FP32 chosen with no rival: nothing timed against it) has none to check
    agreement = {key: _agreement(claim, independent[reference]["round_ms"], independent[shipped]["round_ms"])
                 for key, (claim, reference, shipped) in claims.items() if claim and "low" in claim}
    return {"engine_timing": pareto["engine"].get("timing"), "chosen": pareto["chosen"],
            "not_shipped": pareto.get("not_shipped"), "plans": rows, "interval_agreement": agreement,
            "claims_without_interval": [key for key, (claim, _, _) in claims.items() if claim and "low" not in claim]}


def _agreement(claim: dict, reference_rounds: list[float], shipped_rounds: list[float]) -> dict:
    """The independent clock's speed-up (geometric mean of its per-round ratios, and their range) against the
    interval the search claimed: inside it, and inside it widened by 10 % on each side."""
    ratios = np.asarray(reference_rounds) / np.asarray(shipped_rounds)
    independent = float(np.exp(np.log(ratios).mean()))
    low, high = float(claim["low"]), float(claim["high"])
    return {"claimed": {k: claim[k] for k in ("speedup", "low", "high", "confidence", "rounds", "beyond_timing_noise")},
            "independent": independent, "independent_round_range": [float(ratios.min()), float(ratios.max())],
            "inside": low <= independent <= high, "inside_10_percent": low / 1.1 <= independent <= high * 1.1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["ppocr-rec", "yolov8n"])
    parser.add_argument("--backend", default="ort-cpu")
    parser.add_argument("--budget", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of each fresh process's clock")
    parser.add_argument("--no-isolation", dest="isolate", action="store_false",
                        help="search with candidates measured in this process (autoprec search --no-isolation)")
    add_retime_argument(parser)
    args = parse_arguments(parser, argv, QUICK)
    report = Report(
        "timing_agreement", args, get_backend(args.backend),
        budget=args.budget,
        isolated_search=args.isolate,
        independent=f"fresh process, plain onnxruntime defaults (CUDA: IO binding, synchronised per run), "
        f"{WARMUP} warm-up runs, {args.rounds} interleaved rounds of {RUNS} runs per model; per-run wall "
        "time (median, p10-p90) and the mean of back-to-back runs",
        autoprec_timer_fresh_process=f"benchmarks/_harness.time_interleaved (autoprec's runners) in a fresh process, "
        f"{args.rounds} rounds, median of the rounds' medians",
        models={},
    )
    run_models(report, args.models, lambda name: run_model(name, args))
    checks = [
        a for m in report["models"].values() if "interval_agreement" in m for a in m["interval_agreement"].values()
    ]
    report["interval_agreement"] = {"claims": len(checks), "inside": sum(a["inside"] for a in checks),
                                    "inside_10_percent": sum(a["inside_10_percent"] for a in checks)}
    report.write()
    print(
        f"\ntiming agreement — {report['engine']['engine']} {report['engine']['version']} {report['engine']['provider']} "
        f"on {report['engine']['device']}; JSON: {report.path}"
    )
    print(
        f"{'model':<10} {'plan':<10} {'i8/f16/f32':<11} {'trial ms':>9} {'re-timed':>9} {'own timer':>9} {'indep. ms':>9} "
        f"{'indep p10–p90':>15} {'b2b mean':>9} {'trial/ind':>9} {'retime/ind':>10}  inside p10–p90 (trial, re-timed)"
    )
    for name, m in report["models"].items():
        for label, r in m["plans"].items():
            c, ind = r["counts"], r["independent"]
            retimed = f"{r['autoprec_retimed_ms']:.3f}" if r["autoprec_retimed_ms"] else "—"
            ratio = f"{r['retimed_over_independent']:.2f}" if r["retimed_over_independent"] else "—"
            print(
                f"{Path(name.partition('=')[0]).stem:<10} {label:<10} {c['int8']}/{c['fp16']}/{c['fp32']:<6} "
                f"{r['autoprec_trial_ms']:>9.3f} {retimed:>9} {r['autoprec_timer_fresh_process_ms']:>9.3f} "
                f"{ind['median_ms']:>9.3f} {ind['p10_ms']:>7.3f}–{ind['p90_ms']:<7.3f} {ind['back_to_back_mean_ms']:>9.3f} "
                f"{r['trial_over_independent']:>9.2f} {ratio:>10}  {r['trial_inside_independent_p10_p90']}, "
                f"{r['retimed_inside_independent_p10_p90']}"
            )
    print(f"\nclaimed speed-up intervals against an independent interleaved clock ({args.rounds} rounds, plain onnxruntime)")
    print(f"{'model':<10} {'against':<10} {'claimed':<26} {'independent':>11} {'its rounds':>13}  inside  inside ±10 %")
    for name, m in report["models"].items():
        for key, a in m.get("interval_agreement", {}).items():
            c = a["claimed"]
            claimed = f"{c['speedup']:.2f}× ({c['low']:.2f}–{c['high']:.2f}, {c['rounds']} r)"
            lo, hi = a["independent_round_range"]
            print(
                f"{Path(name.partition('=')[0]).stem:<10} {key.removeprefix('vs_'):<10} {claimed:<26} {a['independent']:>10.2f}× "
                f"{lo:>6.2f}–{hi:<6.2f}  {str(a['inside']):<6}  {a['inside_10_percent']}"
            )
    agreement = report["interval_agreement"]
    print(f"independent ratio inside the claimed interval: {agreement['inside']} of {agreement['claims']}; "
          f"inside it ±10 %: {agreement['inside_10_percent']} of {agreement['claims']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

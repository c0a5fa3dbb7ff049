"""Do autoprec's latencies agree with themselves and with an independent clock?

Per zoo model, in one run: an ``autoprec search`` (ONNX Runtime, CPU provider by default; budget 12,
--max-loss 0.01), then the front's plans and all-FP32, each lowered as the search measured it, timed
again in a fresh Python process that uses nothing of autoprec: plain ``onnxruntime.InferenceSession``
with its defaults, 20 warm-up runs, then 10 interleaved rounds of 50 runs per model. Per plan it
reports autoprec's trial median and its re-timed median (the number the choice used) against the
independent per-run median and its p10–p90, the ratios, and whether each autoprec number falls
inside the independent p10–p90; also the mean of back-to-back runs (what a throughput loop sees).

    python benchmarks/timing_agreement.py [--models ppocr-rec yolov8n] [--backend ort-cpu]
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
from _harness import machine_facts, run_models  # noqa: E402

import autoprec  # noqa: E402
from autoprec.api import recreate  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.lower import QDQForm, lower_plan  # noqa: E402
from autoprec.plan import Plan  # noqa: E402
from autoprec.results import read_result_dir  # noqa: E402

WARMUP, ROUNDS, RUNS = 20, 10, 50

# Runs in a fresh interpreter: onnxruntime and numpy only.
INDEPENDENT = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
spec = json.loads(sys.argv[1])
batch = dict(np.load(spec["batch"]))
providers = [spec["provider"]]
sessions = {name: ort.InferenceSession(path, providers=providers) for name, path in spec["models"].items()}
for s in sessions.values():
    for _ in range(spec["warmup"]):
        s.run(None, batch)
per_run = {name: [] for name in sessions}
back_to_back = {name: [] for name in sessions}
for _ in range(spec["rounds"]):
    for name, s in sessions.items():
        t_round = time.perf_counter()
        for _ in range(spec["runs"]):
            t0 = time.perf_counter()
            s.run(None, batch)
            per_run[name].append((time.perf_counter() - t0) * 1e3)
        back_to_back[name].append((time.perf_counter() - t_round) * 1e3 / spec["runs"])
print(json.dumps({name: {"median_ms": float(np.median(v)), "p10_ms": float(np.percentile(v, 10)),
                         "p90_ms": float(np.percentile(v, 90)), "runs": len(v),
                         "back_to_back_mean_ms": float(np.median(back_to_back[name]))} for name, v in per_run.items()}))
"""


def run_model(name: str, backend: str, budget: int) -> dict:
    engine = get_backend(backend)
    with tempfile.TemporaryDirectory(prefix="autoprec-timing-") as folder:
        out = Path(folder) / "result"
        autoprec.search(f"zoo:{name}", budget=budget, out=out, backend=backend, max_loss=0.01, progress=False)
        result = read_result_dir(out)
        fp32 = result.trial(result.pareto["uniform"]["fp32"])
        plans = {f"trial {t['trial']}": t for t in result.pareto["front"]}
        plans.setdefault(f"trial {fp32['trial']}", fp32)
        prepared, form = recreate(result), QDQForm(result.pareto["engine"]["qdq_form"])  # the search's analysis, once
        models = {}
        for label, trial in plans.items():
            path = Path(folder) / f"{label.replace(' ', '-')}.onnx"
            path.write_bytes(lower_plan(prepared.info, Plan.from_json(trial["plan"]), prepared.ranges, form).SerializeToString())
            models[label] = str(path)
        batch_path = Path(folder) / "batch.npz"
        np.savez(batch_path, **prepared.dataset.evaluation[0])  # the batch the search timed
        spec = {"models": models, "batch": str(batch_path), "provider": engine.provider, "warmup": WARMUP,
                "rounds": ROUNDS, "runs": RUNS}
        proc = subprocess.run([sys.executable, "-c", INDEPENDENT, json.dumps(spec)], capture_output=True, text=True,
                              timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        independent = json.loads(proc.stdout)
    rows = {}
    for label, trial in plans.items():
        ind = independent[label]
        trial_ms, retimed = trial["latency_ms"]["median_ms"], trial.get("retimed_ms") or []
        final = statistics.median(retimed) if retimed else None

        def inside(ms):
            return ms is not None and ind["p10_ms"] <= ms <= ind["p90_ms"]

        rows[label] = {
            "counts": trial["plan"]["counts"], "loss": trial["accuracy_loss"],
            "autoprec_trial_ms": trial_ms, "autoprec_trial_p10_p90": [trial["latency_ms"]["p10_ms"], trial["latency_ms"]["p90_ms"]],
            "autoprec_retimed_ms": final, "independent": ind,
            "trial_over_independent": trial_ms / ind["median_ms"],
            "retimed_over_independent": final / ind["median_ms"] if final else None,
            "trial_inside_independent_p10_p90": inside(trial_ms), "retimed_inside_independent_p10_p90": inside(final),
        }
    return {"engine_timing": result.pareto["engine"].get("timing"), "chosen": result.pareto["chosen"], "plans": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["ppocr-rec", "yolov8n"])
    parser.add_argument("--backend", default="ort-cpu")
    parser.add_argument("--budget", type=int, default=12)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "timing_agreement.json")
    args = parser.parse_args(argv)
    report = {**machine_facts(get_backend(args.backend)), "budget": args.budget,
              "independent": f"fresh process, plain onnxruntime defaults, {WARMUP} warm-up runs, {ROUNDS} interleaved "
                             f"rounds of {RUNS} runs per model; per-run wall time (median, p10-p90) and the mean of "
                             "back-to-back runs", "models": {}}
    run_models(report, args.models, lambda name: run_model(name, args.backend, args.budget), args.json)
    print(f"\ntiming agreement — {report['engine']['engine']} {report['engine']['version']} {report['engine']['provider']} "
          f"on {report['engine']['device']}; JSON: {args.json}")
    print(f"{'model':<10} {'plan':<10} {'i8/f16/f32':<11} {'trial ms':>9} {'re-timed':>9} {'indep. ms':>9} "
          f"{'indep p10–p90':>15} {'b2b mean':>9} {'trial/ind':>9} {'retime/ind':>10}  inside p10–p90 (trial, re-timed)")
    for name, m in report["models"].items():
        for label, r in m["plans"].items():
            c, ind = r["counts"], r["independent"]
            retimed = f"{r['autoprec_retimed_ms']:.3f}" if r["autoprec_retimed_ms"] else "—"
            ratio = f"{r['retimed_over_independent']:.2f}" if r["retimed_over_independent"] else "—"
            print(f"{name:<10} {label:<10} {c['int8']}/{c['fp16']}/{c['fp32']:<6} {r['autoprec_trial_ms']:>9.3f} {retimed:>9} "
                  f"{ind['median_ms']:>9.3f} {ind['p10_ms']:>7.3f}–{ind['p90_ms']:<7.3f} {ind['back_to_back_mean_ms']:>9.3f} "
                  f"{r['trial_over_independent']:>9.2f} {ratio:>10}  {r['trial_inside_independent_p10_p90']}, "
                  f"{r['retimed_inside_independent_p10_p90']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can the session that profiled a plan also time it? ONNX Runtime: a profiled session against a plain one.

The sensitivity pass profiles the all-FP32 model and each all-units plan; those plans are also the
study's first trials. On TensorRT the profile's engine is kept and the trial times it (a fresh
execution context, one build). On ONNX Runtime profiling is a session option: a session created with
``enable_profiling`` is profiled for 10 runs, ``end_profiling()`` is called, and then it is timed
as a trial would be — beside a plain session of the same model, alternately (``--rounds`` rounds,
each the median of ``--runs`` runs, after warm-up), two of each kind so that the difference between
two sessions of one kind shows the noise. Reported: each session's median over rounds and the
ratio profiled / plain. A ratio above the plain pair's own disagreement means the profiled session
would bias the trial, so ONNX Runtime builds the trial a session of its own.

    python benchmarks/profiled_sessions.py [--models ppocr-cls magika]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine_facts, prepare_zoo, run_models  # noqa: E402

from autoprec.backends.onnxruntime import new_session  # noqa: E402

MODELS = ("ppocr-cls", "magika", "yolov8n", "ppocr-rec")
KINDS = ("profiled A", "plain A", "profiled B", "plain B")


def run_model(name: str, rounds: int, runs: int) -> dict:
    baseline, backend = prepare_zoo(name)
    batch = baseline.dataset.evaluation[0]
    with tempfile.TemporaryDirectory(prefix="autoprec-profiled-") as folder:
        sessions = {}
        for kind in KINDS:
            options = backend.session_options()
            if kind.startswith("profiled"):
                options.enable_profiling = True
                options.profile_file_prefix = os.path.join(folder, kind.replace(" ", "-"))
            sessions[kind], _ = new_session(onnxruntime, baseline.info.stored, options,
                                            backend.session_providers())
            if kind.startswith("profiled"):
                for _ in range(11):  # what the sensitivity pass's profile runs
                    sessions[kind].run(None, batch)
                sessions[kind].end_profiling()
        for session in sessions.values():
            for _ in range(5):
                session.run(None, batch)
        medians: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(rounds):
            for kind, session in sessions.items():  # alternate, so drift hits every session alike
                samples = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    session.run(None, batch)
                    samples.append(time.perf_counter() - t0)
                medians[kind].append(statistics.median(samples) * 1e3)
    ms = {kind: statistics.median(v) for kind, v in medians.items()}
    profiled, plain = (ms["profiled A"] + ms["profiled B"]) / 2, (ms["plain A"] + ms["plain B"]) / 2
    return {
        "median_ms": {kind: round(v, 4) for kind, v in ms.items()},
        "profiled_over_plain": round(profiled / plain, 4),
        "plain_b_over_plain_a": round(ms["plain B"] / ms["plain A"], 4),
        "profiled_b_over_profiled_a": round(ms["profiled B"] / ms["profiled A"], 4),
        "rounds_ms": {kind: [round(x, 4) for x in v] for kind, v in medians.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "profiled_sessions.json")
    args = parser.parse_args(argv)
    from autoprec.backends import get_backend

    report = {**machine_facts(get_backend("ort-cpu")), "rounds": args.rounds, "runs_per_round": args.runs, "models": {}}
    run_models(report, args.models, lambda name: run_model(name, args.rounds, args.runs), args.json)
    engine = report["engine"]
    print(
        f"\nprofiled vs plain sessions — {engine['engine']} {engine['version']} {engine['provider']} on {engine['device']}; "
        f"{args.rounds} alternating rounds × median of {args.runs} runs; JSON: {args.json}"
    )
    print(
        f"{'model':<11} {'profiled A':>11} {'plain A':>9} {'profiled B':>11} {'plain B':>9} {'profiled/plain':>15} {'plain B/A':>10}"
    )
    for name, m in report["models"].items():
        ms = m["median_ms"]
        print(
            f"{name:<11} {ms['profiled A']:>11.3f} {ms['plain A']:>9.3f} {ms['profiled B']:>11.3f} {ms['plain B']:>9.3f} "
            f"{m['profiled_over_plain']:>15.3f} {m['plain_b_over_plain_a']:>10.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

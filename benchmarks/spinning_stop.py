"""ONNX Runtime's threads spinning after a run, and what they do to interleaved timing: plain sessions (a user's
``SessionOptions()``) beside autoprec's (``quiet_session_options``: ``session.force_spinning_stop``), alternating.

Per model (the prepared all-FP32 model and its all-INT8 plan, as a search lowers them), per arm, ``--repeats`` times:

- the CPU seconds the process spends in the 0.1 s after one run while its thread does nothing (the pool spinning);
- all-FP32 timed alone: ``--turns`` turns (one warm-up run, then runs for ``--turn-seconds``; the turn's median), each
  after 0.1 s idle, so no other session's threads spin into it: a deployment's steady latency;
- all-FP32 and all-INT8 timed in interleaved turns, back to back, as the re-timing and the final timing time plans:
  each model's median and its turns' slowest over fastest, and INT8's speed-up over FP32 by round.

    python -m benchmarks spinning_stop [--zoo yolov8n ppocr-rec magika] [--turns 8] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _harness import TINY, Report, parse_arguments, prepare_zoo, run_models  # noqa: E402

from autoprec.analysis.preparation import quiet_session_options  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402
from autoprec.measure.measurement import Lowering  # noqa: E402
from autoprec.measure.speedup import in_turn  # noqa: E402

QUICK = {"zoo": [TINY], "turns": 2, "repeats": 1, "turn_seconds": 0.05}
IDLE = 0.1  # seconds: longer than a spinning pool's ~40 ms after a run (measured here as spin_cpu_s)


def plain_options():
    import onnxruntime

    return onnxruntime.SessionOptions()


ARMS = {"plain": plain_options, "autoprec": quiet_session_options}


def turn_ms(run, seconds: float) -> float:
    """One turn: a warm-up run, then runs for ``seconds``; their median (ms)."""
    run()
    times, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds or len(times) < 3:
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def spin_cpu_s(run) -> float:
    """The process's CPU seconds in the IDLE seconds after one run, its thread asleep: the pool's spinning."""
    run()
    cpu = time.process_time()
    time.sleep(IDLE)
    return time.process_time() - cpu


def arm_figures(runs: dict, args: argparse.Namespace) -> dict:
    """One arm's figures for one repeat (see the module's docstring)."""
    spin = statistics.median(spin_cpu_s(runs["fp32"]) for _ in range(3))
    alone = []
    for _ in range(args.turns):
        time.sleep(IDLE)
        alone.append(turn_ms(runs["fp32"], args.turn_seconds))
    paired: dict[str, list[float]] = {"fp32": [], "int8": []}
    time.sleep(IDLE)
    for round_ in range(args.turns):
        for name in in_turn(list(paired), round_):
            paired[name].append(turn_ms(runs[name], args.turn_seconds))
    return {"spin_cpu_s": round(spin, 4), "alone_ms": [round(x, 3) for x in alone],
            "interleaved_ms": {k: [round(x, 3) for x in v] for k, v in paired.items()},
            "speedups": [round(f / i, 4) for f, i in zip(paired["fp32"], paired["int8"])]}


def summary(repeats: list[dict]) -> dict:
    def spread(values: list[float]) -> float:
        return round(max(values) / min(values), 3)

    alone = [x for r in repeats for x in r["alone_ms"]]
    fp32 = [x for r in repeats for x in r["interleaved_ms"]["fp32"]]
    speedups = [x for r in repeats for x in r["speedups"]]
    return {"spin_cpu_s": statistics.median(r["spin_cpu_s"] for r in repeats),
            "alone_median_ms": round(statistics.median(alone), 3), "alone_spread": spread(alone),
            "interleaved_fp32_median_ms": round(statistics.median(fp32), 3), "interleaved_fp32_spread": spread(fp32),
            "interleaved_over_alone": round(statistics.median(fp32) / statistics.median(alone), 3),
            "int8_speedup_median": round(statistics.median(speedups), 3), "int8_speedup_spread": spread(speedups)}


def one_model(name: str, args: argparse.Namespace) -> dict:
    import onnxruntime

    baseline, backend = prepare_zoo(name)
    info = baseline.info
    lowering = Lowering(info, baseline.ranges)
    int8 = frozenset(u.name for u in info.searchable_units if Precision.INT8 in u.allowed)
    models = {"fp32": lowering(backend, info.plan_at(Precision.FP32)),
              "int8": lowering(backend, info.plan_at(Precision.INT8, int8))}
    feeds = baseline.dataset.evaluation[0]
    found: dict[str, list] = {arm: [] for arm in ARMS}
    with contextlib.ExitStack() as stack:
        sessions = {}
        for arm, options in ARMS.items():
            for key, model in models.items():
                path = stack.enter_context(model.file())
                session = onnxruntime.InferenceSession(str(path), options(), providers=["CPUExecutionProvider"])
                wanted = {i.name for i in session.get_inputs()}
                batch = {k: v for k, v in feeds.items() if k in wanted}
                sessions[arm, key] = lambda s=session, b=batch: s.run(None, b)
        for repeat in range(args.repeats):
            for arm in in_turn(list(ARMS), repeat):
                print(f"[{name}] repeat {repeat + 1}/{args.repeats}: {arm} sessions …", file=sys.stderr, flush=True)
                found[arm].append(arm_figures({k: sessions[arm, k] for k in models}, args))
    return {"int8_units": len(int8), "repeats": found, "summary": {arm: summary(r) for arm, r in found.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", nargs="+", default=["yolov8n", "ppocr-rec", "magika"])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--turn-seconds", type=float, default=0.2)
    args = parse_arguments(parser, argv, QUICK)
    from autoprec.backends import get_backend

    report = Report("spinning_stop", args, get_backend("ort-cpu"), models={})
    run_models(report, args.zoo, lambda name: one_model(name, args))
    print(f"\n{report['machine']}: default threads, turns of {args.turn_seconds:g} s, {args.repeats} repeats")
    for name, found in report["models"].items():
        for arm, s in found["summary"].items():
            print(f"{name:<12} {arm:<9} spin after a run {s['spin_cpu_s']:.3f} CPU s | FP32 alone {s['alone_median_ms']} ms "
                  f"(turns ×{s['alone_spread']}) | interleaved {s['interleaved_fp32_median_ms']} ms "
                  f"(×{s['interleaved_fp32_spread']}, {s['interleaved_over_alone']}× alone) | INT8 speed-up "
                  f"{s['int8_speedup_median']} (rounds ×{s['int8_speedup_spread']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

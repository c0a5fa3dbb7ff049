"""Does a speed-up autoprec records hold for the plain session a user builds? (issue 69)

A mixed FP16/FP32 plan of a small conv net (tests/builders.py) against all-FP32, on ONNX Runtime's
CPU provider with one thread: autoprec's final timing (``speedup.time_until_known``, the sessions
autoprec builds) beside an independent clock in the same run: plain
``onnxruntime.InferenceSession``s of the same two files with default options (one intra-op thread),
timed in interleaved rounds of back-to-back runs, the ratio the geometric mean of the rounds' median
ratios; and the same clock with the plan's session built with NchwcTransformer off, as autoprec
built its sessions of every FP16 graph before issue 69 (all-FP32's kept it).

    python -m benchmarks plain_session [--size 64] [--rounds 10] [--runs 50] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
from pathlib import Path

import onnxruntime

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import builders  # noqa: E402
from _harness import Report, parse_arguments, plain_run_ms  # noqa: E402

from autoprec.analysis.baseline import load_baseline  # noqa: E402
from autoprec.analysis.data import Workload  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402
from autoprec.core.search_space import load_search_space  # noqa: E402
from autoprec.measure import speedup  # noqa: E402
from autoprec.measure.measurement import Lowering  # noqa: E402

QUICK = {"size": 16, "rounds": 2, "runs": 5, "seconds": 0.5}


def plain_ratio(
    models: dict, batch: dict, rounds: int, runs: int, left_off: dict[str, list[str]]
) -> dict:
    """all-FP32 over the plan, from plain sessions (``left_off``: each model's optimizers disabled)
    in interleaved rounds."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {}
    with contextlib.ExitStack() as stack:
        for name, model in models.items():
            path = stack.enter_context(model.file())
            sessions[name] = onnxruntime.InferenceSession(
                str(path),
                options,
                providers=["CPUExecutionProvider"],
                disabled_optimizers=left_off.get(name, []),
            )
    ms: dict[str, list[float]] = {name: [] for name in sessions}
    for round_ in range(rounds):
        for name in speedup.in_turn(list(sessions), round_):
            times = plain_run_ms(sessions[name], batch, 5, runs)
            ms[name].append(statistics.median(times))
    ratios = [f / c for f, c in zip(ms["fp32"], ms["chosen"])]
    return {
        "ratio": math.exp(statistics.fmean(math.log(r) for r in ratios)),
        "rounds_ms": ms,
        "round_ratios": [round(r, 4) for r in ratios],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parse_arguments(parser, argv, QUICK)
    backend = get_backend("ort-cpu", threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = builders.save(builders.conv_net(size=args.size), Path(tmp) / "conv.onnx")
        baseline = load_baseline(path, load_search_space(), None, None)
        info = baseline.info
        half = [u.name for u in info.units if Precision.FP16 in u.allowed][
            ::2
        ]  # every other unit: a mixed plan
        lowering, batch = Lowering(info, baseline.ranges), baseline.dataset.evaluation[0]
        models = {
            "fp32": lowering(backend, info.plan_at(Precision.FP32)),
            "chosen": lowering(backend, info.plan_at(Precision.FP16, half)),
        }
        rounds = speedup.time_until_known(
            backend, models, Workload.of(batch), [("fp32", "chosen")], args.seconds
        )
        claim = rounds.speedup("fp32", "chosen")
        plain = plain_ratio(models, batch, args.rounds, args.runs, {})
        old = plain_ratio(models, batch, args.rounds, args.runs, {"chosen": ["NchwcTransformer"]})
    report = Report(
        "plain_session", args, backend,
        model=f"builders.conv_net(size={args.size})",
        fp16_units=half,
        units=[u.name for u in info.units],
        recorded=claim.to_json(),
        recorded_left_off=[],
        plain=plain,
        nchwc_off=old,
        plain_over_recorded=plain["ratio"] / claim.speedup,
        within_10_percent=abs(plain["ratio"] / claim.speedup - 1) <= 0.10,
        load=rounds.steadiness().to_json(),
    )
    report.write()
    print(
        f"recorded {claim.text()}; plain sessions {plain['ratio']:.3f}× "
        f"(ratio {report['plain_over_recorded']:.3f}); "
        f"the plan's session with NchwcTransformer off (before issue 69) {old['ratio']:.3f}×"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

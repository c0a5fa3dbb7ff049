"""The final timing's stopping rule replayed on blocks collected once, per tolerance of all-FP32's level moving
between sessions: how often it calls a plan faster than itself (A/A), how often it finds a real gain (A/B), and how
many blocks and seconds it takes.

Per model, one collection of ``--blocks`` blocks as the final timing runs one (autoprec.measure.speedup): every
model's session built anew in the block's turn order and run once, then two interleaved rounds of ``TURN`` runs,
the cores other processes used alongside. Four models: all-FP32, all-FP32 lowered again (the A/A twin), all-FP32
slowed by Mul pairs to about ``--gain`` (a_over_a.py's A/B) and the given model. Then, per tolerance,
``--replays`` final timings replayed on them: the blocks in a shuffled order, each fed as the final timing runs it
(its second round only where all-FP32's level had moved past the tolerance, or the machine was busy), stopped where
``speedup.known`` stops one, or where ``--seconds`` of the blocks' own measured seconds passed and the intervals
are bounded. A shuffle treats the blocks as exchangeable, which is what a quiet machine's sessions are: what the
tolerance also guards against, a load that comes and goes during the timing, a replay does not test (a_over_a.py
--hog does).

    python -m benchmarks timing_blocks [--zoo yolov8n ppocr-rec] [--batch 32] [--cuda] [--blocks 20]
        [--tolerances 0.1 0.2 0.3] [--replays 400] [--json PATH]
    python -m benchmarks timing_blocks --again COLLECTED.json --tolerances ... --seconds ... --json PATH

With ``--reduced fp16`` a fifth model is timed in every block, the plan with every unit that may take FP16 at it, and
its final timings beside all-FP32 replayed too: how far a reduced plan's own sessions differ, and how many blocks a
final timing needs to decide it. ``--aged N`` builds and runs N sessions of one-unit plans before the collection: a
process as old as a search's measuring worker is by its final timing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import TINY, Report, parse_arguments, prepare_zoo  # noqa: E402
from a_over_a import calibrated_extra, slowed  # noqa: E402
from gpu import batch_data  # noqa: E402

from autoprec.analysis.baseline import load_baseline  # noqa: E402
from autoprec.analysis.data import Workload  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402
from autoprec.core.search_space import load_search_space  # noqa: E402
from autoprec.core.stored import StoredModel  # noqa: E402
from autoprec.core.timing import TURN, Timing  # noqa: E402
from autoprec.measure import speedup  # noqa: E402
from autoprec.measure.measurement import Lowering  # noqa: E402
from autoprec.measure.workload import time_work, warm_up  # noqa: E402
from autoprec.record import verdict  # noqa: E402

QUICK = {"zoo": [TINY], "blocks": 4, "replays": 20, "gain": 1.5, "seconds": 0.5}
A_A = ({"fp32": "fp32", "chosen": "twin", "source": "source"}, speedup.COMPARED)
A_B = ({"fp32": "slowed", "chosen": "fp32"}, (("fp32", "chosen"),))
REDUCED = ({"fp32": "fp32", "chosen": "reduced", "source": "source"}, speedup.COMPARED)


def collected(backend, models: dict[str, StoredModel], work: Workload, count: int) -> list[dict]:
    """``count`` blocks, each: every model's two rounds (Timings), the cores others used, and the seconds of its
    build and first round, and of its second round."""
    blocks = []
    for block in range(count):
        probe = speedup.LoadProbe()
        probe.start()
        started = time.monotonic()
        rounds: dict[str, list] = {name: [] for name in models}
        with contextlib.ExitStack() as stack:
            kept = {}
            for name in speedup.in_turn(list(models), block):
                kept[name] = stack.enter_context(backend.runner(models[name]))
                warm_up(kept[name], work)
            seconds = []
            for turn in range(verdict.BUSY_ROUNDS_PER_BLOCK):
                for name in speedup.in_turn(list(models), 2 * block + turn):
                    rounds[name].append(time_work(kept[name], work, TURN)[0])
                seconds.append(time.monotonic() - started)
                started = time.monotonic()
        blocks.append({"rounds": rounds, "load": probe.others(), "seconds": seconds})
        print(f"  block {block + 1}/{count}: all-FP32 {rounds['fp32'][0].p10_ms:.3f} ms, {sum(seconds):.1f} s",
              file=sys.stderr, flush=True)
    return blocks


def replayed(blocks: list[dict], order: list[int], names: dict[str, str], pairs, seconds: float) -> dict:
    """One final timing replayed on ``blocks`` in ``order`` (its models named as the final timing names them:
    ``names``), where it stops."""
    timings = {name: [] for name in names}
    ids, load, elapsed = [], [], 0.0
    found = verdict.Rounds({name: () for name in names}, ())
    for n, index in enumerate(order):
        block = blocks[index]
        busy = block["load"] is None or block["load"] > verdict.BUSY
        turns = verdict.BUSY_ROUNDS_PER_BLOCK if (found.steadiness().moved or busy) else verdict.ROUNDS_PER_BLOCK
        for turn in range(turns):
            for name, source in names.items():
                timings[name].append(block["rounds"][source][turn])
            ids.append(n)
            elapsed += block["seconds"][turn]
        load.append(block["load"])
        found = verdict.Rounds({k: tuple(v) for k, v in timings.items()}, tuple(ids), tuple(load))
        timed_out = n + 1 >= speedup.MIN_BLOCKS and elapsed > seconds
        if speedup.known(found, pairs, [("fp32", "chosen")]) or (timed_out and speedup.bounded(found, pairs)):
            break
    claim = found.speedup("fp32", "chosen")
    return {"faster": claim.low > 1, "slower": claim.high < 1, "blocks": n + 1, "seconds": elapsed,
            "ran_out": n + 1 == len(order), "moved": found.steadiness().moved, "width": claim.high / claim.low - 1}


def replays(blocks: list[dict], tolerance: float, count: int, seconds: float) -> dict:
    """``count`` A/A and as many A/B final timings replayed at ``tolerance`` (the same shuffles for each
    tolerance)."""
    shuffles = np.random.default_rng(0)
    aa, ab, reduced = [], [], []
    # the tolerance is verdict's constant, read wherever a final timing asks whether the level moved
    with mock.patch.object(verdict, "LEVEL_MOVED", tolerance):
        for _ in range(count):
            order = [int(i) for i in shuffles.permutation(len(blocks))]
            aa.append(replayed(blocks, order, A_A[0], A_A[1], seconds))
            ab.append(replayed(blocks, order, A_B[0], A_B[1], seconds))
            if "reduced" in blocks[0]["rounds"]:
                reduced.append(replayed(blocks, order, REDUCED[0], REDUCED[1], seconds))
    found = {"reduced_faster": sum(r["faster"] for r in reduced), "reduced_slower": sum(r["slower"] for r in reduced),
             "reduced_median_blocks": statistics.median(r["blocks"] for r in reduced),
             "reduced_median_seconds": round(statistics.median(r["seconds"] for r in reduced), 2),
             "reduced_median_width": round(statistics.median(r["width"] for r in reduced), 4)} if reduced else {}
    return {"tolerance": tolerance, "replays": count, **found,
            "aa_faster": sum(r["faster"] for r in aa), "aa_slower": sum(r["slower"] for r in aa),
            "aa_moved": sum(r["moved"] for r in aa), "aa_ran_out": sum(r["ran_out"] for r in aa),
            "aa_median_blocks": statistics.median(r["blocks"] for r in aa),
            "aa_median_seconds": round(statistics.median(r["seconds"] for r in aa), 2),
            "aa_median_width": round(statistics.median(r["width"] for r in aa), 4),
            "ab_found": sum(r["faster"] for r in ab), "ab_median_blocks": statistics.median(r["blocks"] for r in ab),
            "ab_median_seconds": round(statistics.median(r["seconds"] for r in ab), 2)}


def aged(backend, info, lowering: Lowering, batch, sessions: int) -> None:
    """This process made to have built and run ``sessions`` sessions of other plans first (each unit at each
    precision alone, in turn), as a search's measuring worker has by its final timing."""
    plans = [info.plan_at(precision, [unit.name]) for unit in info.searchable_units for precision in unit.allowed
             if precision is not Precision.FP32]
    for i in range(sessions if plans else 0):
        with backend.runner(lowering(backend, plans[i % len(plans)])) as runner:
            runner.run(batch)


def one_model(name: str, args: argparse.Namespace, backend, folder: Path) -> dict:
    if args.batch:
        model, data, shapes = batch_data(name, args.batch, folder)
        baseline = load_baseline(model, load_search_space(), data, shapes)
    else:
        baseline = prepare_zoo(name)[0]
    info = baseline.info
    lowering, plan = Lowering(info, baseline.ranges), info.plan_at(Precision.FP32)
    batch = baseline.dataset.evaluation[0]
    fp32 = lowering(backend, plan)
    extra = calibrated_extra(backend, fp32, batch, args.gain)
    models = {"fp32": fp32, "twin": lowering(backend, plan), "slowed": slowed(fp32, extra),
              "source": StoredModel(info.source, info.folder) if info.source is not None else fp32}
    if args.reduced:  # every unit that may take it at that precision: a plan whose sessions may differ more
        precision = Precision(args.reduced)
        models["reduced"] = lowering(backend, info.plan_at(
            precision, frozenset(u.name for u in info.searchable_units if precision in u.allowed)))
    aged(backend, info, lowering, batch, args.aged)
    print(f"[{name}] {args.blocks} blocks on {backend.info().label()} …", file=sys.stderr, flush=True)
    blocks = collected(backend, models, Workload.of(batch), args.blocks)
    levels = [min(t.p10_ms for t in b["rounds"]["fp32"]) for b in blocks]
    gain = statistics.median(min(t.p10_ms for t in b["rounds"]["slowed"]) / level for b, level in zip(blocks, levels))
    reduced = [min(t.p10_ms for t in b["rounds"]["reduced"]) for b in blocks] if args.reduced else []
    return {"model": name, "batch": args.batch, "aged_sessions": args.aged, "extra_mul_pairs": extra,
            "ab_gain": round(gain, 4),
            "fp32_levels_ms": [round(v, 4) for v in levels],
            "fp32_level_spread": round(max(levels) / min(levels) - 1, 4),
            **({"reduced": args.reduced, "reduced_levels_ms": [round(v, 4) for v in reduced],
                "reduced_level_spread": round(max(reduced) / min(reduced) - 1, 4),
                "reduced_speedups": [round(a / b, 4) for a, b in zip(levels, reduced)]} if reduced else {}),
            "others_cores": [b["load"] for b in blocks],
            "block_seconds": [[round(s, 3) for s in b["seconds"]] for b in blocks],
            "rules": [replays(blocks, t, args.replays, args.seconds) for t in args.tolerances],
            "blocks": [{"load": b["load"], "seconds": b["seconds"],
                        "rounds": {k: [t.to_json() for t in v] for k, v in b["rounds"].items()}} for b in blocks]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", nargs="+", default=["yolov8n", "ppocr-rec"])
    parser.add_argument("--batch", type=int, default=None, help="the zoo data at this batch (benchmarks/gpu.py's)")
    parser.add_argument("--cuda", action="store_true", help="ort-cuda instead of ort-cpu")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--tolerances", type=float, nargs="+", default=[verdict.LEVEL_MOVED, 0.2, 0.3, 1e9])
    parser.add_argument("--replays", type=int, default=400)
    parser.add_argument("--gain", type=float, default=1.15)
    parser.add_argument("--seconds", type=float, default=20.0, help="the final timing's seconds")
    parser.add_argument("--again", type=Path, metavar="JSON", help="replay the blocks an earlier run collected")
    parser.add_argument("--aged", type=int, default=0, metavar="N",
                        help="build and run N sessions of one-unit plans first, as a search's worker has")
    parser.add_argument("--reduced", choices=["fp16", "bf16", "int8"], default=None,
                        help="also time the plan with every unit that may take this precision at it (model 'reduced')")
    args = parse_arguments(parser, argv, QUICK)
    backend = get_backend("ort-cuda" if args.cuda else "ort-cpu")
    report = Report("timing_blocks", args, backend, level_moved=verdict.LEVEL_MOVED, min_blocks=speedup.MIN_BLOCKS,
                    models=[])
    if args.again:
        report.update({k: v for k, v in json.loads(args.again.read_text()).items() if k != "arguments"},
                      replayed_from=args.again.name, arguments=report["arguments"])
        for model in report["models"]:
            blocks = [{**b, "rounds": {k: [Timing.from_json(t) for t in v] for k, v in b["rounds"].items()}}
                      for b in model["blocks"]]
            model["rules"] = [replays(blocks, t, args.replays, args.seconds) for t in args.tolerances]
        report.write()
        print_table(report)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.zoo:
            report["models"].append(one_model(name, args, backend, Path(tmp)))
            report.write()
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    print(f"\nfinal timings replayed on collected blocks; {report['date']}, {report['machine']}")
    print(f"{'model':<12} {'spread':>6} {'tolerance':>9} {'A/A faster':>10} {'slower':>6} {'moved':>6} {'blocks':>6} "
          f"{'s':>6} {'A/B found':>9} {'blocks':>6} {'s':>6}")
    for model in report["models"]:
        for r in model["rules"]:
            n = r["replays"]
            print(f"{model['model']:<12} {100 * model['fp32_level_spread']:>5.0f}% {r['tolerance']:>9.3g} "
                  f"{r['aa_faster']:>5}/{n:<4} {r['aa_slower']:>6} {r['aa_moved']:>6} {r['aa_median_blocks']:>6} "
                  f"{r['aa_median_seconds']:>6.1f} {r['ab_found']:>4}/{n:<4} {r['ab_median_blocks']:>6} "
                  f"{r['ab_median_seconds']:>6.1f}")
        if model.get("reduced"):
            r, speedups = model["rules"][0], model["reduced_speedups"]
            print(f"  all-{model['reduced']}: its level over the sessions {100 * model['reduced_level_spread']:.0f} % "
                  f"apart, its per-block speed-up {min(speedups):.3f}-{max(speedups):.3f}x; replayed at tolerance "
                  f"{r['tolerance']:g}: faster {r['reduced_faster']}/{r['replays']}, slower {r['reduced_slower']}, "
                  f"{r['reduced_median_blocks']} blocks, {r['reduced_median_seconds']:.1f} s, interval "
                  f"{100 * r['reduced_median_width']:.1f} % wide")


if __name__ == "__main__":
    sys.exit(main())

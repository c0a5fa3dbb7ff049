"""A/A: how often the final timing calls a plan faster than itself, and how often it finds a real gain.

Both through the path a search's final timing takes (speedup.time_until_known, as measurement.time_compared calls
it), "faster" meaning beyond timing noise.

Per model and engine setting, ``--repeats`` times:

- **A/A**: the all-FP32 plan against a separately lowered and built all-FP32 plan, with the given
  model beside them, as a search's final timing runs them: the share of comparisons whose 95 %
  interval lies wholly above 1 ("faster", the false claim) or below it, the intervals' median width,
  rounds, sessions and seconds;
- **A/B**: all-FP32 against the same graph with extra element-wise work on its output (Mul by 1.0001
  then by 1/1.0001, ``--extra`` times: about ``--gain`` slower, measured first), the plain graph as
  the plan: the share found beyond noise;
- **before**: the method this replaced (one session per model for all rounds, >= 6 rounds until a 4
  % interval or the seconds pass, a percentile bootstrap of the rounds' mean log ratio), on the same
  A/A pairs, in the same run.

Models: generated ones (a conv net, an MLP, attention: tests/builders.py) and zoo models
(``--zoo``); settings: ONNX Runtime CPU with its default threads and with ``--threads``; ort-cuda
where ``--cuda`` is given. ``--hog SECONDS`` runs a CPU hog beside it all (one process spinning on
one core, on for SECONDS, off for SECONDS, in turn, its phase unrelated to the rounds'): the loaded
machine of issue 69. ``--no-before`` leaves the old method out (it takes as long as the rest).

    python -m benchmarks a_over_a [--repeats 10] [--zoo magika ppocr-cls] [--threads default 1] [--cuda] [--json PATH]
    python -m benchmarks a_over_a --models conv --threads 1 default --gain 1.5 --hog 3 --no-before \
        --json benchmarks/results/a_over_a_hog.json
    python -m benchmarks a_over_a --merge A.json B.json ... --json a_over_a.json    # runs made side by side
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import builders  # noqa: E402
from _harness import Report, parse_arguments, prepare_zoo  # noqa: E402

from autoprec.analysis.baseline import load_baseline  # noqa: E402
from autoprec.analysis.data import Workload  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402
from autoprec.core.search_space import load_search_space  # noqa: E402
from autoprec.core.stored import StoredModel  # noqa: E402
from autoprec.measure import speedup  # noqa: E402
from autoprec.measure.measurement import Lowering  # noqa: E402
from autoprec.record import verdict  # noqa: E402

GENERATED = {"conv": lambda: builders.conv_net(size=48), "mlp": lambda: builders.mlp(batch=16, hidden=256),
             "attention": lambda: builders.attention(tokens=64, dim=64)}
SECONDS = 10.0  # a search's default --retime-seconds
QUICK = {"repeats": 1, "models": ["conv"], "threads": ["1"], "gain": 1.5, "seconds": 0.5, "before": False}


def generated(name: str, folder: Path):
    path = builders.save(GENERATED[name](), folder / f"{name}.onnx")
    return load_baseline(path, load_search_space(), None, None)


def slowed(model: StoredModel, extra: int) -> StoredModel:
    """The model with ``extra`` pairs of Muls (by 1.0001, then by its inverse) on its first output: more work, the
    same outputs to 1e-7, no op ONNX Runtime removes."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    graph = proto.graph
    out = graph.output[0].name
    graph.initializer.extend([onnx.numpy_helper.from_array(np.array(1.0001, np.float32), "aa_up"),
                              onnx.numpy_helper.from_array(np.array(1 / 1.0001, np.float32), "aa_down")])
    for node in graph.node:
        node.output[:] = [f"{o}_aa0" if o == out else o for o in node.output]
    tensor = f"{out}_aa0"
    for i in range(extra):
        last = i == extra - 1
        graph.node.extend([onnx.helper.make_node("Mul", [tensor, "aa_up"], [f"{out}_aa{i}u"], f"aa_up_{i}"),
                           onnx.helper.make_node("Mul", [f"{out}_aa{i}u", "aa_down"],
                                                 [out if last else f"{out}_aa{i + 1}"], f"aa_down_{i}")])
        tensor = f"{out}_aa{i + 1}"
    return model.with_proto(proto)


def before(backend, models: dict, batch, seconds: float) -> verdict.Speedup:
    """The replaced method: each model's one session for every round, >= 6 rounds until a 4 % interval or
    ``seconds``, a percentile bootstrap (4000 resamples) of the rounds' mean log ratio."""
    runners = {name: backend.runner(model).__enter__() for name, model in models.items()}
    try:
        for runner in runners.values():
            runner.run(batch)
        ms: dict[str, list[float]] = {name: [] for name in models}
        started = time.monotonic()
        while True:
            for name in speedup.in_turn(list(models), len(ms["fp32"])):
                ms[name].append(runners[name].time(batch).median_ms)
            found = _bootstrap(ms["fp32"], ms["chosen"])
            if len(ms["fp32"]) >= 60 or (len(ms["fp32"]) >= 6 and (time.monotonic() - started > seconds
                                                                     or found.high / found.low - 1 <= 0.04)):
                return found
    finally:
        for runner in runners.values():
            runner.__exit__(None, None, None)


def _bootstrap(reference: list[float], candidate: list[float]) -> verdict.Speedup:
    ratios = np.log(np.asarray(reference) / np.asarray(candidate))
    means = ratios[np.random.default_rng(0).integers(0, len(ratios), (4000, len(ratios)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return verdict.Speedup.with_interval(math.exp(ratios.mean()), math.exp(low), math.exp(high), 0.95, len(ratios))


def _hog(seconds: float) -> None:
    """Spin one core for ``seconds``, rest as long, forever (a child process, ended by its parent).
    """
    while True:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            pass
        time.sleep(seconds)


@contextlib.contextmanager
def hogged(seconds: float | None):
    """A CPU hog switching on and off every ``seconds`` beside the body (None: none)."""
    if not seconds:
        yield
        return
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_hog, args=(seconds,), daemon=True)
    process.start()
    try:
        yield
    finally:
        process.kill()
        process.join()


def one_setting(name: str, baseline, backend, repeats: int, extra: int, seconds: float,
                with_before: bool) -> dict:
    """A/A, A/B (the reference slowed by ``extra`` Mul pairs) and, ``with_before``, the replaced
    method."""
    info = baseline.info
    plan = info.plan_at(Precision.FP32)
    lowering = Lowering(info, baseline.ranges)
    batch = baseline.dataset.evaluation[0]
    fp32 = lowering(backend, plan)
    aa, ab, old = [], [], []
    source = {"source": StoredModel(info.source, info.folder)} if info.source is not None else {}
    for _ in range(repeats):
        t0 = time.monotonic()
        rounds = final_timing(backend, {"fp32": fp32, "chosen": lowering(backend, plan), **source}, batch, seconds)
        aa.append((rounds.speedup("fp32", "chosen"), time.monotonic() - t0, rounds.steadiness()))
        fast = final_timing(backend, {"fp32": slowed(fp32, extra), "chosen": fp32}, batch, seconds)
        ab.append(fast.speedup("fp32", "chosen"))
        if with_before:
            pair = {"fp32": fp32, "chosen": lowering(backend, plan)}
            old.append(before(backend, pair, batch, seconds))
    return summary(name, backend, aa, ab, old, extra)


def final_timing(backend, models: dict, batch, seconds: float):
    """The models timed as :func:`autoprec.measure.measurement.time_compared` times a chosen plan beside all-FP32
    (and the given model): its pairs, stopped where its time is up or the choice is decided. (time_compared itself
    times a chosen plan that is all-FP32 once, as all-FP32: no A/A through it.)"""
    pairs = [pair for pair in speedup.COMPARED if set(pair) <= set(models)]
    return speedup.time_until_known(backend, models, Workload.of(batch), pairs, seconds,
                                    deciding=[("fp32", "chosen")])


def calibrated_extra(backend, model: StoredModel, batch, gain: float) -> int:
    """How many Mul pairs make the model about ``gain`` slower: doubled until the slowdown is well past the noise
    (twice the gain asked), then scaled down to it (one session each, the median of 5 timings). Each slowed model is
    read against the plain one timed just before and just after it, the slower of the two: a VM whose speed moved
    between them (2026-12-01: a 1.3x level move read as the slowdown of 16 pairs, and the A/B then slowed the model
    by nothing) errs towards more pairs, a larger gain than asked, never a gain that is not there."""
    def ms(m):
        with backend.runner(m) as runner:
            runner.run(batch)
            return statistics.median(runner.time(batch).median_ms for _ in range(5))
    pairs, before = 16, ms(model)
    while True:
        slower, after = ms(slowed(model, pairs)), ms(model)
        slowdown = slower / max(before, after) - 1
        if slowdown >= 2 * (gain - 1) or pairs >= 1 << 16:
            return max(1, round(pairs * (gain - 1) / max(slowdown, 1e-9)))
        pairs, before = pairs * 2, after


def summary(name: str, backend, aa, ab, old, extra: int) -> dict:
    def width(s):
        return s.high / s.low - 1

    claims = [s for s, _, _ in aa]
    return {
        "model": name, "engine": backend.info().label(), "comparisons": len(aa),
        "aa_faster_beyond_noise": sum(s.low > 1 for s in claims), "aa_slower_beyond_noise": sum(s.high < 1 for s in claims),
        "aa_median_width": statistics.median(width(s) for s in claims),
        "aa_median_rounds": statistics.median(s.rounds for s in claims),
        "aa_median_blocks": statistics.median(s.blocks for s in claims),
        "aa_median_seconds": statistics.median(t for _, t, _ in aa),
        "aa_unsteady": sum(s.unsteady for s in claims),
        "aa_others_cores": [list(m.others) if m.others else None for _, _, m in aa],
        "aa_fp32_level_moved": [round(m.level_moved, 4) for _, _, m in aa],
        "aa_speedups": [round(s.speedup, 4) for s in claims],
        "ab_extra_mul_pairs": extra, "ab_found": sum(s.low > 1 for s in ab),
        "ab_median_speedup": statistics.median(s.speedup for s in ab),
        "ab_speedups": [[round(s.low, 4), round(s.speedup, 4), round(s.high, 4)] for s in ab],
        "ab_unsteady": sum(s.unsteady for s in ab),
        "before_faster_beyond_noise": sum(s.low > 1 for s in old) if old else None,
        "before_slower_beyond_noise": sum(s.high < 1 for s in old) if old else None,
        "before_median_width": statistics.median(width(s) for s in old) if old else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--models", nargs="*", default=list(GENERATED))
    parser.add_argument("--zoo", nargs="*", default=[])
    parser.add_argument("--threads", nargs="+", default=["default", "1"],
                        help="the CPU settings: ONNX Runtime's default threads ('default') and/or fixed thread counts")
    parser.add_argument("--cuda", action="store_true", help="ort-cuda instead of the CPU settings")
    parser.add_argument("--gain", type=float, default=1.03)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--hog", type=float, default=None, metavar="SECONDS",
                        help="a CPU hog beside the timings, on and off for SECONDS in turn")
    parser.add_argument("--no-before", dest="before", action="store_false",
                        help="leave the replaced method out")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="join the settings of runs made side by side (e.g. one process per setting, each pinned "
                             "to its own cores) into --json and print their table")
    args = parse_arguments(parser, argv, QUICK)
    engines = [get_backend("ort-cuda")] if args.cuda else [
        get_backend("ort-cpu") if t == "default" else get_backend("ort-cpu", threads=int(t)) for t in args.threads]
    report = Report("a_over_a", args, engines[0], repeats=args.repeats, gain=args.gain, seconds=args.seconds,
                    method=verdict.METHOD, min_blocks=speedup.MIN_BLOCKS, rounds_per_block=verdict.ROUNDS_PER_BLOCK,
                    hog_seconds=args.hog, settings=[])
    if args.merge:
        return merged(args.merge, report)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sources = {name: (lambda n=name: generated(n, Path(tmp))) for name in args.models}
        sources.update({f"zoo:{name}": (lambda n=name: prepare_zoo(n)[0]) for name in args.zoo})
        for name, make in sources.items():
            baseline = make()
            for backend in engines:
                print(f"[{name} · {backend.info().device}] …", file=sys.stderr, flush=True)
                info = baseline.info  # the slowdown is calibrated before the hog starts
                fp32 = Lowering(info, baseline.ranges)(backend, info.plan_at(Precision.FP32))
                extra = calibrated_extra(backend, fp32, baseline.dataset.evaluation[0], args.gain)
                with hogged(args.hog):
                    found = one_setting(name, baseline, backend, args.repeats, extra, args.seconds,
                                        args.before)
                report["settings"].append(found)
                report.write()
    print_table(report)
    return 0


def merged(paths: list[Path], report: Report) -> int:
    """One report of several runs' settings (the first run's facts, each setting keeping its own engine line)."""
    reports = [json.loads(p.read_text()) for p in paths]
    report.update({**reports[0], "settings": [s for r in reports for s in r["settings"]],
                   "machines": sorted({r["machine"] for r in reports}), "merged_from": [p.name for p in paths]})
    report.write()
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    rows = report["settings"]
    total = sum(r["comparisons"] for r in rows)
    faster = sum(r["aa_faster_beyond_noise"] for r in rows)
    old = sum(r["before_faster_beyond_noise"] or 0 for r in rows)
    found = sum(r["ab_found"] for r in rows)
    print(f"\nA/A and A/B through the final timing ({report['method']}); {report['date']}, {report['machine']}")
    print(f"{'model':<16} {'engine':<58} {'A/A n':>5} {'faster':>6} {'slower':>6} {'width':>6} {'rounds':>6} "
          f"{'s':>5} {'A/B found':>9} {'×':>6} {'before: faster':>14} {'width':>6}")
    for r in rows:
        print(f"{r['model']:<16} {r['engine'][:58]:<58} {r['comparisons']:>5} {r['aa_faster_beyond_noise']:>6} "
              f"{r['aa_slower_beyond_noise']:>6} {100 * r['aa_median_width']:>5.1f}% {r['aa_median_rounds']:>6.0f} "
              f"{r['aa_median_seconds']:>5.1f} {r['ab_found']:>4}/{r['comparisons']:<4} {r['ab_median_speedup']:>6.3f} "
              f"{'—' if r['before_median_width'] is None else r['before_faster_beyond_noise']:>14} "
              f"{100 * (r['before_median_width'] or 0):>5.1f}%")
    print(f"A/A called faster beyond noise: {faster} of {total} ({100 * faster / max(total, 1):.1f} %; before: {old} of "
          f"{total}, {100 * old / max(total, 1):.1f} %); A/B ({report['gain']:.2f}×) found: {found} of {total} "
          f"({100 * found / max(total, 1):.0f} %)")


if __name__ == "__main__":
    sys.exit(main())

"""What judging one candidate's outputs costs on the CPU, per code checkout, side by side in one run.

A trial's judging runs in its worker process between two candidates (``seconds["judge"]`` of a measurement): on
ppocr-det@8 it took 1.5-1.7 s of a 5.2-6.0 s trial on 4 × H200 (benchmarks/results/distributed_gpu4_h200_det.json),
the DBNet map's text regions decoded pixel by pixel, FP32's again for every plan. This times the search's own judge
(``Judge.metrics`` then ``Judge.loss``, the zoo model's task metric) on the FP32 reference outputs with noise added
within their range (a candidate that moves some decisions): the first call (FP32's decisions decoded too, where
the judge keeps them) and the median of the later ones. Each ``--code`` checkout is timed in its own process, in
turn, ``--rounds`` times; the table gives each one's median and its ratio to the first's.

    git worktree add /tmp/before HEAD~1
    python -m benchmarks judge_cost --code /tmp/before . --models ppocr-det@8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
QUICK = {"models": ["tiny@1"], "rounds": 1, "calls": 2}


def _time_here(entry: str, calls: int) -> dict:
    """In this process (its checkout on sys.path): the judge of zoo model ``entry`` (NAME@BATCH) timed."""
    import numpy as np

    import autoprec

    sys.path.insert(0, str(HERE))
    from _harness import model_source
    from gpu import batch_data

    from autoprec.analysis.baseline import load_baseline
    from autoprec.app.resolve import engine_space, judge_for, metric_for, wanted_metric
    from autoprec.backends import get_backend
    from autoprec.core.search_space import load_search_space

    name, _, batch = entry.partition("@")
    with tempfile.TemporaryDirectory(prefix="autoprec-judge-") as tmp:
        model_path, data, shapes = batch_data(name, int(batch or 32), Path(tmp))
        space, _, _ = engine_space(load_search_space(), get_backend("ort-cpu"), None)
        baseline = load_baseline(model_path, space, data, shapes, cache=Path(tmp))
    metric = metric_for(wanted_metric(autoprec.JudgeSpec(), model_source(name)[0]), baseline.info, baseline.dataset)
    judge, _ = judge_for(metric, baseline)
    rng = np.random.default_rng(0)
    candidate = [{k: np.clip(v + rng.normal(0, 0.01, v.shape).astype(v.dtype), v.min(), v.max()) if v.dtype.kind == "f"
                  else v for k, v in outputs.items()} for outputs in baseline.reference]  # within FP32's range
    seconds = []
    for _ in range(calls):
        t0 = time.perf_counter()
        judge.loss(judge.metrics(candidate), candidate)
        seconds.append(time.perf_counter() - t0)
    return {"metric": metric.name, "batches": len(candidate), "first_s": seconds[0],
            "later_s": statistics.median(seconds[1:])}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))
    from _harness import Report, parse_arguments, source_revision

    from autoprec.backends import get_backend

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["ppocr-det@8"])
    parser.add_argument("--code", nargs="*", default=["."], help="checkouts of autoprec to time, in turn")
    parser.add_argument("--rounds", type=int, default=3, help="each checkout timed this many times, in turn")
    parser.add_argument("--calls", type=int, default=6, help="judge calls per round (the first, then the later ones)")
    parser.add_argument("--here", help=argparse.SUPPRESS)  # a round in this process: prints its JSON
    args = parse_arguments(parser, argv, QUICK)
    if args.here:
        print(json.dumps(_time_here(args.here, args.calls)))
        return 0
    report = Report("judge_cost", args, get_backend("ort-cpu"), rounds=args.rounds, calls=args.calls, models={})
    labels = [source_revision(Path(code)) or code for code in args.code]
    print(f"{'model':<14}{'code':<22}{'metric':<14}{'first s':>9}{'later s':>9}{'×first code':>12}")
    for entry in args.models:
        found: dict[str, list[dict]] = {label: [] for label in labels}
        for _ in range(args.rounds):  # in turn: a slower minute of the machine falls on every checkout
            for code, label in zip(args.code, labels):
                found[label].append(_timed_in(code, entry, args.calls))
        rows = report["models"][entry] = {
            label: {"metric": runs[0]["metric"], "batches": runs[0]["batches"],
                    **{k: round(statistics.median(r[k] for r in runs), 4) for k in ("first_s", "later_s")}}
            for label, runs in found.items()}
        for label, row in rows.items():
            row["later_vs_first_code"] = round(row["later_s"] / rows[labels[0]]["later_s"], 3)
            print(f"{entry:<14}{label:<22}{row['metric']:<14}{row['first_s']:>9.3f}{row['later_s']:>9.3f}"
                  f"{row['later_vs_first_code']:>12.3f}", flush=True)
        report.write()
    print(f"wrote {report.path}")
    return 0


def _timed_in(code: str, entry: str, calls: int) -> dict:
    """One round in a process that imports autoprec from checkout ``code``."""
    path = os.pathsep.join(p for p in (str(Path(code).resolve()), os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, __file__, "--here", entry, "--calls", str(calls)], cwd=code, check=True,
                         env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())

"""A deployment request's work timed on a runner: each of its batches timed alone, their latencies
summed as often as a request runs each (a decoder's prompt once, a decode step per generated
token)."""

from __future__ import annotations

from autoprec.analysis.data import Workload
from autoprec.backends.base import Runner
from autoprec.core.timing import TRIAL, Runs, Timing


def time_work(runner: Runner, work: Workload, runs: Runs = TRIAL) -> tuple[Timing, dict[str, Timing]]:
    """The request's latency (the runs' medians and percentiles, each part's times its runs) and
    each part's own timing by point, each batch run as ``runs`` asks; a request of one
    batch run once is that batch's timing, with no parts."""
    if work.single:
        return runner.time(work.parts[0][1], runs), {}
    each = {name: runner.time(batch, runs) for name, batch, _ in work.parts}
    counts = {name: count for name, _, count in work.parts}

    def total(figure: str) -> float:
        return sum(counts[name] * getattr(timing, figure) for name, timing in each.items())

    timings = list(each.values())
    mix = Timing(total("median_ms"), total("p10_ms"), total("p90_ms"), min(t.runs for t in timings),
                 max(t.warmup for t in timings))
    return mix, each


def warm_up(runner: Runner, work: Workload) -> None:
    """Each of the request's batches run once: allocations and kernel selection stay out of the
    timed runs."""
    for _, batch, _ in work.parts:
        runner.run(batch)

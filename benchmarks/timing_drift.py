"""Does this machine's latency hold still? One model, one session, blocks of back-to-back timed runs.

autoprec's timings of a plan in its trial and in the final re-timing are taken seconds to minutes
apart; if the host drifts in between, no timer can make them agree, and only interleaved comparisons
(the re-timing's rounds) stay fair. This prints the median of each block of runs over time, in this
process and in fresh processes pinned to given CPUs (is it the core the launching thread runs on?),
with autoprec's own runner (ONNX Runtime; on CUDA with IO binding, synchronised per run).

    python benchmarks/timing_drift.py MODEL.onnx DATA.npz [--backend ort-cuda] [--blocks 40] [--pin 0 7 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine_facts  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402
from autoprec.core import atomic, stored  # noqa: E402

RUNS_PER_BLOCK, WARMUP = 100, 20


def block_medians(model_path: str, data_path: str, backend: str, blocks: int) -> list[dict]:
    data, model = np.load(data_path), stored.load(Path(model_path))
    batch = {name: data[name][:1] for name in data.files if name in {i.name for i in model.graph.input}}
    with get_backend(backend).runner(model) as runner:
        runner.run(batch)
        started, rows = time.perf_counter(), []
        for _ in range(blocks):
            timing = runner.time(batch)  # autoprec's timer: 3 warm-ups, >= 10 runs and >= 0.2 s
            rows.append({"seconds": round(time.perf_counter() - started, 2), "median_ms": timing.median_ms,
                         "p10_ms": timing.p10_ms, "p90_ms": timing.p90_ms})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("--backend", default="ort-cpu")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--pin", type=int, nargs="*", default=[], help="also run in fresh processes pinned to each CPU")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "timing_drift.json")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(block_medians(args.model, args.data, args.backend, args.blocks)))
        return 0
    report = {**machine_facts(get_backend(args.backend)), "model": Path(args.model).name,
              "timer": "autoprec's runner.time per block (3 warm-ups, >= 10 runs and >= 0.2 s), blocks back to back",
              "this_process": block_medians(args.model, args.data, args.backend, args.blocks), "pinned": {}}
    for cpu in args.pin:
        child = [
            sys.executable,
            __file__,
            args.model,
            args.data,
            "--backend",
            args.backend,
            "--blocks",
            str(args.blocks // 4 or 1),
            "--child",
        ]
        proc = subprocess.run(
            child, capture_output=True, text=True, preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu})
        )
        report["pinned"][str(cpu)] = (
            json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else proc.stderr[-500:]
        )
    atomic.write_json(args.json, report)
    print(
        f"timing drift — {report['engine']['engine']} {report['engine']['provider']} on {report['engine']['device']}, "
        f"{report['model']}; JSON: {args.json}"
    )
    for label, rows in [
        ("this process", report["this_process"]),
        *((f"pinned to CPU {c}", r) for c, r in report["pinned"].items()),
    ]:
        if isinstance(rows, str):
            print(f"{label:<18} failed: {rows}")
            continue
        medians = [r["median_ms"] for r in rows]
        print(
            f"{label:<18} block medians {min(medians):.3f}–{max(medians):.3f} ms (max/min {max(medians) / min(medians):.2f}) "
            f"over {rows[-1]['seconds']:.0f} s: " + " ".join(f"{m:.2f}" for m in medians)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

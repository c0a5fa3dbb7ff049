"""What a search's answer costs, stage by stage, beside the conversion time of the tools users compare it with.

Per model, in one run: ``autoprec search MODEL --budget B`` as a user runs it (a child process, default settings),
its wall clock from outside (import and writing included) and ``pareto.json``'s ``search.stage_seconds``; the share
of the wall outside the sensitivity pass and the trials (set-up, re-timing, held-out judging and final timing,
deployment, writing: what issue 68 holds to 35 %); and beside it ONNX Runtime's ``quantize_static`` (QDQ, the same
calibration batches) converting the same model, and ModelOpt's AutoCast (its FP16 conversion, the same call as
benchmarks/peers.py's) where ``nvidia-modelopt`` is installed (on the GPU machine: ``--batch 32 --backend ort-cuda``). With ``--before DIR`` (a checkout of older code, e.g. ``git worktree add``), each model is
also searched with that code, the two runs alternating, so that each stage reads before and after in one run.

    python -m benchmarks search_cost [--models ppocr-cls yolov8n ppocr-rec] [--budget 16] [--before DIR] [--batch N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).parent))
from _harness import (  # noqa: E402
    HERE,
    QUICK_RETIME,
    TINY,
    Report,
    model_source,
    parse_arguments,
    resolve,
    run_models,
)
from gpu import batch_data  # noqa: E402
from peers import AUTOCAST_CALL, autocast_converted  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402

MODELS = ("ppocr-cls", "yolov8n", "ppocr-rec")
QUICK = {"models": [TINY], "budget": 2, "retime_seconds": QUICK_RETIME}
SEARCHING = ("sensitivity", "trials")  # what a search is for; every other stage is its fixed cost


def source(name: str, batch: int | None, folder: Path) -> tuple[str, Path | None, dict | None]:
    """What the searches and the peers are given: the zoo model with its own data, or (``batch``) its data at that
    batch, as benchmarks/gpu.py gives it."""
    if batch is None:
        return model_source(name)
    model, data, shapes = batch_data(name, batch, folder)
    return str(model), data, shapes


def run_cli(code: Path, name: str, verb: str, args: argparse.Namespace, out: Path, *options: str) -> float:
    """``autoprec VERB`` of model ``name`` (as :func:`source` gives it) with the package in ``code``, writing to
    ``out``: its wall clock from outside."""
    model, data, shapes = source(name, args.batch, out.parent)
    ran = "import sys, autoprec.app.cli as cli; print(cli.__file__, file=sys.stderr); raise SystemExit(cli.main())"
    command = [sys.executable, "-c", ran, verb, model, "--out", str(out), "--no-progress", "--backend", args.backend,
               *options]
    command += ["--data", str(data)] if data else []
    command += [arg for dim, shape in (shapes or {}).items() for arg in ("--shape", f"{dim}={'x'.join(map(str, shape))}")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])}
    started = time.monotonic()
    # from the output's folder: python -c puts its working directory first on the path, and a run from a checkout
    # would import that checkout's autoprec, whatever PYTHONPATH says (every --before run did so until 2026-11-29)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600, cwd=out.parent)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{verb} of {name} with {code} exited {done.returncode}: {done.stderr[-2000:]}")
    imported = Path(done.stderr.splitlines()[0])
    if not imported.is_relative_to(code.resolve()):
        raise RuntimeError(f"the {verb} meant to run {code}'s autoprec ran {imported}")
    return wall


def searched(code: Path, name: str, args: argparse.Namespace, out: Path) -> dict:
    """``autoprec search`` with the package in ``code`` (its wall clock from outside, its stages from inside)."""
    retime = ["--retime-seconds", str(args.retime_seconds)] if args.retime_seconds is not None else []
    wall = run_cli(code, name, "search", args, out, "--budget", str(args.budget), *retime)
    search = json.loads((out / "pareto.json").read_text())["search"]
    stages = search["stage_seconds"]
    outside = wall - sum(stages.get(stage, 0.0) for stage in SEARCHING)
    return {"wall_seconds": round(wall, 2), "stage_seconds": stages, "inside_wall_seconds": search["wall_seconds"],
            "import_and_writing_seconds": round(wall - search["wall_seconds"], 2),
            "outside_searching_share": round(outside / wall, 3), "retiming": search.get("retiming")}


def given(name: str, batch: int | None, folder: Path) -> tuple[Path, Path, dict]:
    """The model file, data file and shapes the searches were given (see :func:`source`)."""
    return batch_data(name, batch, folder) if batch is not None else resolve(name)[:3]


def quantize_static_seconds(name: str, batch: int | None, folder: Path) -> dict:
    """ONNX Runtime's quantize_static (QDQ, per-channel) on the model, calibrated on its data: the whole-model tool's
    conversion time."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    model, data, _ = given(name, batch, folder)
    if data is None:
        return {"not_run": "the model came without data to calibrate on"}
    inputs = {i.name for i in onnx.load(str(model), load_external_data=False).graph.input}
    with np.load(data) as arrays:
        items = {key: arrays[key] for key in arrays.files if key in inputs}  # not the labels

    class Reader(CalibrationDataReader):
        def __init__(self):
            count = len(next(iter(items.values())))
            self.batches = iter([{k: v[i:i + 1] for k, v in items.items()} for i in range(count // 2)])

        def get_next(self):
            return next(self.batches, None)

    started = time.monotonic()
    try:
        quantize_static(str(model), str(folder / "static.onnx"), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a finding, not a crash
        return {"failed": f"{type(exc).__name__}: {exc}"[:500]}
    return {"seconds": round(time.monotonic() - started, 2)}


def autocast_seconds(name: str, batch: int | None, folder: Path) -> dict:
    """ModelOpt AutoCast's conversion of the same model at the same batch (its FP16 model, calibrated on the same
    data), where nvidia-modelopt is installed: the time a user compares a search's with on the GPU machine."""
    try:
        import modelopt
    except ImportError:
        return {"not_run": "nvidia-modelopt is not installed here"}
    try:
        converted, seconds = autocast_converted(*given(name, batch, folder), folder, f"{name}-autocast")
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a finding, not a crash
        return {"failed": f"{type(exc).__name__}: {exc}"[:500]}
    return {"seconds": round(seconds, 2), "modelopt": modelopt.__version__, "call": AUTOCAST_CALL,
            "casts": sum(n.op_type == "Cast" for n in converted.graph.node)}


def run_model(name: str, args: argparse.Namespace) -> dict:
    codes = {"after": HERE.parent, **({"before": args.before.resolve()} if args.before else {})}
    runs: dict[str, list[dict]] = {label: [] for label in codes}
    with tempfile.TemporaryDirectory(prefix="search-cost-") as tmp:
        for repeat in range(args.repeats):
            order = list(codes) if repeat % 2 == 0 else list(reversed(codes))
            for label in order:
                out = Path(tmp) / f"{label}-{repeat}"
                runs[label].append(searched(codes[label], name, args, out))
        peers = {"quantize_static": quantize_static_seconds(name, args.batch, Path(tmp)),
                 "autocast": autocast_seconds(name, args.batch, Path(tmp))}
    found = {label: found for label, found in runs.items()}
    if "before" in found:
        ratio = [b["wall_seconds"] / a["wall_seconds"] for a, b in zip(found["after"], found["before"])]
        found["before_over_after_wall"] = [round(r, 3) for r in ratio]
    return {**found, "peers": peers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="searches per model and code, alternating")
    parser.add_argument("--before", type=Path, help="a checkout of older code, searched beside (before and after)")
    parser.add_argument("--retime-seconds", type=float, default=None, help="the searches' (default: theirs)")
    parser.add_argument("--backend", default="ort-cpu", help="the searches' engine (ort-cuda on the GPU machine)")
    parser.add_argument("--batch", type=int, default=None, help="the data's items at this batch (default: the zoo's)")
    args = parse_arguments(parser, argv, QUICK)
    report = Report("search_cost", args, get_backend(args.backend), budget=args.budget, models={})
    run_models(report, args.models, lambda name: run_model(name, args))
    print(f"\nsearch cost — {report['engine']['engine']} {report['engine']['version']} on {report['engine']['device']}; "
          f"budget {args.budget}; JSON: {report.path}")
    print(f"{'model':<10} {'code':<7} {'wall s':>7} {'outside':>8}   stages (s)   | quantize_static s, AutoCast s")
    for name, found in report["models"].items():
        static = found["peers"]["quantize_static"]
        static = static.get("seconds", "not run" if "not_run" in static else "failed")
        static = f"{static}, {found['peers']['autocast'].get('seconds', 'not run')}"
        for label in ("before", "after"):
            for run in found.get(label, []):
                stages = ", ".join(f"{k} {v:g}" for k, v in run["stage_seconds"].items())
                print(f"{name:<10} {label:<7} {run['wall_seconds']:>7.1f} {run['outside_searching_share']:>8.0%}   "
                      f"{stages}, import+writing {run['import_and_writing_seconds']:g} | {static}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

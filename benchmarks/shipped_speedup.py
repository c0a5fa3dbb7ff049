"""Does the speed-up a search states over the given model hold for the files a user deploys? (issue 68)

A search of a model with a dynamic dim (magika: ``bytes [batch, 2048]``), then plain
``onnxruntime.InferenceSession``s (default options, a fresh session each round, interleaved rounds of back-to-back
runs after a warm-up) of four files: the given file and best/model.onnx as they are (their dims kept), and each with
its dynamic dims fixed at the measured shape, the graphs searches timed before their final timing timed the shipped
files. Each is timed with ONNX Runtime's default threads and with one thread: on a 2-core VM the default threads'
timings have two levels minutes apart (a second thread's help comes and goes), one thread's do not.

    python -m benchmarks shipped_speedup [--model magika] [--budget 20] [--rounds 12] [--runs 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

sys.path.insert(0, str(Path(__file__).parent))
from _harness import Report, model_source, parse_arguments, plain_run_ms  # noqa: E402

from autoprec.app.cli import main as autoprec_main  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.measure.speedup import in_turn  # noqa: E402

QUICK = {"model": "tiny", "budget": 4, "rounds": 2, "runs": 20}
METRICS = {"magika": ["--metric", "top1@labels", "--max-loss", "0.01"]}


def fixed_twin(path: Path, shapes: dict[str, list[int]], folder: Path) -> Path:
    """``path``'s graph with its inputs' dynamic dims fixed at ``shapes`` (its weights inline: small models only)."""
    model = onnx.load(path)
    for value in model.graph.input:
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes.get(value.name, [])):
            dim.Clear()
            dim.dim_value = size
    twin = folder / f"{path.parent.name}-{path.stem}-fixed.onnx"
    onnx.save(model, twin)
    return twin


def plain_rounds(files: dict[str, Path], feeds: dict, rounds: int, runs: int, threads: int) -> dict[str, list]:
    """Each file's (median, p10) ms per round: a fresh plain session per round, 10 warm-up runs, ``runs`` timed."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    found: dict[str, list] = {name: [] for name in files}
    for round_ in range(rounds):
        for name in in_turn(list(files), round_):
            session = onnxruntime.InferenceSession(str(files[name]), options, providers=["CPUExecutionProvider"])
            times = plain_run_ms(session, feeds, 10, runs)
            found[name].append((statistics.median(times), float(np.percentile(times, 10))))
    return found


def ratio(found: dict[str, list], reference: str, candidate: str, figure: int) -> dict:
    """The geometric mean of the rounds' ratios (``figure`` 0: medians, 1: p10s), and their range."""
    each = [r[figure] / c[figure] for r, c in zip(found[reference], found[candidate])]
    return {"ratio": math.exp(statistics.fmean(math.log(r) for r in each)), "low": min(each), "high": max(each)}


def compared(found: dict[str, list]) -> dict:
    return {figure: {"shipped": ratio(found, "given", "best", i), "fixed_twins": ratio(found, "given fixed", "best fixed", i),
                     "best_fixed_over_best": 1 / ratio(found, "best fixed", "best", i)["ratio"],
                     "given_fixed_over_given": 1 / ratio(found, "given fixed", "given", i)["ratio"]}
            for i, figure in enumerate(("medians", "p10s"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="magika")
    parser.add_argument("--budget", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--runs", type=int, default=200)
    args = parse_arguments(parser, argv, QUICK)
    source, data, _ = model_source(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        out, started = Path(tmp) / "result", time.monotonic()
        given = ["--data", str(data)] if data else []
        autoprec_main(["search", source, *given, *METRICS.get(args.model, []), "--budget", str(args.budget),
                       "--out", str(out), "--no-progress", "--no-plots"])
        pareto = json.loads((out / "pareto.json").read_text())
        shapes = {name: spec["shape"] for name, spec in pareto["model"]["inputs"].items()}
        files = {"given": Path(pareto["model"]["path"]), "best": out / "best" / "model.onnx"}
        files |= {f"{name} fixed": fixed_twin(path, shapes, Path(tmp)) for name, path in list(files.items())}
        model = onnx.load(files["given"], load_external_data=False)
        rng = np.random.default_rng(0)
        feeds = {v.name: rng.integers(0, 256, shapes[v.name]).astype(onnx.helper.tensor_dtype_to_np_dtype(
            v.type.tensor_type.elem_type)) for v in model.graph.input}
        plain = {f"threads {threads or 'default'}": plain_rounds(files, feeds, args.rounds, args.runs, threads)
                 for threads in (0, 1)}
        report = Report("shipped_speedup", args, get_backend("ort-cpu"), model=args.model,
                        search_seconds=round(time.monotonic() - started, 1),
                        stated={"over_given": pareto["chosen_vs_source"], "over_fp32": pareto["chosen_vs_fp32"]},
                        shipped_counts=json.loads((out / "best" / "plan.json").read_text())["plan"]["counts"],
                        plain={name: {"rounds_ms": found, **compared(found)} for name, found in plain.items()})
    report.write()
    stated = pareto["chosen_vs_source"]
    print(f"stated over the given model: {stated['speedup']:.3f}x ({stated.get('low') or 0:.2f}-{stated.get('high') or 0:.2f})"
          if stated else "stated: none (all-FP32 shipped)")
    for name, found in report["plain"].items():
        p10 = found["p10s"]
        print(f"plain sessions, {name}: shipped files {p10['shipped']['ratio']:.3f}x, fixed twins "
              f"{p10['fixed_twins']['ratio']:.3f}x (p10s); best fixed/best {p10['best_fixed_over_best']:.3f}, "
              f"given fixed/given {p10['given_fixed_over_given']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

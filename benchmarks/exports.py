"""Every export people make, side by side with the peers, timed by one clock of this script's own.

The export corpus (benchmarks/export_corpus.py) searched by autoprec and converted by the tools a user of that
engine reaches for, all timed by plain ONNX Runtime sessions (not autoprec's timing code) in interleaved rounds.

    python -m benchmarks exports generate CORPUS [--only ...] [--images SKIMAGE_WHEEL]   # = export_corpus.py
    python -m benchmarks exports cpu CORPUS [--models ...] [--threads 2] [--budget 16] [--quark-python PY]
    python -m benchmarks exports gpu CORPUS [--models ...] [--batches 32 1] [--budget 16] [--device N]
    python -m benchmarks exports report [JSON ...]      # the tables of results/exports*.json, merged
    python -m benchmarks exports cpu --quick            # a corpus of one generated classifier (gpu --quick: the
                                                        # GPU comparison on the CPU)

CPU (``ort-cpu``, batch 1, ``--threads`` fixed for every session): autoprec's shipped plan (``autoprec search
--max-loss 0.01``, best/model.onnx) against ONNX Runtime's ``quantize_static`` and AMD Quark, run as
benchmarks/qdq_forms.py runs them (U8S8, per-channel weights, MinMax, Conv/MatMul/Gemm; Quark in its own venv).
GPU (``ort-cuda``, batch 32 and 1, IO binding): autoprec's shipped plan against ModelOpt AutoCast
(``convert_to_mixed_precision(fp16, keep_io_types=True)`` on the given file, the batch's calibration half as its
data) and whole-model FP16 (onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)``).

Every method is timed beside the given FP32 model in ``ROUNDS`` interleaved rounds (each the median of >= 20 runs
after 5 warm-ups, each round starting one model later); a ratio is FP32's median over the method's per round, and
its spread the rounds' 10th–90th percentile. Loss: 1 - cosine against the given model's outputs on the search's
evaluation items (flattened per item, the mean over items), and for classifiers the share of top-1 decisions
that changed. A peer past the limit is reported with its loss, not raced. Writes results/exports_{cpu,gpu}.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _harness import (  # noqa: E402
    QUICK_RETIME,
    RESULTS,
    Report,
    add_output_arguments,
    add_retime_argument,
    with_quick,
)

MAX_LOSS = 0.01
ROUNDS = 15
RUNS, WARMUP = 20, 5
QUICK = {"budget": 2, "rounds": 2, "threads": 1, "batches": [2], "backend": "ort-cpu", "model_seconds": 300,
         "retime_seconds": QUICK_RETIME}


# --- the corpus and its data --------------------------------------------------------------------------------
def corpus_models(corpus: Path, names: list[str] | None) -> dict[str, dict]:
    models = json.loads((corpus / "corpus.json").read_text())["models"]
    return {k: v for k, v in models.items() if (not names or k in names) and "error" not in v}


def image_options(entry: dict):
    from autoprec.analysis.images import ImageOptions

    pre = entry.get("preprocess") or {}
    return ImageOptions(tuple(pre.get("mean", (0.0,))), tuple(pre.get("std", (1.0,))), pre.get("order", "RGB"),
                        float(pre.get("range", 1)), pre.get("resize", "stretch"))


def batch_shapes(entry: dict, batch: int) -> dict[str, list[int]]:
    return {i["name"]: [batch, *entry["shape"][1:]] for i in entry["inputs"]}


def items_at(corpus: Path, entry: dict, count: int) -> dict[str, np.ndarray]:
    """``count`` items for ``entry``: the corpus's images as its preprocessing makes them (then their mirror
    images, cycled), or its token ids."""
    if entry["layout"] == "tokens":
        with np.load(corpus / "tokens.npz") as tokens:
            return {name: tokens[name][np.arange(count) % len(tokens[name])] for name in tokens.files}
    from autoprec.analysis.data import load_items
    from autoprec.analysis.model_info import TensorSpec

    name = entry["inputs"][0]["name"]
    spec = TensorSpec(name, tuple(entry["shape"]), "float32")
    images = load_items(corpus / "images", (spec,), image_options(entry))[name]
    width_axis = 3 if entry["layout"] == "NCHW" else 2
    pool = np.concatenate([images, np.flip(images, axis=width_axis)])
    return {name: np.ascontiguousarray(pool[np.arange(count) % len(pool)])}


# --- the clock: plain ONNX Runtime, not autoprec's timing code -----------------------------------------------
class Timed:
    """One model's session on the CPU (``threads``) or one GPU (``device``, IO binding: inputs and outputs stay
    on the GPU, synchronised after each run)."""

    def __init__(self, path: Path, feeds: dict[str, np.ndarray], threads: int, device: int | None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        providers = (["CPUExecutionProvider"] if device is None
                     else [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"])
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.feeds = feeds
        self.outputs = [o.name for o in self.session.get_outputs()]
        if device is None:
            self.call = lambda: self.session.run(self.outputs, feeds)
        else:
            binding = self.session.io_binding()
            for name, value in feeds.items():
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", device))
            for name in self.outputs:
                binding.bind_output(name, "cuda", device)
            self.session.run_with_iobinding(binding)

            def call():
                self.session.run_with_iobinding(binding)
                binding.synchronize_outputs()
            self.call = call

    def median_ms(self) -> float:
        for _ in range(WARMUP):
            self.call()
        samples = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            self.call()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.outputs, feeds)


def time_side_by_side(paths: dict[str, Path], feeds: dict[str, np.ndarray], threads: int, device: int | None,
                      rounds: int) -> dict[str, list[float]]:
    """Each model's median per round, ``rounds`` interleaved rounds, each starting one model later; a model that
    fails to load or run is left out (its error kept under the key ``error: NAME``)."""
    sessions, failed = {}, {}
    for name, path in paths.items():
        try:
            sessions[name] = Timed(path, feeds, threads, device)
            sessions[name].call()
        except Exception as exc:  # noqa: BLE001 - a peer's model the engine refuses is a finding
            failed[f"error: {name}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    found: dict[str, list[float]] = {name: [] for name in sessions}
    names = list(sessions)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            found[name].append(sessions[name].median_ms())
    return {**found, **failed}


def ratios(fp32: list[float], other: list[float]) -> dict:
    per_round = [a / b for a, b in zip(fp32, other)]
    low, high = np.percentile(per_round, [10, 90])
    return {"x_fp32": statistics.median(per_round), "low": float(low), "high": float(high),
            "ms": statistics.median(other)}


# --- accuracy: the same for every method ---------------------------------------------------------------------
def judged(path: Path, reference: list[list[np.ndarray]], items: list[dict], classifier: bool, device: int | None
           ) -> dict:
    session = Timed(path, items[0], 0, device)
    cosines, changed, total = [], 0, 0
    for feeds, want in zip(items, reference):
        got = session.run(feeds)
        for a, b in zip(got, want):
            a, b = a.astype(np.float64).reshape(len(a), -1), b.astype(np.float64).reshape(len(b), -1)
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            cosines += list(np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-300), 1.0))
        if classifier:
            changed += int((got[0].argmax(-1) != want[0].argmax(-1)).sum())
            total += got[0].argmax(-1).size
    loss = float(1 - np.mean(cosines)) if all(np.isfinite(cosines)) else math.inf
    return {"loss": loss, "top1_changed": changed / total if total else None}


def casts(path: Path) -> int:
    import onnx

    return sum(n.op_type == "Cast" for n in onnx.load(str(path), load_external_data=False).graph.node)


# --- autoprec's search ---------------------------------------------------------------------------------------
def searched(model: Path, entry: dict, data: Path, batch: int, backend: str, args, threads: int, out: Path) -> dict:
    import autoprec

    t0 = time.monotonic()
    result = autoprec.search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data, shapes=batch_shapes(entry, batch), **_image_fields(entry)),
        engine=autoprec.EngineSpec(backend=backend, device=args.device, threads=threads),
        judge=autoprec.JudgeSpec(max_loss=MAX_LOSS), study=autoprec.StudySpec(budget=args.budget), out=out,
        retime_seconds=args.retime_seconds))
    chosen = result.chosen
    said = result.stated_versus().to_json().get("chosen_vs_fp32") if chosen is not None else None
    return {"wall_s": round(time.monotonic() - t0, 1), "counts": chosen.plan.counts() if chosen else None,
            "trial": chosen.number if chosen else None, "loss": chosen.loss if chosen else None, "stated": said,
            "preparation": list(result.model.preparation)}


def _image_fields(entry: dict) -> dict:
    if entry["layout"] == "tokens":
        return {}
    options = image_options(entry)
    return {"image_mean": options.mean, "image_std": options.std, "image_order": options.order,
            "image_scale": options.scale, "image_resize": options.resize}


def data_file(corpus: Path, entry: dict, batch: int, folder: Path) -> Path:
    """The search's --data: the image folder itself at batch 1 (what a user gives), else items as arrays."""
    if entry["layout"] != "tokens" and batch == 1:
        return corpus / "images"
    path = folder / f"{entry['name']}-b{batch}.npz"
    np.savez(path, **items_at(corpus, entry, max(2 * batch, 26)))
    return path


def evaluation_items(corpus: Path, entry: dict, batch: int) -> list[dict[str, np.ndarray]]:
    """Batches the accuracy of every method is judged on (the corpus's items at ``batch``, two batches at
    least)."""
    items = items_at(corpus, entry, max(2 * batch, 26))
    count = len(next(iter(items.values())))
    return [{k: v[i:i + batch] for k, v in items.items()} for i in range(0, count - batch + 1, batch)][:8]


# --- peers ---------------------------------------------------------------------------------------------------
def cpu_peers(model: Path, entry: dict, data: Path, folder: Path, quark_python: str | None) -> dict[str, Path | str]:
    from qdq_forms import peers

    from autoprec.analysis.baseline import load_baseline
    from autoprec.app.resolve import engine_space
    from autoprec.backends import get_backend
    from autoprec.core.search_space import load_search_space

    space, _, _ = engine_space(load_search_space(), get_backend("ort-cpu"), None)
    baseline = load_baseline(model, space, data, batch_shapes(entry, 1), image=image_options(entry))
    return peers(baseline, model, folder, quark_python)


def gpu_peers(model: Path, calibration: dict[str, np.ndarray], folder: Path) -> dict[str, Path | str]:
    import onnx

    made: dict[str, Path | str] = {}
    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision

        (folder / "calib").mkdir(exist_ok=True)
        np.savez(folder / "calib" / "batch.npz", **calibration)
        converted = convert_to_mixed_precision(str(model), "fp16", keep_io_types=True,
                                               calibration_data=str(folder / "calib"))
        onnx.save(converted, str(folder / "autocast.onnx"))
        made["modelopt_autocast"] = folder / "autocast.onnx"
    except Exception as exc:  # noqa: BLE001 - the peer's failure is reported
        made["modelopt_autocast"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        from onnxconverter_common import float16

        half = float16.convert_float_to_float16(onnx.load(str(model)), keep_io_types=True)
        onnx.save(half, str(folder / "fp16.onnx"))
        made["whole_fp16"] = folder / "fp16.onnx"
    except Exception as exc:  # noqa: BLE001
        made["whole_fp16"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return made


# --- one model -----------------------------------------------------------------------------------------------
def run_model(corpus: Path, entry: dict, batch: int, mode: str, args, folder: Path) -> dict:
    model = corpus / entry["name"] / "model.onnx"
    data = data_file(corpus, entry, batch, folder)
    backend = "ort-cpu" if mode == "cpu" else args.backend
    device = None if backend == "ort-cpu" else args.device
    threads = args.threads if mode == "cpu" else 0
    found = {"batch": batch, "casts_given": casts(model)}
    started = time.monotonic()

    def say(phase: str) -> None:
        print(f"  {entry['name']}@{batch}: {phase} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)

    search = searched(model, entry, data, batch, backend, args, threads, folder / "search")
    found["autoprec_search"] = search
    say("searched")
    methods: dict[str, Path | str] = {"fp32": model, "autoprec": folder / "search" / "best" / "model.onnx"}
    if mode == "cpu":
        methods.update(cpu_peers(model, entry, data, folder, args.quark_python))
    else:
        methods.update(gpu_peers(model, items_at(corpus, entry, batch), folder))
    say("peers converted")
    failed = {k: v for k, v in methods.items() if isinstance(v, str)}
    paths = {k: v for k, v in methods.items() if not isinstance(v, str)}
    items = evaluation_items(corpus, entry, batch)
    reference = [Timed(model, items[0], 0, None).run(feeds) for feeds in items]  # FP32 on the CPU: the reference
    classifier = entry["task"] == "classifier"
    results = {}
    for name, path in paths.items():
        try:
            results[name] = {**judged(path, reference, items, classifier, device), "casts": casts(path)}
        except Exception as exc:  # noqa: BLE001
            failed[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    say("judged")
    raced = {k: paths[k] for k in results if k in ("fp32", "autoprec") or results[k]["loss"] <= MAX_LOSS}
    rounds = time_side_by_side(raced, items[0], threads, device, args.rounds)
    for name, value in rounds.items():
        if name.startswith("error: "):
            failed[name[7:]] = value
        else:
            results[name].update(ratios(rounds["fp32"], value), rounds_ms=value)
    for name in results:
        results[name]["raced"] = name in raced and "ms" in results[name]
    say("timed")
    found.update(methods=results, failed=failed, verdict=verdict(results))
    return found


def verdict(results: dict) -> str:
    """Whether autoprec's plan is at least as fast as every peer within the limit, within the rounds' spread."""
    mine = results.get("autoprec", {})
    if "x_fp32" not in mine:
        return "autoprec not timed"
    ahead = [n for n, r in results.items() if n not in ("fp32", "autoprec") and r.get("raced")
             and r["low"] > mine["high"]]
    if ahead:
        return "slower than " + ", ".join(ahead) + " beyond the rounds"
    faster = [n for n, r in results.items() if n not in ("fp32", "autoprec") and r.get("raced")
              and r["x_fp32"] > mine["x_fp32"]]
    return "within the rounds of " + ", ".join(faster) if faster else "at least as fast as every peer within the limit"


# --- the run -------------------------------------------------------------------------------------------------
def run(mode: str, args) -> int:
    """Each model and batch in a process of its own (``--model-seconds`` at most: a model that hangs an engine or a
    peer is reported so, the rest still run), its phases logged with their times; the report written after each."""
    from autoprec.backends import get_backend

    engine = get_backend("ort-cpu", threads=args.threads) if mode == "cpu" else get_backend(args.backend, args.device)
    with tempfile.TemporaryDirectory() as quick:
        corpus = args.corpus or quick_corpus(Path(quick))
        report = Report(f"exports_{mode}", args, engine, budget=args.budget, max_loss=MAX_LOSS,
                        threads=args.threads if mode == "cpu" else None, rounds=args.rounds,
                        corpus=json.loads((corpus / "corpus.json").read_text()).get("machine"), models={})
        if report.path.exists():  # runs split over several calls add to one file
            report["models"] = json.loads(report.path.read_text()).get("models", {})
        for name, entry in sorted(corpus_models(corpus, args.models).items(),
                                  key=lambda item: (args.models or []).index(item[0]) if args.models else 0):
            for batch in [1] if mode == "cpu" else args.batches:
                key = f"{name}@{batch}"
                print(f"[{key}] … ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
                started = time.monotonic()
                result = in_a_process(mode, corpus, name, batch, args)
                report["models"][key] = {"exporter": entry["exporter"], "architecture": entry["architecture"],
                                         "sha256": entry["sha256"], "seconds": round(time.monotonic() - started, 1),
                                         **result}
                report.write()
    print_report([report.path])
    return 0


def in_a_process(mode: str, corpus: Path, name: str, batch: int, args) -> dict:
    """:func:`run_one` of one model at one batch in a process of its own, stopped after ``--model-seconds``."""
    with tempfile.TemporaryDirectory() as tmp:
        found = Path(tmp) / "one.json"
        command = [sys.executable, __file__, "one", mode, str(corpus), name, str(batch), str(found),
                   json.dumps({k: v for k, v in vars(args).items() if k in ONE_ARGS})]
        try:
            subprocess.run(command, timeout=args.model_seconds, check=False)
            return json.loads(found.read_text()) if found.exists() else {"error": "the run wrote nothing"}
        except subprocess.TimeoutExpired:
            return {"error": f"not finished in {args.model_seconds:g} s (stopped)"}


def quick_corpus(folder: Path) -> Path:
    """--quick's corpus: tests/builders.py's conv net (batch dim N) as one classifier, and 8 generated images."""
    from PIL import Image

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import builders

    (folder / "tiny").mkdir(parents=True)
    model = builders.save(builders.conv_net(batch="N"), folder / "tiny" / "model.onnx")
    (folder / "images").mkdir()
    for i, image in enumerate(builders.image_like(8)):
        pixels = (127.5 * (np.clip(image, -1, 1) + 1)).astype(np.uint8).transpose(1, 2, 0)
        Image.fromarray(pixels).save(folder / "images" / f"{i}.png")
    entry = {"name": "tiny", "architecture": "tests/builders.py conv_net", "exporter": "onnx.helper",
             "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "layout": "NCHW", "shape": [1, 3, 16, 16],
             "inputs": [{"name": "x", "shape": ["N", 3, 16, 16], "dtype": "float32"}], "task": "classifier"}
    (folder / "corpus.json").write_text(json.dumps({"machine": "generated by --quick", "models": {"tiny": entry}}))
    return folder


ONE_ARGS = ("budget", "threads", "device", "quark_python", "backend", "rounds", "retime_seconds")


def run_one(mode: str, corpus: Path, name: str, batch: int, out: Path, settings: str) -> int:
    """One model at one batch (the process :func:`run` starts), its result as JSON in ``out``."""
    import logging

    import onnxruntime

    args = argparse.Namespace(**{"backend": "ort-cpu", **json.loads(settings)})
    if args.backend == "ort-cuda" and hasattr(onnxruntime, "preload_dlls"):
        onnxruntime.preload_dlls()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logging.getLogger("autoprec").addHandler(handler)
    logging.getLogger("autoprec").setLevel(logging.INFO)
    entry = corpus_models(corpus, [name])[name]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            found = run_model(corpus, entry, batch, mode, args, Path(tmp))
        except Exception as exc:  # noqa: BLE001 - a model that fails is a finding, the others still run
            found = {"error": f"{type(exc).__name__}: {exc}"}
    out.write_text(json.dumps(found, default=str))
    return 0


def print_report(paths: list[Path]) -> None:
    for path in paths:
        report = json.loads(path.read_text())
        engine = report.get("engine") or {}  # a label, in reports written before the harness's
        said = engine if isinstance(engine, str) else f"{engine['engine']} {engine['version']} on {engine['device']}"
        print(f"\n{path.name}: {said}, budget {report.get('budget')}, max loss {report.get('max_loss')}"
              f", {report.get('rounds')} rounds")
        print(f"{'model@batch':<28} {'method':<22} {'×fp32':>6} {'p10–p90':>12} {'loss':>9} {'top-1 Δ':>8} "
              f"{'casts':>5}  verdict")
        for key, m in report["models"].items():
            if "error" in m:
                print(f"{key:<28} error: {m['error'][:100]}")
                continue
            first = True
            for name, r in m["methods"].items():
                x = f"{r['x_fp32']:.2f}" if "x_fp32" in r else "—"
                spread = f"{r['low']:.2f}–{r['high']:.2f}" if "low" in r else ("past limit" if not r.get("raced")
                                                                                else "—")
                top1 = f"{100 * r['top1_changed']:.1f}%" if r.get("top1_changed") is not None else "—"
                print(f"{key if first else '':<28} {name:<22} {x:>6} {spread:>12} {r['loss']:>9.2e} {top1:>8} "
                      f"{r['casts']:>5}  {m['verdict'] if first else ''}")
                first = False
            for name, error in m.get("failed", {}).items():
                print(f"{'':<28} {name:<22} failed: {error[:90]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("generate", help="make the corpus (benchmarks/export_corpus.py's options)", add_help=False)
    modes = {}
    for mode in ("cpu", "gpu"):
        p = modes[mode] = sub.add_parser(mode)
        p.add_argument("corpus", type=Path, nargs="?", help="the corpus (with --quick: one generated classifier)")
        p.add_argument("--models", nargs="*")
        p.add_argument("--budget", type=int, default=16)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--device", type=int, default=0)
        p.add_argument("--batches", nargs="*", type=int, default=[32, 1])
        p.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds of every method beside FP32")
        p.add_argument("--quark-python", help="a venv's python with amd-quark (benchmarks/quark_quantize.py)")
        p.add_argument("--model-seconds", type=float, default=900, help="stop a model (at one batch) after this long")
        p.add_argument("--backend", default="ort-cuda" if mode == "gpu" else "ort-cpu",
                       help="gpu: ort-cpu makes the GPU comparison on the CPU (to try it)")
        add_retime_argument(p)
        add_output_arguments(p)
    p = sub.add_parser("one", help="one model at one batch (what cpu/gpu run in a process of its own)")
    for name in ("one_mode", "corpus", "name", "batch", "out", "settings"):
        p.add_argument(name)
    p = sub.add_parser("report")
    p.add_argument("json", nargs="*", type=Path)
    args, rest = parser.parse_known_args(argv)
    if args.mode == "generate":
        from export_corpus import main as generate

        return generate(rest)
    if args.mode == "one":
        return run_one(args.one_mode, Path(args.corpus), args.name, int(args.batch), Path(args.out), args.settings)
    if args.mode == "report":
        print_report(args.json or sorted(RESULTS.glob("exports_*.json")))
        return 0
    parser.parse_args(argv)  # nothing left over
    args = with_quick(modes[args.mode], args, QUICK)
    if args.corpus is None and not args.quick:
        parser.error(f"{args.mode}: give the CORPUS (benchmarks/export_corpus.py makes it), or --quick")
    return run(args.mode, args)


if __name__ == "__main__":
    sys.exit(main())

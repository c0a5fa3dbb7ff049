"""The decoder corpus side by side: autoprec's search, its all-FP16 plan and ONNX Runtime's quantizers per decoder.

Per decoder of the corpus (benchmarks/decoder_corpus.py), autoprec's search with one shape of data as a user gives
it, its all-FP16 plan, ONNX Runtime's ``quantize_dynamic`` and ``quantize_static`` (QDQ, calibrated on the same
data), each against the given FP32 model, in one run:

- per phase, the speed-up over FP32 with its 95 % interval (interleaved rounds, every session built anew per block:
  autoprec's own final timing, :func:`autoprec.measure.speedup.time_until_known`): prefill (the prompt's tokens, no
  past: time to first token) and decode (one token after a past of 40: per-token latency), batch 1;
- what a user sees: greedy generation of 16 tokens from 8 prompts, the share of tokens as FP32's before the first
  that is not, and 1 - cosine of the logits at prefill (7 tokens and 1) and at decode after pasts of 0 to 40 made
  by the FP32 model, batch 1 and 3 (the worst) — computed here, not by autoprec.

    python -m benchmarks decoders CORPUS [--only NAME ...] [--budget 16] [--threads 1] [--precisions LIST] [--backend ort-cuda]
        [--peers quantize_dynamic quantize_static int4_rtn int4_hqq int4_gptq] --json OUT.json
    python -m benchmarks decoders [CORPUS] --quick    # its first entry (without CORPUS: a generated decoder)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import QUICK_RETIME, Report, add_retime_argument, parse_arguments  # noqa: E402

import autoprec  # noqa: E402
from autoprec.analysis.data import Workload  # noqa: E402
from autoprec.app.cli import main as cli  # noqa: E402
from autoprec.backends import get_backend  # noqa: E402
from autoprec.core.stored import load  # noqa: E402
from autoprec.measure.speedup import time_until_known  # noqa: E402

PROMPT, DECODE_PAST, GENERATED, PROMPTS = 7, 40, 16, 8
QUICK = {"budget": 2, "seconds": 0.5, "retime_seconds": QUICK_RETIME}


class Decoder:
    """A model file run as a decoder: prefill and decode feeds, greedy generation (this benchmark's own code)."""

    def __init__(self, path: Path, threads: int, backend: str = "ort-cpu"):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        if backend == "ort-cuda":  # (cuDNN and cuBLAS from the nvidia wheels)
            getattr(onnxruntime, "preload_dlls", lambda: None)()
            providers.insert(0, "CUDAExecutionProvider")
        self.session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def feeds(self, ids: np.ndarray, made: dict | None, past: int) -> dict[str, np.ndarray]:
        rows, found = len(ids), {}
        for name, spec in self.inputs.items():
            if name in ("input_ids", "decoder_input_ids"):
                found[name] = ids
            elif name in ("attention_mask", "decoder_attention_mask"):
                found[name] = np.ones((rows, past + ids.shape[1]), np.int64)
            elif name == "position_ids":
                found[name] = np.tile(np.arange(past, past + ids.shape[1]), (rows, 1))
            elif name.startswith("past_key_values") and made and name.replace("past_key_values", "present") in made:
                found[name] = made[name.replace("past_key_values", "present")]
            else:  # an empty past, or an encoder-decoder's fixed context of PROMPT positions
                length = PROMPT if "encoder" in name else 0
                shape = [rows if i == 0 else (d if isinstance(d, int) else length) for i, d in enumerate(spec.shape)]
                found[name] = (np.ones if spec.type == "tensor(int64)" else np.zeros)(
                    shape, np.int64 if spec.type == "tensor(int64)" else np.float32)
        return found

    def run(self, feeds: dict) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(None, feeds)))

    def generate(self, ids: np.ndarray, steps: int) -> np.ndarray:
        made, past, tokens = None, 0, []
        for _ in range(steps):
            outputs = self.run(self.feeds(ids, made, past))
            past, made = past + ids.shape[1], outputs
            ids = outputs[self.outputs[0]][:, -1:].argmax(-1)
            tokens.append(ids)
        return np.concatenate(tokens, axis=1)


def _cosine_loss(a: np.ndarray, b: np.ndarray) -> float:
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    if not np.isfinite(b).all():
        return float("inf")
    return float(1 - ((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).mean())


def judged(given: Decoder, other: Decoder, vocab: int) -> dict:
    """What a user sees of ``other`` against ``given``: generation agreement, and the logits' worst loss per phase."""
    rng = np.random.default_rng(11)
    prompts = rng.integers(0, vocab, (PROMPTS, PROMPT))
    want, got = given.generate(prompts, GENERATED), other.generate(prompts, GENERATED)
    agreement = float(np.cumprod(want == got, axis=1).mean())
    prefill, decode = 0.0, 0.0
    for rows in (1, 3):
        for tokens in (PROMPT, 1):
            feeds = given.feeds(rng.integers(0, vocab, (rows, tokens)), None, 0)
            prefill = max(prefill, _cosine_loss(given.run(feeds)[given.outputs[0]], other.run(feeds)[given.outputs[0]]))
        ids, made = rng.integers(0, vocab, (rows, 1)), None
        for past in range(DECODE_PAST + 1):
            feeds = given.feeds(ids, made, past)
            made = given.run(feeds)
            decode = max(decode, _cosine_loss(made[given.outputs[0]], other.run(feeds)[given.outputs[0]]))
            ids = made[given.outputs[0]][:, -1:].argmax(-1)
    return {"generation_agreement": agreement, "prefill_logits_loss": prefill, "decode_logits_loss": decode}


def phase_batches(given: Decoder, vocab: int) -> dict[str, dict]:
    """Batch 1 at prefill (PROMPT tokens, no past) and at decode (one token after DECODE_PAST, made by FP32)."""
    rng = np.random.default_rng(12)
    prefill = given.feeds(rng.integers(0, vocab, (1, PROMPT)), None, 0)
    made, past, ids = given.run(prefill), PROMPT, rng.integers(0, vocab, (1, 1))
    while past < DECODE_PAST:
        made = given.run(given.feeds(ids, made, past))
        past += 1
    return {"prefill": prefill, "decode": given.feeds(ids, made, past)}


def peers(model: Path, data: Path, out: Path, chosen: list[str]) -> dict[str, Path]:
    """ONNX Runtime's whole-model quantizers on the same model, those ``chosen`` of: dynamic INT8 (weights), static
    QDQ INT8 calibrated on the data as given, and INT4 weights by its MatMulNBitsQuantizer (round to nearest, HQQ,
    GPTQ; symmetric, block 32, accuracy level 4 as autoprec's)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            with np.load(data) as arrays:
                self.items = iter([{k: arrays[k][i:i + 1] for k in arrays.files} for i in range(len(arrays["input_ids"]))])

        def get_next(self):
            return next(self.items, None)

    made = {name: out / f"{name}.onnx" for name in chosen}
    if "quantize_dynamic" in made:
        quantize_dynamic(str(model), str(made["quantize_dynamic"]), use_external_data_format=True)
    if "quantize_static" in made:
        quantize_static(str(model), str(made["quantize_static"]), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, use_external_data_format=True)
    for name in [n for n in made if n.startswith("int4_")]:
        int4_whole_model(model, made[name], name.removeprefix("int4_"), Reader)
    return made


def int4_whole_model(model: Path, out: Path, algorithm: str, reader=None) -> None:
    """ONNX Runtime's MatMulNBitsQuantizer on every MatMul with a constant weight (``rtn``, ``hqq``, or ``gptq``
    with its Hessians from the data ``reader()`` reads)."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    config = (nbits.HQQWeightOnlyQuantConfig(block_size=32) if algorithm == "hqq" else
              nbits.GPTQWeightOnlyQuantConfig(calibration_data_reader=reader()) if algorithm == "gptq" else
              nbits.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, accuracy_level=4))
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(model)), block_size=32, is_symmetric=True, accuracy_level=4,
                                           algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(str(out), use_external_data_format=True)


def searched(model: Path, data: Path, out: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """autoprec's search (one shape of data, as a user gives it), its best/ and all-FP16 plans as files."""
    started = time.monotonic()
    result = autoprec.search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec(max_loss=args.max_loss, metric=args.metric or "auto"),
        space=autoprec.SpaceSpec(precisions=args.precisions.split(",") if args.precisions else None),
        engine=autoprec.EngineSpec(backend=args.backend, threads=args.threads), study=autoprec.StudySpec(budget=args.budget),
        out=out / "search", retime_seconds=args.retime_seconds))
    wall = time.monotonic() - started
    pareto = json.loads((out / "search" / "pareto.json").read_text())
    files = {"autoprec": out / "search" / "best" / "model.onnx"}
    fp16 = pareto["uniform"].get("fp16")
    if fp16 is not None:
        exported = cli(["export", str(out / "search"), "--format", "triton", "--trial", str(fp16), "--out",
                        str(out / "fp16"), "--name", "m"])
        assert exported == 0, f"autoprec export of the all-FP16 plan: exit {exported}"
        files["all-FP16"] = out / "fp16" / "m" / "1" / "model.onnx"
    chosen = result.chosen
    return files, {"wall_seconds": round(wall, 1), "metric": pareto["search"]["metric"],
                   "judged_shapes": [p["name"] for p in pareto["search"]["judged_shapes"]],
                   "chosen_mix": chosen.mix if chosen else None, "chosen_loss": chosen.loss if chosen else None,
                   "int4_kernels": pareto["search"].get("int4_kernels")}


def timed(files: dict[str, Path], batches: dict[str, dict], backend: str, threads: int, seconds: float) -> dict:
    """Each model's speed-up over FP32 per phase, with its 95 % interval, from interleaved rounds."""
    backend = get_backend(backend, 0, None, threads)
    models = {name: load(path) for name, path in files.items()}
    found = {}
    for phase, batch in batches.items():
        feeds = {k: v for k, v in batch.items()}
        rounds = time_until_known(backend, models, Workload.of(feeds), [("fp32", n) for n in models if n != "fp32"],
                                  seconds)
        found[phase] = {name: {"speedup": s.speedup, "low": s.low, "high": s.high,
                               "ms": float(np.median([t.median_ms for t in rounds.timings[name]]))}
                        for name in models if name != "fp32" for s in [rounds.speedup("fp32", name)]}
        found[phase]["fp32"] = {"ms": float(np.median([t.median_ms for t in rounds.timings["fp32"]]))}
    return found


def run_entry(folder: Path, entry: dict, args: argparse.Namespace) -> dict:
    model, data = folder / entry["searched"], folder / "data.npz"
    with tempfile.TemporaryDirectory(prefix="autoprec-decoders-") as tmp:
        work = Path(tmp)
        files, search = searched(model, data, work, args)
        files.update(peers(model, data, work, args.peers))
        given = Decoder(model, args.threads, args.backend)
        vocab = int(given.session.get_outputs()[0].shape[-1])
        accuracy = {name: judged(given, Decoder(path, args.threads, args.backend), vocab) for name, path in files.items()}
        speed = timed({"fp32": model, **files}, phase_batches(given, vocab), args.backend, args.threads, args.seconds)
    return {"architecture": entry["architecture"], "search": search, "accuracy": accuracy, "speed": speed}


def table(report: dict) -> str:
    lines = ["| decoder | method | prefill ×FP32 | decode ×FP32 | generation same | logits loss prefill / decode |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, found in report["models"].items():
        for method, accuracy in found["accuracy"].items():
            speed = [found["speed"][p].get(method, {}) for p in ("prefill", "decode")]
            said = [f"{s['speedup']:.2f} ({s['low']:.2f}–{s['high']:.2f})" if s else "—" for s in speed]
            lines.append(f"| {name} | {method} | {said[0]} | {said[1]} | {accuracy['generation_agreement']:.0%} | "
                         f"{accuracy['prefill_logits_loss']:.2g} / {accuracy['decode_logits_loss']:.2g} |")
    return "\n".join(lines)


def quick_corpus(folder: Path) -> Path:
    """--quick's corpus: tests/builders.py's one-layer decoder with a KV cache, named as optimum exports GPT-2."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import builders

    (folder / "kv").mkdir(parents=True)
    model = builders.save(builders.kv_decoder(), folder / "kv" / "model.onnx")
    builders.decoder_data(model, folder / "kv" / "data.npz")
    entry = {"name": "kv", "architecture": "tests/builders.py kv_decoder (1 layer, 16 wide)", "searched": "model.onnx"}
    (folder / "corpus.json").write_text(json.dumps({"exporter": "onnx.helper", "models": [entry]}))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, nargs="?", help="the corpus (with --quick: a generated decoder)")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--max-loss", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", choices=["ort-cpu", "ort-cuda"], default="ort-cpu",
                        help="the engine every model runs on: the search's, the judging's and the timing's")
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's timing, at most (after 6 blocks)")
    parser.add_argument("--precisions", help="autoprec's --precisions (default: the engine's default)")
    parser.add_argument("--metric", help="autoprec's --metric (default: a decoder's, generation)")
    parser.add_argument("--peers", nargs="*", default=["quantize_dynamic", "quantize_static"],
                        choices=["quantize_dynamic", "quantize_static", "int4_rtn", "int4_hqq", "int4_gptq"])
    add_retime_argument(parser)
    args = parse_arguments(parser, argv, QUICK)
    if args.corpus is None and not args.quick:
        parser.error("give the CORPUS (benchmarks/decoder_corpus.py makes it), or --quick")
    with tempfile.TemporaryDirectory() as quick:
        folder = args.corpus or quick_corpus(Path(quick))
        corpus = json.loads((folder / "corpus.json").read_text())
        entries = [e for e in corpus["models"] if not args.only or e["name"] in args.only][:1 if args.quick else None]
        report = Report("decoders", args, get_backend(args.backend, 0, None, args.threads), corpus=corpus,
                        budget=args.budget, max_loss=args.max_loss, threads=args.threads, precisions=args.precisions, metric=args.metric,
                        peers=args.peers, models={})
        for entry in entries:
            print(f"[{entry['name']}] …", file=sys.stderr, flush=True)
            report["models"][entry["name"]] = run_entry(folder / entry["name"], entry, args)
            report.write()
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The decoder corpus: decoders exported with their KV cache as people export them (Hugging Face optimum,
``text-generation-with-past``; an encoder-decoder's ``text2text-generation-with-past``), from architectures that
ship in transformers, with random weights (nothing is downloaded), in two sizes, the larger 1024 wide.

    python benchmarks/decoder_corpus.py OUT [--only NAME ...]   # in a venv with torch, transformers, optimum-onnx

Writes OUT/NAME/ (optimum's export: model.onnx, or the encoder-decoder's encoder_model.onnx and
decoder_with_past_model.onnx), OUT/NAME/data.npz (one shape, as a user would give it: 7 tokens after a past of 12,
the past made by the FP32 model from 12 earlier tokens) and OUT/corpus.json (architecture, size, exporter and
versions, the searched file, its sha256). benchmarks/decoders.py runs the corpus side by side with peers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

PAST, TOKENS = 12, 7  # the data's one shape: TOKENS tokens after a past of PAST
ITEMS = 16


@dataclass(frozen=True)
class Entry:
    """One corpus decoder: its transformers architecture and size, optimum's task, the file autoprec searches."""

    name: str
    architecture: str
    config: dict
    task: str = "text-generation-with-past"
    searched: str = "model.onnx"


def _gpt2(width: int, layers: int, vocab: int) -> dict:
    return {"model_type": "gpt2", "n_embd": width, "n_layer": layers, "n_head": width // 64, "vocab_size": vocab,
            "n_positions": 512}


def _llama(model_type: str, width: int, layers: int, vocab: int, kv_heads: int) -> dict:
    return {"model_type": model_type, "hidden_size": width, "num_hidden_layers": layers,
            "num_attention_heads": width // 64, "num_key_value_heads": kv_heads, "intermediate_size": width * 8 // 3,
            "vocab_size": vocab, "max_position_embeddings": 512}


CORPUS = [
    Entry("gpt2-256", "GPT-2 (4 layers, 256 wide)", _gpt2(256, 4, 4096)),
    Entry("gpt2-1024", "GPT-2 (4 layers, 1024 wide)", _gpt2(1024, 4, 32000)),
    Entry("llama-256", "LLaMA (4 layers, 256 wide, grouped-query attention)", _llama("llama", 256, 4, 4096, 2)),
    Entry("llama-1024", "LLaMA (4 layers, 1024 wide, grouped-query attention)", _llama("llama", 1024, 4, 32000, 4)),
    Entry("qwen2-256", "Qwen2 (4 layers, 256 wide, grouped-query attention)", _llama("qwen2", 256, 4, 4096, 2)),
    Entry("qwen2-1024", "Qwen2 (4 layers, 1024 wide, grouped-query attention)", _llama("qwen2", 1024, 4, 32000, 4)),
    Entry("t5-256", "T5 encoder-decoder (2+2 layers, 256 wide): its decoder with past",
          {"model_type": "t5", "d_model": 256, "d_ff": 1024, "num_layers": 2, "num_decoder_layers": 2,
           "num_heads": 4, "d_kv": 64, "vocab_size": 4096, "decoder_start_token_id": 0},
          "text2text-generation-with-past", "decoder_with_past_model.onnx"),
    # held out from the INT4 work (issue 71): exported after it, searched once (docs/engines.md); decode data of
    # one token after the past of 12 is data.npz's input_ids[:, :1], attention_mask[:, :13], position_ids[:, :1]
    Entry("phi3-1024", "Phi-3 (4 layers, 1024 wide, fused qkv and gate/up, a 3000-wide MLP)",
          {"model_type": "phi3", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
           "num_key_value_heads": 16, "intermediate_size": 3000, "vocab_size": 32064, "max_position_embeddings": 512,
           "original_max_position_embeddings": 512, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    Entry("opt-1024", "OPT (4 layers, 1024 wide, ReLU MLP, learned positions)",
          {"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 4, "ffn_dim": 4096,
           "num_attention_heads": 16, "vocab_size": 32000, "word_embed_proj_dim": 1024,
           "max_position_embeddings": 512}),
    # held out from INT4 embeddings (issue 71): its head reads the embedding's table (tied), searched once
    Entry("gemma-1024", "Gemma (4 layers, 1024 wide, GeGLU MLP, one KV head, tied embeddings)",
          {"model_type": "gemma", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 1, "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000,
           "max_position_embeddings": 512, "tie_word_embeddings": True}),
]


def build(entry: Entry, folder: Path) -> None:
    """The architecture with random weights, saved as a transformers checkpoint, exported by optimum's CLI."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**entry.config)
    auto = (transformers.AutoModelForSeq2SeqLM if entry.task.startswith("text2text")
            else transformers.AutoModelForCausalLM)
    checkpoint = folder / "checkpoint"
    auto.from_config(config).eval().save_pretrained(checkpoint)
    # optimum-cli as a module: where its wheels were installed with --target (the GPU machine), no script is
    subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(checkpoint),
                    "--task", entry.task, str(folder)], check=True, capture_output=True)


def make_data(model: Path, path: Path) -> None:
    """ITEMS items of TOKENS tokens after a past of PAST, the past the model's own from PAST earlier tokens; inputs
    a decoder with past also takes (an encoder-decoder's encoder states) from zeros of their declared dims."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    vocab = session.get_outputs()[0].shape[-1]
    rng = np.random.default_rng(1)
    rows: dict[str, list] = {i.name: [] for i in session.get_inputs()}
    for _ in range(ITEMS):
        first = _feeds(session, rng.integers(0, vocab, (1, PAST)), {}, 0)
        made = dict(zip(outputs, session.run(None, first)))
        item = _feeds(session, rng.integers(0, vocab, (1, TOKENS)), made, PAST)
        for name in rows:
            rows[name].append(item[name][0])
    np.savez(path, **{name: np.stack(values) for name, values in rows.items()})


def _feeds(session, ids: np.ndarray, made: dict, past: int) -> dict[str, np.ndarray]:
    found = {}
    for spec in session.get_inputs():
        name = spec.name
        if name in ("input_ids", "decoder_input_ids"):
            found[name] = ids
        elif name in ("attention_mask", "decoder_attention_mask"):
            found[name] = np.ones((1, past + ids.shape[1]), np.int64)
        elif name == "position_ids":
            found[name] = np.arange(past, past + ids.shape[1])[None]
        elif name.startswith("past_key_values"):
            present = name.replace("past_key_values", "present")
            fixed = TOKENS if "encoder" in name else 0  # an encoder's cache: the fixed context, not grown
            found[name] = made.get(present, _zeros(spec, fixed))
        else:  # an encoder-decoder's encoder mask or states: a fixed context of TOKENS positions
            found[name] = _zeros(spec, TOKENS, ones=spec.type == "tensor(int64)")
    return found


def _zeros(spec, length: int, ones: bool = False) -> np.ndarray:
    shape = [1 if i == 0 else (d if isinstance(d, int) else length) for i, d in enumerate(spec.shape)]
    dtype = np.int64 if spec.type == "tensor(int64)" else np.float32
    return (np.ones if ones else np.zeros)(shape, dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", help="these entries only")
    args = parser.parse_args(argv)
    import optimum
    import torch
    import transformers

    made = []
    for entry in CORPUS:
        if args.only and entry.name not in args.only:
            continue
        folder = args.out / entry.name
        folder.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        build(entry, folder)
        make_data(folder / entry.searched, folder / "data.npz")
        sha = hashlib.sha256((folder / entry.searched).read_bytes()).hexdigest()
        made.append({**asdict(entry), "sha256": sha, "seconds": round(time.monotonic() - started, 1)})
        print(f"{entry.name}: {folder / entry.searched} ({time.monotonic() - started:.0f} s)", flush=True)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "optimum": getattr(optimum, "__version__", "?"), "python": platform.python_version()}
    (args.out / "corpus.json").write_text(json.dumps({"exporter": "optimum", "versions": versions,
                                                      "data": {"tokens": TOKENS, "past": PAST, "items": ITEMS},
                                                      "models": made}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

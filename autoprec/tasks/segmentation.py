"""segmentation: the class of each pixel, the plan's against FP32's as a mean IoU; against the
data's ``masks`` for ``segmentation@labels``."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoprec.tasks import regions
from autoprec.tasks.task import Reading, Task

NAME = "segmentation"


class Segmentation(Task):
    name = NAME
    key = "miou"
    said = "1 − mIoU vs FP32"
    shown = (("miou", "mIoU vs FP32"), ("miou_labels", "mIoU vs labels"))
    labels = "masks"
    label_form = "N×H×W integer class per pixel, as the output's map; negative = not labelled"
    implied = True
    needs = "it needs per-pixel class scores N×C×H×W or class ids N×H×W (--task-output)"

    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        return NAME in reading.asked and reading.reads(name) and regions.class_map(ref) is not None

    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        ref_ids, cand_ids = regions.class_map(ref), regions.class_map(cand)
        found = {"pixel_agreement": float((ref_ids == cand_ids).mean()),
                 "miou": float(np.mean([regions.mean_iou(c, r) for c, r in zip(cand_ids, ref_ids)]))}
        truth = labels.get("masks")
        if truth is not None and truth.shape == cand_ids.shape:
            found["miou_labels"] = float(np.mean([regions.mean_iou(c, t) for c, t in zip(cand_ids, truth)]))
        return found

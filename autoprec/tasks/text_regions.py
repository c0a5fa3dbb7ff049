"""text-regions: the text regions a DBNet detector's probability map holds (binarised as PaddleOCR
does), the plan's matched to FP32's as an F-score; against the data's ``boxes`` for
``text-regions@labels``."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoprec.tasks import regions
from autoprec.tasks.boxes import padded_boxes
from autoprec.tasks.task import Reading, Task

NAME = "text-regions"


class TextRegions(Task):
    name = NAME
    key = "region_f"
    said = "1 − region F vs FP32"
    shown = (("region_f", "text regions F vs FP32"), ("region_f_labels", "text regions F vs "
                                                                         "labels"))
    labels = "boxes"
    label_form = "N×M×5 rows of class, x1, y1, x2, y2 in input pixels; a negative class pads"
    needs = "it needs a DBNet probability map shaped N×1×H×W or N×H×W, values in [0, 1] (--task-output)"
    lower_is_closer = ("region_count_change",)

    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        return NAME in reading.asked and reading.reads(name) and regions.probability_maps(ref) is not None

    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        key = (NAME, name, len(ref))  # FP32's regions, decoded once for every plan
        if key not in reading.kept:
            reading.kept[key] = _regions(reading, ref)
        fp32, mine = reading.kept[key], _regions(reading, cand)
        counted = sum(map(len, fp32))
        found = {"region_f": regions.region_f_score(mine, fp32),
                 "region_count_change": (sum(map(len, mine)) - counted) / max(1, counted)}
        if "boxes" in labels:
            truth = [b[:, 1:5] for b in padded_boxes(labels["boxes"])]
            found["region_f_labels"] = regions.region_f_score(mine, truth)
        return found


def _regions(reading: Reading, output: np.ndarray) -> list[np.ndarray]:
    """Each image's text regions, decoded with the options' thresholds."""
    options = reading.options
    return [regions.text_regions(m, options.db_thresh, options.db_box_thresh) for m in regions.maps(output)]

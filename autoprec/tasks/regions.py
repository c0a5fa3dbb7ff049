"""What text detectors and segmenters decide: DBNet-style probability maps binarised into text
regions (as PaddleOCR's post-processing does, its thresholds by default), and per-pixel classes.
Compared plan against FP32: the F-score of matched regions, the mean IoU of the classes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DB_THRESHOLD = 0.3  # PaddleOCR's det_db_thresh: a pixel of text
DB_BOX_THRESHOLD = 0.6  # det_db_box_thresh: a region kept when its mean probability reaches this
MIN_SIDE = 3  # PaddleOCR's min_size: smaller regions are noise
MATCH_IOU = 0.5
# A sigmoid computed in float may pass 1 by a rounding step (ONNX Runtime's CPU gave 1.0000001 on
# one page of PP-OCRv5's map): probabilities may lie this far outside [0, 1].
ROUNDING = 1e-5


def probabilities(values: np.ndarray) -> bool:
    """Whether ``values`` are probabilities: in [0, 1] but for float rounding."""
    return values.size > 0 and bool(values.min() >= -ROUNDING and values.max() <= 1 + ROUNDING)


def maps(output: np.ndarray) -> np.ndarray | None:
    """An N×1×H×W or N×H×W float output as N×H×W maps; None for any other output."""
    if output.dtype.kind != "f" or output.ndim not in (3, 4) or (output.ndim == 4 and output.shape[1] != 1):
        return None
    found = output[:, 0] if output.ndim == 4 else output
    return found if found.shape[-1] >= 8 and found.shape[-2] >= 8 else None


def probability_maps(output: np.ndarray) -> np.ndarray | None:
    """N×1×H×W or N×H×W probabilities (a DBNet head's sigmoid) as N×H×W; None for any other output.
    (A plan's map is decoded whatever its values: a lowered sigmoid may overshoot 1 by more than a
    float rounding.)"""
    found = maps(output)
    return found if found is not None and probabilities(found) else None


@dataclass(frozen=True)
class Runs:
    """A boolean H×W mask's horizontal runs of True pixels, in raster order: each run's row, its
    first column and the column past its last, and the 4-connected region (0…K-1, numbered in the
    raster order of their first pixels) it belongs to. A text map's regions are a few thousand runs,
    not hundreds of thousands of pixels."""

    row: np.ndarray
    start: np.ndarray
    end: np.ndarray
    region: np.ndarray

    @classmethod
    def of(cls, mask: np.ndarray) -> Runs:
        padded = np.zeros((mask.shape[0], mask.shape[1] + 2), np.int8)
        padded[:, 1:-1] = mask
        edges = np.diff(padded, axis=1)
        # row-major: the k-th start and the k-th end are one run's
        row, start = np.nonzero(edges == 1)
        end = np.nonzero(edges == -1)[1]
        return cls(row, start, end, _joined(row, start, end, mask.shape[1] + 1))

    @property
    def regions(self) -> int:
        return int(self.region.max()) + 1 if self.region.size else 0


def _joined(row: np.ndarray, start: np.ndarray, end: np.ndarray, stride: int) -> np.ndarray:
    """Each run's region: runs of adjacent rows that share a column are joined (min-label hooking
    with pointer jumping over the runs, so the passes grow with the log of a region's size)."""
    first, past = row * stride + start, row * stride + end  # sorted: runs are in raster order
    # runs of the row above ending after
    above_lo = np.searchsorted(past, (row - 1) * stride + start, side="right")
    # ... and starting before this run's end
    above_hi = np.searchsorted(first, (row - 1) * stride + end, side="left")
    touching = np.maximum(above_hi - above_lo, 0)
    # a run below, once for each run above it touches
    below = np.repeat(np.arange(row.size), touching)
    # 0, 1 … per run below
    within = np.arange(touching.sum()) - np.repeat(np.cumsum(touching) - touching, touching)
    above = np.repeat(above_lo, touching) + within
    parent = np.arange(row.size)
    while True:
        lowest = np.minimum(parent[below], parent[above])
        np.minimum.at(parent, parent[below], lowest)
        np.minimum.at(parent, parent[above], lowest)
        while not np.array_equal(jumped := parent[parent], parent):
            parent = jumped
        if np.array_equal(parent[below], parent[above]):
            # roots are each region's first run: raster order
            return np.unique(parent, return_inverse=True)[1]


def text_regions(probability: np.ndarray, threshold: float = DB_THRESHOLD,
                 box_threshold: float = DB_BOX_THRESHOLD) -> np.ndarray:
    """K×4 boxes (x1, y1, x2, y2) of the map's text regions: pixels above ``threshold``, joined into
    connected regions, kept where their mean probability reaches ``box_threshold`` and both sides
    MIN_SIDE; in the raster order of their first pixels."""
    runs = Runs.of(probability > threshold)
    count = runs.regions
    if not count:
        return np.zeros((0, 4), np.float64)
    summed = np.zeros((probability.shape[0], probability.shape[1] + 1), np.float64)
    np.cumsum(probability, axis=1, out=summed[:, 1:])
    pixels = np.bincount(runs.region, weights=runs.end - runs.start)
    total = np.bincount(runs.region,
                        weights=summed[runs.row, runs.end] - summed[runs.row, runs.start])
    x1, y1 = np.full(count, probability.shape[1]), np.full(count, probability.shape[0])
    x2, y2 = np.zeros(count, np.int64), np.zeros(count, np.int64)
    np.minimum.at(x1, runs.region, runs.start)
    np.minimum.at(y1, runs.region, runs.row)
    np.maximum.at(x2, runs.region, runs.end)
    np.maximum.at(y2, runs.region, runs.row + 1)
    kept = (total / pixels >= box_threshold) & (np.minimum(x2 - x1, y2 - y1) >= MIN_SIDE)
    return np.stack([x1, y1, x2, y2], axis=1)[kept].astype(np.float64)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` with every box of ``b`` (K×M)."""
    x1, y1 = np.maximum(a[:, None, 0], b[None, :, 0]), np.maximum(a[:, None, 1], b[None, :, 1])
    x2, y2 = np.minimum(a[:, None, 2], b[None, :, 2]), np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda boxes: (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-12)


def region_f_score(found: list[np.ndarray], truth: list[np.ndarray], iou: float = MATCH_IOU) -> float:
    """F-score of ``found`` regions against ``truth`` over all images: one-to-one matches of IoU >=
    ``iou``, best first (1.0 where both have none)."""
    matched = total = 0
    for mine, theirs in zip(found, truth):
        total += len(mine) + len(theirs)
        if len(mine) and len(theirs):
            overlap = _iou(mine, theirs)
            free_mine, free_theirs = set(range(len(mine))), set(range(len(theirs)))
            for i, j in zip(*np.unravel_index(np.argsort(-overlap, axis=None), overlap.shape)):
                if overlap[i, j] < iou:
                    break
                if i in free_mine and j in free_theirs:
                    free_mine.discard(i)
                    free_theirs.discard(j)
                    matched += 1
    return 1.0 if total == 0 else 2.0 * matched / total


def class_map(output: np.ndarray) -> np.ndarray | None:
    """Per-pixel classes of a segmenter's output: N×C×H×W scores (C ≥ 2: the argmax) or N×H×W class
    ids."""
    if output.ndim == 4 and output.dtype.kind == "f" and output.shape[1] >= 2:
        return output.argmax(1)
    if output.ndim == 3 and output.dtype.kind in "iu":
        return output
    return None


def mean_iou(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Mean over the classes either holds of their pixel IoU (negative truth: not labelled); 1.0 for
    none."""
    scored = truth >= 0
    ious = []
    for cls in np.union1d(np.unique(predicted[scored]), np.unique(truth[scored])):
        mine, theirs = (predicted == cls) & scored, (truth == cls) & scored
        ious.append(np.logical_and(mine, theirs).sum() / max(np.logical_or(mine, theirs).sum(), 1))
    return float(np.mean(ious)) if ious else 1.0

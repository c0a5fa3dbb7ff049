"""What text detectors and segmenters decide: DBNet-style probability maps binarised into text regions (as
PaddleOCR's post-processing does, its thresholds by default), and per-pixel classes. Compared plan against
FP32: the F-score of matched regions, the mean IoU of the classes."""

from __future__ import annotations

import numpy as np

DB_THRESHOLD = 0.3  # PaddleOCR's det_db_thresh: a pixel of text
DB_BOX_THRESHOLD = 0.6  # det_db_box_thresh: a region kept when its mean probability reaches this
MIN_SIDE = 3  # PaddleOCR's min_size: smaller regions are noise
MATCH_IOU = 0.5
# A sigmoid computed in float may pass 1 by a rounding step (ONNX Runtime's CPU gave 1.0000001 on one page of
# PP-OCRv5's map): probabilities may lie this far outside [0, 1].
ROUNDING = 1e-5


def probabilities(values: np.ndarray) -> bool:
    """Whether ``values`` are probabilities: in [0, 1] but for float rounding."""
    return values.size > 0 and bool(values.min() >= -ROUNDING and values.max() <= 1 + ROUNDING)


def probability_maps(output: np.ndarray) -> np.ndarray | None:
    """N×1×H×W or N×H×W probabilities (a DBNet head's sigmoid) as N×H×W; None for any other output."""
    if output.dtype.kind != "f" or output.ndim not in (3, 4) or (output.ndim == 4 and output.shape[1] != 1):
        return None
    maps = output[:, 0] if output.ndim == 4 else output
    if maps.shape[-1] < 8 or maps.shape[-2] < 8 or not probabilities(maps):
        return None
    return maps


def components(mask: np.ndarray) -> np.ndarray:
    """4-connected regions of a boolean H×W mask, labelled 1…K in no particular order (0: background):
    min-label hooking with pointer jumping, so the passes grow with the log of a region's size, not its length."""
    height, width = mask.shape
    parent = np.arange(height * width + 1)  # parent[0]: the background
    labels = np.where(mask, np.arange(1, height * width + 1).reshape(height, width), 0)
    big = height * width + 1
    while True:
        padded = np.pad(np.where(mask, labels, big), 1, constant_values=big)
        lowest = np.minimum.reduce([padded[1:-1, 1:-1], padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2],
                                    padded[1:-1, 2:]])
        np.minimum.at(parent, labels[mask], lowest[mask])
        while not np.array_equal(jumped := parent[parent], parent):
            parent = jumped
        relabelled = np.where(mask, parent[labels], 0)
        if np.array_equal(relabelled, labels):
            _, dense = np.unique(labels, return_inverse=True)
            return dense.reshape(labels.shape)
        labels = relabelled


def text_regions(probability: np.ndarray, threshold: float = DB_THRESHOLD,
                 box_threshold: float = DB_BOX_THRESHOLD) -> np.ndarray:
    """K×4 boxes (x1, y1, x2, y2, pixels) of the map's text regions: pixels above ``threshold``, joined into
    connected regions, kept where their mean probability reaches ``box_threshold`` and both sides MIN_SIDE."""
    labelled = components(probability > threshold)
    boxes = []
    for region in range(1, labelled.max() + 1):
        ys, xs = np.nonzero(labelled == region)
        if ys.size == 0 or probability[ys, xs].mean() < box_threshold:
            continue
        x1, y1, x2, y2 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
        if min(x2 - x1, y2 - y1) >= MIN_SIDE:
            boxes.append((x1, y1, x2, y2))
    return np.asarray(boxes, np.float64).reshape(-1, 4)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` with every box of ``b`` (K×M)."""
    x1, y1 = np.maximum(a[:, None, 0], b[None, :, 0]), np.maximum(a[:, None, 1], b[None, :, 1])
    x2, y2 = np.minimum(a[:, None, 2], b[None, :, 2]), np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda boxes: (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-12)


def region_f_score(found: list[np.ndarray], truth: list[np.ndarray], iou: float = MATCH_IOU) -> float:
    """F-score of ``found`` regions against ``truth`` over all images: one-to-one matches of IoU >= ``iou``,
    best first (1.0 where both have none)."""
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
    """Per-pixel classes of a segmenter's output: N×C×H×W scores (C ≥ 2: the argmax) or N×H×W class ids."""
    if output.ndim == 4 and output.dtype.kind == "f" and output.shape[1] >= 2:
        return output.argmax(1)
    if output.ndim == 3 and output.dtype.kind in "iu":
        return output
    return None


def mean_iou(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Mean over the classes either holds of their pixel IoU (negative truth: not labelled); 1.0 for none."""
    scored = truth >= 0
    ious = []
    for cls in np.union1d(np.unique(predicted[scored]), np.unique(truth[scored])):
        mine, theirs = (predicted == cls) & scored, (truth == cls) & scored
        ious.append(np.logical_and(mine, theirs).sum() / max(np.logical_or(mine, theirs).sum(), 1))
    return float(np.mean(ious)) if ious else 1.0

"""Boxes as YOLO-family heads give them (YOLOv8, YOLOv5, YOLOX), class-wise NMS, and mAP@0.5 against
other boxes: what the detection task reads (plain NumPy)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoprec.core.errors import AutoprecError

# Box layouts of YOLO-family heads: channels first (4 box + classes, no objectness: YOLOv8 and
# later), channels last with objectness in column 4 (YOLOv5, YOLOX exported decoded), or YOLOX's raw
# head (the same columns, boxes still relative to their grid cell at strides 8, 16, 32).
DETECTION_LAYOUTS = ("yolov8", "yolov5", "yolox", "picodet")  # picodet: autoprec.tasks.gfl
YOLOX_STRIDES = (8, 16, 32)


def yolo_detections(output: np.ndarray, layout: str, conf: float, iou: float, max_boxes: int = 300) -> list[np.ndarray]:
    """Per image: (K, 6) rows of x1, y1, x2, y2, score, class after class-wise NMS, best first."""
    if layout == "yolov8":
        rows = output.transpose(0, 2, 1) if output.shape[1] < output.shape[2] else output
        boxes, scores = rows[..., :4], rows[..., 4:]
    else:
        boxes, scores = output[..., :4], output[..., 5:] * output[..., 4:5]
        if layout == "yolox":
            boxes = yolox_boxes(boxes)
    if scores.shape[-1] == 0:
        raise AutoprecError(f"--metric detection: a {layout} head needs 4 box values and at least "
                            f"one class score per box, and this output has {boxes.shape[-1]} "
                            "values per box; check --det-layout and --task-output, or use "
                            "--metric cosine")
    result = []
    for image_boxes, image_scores in zip(boxes, scores):
        classes = image_scores.argmax(-1)
        best = image_scores.max(-1)
        keep = best >= conf
        cx, cy, w, h = image_boxes[keep].T
        corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        found = class_nms(corners, best[keep], classes[keep], iou)[:max_boxes]
        result.append(np.column_stack([corners[found], best[keep][found], classes[keep][found]]).astype(np.float64))
    return result


def yolox_boxes(raw: np.ndarray) -> np.ndarray:
    """YOLOX's raw (N, A, 4) regression as centre/size in input pixels: (x + grid x) · stride,
    exp(w) · stride, the grids of a square input whose side the box count gives (A = side² · (1/8² +
    1/16² + 1/32²))."""
    side = round(np.sqrt(raw.shape[1] / sum(1 / s**2 for s in YOLOX_STRIDES)))
    grids, strides = [], []
    for stride in YOLOX_STRIDES:
        cells = side // stride
        ys, xs = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
        grids.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
        strides.append(np.full((cells * cells, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    if len(grid) != raw.shape[1]:
        raise ValueError(f"{raw.shape[1]} boxes are not the grids of a square input at strides "
                         f"{YOLOX_STRIDES}")
    centre = (raw[..., :2] + grid) * stride
    size = np.exp(np.clip(raw[..., 2:4], None, 30)) * stride
    return np.concatenate([centre, size], axis=-1)


def box_iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one x1y1x2y2 box with each of (K, 4) boxes."""
    width = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    height = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    overlap = width * height
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - overlap
    return np.where(union > 0, overlap / np.where(union > 0, union, 1), 0.0)


def class_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> list[int]:
    order = list(np.argsort(-scores, kind="stable"))
    kept: list[int] = []
    while order:
        best, order = order[0], order[1:]
        kept.append(best)
        if order:
            rest = np.asarray(order)
            overlaps = box_iou(boxes[best], boxes[rest])
            order = [int(i) for i, o, c in zip(rest, overlaps, classes[rest]) if c != classes[best] or o <= iou]
    return kept


def mean_average_precision(detections: Sequence[np.ndarray], truths: Sequence[np.ndarray],
                           iou: float = 0.5) -> float:
    """mAP at one IoU threshold (VOC all-point interpolation) of (K, 6) detections against (M, 5)
    truths (class, x1, y1, x2, y2), averaged over the classes the truths hold. No truths at all: 1.0
    when nothing was detected either, else 0.0."""
    classes = sorted({int(c) for t in truths for c in t[:, 0]})
    if not classes:
        return float(all(len(d) == 0 for d in detections))
    precisions = []
    for cls in classes:
        scored = []  # (score, is a true positive)
        total = 0
        for found, truth in zip(detections, truths, strict=True):
            gt = truth[truth[:, 0] == cls, 1:5]
            total += len(gt)
            taken = np.zeros(len(gt), bool)
            mine = found[found[:, 5] == cls]
            for row in mine[np.argsort(-mine[:, 4], kind="stable")]:
                overlaps = box_iou(row[:4], gt) if len(gt) else np.zeros(0)
                j = int(overlaps.argmax()) if len(overlaps) else -1
                hit = j >= 0 and overlaps[j] >= iou and not taken[j]
                if hit:
                    taken[j] = True
                scored.append((row[4], hit))
        scored.sort(key=lambda s: -s[0])
        hits = np.cumsum([h for _, h in scored]) if scored else np.zeros(0)
        recall = hits / total
        precision = hits / np.arange(1, len(scored) + 1)
        precisions.append(_area_under(recall, precision))
    return float(np.mean(precisions))


def _area_under(recall: np.ndarray, precision: np.ndarray) -> float:
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[1.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.flatnonzero(r[1:] != r[:-1])
    return float(((r[steps + 1] - r[steps]) * p[steps + 1]).sum())


def box_costs(truths: Sequence[np.ndarray]) -> list[float]:
    """What one box of each class costs mAP@0.5 (against ``truths``, rows of class, x1, y1, x2, y2)
    when it is lost or moved off its place: that class's AP drops by one of its boxes, averaged over
    the classes, 1 / (classes × its boxes); cheapest first."""
    classes = np.concatenate([t[:, 0] for t in truths]) if truths else []
    counts = np.unique(classes, return_counts=True)[1]
    return sorted(1.0 / (len(counts) * n) for n in counts)


def as_truths(detections: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Detections (x1, y1, x2, y2, score, class) as truths (class, x1, y1, x2, y2)."""
    return [np.column_stack([d[:, 5], d[:, :4]]) for d in detections]


def padded_boxes(boxes: np.ndarray) -> list[np.ndarray]:
    """(N, M, 5) ground-truth boxes, rows with a negative class being padding, as a list of (M_i,
    5)."""
    return [item[item[:, 0] >= 0].astype(np.float64) for item in boxes]



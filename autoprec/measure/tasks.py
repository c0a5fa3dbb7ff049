"""What a model decides, decoded from its raw outputs: text (CTC), boxes (YOLO), neighbours (embeddings).

Plain NumPy, no framework: a precision plan is judged by whether these decisions stay those of the
FP32 model (or of the ground truth, where the data carries it), not only by how close the numbers are.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoprec.core.errors import AutoprecError

# --- CTC text -------------------------------------------------------------------------------------


def greedy_ctc(scores: np.ndarray, blank: int = 0) -> list[tuple[int, ...]]:
    """Best path per item of (N, T, C) scores (or of (N, T) class ids, a head that takes the argmax
    itself): the argmax per step, repeats merged, blanks dropped."""
    best = scores if scores.ndim == 2 else scores.argmax(-1)
    decoded = []
    for steps in best:
        keep = np.ones(len(steps), bool)
        keep[1:] = steps[1:] != steps[:-1]
        decoded.append(tuple(int(s) for s in steps[keep & (steps != blank)]))
    return decoded


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def character_error_rate(hypotheses: Sequence[Sequence], truths: Sequence[Sequence]) -> float:
    """Edits needed to turn every hypothesis into its truth, per character of the truths (corpus CER)."""
    edits = sum(edit_distance(h, t) for h, t in zip(hypotheses, truths, strict=True))
    characters = sum(len(t) for t in truths)
    return edits / characters if characters else float(edits > 0)


def ctc_text(ids: Sequence[int], charset: Sequence[str]) -> str:
    """Class ids (blank already dropped) as text; an id past the charset becomes U+FFFD, never an error."""
    return "".join(charset[i] if 0 <= i < len(charset) else "\ufffd" for i in ids)


def class_characters(dictionary: Sequence[str], classes: int | None, blank: int = 0) -> list[str] | None:
    """The text of each class id. A dictionary of exactly ``classes`` lines (or, for a head that gives ids,
    one whose line ``blank`` is empty) already lists every class; otherwise PaddleOCR's order, as RapidOCR
    embeds its dictionary in the model's ``character`` metadata: blank, the dictionary, then a space when
    the head has room for it. None when the dictionary does not fit the head's class count."""
    chars = list(dictionary)
    if len(chars) == classes or (classes is None and blank < len(chars) and chars[blank] == ""):
        return chars
    if classes is not None and len(chars) + 2 == classes:
        chars = [*chars, " "]
    if classes is not None and len(chars) + 1 != classes:
        return None
    return chars[:blank] + [""] + chars[blank:]


# --- YOLO detection ----------------------------------------------------------------------------------

# Box layouts of YOLO-family heads: channels first (4 box + classes, no objectness: YOLOv8 and later),
# channels last with objectness in column 4 (YOLOv5, YOLOX exported decoded), or YOLOX's raw head
# (the same columns, boxes still relative to their grid cell at strides 8, 16, 32).
DETECTION_LAYOUTS = ("yolov8", "yolov5", "yolox", "picodet")  # picodet: autoprec.measure.gfl
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
        raise AutoprecError(f"--metric detection: a {layout} head needs 4 box values and at least one class score "
                            f"per box, and this output has {boxes.shape[-1]} values per box; check --det-layout and "
                            "--task-output, or use --metric cosine")
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
    """YOLOX's raw (N, A, 4) regression as centre/size in input pixels: (x + grid x) · stride, exp(w) · stride,
    the grids of a square input whose side the box count gives (A = side² · (1/8² + 1/16² + 1/32²))."""
    side = round(np.sqrt(raw.shape[1] / sum(1 / s**2 for s in YOLOX_STRIDES)))
    grids, strides = [], []
    for stride in YOLOX_STRIDES:
        cells = side // stride
        ys, xs = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
        grids.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
        strides.append(np.full((cells * cells, 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    if len(grid) != raw.shape[1]:
        raise ValueError(f"{raw.shape[1]} boxes are not the grids of a square input at strides {YOLOX_STRIDES}")
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


def mean_average_precision(detections: Sequence[np.ndarray], truths: Sequence[np.ndarray], iou: float = 0.5) -> float:
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
    """(N, M, 5) ground-truth boxes, rows with a negative class being padding, as a list of (M_i, 5)."""
    return [item[item[:, 0] >= 0].astype(np.float64) for item in boxes]


# --- embeddings ---------------------------------------------------------------------------------------


def pooled(output: np.ndarray) -> np.ndarray:
    """(N, D) embeddings; (N, T, D) token embeddings are averaged over their tokens."""
    return output.mean(axis=1) if output.ndim == 3 else output.reshape(len(output), -1)


def unit_rows(embeddings: np.ndarray) -> np.ndarray:
    embeddings = embeddings.astype(np.float64)
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
    return embeddings / np.where(norms > 0, norms, 1.0)


def nearest_neighbours(embeddings: np.ndarray) -> np.ndarray:
    """Each item's most similar other item (cosine) within the set."""
    unit = unit_rows(embeddings)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(axis=1)

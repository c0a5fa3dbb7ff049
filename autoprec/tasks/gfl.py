"""PicoDet / GFL detection heads (PaddleDetection's export without NMS): per stride a score tensor
N×A×classes and a box-distribution tensor N×A×4·(reg_max+1), or one pair over every stride
concatenated.

The outputs are paired by their anchor count A and the strides found from the image's size (A =
⌈H/s⌉·⌈W/s⌉, strides 8, 16, 32, 64, …); each side of a box is the expectation of its softmaxed
distribution times the stride, from the cell's centre, as PaddleDetection's PicoDetPostProcess
decodes it. Scores already in [0, 1] are taken as they are, others go through a sigmoid. Boxes are
clipped to the image. Each class above the threshold keeps its box (a box may count for two
classes), then class-wise NMS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from autoprec.core.errors import AutoprecError
from autoprec.tasks.boxes import class_nms

STRIDES = (8, 16, 32, 64, 128)
TOP_K = 1000  # candidates kept per stride before NMS (PaddleDetection's nms_top_k)
KEEP_K = 100  # boxes kept per image (keep_top_k)


@dataclass(frozen=True)
class Head:
    """Which outputs hold the scores and the box distributions, and at what strides (one stride per
    cell)."""

    scores: tuple[str, ...]
    boxes: tuple[str, ...]
    strides: tuple[tuple[int, ...], ...]  # per pair: the strides its anchors run through, in order
    image: tuple[int, int]  # H, W


def cells(image: tuple[int, int], stride: int) -> int:
    return -(-image[0] // stride) * -(-image[1] // stride)


def strides_for(anchors: int, image: tuple[int, int]) -> tuple[int, ...] | None:
    """The stride of a per-stride output, or the run of strides from 8 a concatenated output
    holds."""
    single = tuple(s for s in STRIDES if cells(image, s) == anchors)
    if single:
        return single[:1]
    total = 0
    for count, stride in enumerate(STRIDES, 1):
        total += cells(image, stride)
        if total == anchors and count > 1:
            return STRIDES[:count]
    return None


def find_head(shapes: Mapping[str, tuple[int, ...]], image: tuple[int, int] | None) -> Head:
    """The score/box pairs among the outputs (N×A×C float tensors), from their shapes; one line
    where none fit."""
    if image is None:
        raise AutoprecError("--det-layout picodet: the model has no image input (N×C×H×W) to place "
                            "the anchors of; use --metric cosine, or a module:function metric")
    three = {name: shape for name, shape in shapes.items() if len(shape) == 3}
    by_anchors: dict[int, list[str]] = {}
    for name, shape in three.items():
        by_anchors.setdefault(shape[1], []).append(name)
    pairs = []
    for anchors, names in by_anchors.items():
        strides = strides_for(anchors, image)
        if len(names) != 2 or strides is None:
            continue
        boxes = [n for n in names if three[n][2] % 4 == 0 and three[n][2] >= 8]
        box = boxes[-1] if boxes else None  # both fit: PaddleDetection exports the scores first
        if box is not None:
            pairs.append((strides, next(n for n in names if n != box), box))
    if not pairs:
        found = ", ".join(f"{n} {list(s)}" for n, s in shapes.items())
        raise AutoprecError(
            "--det-layout picodet: no outputs pair up as N×A×classes scores and N×A×4·(reg_max+1) "
            f"boxes with A the cells of a {image[0]}×{image[1]} image at strides "
            f"{', '.join(map(str, STRIDES[:4]))} (outputs: {found}); check --det-layout, or use "
            "--metric cosine")
    pairs.sort()
    return Head(tuple(p[1] for p in pairs), tuple(p[2] for p in pairs), tuple(p[0] for p in pairs),
                image)


def _centres(image: tuple[int, int], strides: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every anchor's centre (A×2, x then y, in input pixels) and stride (A), row by row per
    stride."""
    centres, per_anchor = [], []
    for stride in strides:
        ys, xs = np.meshgrid(np.arange(-(-image[0] // stride)), np.arange(-(-image[1] // stride)),
                             indexing="ij")
        centres.append((np.stack([xs.ravel(), ys.ravel()], axis=1) + 0.5) * stride)
        per_anchor.append(np.full(xs.size, stride))
    return np.concatenate(centres), np.concatenate(per_anchor)


def _distances(distribution: np.ndarray) -> np.ndarray:
    """A×4·(R+1) bins as A×4 distances in strides: the expectation of each side's softmax."""
    bins = distribution.reshape(len(distribution), 4, -1).astype(np.float64)
    bins = np.exp(bins - bins.max(axis=-1, keepdims=True))
    bins /= bins.sum(axis=-1, keepdims=True)
    return bins @ np.arange(bins.shape[-1])


def detections(outputs: Mapping[str, np.ndarray], head: Head, conf: float, iou: float,
               logits: bool) -> list[np.ndarray]:
    """Per image: (K, 6) rows of x1, y1, x2, y2, score, class after class-wise NMS, best first."""
    result = []
    for item in range(len(outputs[head.scores[0]])):
        boxes, scores = [], []
        for score_name, box_name, strides in zip(head.scores, head.boxes, head.strides):
            score = outputs[score_name][item].astype(np.float64)
            score = 1 / (1 + np.exp(-score)) if logits else score
            centre, stride = _centres(head.image, strides)
            top = np.argsort(-score.max(axis=1), kind="stable")[:TOP_K]
            distance = _distances(outputs[box_name][item][top]) * stride[top, None]
            boxes.append(np.concatenate([centre[top] - distance[:, :2],
                                         centre[top] + distance[:, 2:]], axis=1))
            scores.append(score[top])
        box, score = np.concatenate(boxes), np.concatenate(scores)
        # inside the image, as the package's decoder does
        box = np.clip(box, 0, [head.image[1], head.image[0]] * 2)
        anchor, cls = np.nonzero(score > conf)
        rows = np.column_stack([box[anchor], score[anchor, cls], cls]) if len(anchor) else np.zeros((0, 6))
        kept = class_nms(rows[:, :4], rows[:, 4], rows[:, 5], iou)[:KEEP_K]
        result.append(rows[kept].astype(np.float64))
    return result

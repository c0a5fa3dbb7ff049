"""detection: the boxes a YOLO-family head (YOLOv8, YOLOv5, YOLOX) or a PicoDet head finds after
NMS, the plan's against FP32's as mAP@0.5; against the data's ``boxes`` for ``detection@labels``."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from autoprec.core.errors import AutoprecError
from autoprec.tasks import boxes, gfl, regions
from autoprec.tasks.task import Limit, Reading, Task

NAME = "detection"


class Detection(Task):
    name = NAME
    key = "map50"
    said = "1 − mAP50 vs FP32"
    shown = (("map50", "mAP50 vs FP32"), ("map50_labels", "mAP50 vs labels"))
    labels = "boxes"
    label_form = "N×M×5 rows of class, x1, y1, x2, y2 in input pixels; a negative class pads"
    implied = True
    needs = "it needs a YOLO head shaped N×(4+classes)×boxes or N×boxes×(5+classes) (--task-output, --det-layout)"
    changes = ("map50", "detections (1 - mAP@0.5)")
    lower_is_closer = ("box_count_change",)

    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        """A YOLO head's one output (a PicoDet head is read from all its outputs at once:
        scored_together)."""
        return (NAME in reading.asked and reading.reads(name) and ref.ndim == 3 and ref.dtype.kind == "f"
                and not picodet(reading))

    def claims(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        return self.applies(reading, name, ref)

    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        options = reading.options
        layout = options.layout or inferred_layout(name, ref)
        ref_boxes, cand_boxes = (boxes.yolo_detections(o, layout, options.conf, options.iou) for o in (ref, cand))
        return box_decisions(ref_boxes, cand_boxes, labels)

    def scored_together(self, reading: Reading, refs: Mapping[str, np.ndarray],
                        cands: Mapping[str, np.ndarray],
                        labels: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
        """A PicoDet head: its boxes from every output of it at once (scores outside [0, 1] are
        logits); the per-anchor scores decide nothing of their own (no top-1)."""
        if not picodet(reading):
            return {}
        head, options = gfl_head(reading), reading.options
        logits = not all(regions.probabilities(refs[n]) for n in head.scores)
        ref_boxes, cand_boxes = (gfl.detections(o, head, options.conf, options.iou, logits) for o in (refs, cands))
        found: dict[str, dict[str, float]] = {name: {} for name in (*head.scores, *head.boxes)}
        found[head.scores[0]] = box_decisions(ref_boxes, cand_boxes, labels)
        return found

    def limit_said(self, reading: Reading, limit: Limit) -> str | None:
        """Each box lost or moved costs its class's share of mAP@0.5 (one YOLO head; not a PicoDet
        head's)."""
        if picodet(reading):
            return None
        if limit.against_labels:
            truths = boxes.padded_boxes(limit.labels["boxes"]) if "boxes" in limit.labels else None
        else:
            heads = [n for n, ref in limit.references.items() if self.applies(reading, n, ref)]
            if len(heads) != 1:
                return None
            options, ref = reading.options, limit.references[heads[0]]
            layout = options.layout or inferred_layout(heads[0], ref)
            truths = boxes.as_truths(boxes.yolo_detections(ref, layout, options.conf, options.iou))
        return boxes_said(truths, limit.max_loss, limit.metric) if truths is not None else None


def picodet(reading: Reading) -> bool:
    return NAME in reading.asked and reading.options.layout == "picodet"


def gfl_head(reading: Reading) -> gfl.Head:
    key = (NAME, "head")
    if key not in reading.kept:
        reading.kept[key] = gfl.find_head(reading.shapes, reading.options.image)
    return reading.kept[key]


def box_decisions(ref_boxes: list[np.ndarray], cand_boxes: list[np.ndarray],
                  labels: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Detections against FP32's (mAP@0.5, the change in their count) and against the data's
    boxes."""
    count = sum(len(b) for b in ref_boxes)
    found = {"map50": boxes.mean_average_precision(cand_boxes, boxes.as_truths(ref_boxes)),
             "box_count_change": (sum(len(b) for b in cand_boxes) - count) / max(1, count)}
    if "boxes" in labels:
        found["map50_labels"] = boxes.mean_average_precision(cand_boxes, boxes.padded_boxes(labels["boxes"]))
    return found


def inferred_layout(name: str, ref: np.ndarray) -> str:
    """Channels first (N × 4+classes × boxes) is YOLOv8's; channels last is ambiguous (objectness or
    not)."""
    if ref.shape[1] < ref.shape[2]:
        return "yolov8"
    raise AutoprecError(
        f"--metric {NAME}: output {name!r} is {'×'.join(map(str, ref.shape))}, boxes first: YOLOv5 "
        "or decoded YOLOX (objectness in column 5), YOLOX's raw head (boxes still per grid cell), "
        "or a transposed YOLOv8 (no objectness)? give --det-layout yolov5, yolox or yolov8")


def boxes_said(truths: list[np.ndarray], max_loss: float, metric: str) -> str:
    """What ``--max-loss`` allows in boxes, each lost or moved box costing its class's share of
    mAP@0.5."""
    costs = boxes.box_costs(truths)  # one per class
    count, classes = sum(len(t) for t in truths), len(costs)
    whose = "the data's" if metric.endswith("@labels") else "FP32's"
    if not costs:
        return f"--max-loss {max_loss:g} with --metric {metric}: {whose} boxes on the evaluation batches are none"
    most, least = (math.floor(max_loss / c + 1e-9) for c in (costs[0], costs[-1]))
    allowed = ("no box" if most == 0 else f"{least}–{most} box(es)" if least != most else f"{most} "
                                                                                          "box(es)")
    span = f"{costs[0]:.3g}" if costs[0] == costs[-1] else f"{costs[0]:.3g}–{costs[-1]:.3g}"
    said = (f"--max-loss {max_loss:g} with --metric {metric} over {whose} {count} box(es) in "
            f"{classes} class(es) on the evaluation batches allows {allowed} lost or moved off its "
            f"place: each is a loss of {span} (1 / (classes × that class's boxes))")
    if most == 0:
        said += f"; give --max-loss {costs[0]:.3g} or more to allow one, or more evaluation data"
    return said

"""top1: the class an output gives each item (or each position of a sequence), the plan's against
FP32's; against the data's ``labels`` for ``top1@labels``."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from autoprec.tasks.labels import class_scores, scores_classes
from autoprec.tasks.task import Limit, Reading, Task, decisions_said

NAME = "top1"


class Top1(Task):
    name = NAME
    key = "top1"
    said = "share of top-1 changed"
    shown = (("top1", "top-1 same"), ("top1_labels", "top-1 vs labels"))
    labels = "labels"
    label_form = "integer class per item, shaped N or N×T; negative = not labelled"
    needs = "it needs class scores shaped N×C or N×T×C: choose cosine or rel_l2"
    changes = ("top1", "top-1 decisions")
    yields = ("top1",)  # an argmax over boxes or vectors decides nothing
    by_chance = True  # labels FP32 gets right no more often than chance are doubted

    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        return class_scores(ref)

    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        found = {"top1": float((ref.argmax(-1) == cand.argmax(-1)).mean())}
        truth = labels.get("labels")
        if truth is not None and scores_classes(truth, ref) and reading.reads(name):
            scored = truth >= 0
            found["top1_labels"] = float((cand.argmax(-1) == truth)[scored].mean()) if scored.any() else math.nan
        return found

    def when_nonfinite(self, name: str, ref: np.ndarray) -> dict[str, float]:
        return {"top1": 0.0} if class_scores(ref) else {}

    def limit_said(self, reading: Reading, limit: Limit) -> str | None:
        """Each changed decision of the one output it scores (or each labelled item) costs alike."""
        key = self.label_key if limit.against_labels else self.key
        scored = [name for name, values in limit.own.items() if key in values]
        if len(scored) != 1:
            return None
        if limit.against_labels:
            count = int((limit.labels["labels"] >= 0).sum())
        else:
            count = int(np.prod(np.shape(limit.references[scored[0]])[:-1]))
        what = "fewer correct answers than FP32's" if limit.against_labels else "changed top-1 decision(s)"
        return decisions_said(count, limit.max_loss, limit.metric, what) if count else None

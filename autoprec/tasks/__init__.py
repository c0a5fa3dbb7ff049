"""The tasks: what a model's outputs decide (classes, text, boxes, text regions, pixels' classes,
neighbours, a decoder's generated tokens), one module each, and the registry every other part of
autoprec reads them from (the judge, the views, the options, the zoo). Adding a task is a module
with a :class:`Task` subclass and a line below."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from autoprec.tasks.boxes import DETECTION_LAYOUTS
from autoprec.tasks.ctc_text import CtcText
from autoprec.tasks.detection import Detection
from autoprec.tasks.embedding import Embedding
from autoprec.tasks.generation import Generation
from autoprec.tasks.segmentation import Segmentation
from autoprec.tasks.task import HeadOptions, Limit, Reading, Task
from autoprec.tasks.text_regions import TextRegions
from autoprec.tasks.top1 import Top1

REGISTRY: dict[str, Task] = {task.name: task for task in (
    Top1(), CtcText(), Detection(), Embedding(), TextRegions(), Segmentation(), Generation(),
)}
TASKS = tuple(REGISTRY.values())
# The label arrays the data may carry, each with its form in words (what the tasks with labels score
# against).
LABEL_FORMS = {task.labels: task.label_form for task in TASKS if task.labels}

__all__ = ["DETECTION_LAYOUTS", "LABEL_FORMS", "REGISTRY", "TASKS", "HeadOptions", "Limit",
           "Reading", "Task",
           "doubtful", "implied_by", "lower_is_closer", "shown_keys", "task_named"]


def task_named(name: str) -> Task | None:
    """The task ``name`` (``top1@labels``'s is top1's), or None for a name that is not one."""
    return REGISTRY.get(name.removesuffix("@labels"))


def implied_by(labels: Mapping[str, object]) -> list[str]:
    """The tasks the data's label arrays call for (its text: ctc-text; its boxes: detection; its
    masks)."""
    return [t.name for t in TASKS if t.implied and t.labels in labels]


def lower_is_closer(key: str) -> bool:
    """Whether a task's metric ``key`` reads lower where closer to FP32 (an error, a change), not
    higher."""
    return any(key in t.lower_is_closer for t in TASKS)


def shown_keys() -> tuple[tuple[str, str], ...]:
    """Every task's metrics as the views name them, in the registry's order."""
    return tuple(pair for t in TASKS for pair in t.shown)


def doubtful(fp32: Mapping[str, Mapping[str, float]], outputs: Mapping[str, np.ndarray]) -> list[str]:
    """FP32's own scores against the labels where they say the labels may not be this model's: none
    right (a task's worst score), or top-1 no better than chance. A loss measured against such
    labels says little."""
    by_key = {t.label_key: t for t in TASKS if t.labels}
    lines = []
    for name, scores in fp32.items():
        for key, value in scores.items():
            task = by_key.get(key)
            if task is None or math.isnan(value):
                continue
            classes = np.shape(outputs.get(name, ()))[-1:] or (0,)
            chance = 1.0 / classes[0] if task.by_chance and classes[0] >= 2 else None
            if (chance is not None and value <= chance) or (not task.by_chance and task.hopeless(value)):
                where = f" (chance with {classes[0]} classes: {chance:.1%})" if chance is not None else ""
                said = dict(task.shown).get(key, key)
                lines.append(f"FP32 itself scores {said} {value:.1%} on output {name!r}{where}: "
                             "the labels may not be this model's (another class order or "
                             "mapping?), and a loss against them says little; check them")
    return lines

"""The data's labels against the outputs they score: one class per item, each a class the output
has, some item labelled; and FP32's own score against them, which says whether they are this model's
labels at all."""

from __future__ import annotations

from typing import Mapping

import numpy as np


def class_scores(value: np.ndarray) -> bool:
    """(N, C) or (N, T, C) float scores with a few classes or more."""
    return value.dtype.kind == "f" and value.ndim in (2, 3) and value.shape[-1] >= 2


def scores_classes(truth: np.ndarray, scores: np.ndarray) -> bool:
    """Whether ``truth`` (classes; negative: not labelled) are classes of ``scores``: one per item
    (the scores' shape less its class axis), each below the number of classes it scores."""
    return truth.shape == scores.shape[:-1] and (not truth.size or int(truth.max()) < scores.shape[-1])


def unscored(wanted: str, labels: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
             output: str | None, form: str) -> str:
    """Why the data's ``wanted`` array (one evaluation batch of it: ``labels``) scores none of the
    model's ``outputs`` (one batch of each; ``output``: --task-output), in words for one line: the
    labels' fault, said of the labels, with the shape or classes they would need."""
    truth = np.asarray(labels[wanted])
    if wanted != "labels":
        shapes = ", ".join(f"{name} {list(np.shape(v))}" for name, v in outputs.items())
        return (f"the data's {wanted!r} array, shaped {list(truth.shape)} per batch, fits no "
                f"output ({shapes}); it must hold {form}; fix the array, or name the output with "
                "--task-output")
    scores = {name: np.asarray(v) for name, v in outputs.items()
              if class_scores(np.asarray(v)) and output in (None, name)}
    if not scores:
        shapes = ", ".join(f"{name} {list(np.shape(v))}" for name, v in outputs.items())
        return ("no output gives class scores (N×C or N×T×C) for the data's 'labels' to score "
                f"(the model's outputs: {shapes}); choose --metric cosine or rel_l2")
    name, value = next(((n, v) for n, v in scores.items() if truth.shape == v.shape[:-1]),
                       next(iter(scores.items())))
    if truth.shape != value.shape[:-1]:
        return (f"the data's 'labels' are shaped {list(truth.shape)} per batch, but output {name} "
                f"gives class scores shaped {list(value.shape)}: give one class per item, shaped "
                f"{list(value.shape[:-1])} per batch ({form})")
    return (f"the data's 'labels' hold class {int(truth.max())}, but output {name} scores "
            f"{value.shape[-1]} classes (0–{value.shape[-1] - 1}): give the model's own class "
            "numbers (negative: not labelled), or check the label mapping")

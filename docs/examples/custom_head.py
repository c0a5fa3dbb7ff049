"""A custom accuracy loss for a head autoprec has no metric for: ``--metric custom_head:loss``.

The head here outputs boxes already decoded, N × K × 6 rows of (x1, y1, x2, y2, score, class) — as detectors
with NMS inside the graph do. The loss is what changes in the decisions: 1 − the F-score of the plan's boxes
matched to FP32's (same class, IoU ≥ 0.5), over every evaluation image. FP32 against itself scores 0.

autoprec calls ``loss(reference, outputs)`` in its measuring worker for every plan: both are lists (one per
evaluation batch) of {output name: numpy array}. Return one float, 0 or more; raising, NaN or a value below 0
stops the search with a line naming the function. Run with this folder on the path:

    PYTHONPATH=docs/examples autoprec search detector.onnx --metric custom_head:loss --max-loss 0.02
"""

import numpy as np

from autoprec.tasks.regions import region_f_score

OUTPUT = "boxes"  # the head's output name
SCORE = 0.3  # boxes kept at this score or above


def _kept(rows: np.ndarray, cls: float) -> np.ndarray:
    """One image's boxes of class ``cls`` above SCORE, as (x1, y1, x2, y2) with the corners in order."""
    rows = rows[(rows[:, 4] >= SCORE) & (np.round(rows[:, 5]) == cls)]
    corners = rows[:, :4]
    return np.column_stack([np.minimum(corners[:, 0], corners[:, 2]), np.minimum(corners[:, 1], corners[:, 3]),
                            np.maximum(corners[:, 0], corners[:, 2]), np.maximum(corners[:, 1], corners[:, 3])])


def loss(reference, outputs):
    fp32 = np.concatenate([batch[OUTPUT] for batch in reference[: len(outputs)]])
    plan = np.concatenate([batch[OUTPUT] for batch in outputs])
    found, truth = [], []
    for mine, theirs in zip(plan, fp32):
        for cls in np.union1d(np.round(mine[:, 5]), np.round(theirs[:, 5])):  # class ids, as the head rounds them
            found.append(_kept(mine, cls))
            truth.append(_kept(theirs, cls))
    return 1.0 - region_f_score(found, truth)

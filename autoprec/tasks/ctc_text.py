"""ctc-text: the text a CTC recognizer reads (greedy), the plan's against FP32's as a character
error rate; against the data's ``text`` for ``ctc-text@labels``."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoprec.core.errors import AutoprecError
from autoprec.tasks import ctc_decoding as ctc
from autoprec.tasks.task import Reading, Task

NAME = "ctc-text"


def looks_like_ctc(arr: np.ndarray) -> bool:
    """(N, T, C) per-step probabilities (each step sums to 1): what a CTC recognizer's softmax
    gives."""
    if not (arr.dtype.kind == "f" and arr.ndim == 3 and arr.shape[1] >= 2 and arr.shape[2] >= 3):
        return False
    return bool(arr.min() >= 0 and np.allclose(arr.sum(-1), 1.0, atol=1e-3))


class CtcText(Task):
    name = NAME
    key = "cer"
    higher_is_better = False
    said = "CER vs FP32"
    shown = (("cer", "CER vs FP32"), ("cer_labels", "CER vs labels"))
    labels = "text"
    label_form = "one string per item"
    implied = True
    needs = "it needs per-step class scores shaped N×T×C (name the output with --task-output)"
    changes = ("cer", "decoded characters (CER)")
    lower_is_closer = ("cer", "cer_labels")

    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        if not reading.reads(name):
            return False
        if ref.ndim == 2 and ref.dtype.kind in "iu":  # class ids: the head took the argmax itself
            return NAME in reading.asked
        return ref.ndim == 3 and ref.dtype.kind == "f" and (NAME in reading.asked or looks_like_ctc(ref))

    def transposed(self, reading: Reading, name: str, first: np.ndarray) -> tuple[int, ...] | None:
        """A per-batch (T > 1, 1, C) output: time first, the batch of one second."""
        time_major = (first.ndim == 3 and first.shape[1] == 1 and first.shape[0] > 1
                      and self.applies(reading, name, first.transpose(1, 0, 2)))
        return (1, 0, 2) if time_major else None

    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        options = reading.options
        ref_ids, cand_ids = ctc.greedy_ctc(ref, options.blank), ctc.greedy_ctc(cand, options.blank)
        found = {"cer": ctc.character_error_rate(cand_ids, ref_ids)}
        if "text" in labels and options.charset is not None:
            classes = ref.shape[2] if ref.ndim == 3 else None
            charset = ctc.class_characters(options.charset, classes, options.blank)
            if charset is None:
                raise AutoprecError(
                    f"--ctc-charset: {len(options.charset)} characters do not fit output {name!r} "
                    f"with {classes or 'its'} classes (every class in order, or PaddleOCR's order: "
                    "blank, the dictionary, a space when there is room); give the model's own "
                    "dictionary")
            found["cer_labels"] = ctc.character_error_rate(
                [ctc.ctc_text(ids, charset).strip() for ids in cand_ids],
                [str(t).strip() for t in labels["text"]])
        return found

    def refused(self, reading: Reading, metric: str, against_labels: bool) -> str | None:
        if against_labels and reading.options.charset is None:
            return ("ground-truth text needs the head's characters; the model has no 'character' "
                    "metadata: give --ctc-charset FILE (one character per line, PaddleOCR's "
                    "dictionary order)")
        return None

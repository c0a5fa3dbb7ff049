"""Text from a CTC recognizer's per-step class scores (greedy), and the character error rate between
texts: what the ctc-text task reads (plain NumPy)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


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
    """Edits needed to turn every hypothesis into its truth, per character of the truths (corpus
    CER)."""
    edits = sum(edit_distance(h, t) for h, t in zip(hypotheses, truths, strict=True))
    characters = sum(len(t) for t in truths)
    return edits / characters if characters else float(edits > 0)


def ctc_text(ids: Sequence[int], charset: Sequence[str]) -> str:
    """Class ids (blank already dropped) as text; an id past the charset becomes U+FFFD, never an
    error."""
    return "".join(charset[i] if 0 <= i < len(charset) else "\ufffd" for i in ids)


def class_characters(dictionary: Sequence[str], classes: int | None, blank: int = 0) -> list[str] | None:
    """The text of each class id. A dictionary of exactly ``classes`` lines (or, for a head that
    gives ids, one whose line ``blank`` is empty) already lists every class; otherwise PaddleOCR's
    order, as RapidOCR embeds its dictionary in the model's ``character`` metadata: blank, the
    dictionary, then a space when the head has room for it. None when the dictionary does not fit
    the head's class count."""
    chars = list(dictionary)
    if len(chars) == classes or (classes is None and blank < len(chars) and chars[blank] == ""):
        return chars
    if classes is not None and len(chars) + 2 == classes:
        chars = [*chars, " "]
    if classes is not None and len(chars) + 1 != classes:
        return None
    return chars[:blank] + [""] + chars[blank:]



"""Two arrays' similarity sums in float64, a cache-sized piece at a time: what every judged output's
figures (autoprec.measure.accuracy), a decoder's logits loss and the FP32 reference's agreement checks
(autoprec.analysis.reference) stand on, without a whole float64 copy of an output."""

from __future__ import annotations

import numpy as np

# Values an output's sums take at once: their float64 copies stay in the CPU's cache (a 32 x 40 x 6625
# OCR output's metrics 0.25 -> 0.06 s, whole arrays passed through memory a dozen times before).
CHUNK_VALUES = 1 << 16


Sums = tuple[np.ndarray, np.ndarray, np.ndarray, float, float]


def similarity_sums(ref: np.ndarray, cand: np.ndarray) -> Sums | None:
    """Per row of two 2-d arrays the sums of squares of ``ref`` and ``cand`` and their dot product,
    and over all rows the squared error and the largest absolute error, in float64, a cache-sized
    chunk at a time; None where ``cand`` holds a NaN or an infinity."""
    rows, width = ref.shape
    ref_squares, cand_squares, dots = np.zeros(rows), np.zeros(rows), np.zeros(rows)
    noise, largest = 0.0, []
    step = max(1, CHUNK_VALUES // max(1, width))
    spans = ([(slice(i, i + step), slice(None)) for i in range(0, rows, step)] if width <= CHUNK_VALUES else
             [(slice(i, i + 1), slice(j, j + CHUNK_VALUES)) for i in range(rows) for j in range(0, width, CHUNK_VALUES)])
    for items, values in spans:
        r, c = ref[items, values].astype(np.float64), cand[items, values].astype(np.float64)
        if not np.isfinite(c).all():
            return None
        ref_squares[items] += np.einsum("ij,ij->i", r, r)
        cand_squares[items] += np.einsum("ij,ij->i", c, c)
        dots[items] += np.einsum("ij,ij->i", r, c)
        error = c - r
        noise += float(np.einsum("ij,ij->", error, error))
        largest.append(np.abs(error).max())
    return ref_squares, cand_squares, dots, noise, float(np.max(largest)) if largest else 0.0


def row_cosines(ref: np.ndarray, cand: np.ndarray, sums: Sums) -> np.ndarray:
    """Each row's cosine from its :func:`similarity_sums`: two all-zero rows agree perfectly, one zero
    and one not do not."""
    ref_squares, cand_squares, dots, _, _ = sums
    norms = np.sqrt(ref_squares) * np.sqrt(cand_squares)
    positive = norms > 0
    cosines = dots / np.where(positive, norms, 1.0)
    cosines[~positive] = np.where(np.all(ref[~positive] == cand[~positive], axis=1), 1.0, 0.0)
    return cosines

"""Embeddings pooled and compared: unit rows, each item's nearest neighbour (plain NumPy)."""

from __future__ import annotations

import numpy as np


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

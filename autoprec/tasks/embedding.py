"""embedding: vectors that place items (a sentence encoder's), the plan's against FP32's: their
cosine and each item's nearest neighbour among the others."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoprec.tasks import embedding_decoding as vectors
from autoprec.tasks.task import Reading, Task

NAME = "embedding"


class Embedding(Task):
    name = NAME
    key = "embedding_loss"
    higher_is_better = False
    said = "embedding loss"
    shown = (("nn_agreement", "NN same"),)
    needs = "it needs embeddings shaped N×D or N×T×D (--task-output)"
    changes = ("nn_agreement", "nearest neighbours")
    lower_is_closer = ("embedding_loss",)

    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        return NAME in reading.asked and reading.reads(name) and ref.ndim in (2, 3) and ref.dtype.kind == "f"

    def claims(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        return self.applies(reading, name, ref)

    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        ref_emb, cand_emb = vectors.pooled(ref), vectors.pooled(cand)
        cosine = float((vectors.unit_rows(ref_emb) * vectors.unit_rows(cand_emb)).sum(1).mean())
        found = {"embedding_cosine": cosine, "embedding_loss": 1.0 - cosine}
        # with two items, each one's neighbour is the other: nothing to agree on
        if len(ref_emb) >= 3:
            same = vectors.nearest_neighbours(ref_emb) == vectors.nearest_neighbours(cand_emb)
            found["nn_agreement"] = float(same.mean())
            found["embedding_loss"] = max(found["embedding_loss"], 1.0 - found["nn_agreement"])
        return found

"""generation: what a decoder with a KV cache says, greedy generation from the data's prompts with
the plan's own cache fed back, against FP32's: the share of tokens that agree before the first that
does not, and the logits' loss at every shape the search judges. Its judge runs the model itself
(autoprec.measure.shaped), so it reads no output here."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoprec.tasks.task import Reading, Task

NAME = "generation"


class Generation(Task):
    name = NAME
    key = "token_agreement"
    said = "generated tokens unlike FP32's, or the logits' 1 − cos at the worst shape"
    shown = (("token_agreement", "generated tokens as FP32's"),)
    needs = ("it needs a decoder with a KV cache (an output fed back as an input, such as "
             "present.N.key -> past_key_values.N.key, beside input_ids and logits): choose cosine "
             "or top1")

    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        return False

    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        return {}

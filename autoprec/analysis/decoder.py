"""A decoder with a KV cache, recognised from its inputs and outputs, and the two phases it runs in
deployment.

A decoder exported with its cache (optimum's ``text-generation-with-past``, a LLaMA/Mistral/Phi/Qwen
export, a hand-written one) takes the tokens, an attention mask, maybe positions, and a *past* per
layer; it returns logits and a *present* per layer, which the next run takes as its past. Generation
runs it in two phases: *prefill* (the prompt's tokens, no past) and *decode* (one token at a time,
the past growing). A plan judged at one of them may be wrong at the other, so the search judges
both, with pasts made the way generation makes them: by running the FP32 model on the data's own
tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from autoprec.analysis.model_info import TensorSpec

Batch = dict[str, np.ndarray]
Run = Callable[[Batch], Mapping[str, np.ndarray]]  # a model run: feeds in, outputs by name

# An output named like the left side is fed back as the input named like the right (optimum, Hugging
# Face's exporters, ONNX Runtime's GenAI builder, most hand-written exports).
CACHE_NAMES = ((r"^present\.", "past_key_values."), (r"^present_key_values\.", "past_key_values."),
               (r"^present_", "past_"), (r"^present", "past"))
TOKEN_NAMES = ("input_ids", "decoder_input_ids", "tokens", "ids")
MASK_NAMES = ("attention_mask", "decoder_attention_mask")
POSITION_NAMES = ("position_ids", "cache_position")
# a merged export's flag: False runs the graph without a past, True with it
BRANCH_NAMES = ("use_cache_branch",)


@dataclass(frozen=True)
class CachePair:
    """One layer's cache tensor: the input it is read from, the output it is returned in, the axis
    it grows on."""

    past: str
    present: str
    axis: int


@dataclass(frozen=True)
class Decoder:
    """Which of a model's inputs and outputs play which role in generation."""

    tokens: str
    logits: str
    cache: tuple[CachePair, ...]
    mask: str | None = None
    positions: str | None = None
    # inputs fed one tensor per run whatever the rows (a merged export's branch flag)
    unbatched: tuple[str, ...] = ()
    branch: str | None = None
    vocabulary: int | None = None  # the logits' last dim, where fixed: the token ids it takes

    def past_length(self, batch: Mapping[str, np.ndarray]) -> int:
        pair = self.cache[0]
        return int(np.shape(batch[pair.past])[pair.axis])

    def describe(self) -> str:
        return (f"a decoder with a KV cache ({len(self.cache)} cache tensors, {self.cache[0].past} "
                f"-> {self.cache[0].present}; tokens {self.tokens}, logits {self.logits})")


def find_decoder(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> Decoder | None:
    """The decoder roles of a model, or None: it needs an output fed back as an input (by its name,
    as ``present.N.key`` feeds ``past_key_values.N.key``, or else by its dims: an input dim named P
    returned as ``P + S``), a 2-D integer token input and a float logits output shaped [batch,
    sequence, vocabulary]."""
    by_name = {i.name: i for i in inputs}
    cache = _paired_by_name(by_name, outputs) or _paired_by_dims(inputs, outputs)
    fed_back = {p.past for p in cache}
    tokens = _named(inputs, TOKEN_NAMES,
                    lambda i: len(i.shape) == 2 and np.dtype(i.dtype).kind in "iu")
    returned = {p.present for p in cache}
    logits = next((o for o in outputs if o.name not in returned and len(o.shape) == 3
                   and np.dtype(o.dtype).kind == "f" and (o.name == "logits" or "logit" in o.name)),
                   None)
    logits = logits or next((o for o in outputs if o.name not in returned and len(o.shape) == 3
                             and np.dtype(o.dtype).kind == "f"), None)
    if not cache or tokens is None or tokens.name in fed_back or logits is None:
        return None
    mask = _named(inputs, MASK_NAMES, lambda i: len(i.shape) == 2)
    positions = _named(inputs, POSITION_NAMES, lambda i: np.dtype(i.dtype).kind in "iu")
    unbatched = tuple(i.name for i in inputs if i.batch_axis is None)
    branch = _named(inputs, BRANCH_NAMES, lambda i: np.dtype(i.dtype).kind == "b")
    vocabulary = logits.shape[-1] if isinstance(logits.shape[-1], int) and logits.shape[-1] > 0 else None
    return Decoder(tokens.name, logits.name, tuple(cache), mask and mask.name,
                   positions and positions.name,
                   unbatched, branch and branch.name, vocabulary)


def _named(specs: Sequence[TensorSpec], names: Sequence[str], fits: Callable[[TensorSpec], bool]) -> TensorSpec | None:
    return next((s for name in names for s in specs if s.name == name and fits(s)), None)


def _paired_by_name(inputs: Mapping[str, TensorSpec], outputs: Sequence[TensorSpec]) -> list[CachePair]:
    pairs = []
    for out in outputs:
        for pattern, replacement in CACHE_NAMES:
            name = re.sub(pattern, replacement, out.name, count=1)
            spec = inputs.get(name)
            if name != out.name and spec is not None and len(spec.shape) == len(out.shape):
                axis = _growing_axis(spec, out)
                if axis is not None:
                    pairs.append(CachePair(spec.name, out.name, axis))
                break
    return pairs


def _paired_by_dims(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> list[CachePair]:
    """Outputs fed back by their dims: an input and an output of one rank and type whose dims agree
    but on one axis, where the input's dim name P reappears in the output's (``P + S``), paired in
    order."""
    pairs, taken = [], set()
    for out in outputs:
        for spec in inputs:
            if spec.name in taken or spec.dtype != out.dtype or len(spec.shape) != len(out.shape):
                continue
            axis = _growing_axis(spec, out)
            if axis is not None and isinstance(spec.shape[axis], str) and spec.shape[axis] in str(out.shape[axis]):
                pairs.append(CachePair(spec.name, out.name, axis))
                taken.add(spec.name)
                break
    return pairs


def _growing_axis(past: TensorSpec, present: TensorSpec) -> int | None:
    """The one axis where a cache input's dim and its output's differ (the sequence it grows
    along)."""
    differ = [a for a, (p, q) in enumerate(zip(past.shape, present.shape)) if p != q]
    if len(differ) == 1 and not isinstance(past.shape[differ[0]], int):
        return differ[0]
    dynamic = [a for a, d in enumerate(past.shape) if isinstance(d, str) and "past" in d.lower()]
    return dynamic[0] if len(dynamic) == 1 and not differ else None


def has_rows(decoder: Decoder, name: str, value: np.ndarray) -> bool:
    """Whether an input has rows to stack or split (a batch axis, 0 in every decoder export)."""
    return name not in decoder.unbatched and np.ndim(value) > 0


def stacked(decoder: Decoder, batches: Sequence[Batch]) -> Batch:
    """``batches`` (of one shape) as one: their rows stacked, an input without rows as the first's."""
    return {name: np.concatenate([b[name] for b in batches]) if has_rows(decoder, name, value) else value
            for name, value in batches[0].items()}


def prefill(decoder: Decoder, batch: Batch, tokens: np.ndarray) -> Batch:
    """``batch`` as the first run of a generation: ``tokens`` (batch × sequence) and no past (its
    cache inputs zero-long along their growing axis); its other inputs kept."""
    fed = {**batch, decoder.tokens: tokens.astype(batch[decoder.tokens].dtype)}
    for pair in decoder.cache:
        shape = list(np.shape(batch[pair.past]))
        shape[pair.axis] = 0
        fed[pair.past] = np.zeros(shape, batch[pair.past].dtype)
    return _masked(decoder, _branch(decoder, fed, False), past=0, tokens=tokens.shape[1])


def next_run(decoder: Decoder, batch: Batch, outputs: Mapping[str, np.ndarray], tokens: np.ndarray) -> Batch:
    """The run after ``batch`` gave ``outputs``: ``tokens`` (batch × 1) with the cache it returned
    as the past."""
    fed = {**batch, decoder.tokens: tokens.astype(batch[decoder.tokens].dtype)}
    for pair in decoder.cache:
        fed[pair.past] = np.asarray(outputs[pair.present])
    return _masked(decoder, _branch(decoder, fed, True), past=decoder.past_length(fed),
                   tokens=tokens.shape[1])


def _branch(decoder: Decoder, fed: Batch, with_past: bool) -> Batch:
    """A merged export's branch flag set for the phase (its graph without a past at prefill, with it
    after)."""
    if decoder.branch is not None and decoder.branch in fed:
        fed[decoder.branch] = np.full(np.shape(fed[decoder.branch]), with_past, dtype=bool)
    return fed


def _masked(decoder: Decoder, fed: Batch, past: int, tokens: int) -> Batch:
    """The mask over past and new tokens (every position attended), the new tokens' positions."""
    rows = np.shape(fed[decoder.tokens])[0]
    if decoder.mask is not None and decoder.mask in fed:
        fed[decoder.mask] = np.ones((rows, past + tokens), fed[decoder.mask].dtype)
    if decoder.positions is not None and decoder.positions in fed:
        positions = np.arange(past, past + tokens)
        dtype = fed[decoder.positions].dtype
        fed[decoder.positions] = (positions if np.ndim(fed[decoder.positions]) == 1
                                  else np.tile(positions, (rows, 1))).astype(dtype)
    return fed


def greedy(logits: np.ndarray) -> np.ndarray:
    """The next token of each row: the last position's most likely, batch × 1."""
    return np.asarray(logits)[:, -1:, :].argmax(-1)


@dataclass(frozen=True)
class Generated:
    """A greedy generation: the tokens chosen (batch × steps) and each step's last-position
    logits."""

    tokens: np.ndarray
    logits: tuple[np.ndarray, ...]


def generate(run: Run, decoder: Decoder, first: Batch, steps: int) -> Generated:
    """Greedy generation of ``steps`` tokens from the prefill run ``first``, each run fed the cache
    the run before it returned (the model's own, as a deployment's)."""
    fed, tokens, logits = first, [], []
    for step in range(steps):
        outputs = run(fed)
        last = np.asarray(outputs[decoder.logits])[:, -1, :]
        logits.append(last)
        chosen = greedy(outputs[decoder.logits])
        tokens.append(chosen)
        if step + 1 < steps:
            fed = next_run(decoder, fed, outputs, chosen)
    return Generated(np.concatenate(tokens, axis=1), tuple(logits))


def prompt_only(decoder: Decoder, specs: Sequence[TensorSpec], arrays: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray] | None:
    """Prompts given alone (stacks of items: the tokens, maybe a mask) completed as a generation's
    first run takes them: each past zero-long, the mask all ones, positions from 0, a merged
    export's flag False; None where ``arrays`` lack more than those inputs, or a past's other dims
    are not fixed numbers (nothing to make them from)."""
    tokens = arrays.get(decoder.tokens)
    made = {pair.past for pair in decoder.cache} | ({decoder.mask, decoder.positions, decoder.branch} - {None})
    missing = [s for s in specs if s.name not in arrays]
    if tokens is None or np.ndim(tokens) < 2 or not missing or any(s.name not in made for s in missing):
        return None
    items, length = np.shape(tokens)[0], np.shape(tokens)[-1]
    axes = {pair.past: pair.axis for pair in decoder.cache}
    filled = dict(arrays)
    for spec in missing:
        if spec.name in axes:
            dims = [0 if axis == axes[spec.name] else d for axis, d in enumerate(spec.shape)
                    if axis != spec.batch_axis]
            if not all(isinstance(d, int) and d >= 0 for d in dims):
                return None
            filled[spec.name] = np.zeros((items, *dims), spec.dtype)
        elif spec.name == decoder.branch:
            filled[spec.name] = np.zeros((items, *[d if isinstance(d, int) else 1 for d in spec.shape]), bool)
        else:  # the mask over the prompt alone, its positions
            row = np.ones(length) if spec.name == decoder.mask else np.arange(length)
            filled[spec.name] = np.tile(row, (items, 1)).astype(spec.dtype)
    return filled


def random_prompts(decoder: Decoder, specs: Sequence[TensorSpec], count: int, seed: int,
                   ids: tuple[int, int]) -> dict[str, np.ndarray] | None:
    """``count`` random prompts (token ids in ``ids``, below the vocabulary) completed as a first
    run takes them (:func:`prompt_only`): random data for a decoder whose past is 0 at the search's
    shapes (a random mask or position would be no input it ever runs on); None where the past is
    not 0."""
    by_name = {s.name: s for s in specs}
    if any(by_name[p.past].shape[p.axis] != 0 for p in decoder.cache if p.past in by_name):
        return None
    spec = by_name[decoder.tokens]
    high = min(ids[1], decoder.vocabulary or ids[1])
    tokens = np.random.default_rng(seed).integers(ids[0], high, (count, *spec.item_shape)).astype(spec.dtype)
    return prompt_only(decoder, specs, {decoder.tokens: tokens})

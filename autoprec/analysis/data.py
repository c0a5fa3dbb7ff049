"""Sample inputs: read from files (or made at random), batched to the model's shapes, split once."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from autoprec.analysis.decoder import Decoder, prompt_only, random_prompts
from autoprec.analysis.images import IMAGE_SUFFIXES, ImageOptions, read_images
from autoprec.analysis.label_files import load_labels
from autoprec.analysis.model_info import TensorSpec
from autoprec.core import untrusted
from autoprec.core.errors import DataError
from autoprec.core.profile import names_text
from autoprec.record.facts import ShapePoint

ARRAY_SUFFIXES = {".npy", ".npz"}

Batch = dict[str, np.ndarray]


class RandomDataWarning(UserWarning):
    """Accuracy measured on random inputs says little about real inputs."""


@dataclass(frozen=True)
class Workload:
    """What one latency stands for: the batches one deployment request runs, each ``runs`` times (a
    decoder's prompt once and a decode step per token it generates; the one batch of a model
    deployed at one shape)."""

    parts: tuple[tuple[str, Batch, int], ...]  # (point name, batch, runs)

    @classmethod
    def of(cls, batch: Batch) -> Workload:
        return cls((("opt", batch, 1),))

    @property
    def single(self) -> bool:
        return len(self.parts) == 1 and self.parts[0][2] == 1

    @property
    def first(self) -> Batch:
        """The batch a profile of the engine's nodes runs: the part with the most runs (decode, for
        a decoder)."""
        return max(self.parts, key=lambda part: part[2])[1]


@dataclass(frozen=True)
class Dataset:
    """Batches for calibration and for evaluation, with where they came from, and the evaluation
    batches' ground truth when the data carries it (one mapping per evaluation batch)."""

    calibration: tuple[Batch, ...]
    evaluation: tuple[Batch, ...]
    source: str
    random: bool
    labels: tuple[Batch, ...] | None = None
    # Items the data holds at other shapes than the search's, a batch of one each: a point of their
    # own where the model's dims are dynamic (autoprec.analysis.shape_points), and the shipped model
    # checked on them.
    other_shapes: tuple[Batch, ...] = ()
    # the calibration batches' ground truth, likewise
    calibration_labels: tuple[Batch, ...] | None = None
    # More shapes than the data's one (autoprec.analysis.shape_points): the points, and the point of
    # each evaluation and calibration batch (the batches of all points interleaved, so any leading
    # run holds each).
    points: tuple[ShapePoint, ...] = ()
    evaluation_at: tuple[int, ...] = ()
    calibration_at: tuple[int, ...] = ()

    @property
    def main_evaluation(self) -> tuple[Batch, ...]:
        """The evaluation batches at the data's own shape (point 0): what is fitted to other
        shapes."""
        if not self.points:
            return self.evaluation
        return tuple(b for b, at in zip(self.evaluation, self.evaluation_at) if at == 0)

    @property
    def workload(self) -> Workload:
        """What a latency times: each timed point's first evaluation batch, run as often as a
        request runs it."""
        if not self.points:
            return Workload.of(self.evaluation[0])
        firsts = {at: b for b, at in reversed(list(zip(self.evaluation, self.evaluation_at)))}
        return Workload(tuple((p.name, firsts[i], p.runs) for i, p in enumerate(self.points) if p.runs and i in firsts))

    @property
    def calibration_apart(self) -> bool:
        """Whether the calibration batches are others than the evaluation batches (not one batch for
        both)."""
        return not any(c is e for c in self.calibration for e in self.evaluation)

    def fingerprint(self) -> str:
        """Content hash: cached ranges and references are valid only for the same data."""
        digest = hashlib.sha256()
        for part, batches in (("calibration", self.calibration), ("evaluation", self.evaluation),
                              ("labels", self.labels or ())):
            digest.update(part.encode())
            for batch in batches:
                for name in sorted(batch):
                    digest.update(name.encode())
                    digest.update(np.ascontiguousarray(batch[name]).tobytes())
        return digest.hexdigest()[:16]


def item_shapes(path: str | Path | None, inputs: Sequence[TensorSpec], decoder: Decoder | None = None
                ) -> dict[str, tuple[int, ...]]:
    """Per-item shapes (without the batch dim) the data offers, to fix dynamic model dims (a
    ``decoder``'s prompts alone: with the inputs a first run takes, :func:`prompt_only`).

    Images are resized to the model's shape, so they fix nothing.
    """
    if path is None:
        return {}
    path = Path(path)
    files = data_files(path)
    if files and all(f.suffix.lower() in ARRAY_SUFFIXES for f in files):
        specs = {i.name: i for i in inputs}
        return {name: _item_shape(arr.shape[1:], specs[name])
                for name, arr in _read_arrays(path, files, inputs, decoder).items()}
    return {}


def _item_shape(shape: tuple[int, ...], spec: TensorSpec) -> tuple[int, ...]:
    """An item's shape without the batch dim of 1 it was saved whole with (as :func:`load_items`
    accepts it)."""
    axis = spec.batch_axis
    if axis is not None and len(shape) == len(spec.shape) and shape[axis] == 1:
        return shape[:axis] + shape[axis + 1:]
    return shape


def scalar_values(path: str | Path | None, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """The first item's value of each scalar input the data holds: what a check run of the model
    is fed (a sample rate of 0 can send it down a branch the data never takes)."""
    scalars = [i for i in inputs if not i.shape]
    if path is None or not scalars:
        return {}
    files = data_files(Path(path))
    if not all(f.suffix.lower() in ARRAY_SUFFIXES for f in files):
        return {}
    try:
        arrays = _read_arrays(Path(path), files, scalars)
    except DataError:
        return {}  # said when the data is loaded, with the constants known
    return {i.name: arrays[i.name].reshape(len(arrays[i.name]), -1)[0, 0] for i in scalars if arrays[i.name].size}


def data_files(path: Path) -> list[Path]:
    if not path.exists():
        raise DataError(f"--data {path}: no such file or folder; check the path")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(
            f"--data {path}: neither a file nor a folder (a device or pipe?); give .npy/.npz files "
            "or images"
        )
    files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES | ARRAY_SUFFIXES)
    if not files:
        raise DataError(
            f"--data {path}: the folder holds no .npy, .npz or image files; put sample inputs "
            "there or leave out --data for random inputs"
        )
    return files


def _read_arrays(path: Path, files: list[Path], inputs: Sequence[TensorSpec], decoder: Decoder | None = None
                 ) -> dict[str, np.ndarray]:
    """Stack items per input along a new leading axis (one .npz: its arrays already are stacks; a
    ``decoder``'s prompts alone, completed: :func:`prompt_only`)."""
    names = [i.name for i in inputs]
    if len(files) == 1 and files[0].suffix.lower() == ".npz" and path.is_file():
        try:
            with np.load(untrusted.npz_checked(files[0], f"--data {path}"), allow_pickle=False) as npz:
                missing = [n for n in names if n not in npz.files]
                present = {n: _stack_of_items(npz[n], path, n) for n in names if n in npz.files}
                if missing and decoder is not None and (prompts := prompt_only(decoder, inputs, present)):
                    return prompts
                if missing:
                    scalar = next((i.name for i in inputs if i.name in missing and not i.shape),
                                  None)
                    raise DataError(
                        f"--data {path}: has arrays {', '.join(npz.files) or '(none)'} but the "
                        f"model needs {', '.join(missing)}; name the arrays like the model inputs "
                        f"({', '.join(names)})"
                        + (f", or give the scalar {scalar} with --const {scalar}=VALUE" if scalar else "")
                    )
                return present
        except untrusted.NUMPY_UNREADABLE as exc:
            # an object array (Python strings, ragged lists): never unpickled
            pickled = "allow_pickle" in str(exc)
            raise DataError(
                f"--data {path}: cannot be read as a NumPy .npz file ({exc}); "
                + ("store its strings as a str array (np.array(texts, dtype=str)) and numbers as "
                   "numeric arrays, then numpy.savez" if pickled else "re-save it with numpy.savez")
            ) from None
    items: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for f in files:
        try:
            if f.suffix.lower() == ".npy":
                if len(names) != 1:
                    raise DataError(
                        f"--data {f}: a .npy file holds one array, but the model has inputs "
                        f"{', '.join(names)}; use .npz files with arrays named like the inputs"
                    )
                items[names[0]].append(np.load(f, allow_pickle=False))
            else:
                with np.load(untrusted.npz_checked(f, f"--data {f}"), allow_pickle=False) as npz:
                    missing = [n for n in names if n not in npz.files]
                    if missing:
                        raise DataError(
                            f"--data {f}: lacks array(s) {', '.join(missing)}; name arrays like "
                            "the model inputs"
                        )
                    for item in _file_items({n: npz[n] for n in names}, inputs):
                        for n in names:
                            items[n].append(item[n])
        except untrusted.NUMPY_UNREADABLE as exc:
            why = "not a NumPy array file" if "pickle" in str(exc) else str(exc)  # NumPy's word for any other file
            raise DataError(f"--data {f}: cannot be read as a NumPy .npy/.npz file ({why}); give "
                            "arrays saved with numpy.save or numpy.savez (or image files), and no "
                            "other files in a --data folder") from None
    _one_form(items, inputs)
    main = _main_group(items, inputs)
    return {n: np.stack([a for i, a in enumerate(arrays) if i in main]) for n, arrays in items.items()}


def _one_form(items: dict[str, list[np.ndarray]], inputs: Sequence[TensorSpec]) -> None:
    """Items of a fixed input saved alone and others saved whole with a batch of 1 (both forms are
    read) made one form, alone: else the one form's items were kept apart as 'other shapes'."""
    for spec in inputs:
        if spec.batch_axis is None or not all(isinstance(d, int) for d in spec.shape):
            continue
        whole = tuple(1 if a == spec.batch_axis else d for a, d in enumerate(spec.shape))
        shapes = {a.shape for a in items[spec.name]}
        if whole in shapes and tuple(spec.item_shape) in shapes:
            items[spec.name] = [np.squeeze(a, axis=spec.batch_axis) if a.shape == whole else a
                                for a in items[spec.name]]


def _file_items(arrays: Mapping[str, np.ndarray], inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
    """One .npz file of a folder as items: one item, or — where its arrays carry the batch dim with
    more than one row (a file per phase: a prompt batch, a decode batch) — one per row, each kept
    whole with a batch of 1."""
    batched = [s for s in inputs if s.batch_axis is not None and np.ndim(arrays[s.name]) == len(s.shape)]
    rows = {np.shape(arrays[s.name])[s.batch_axis] for s in batched}
    if not batched or len(rows) != 1 or (count := rows.pop()) <= 1:
        return [dict(arrays)]
    items = []
    for row in range(count):
        item = {}
        for spec in inputs:
            array = arrays[spec.name]
            item[spec.name] = np.take(array, [row], axis=spec.batch_axis) if spec in batched else array
        items.append(item)
    return items


def _main_group(items: Mapping[str, list[np.ndarray]], inputs: Sequence[TensorSpec]) -> set[int]:
    """The files whose items the search measures on: where their shapes differ (a folder of text
    lines of several widths), those at the inputs' shapes where these are fixed, else the most of
    one shape; the others are kept apart (:func:`other_shapes`) for the check of the shipped
    model."""
    signatures = [
        tuple(arrays[i].shape for arrays in items.values()) for i in range(len(next(iter(items.values()), [])))
    ]
    if len(set(signatures)) <= 1:
        return set(range(len(signatures)))
    fitting = [sign for sign in signatures if all(_fits(shape, spec) for shape, spec in zip(sign, inputs))]
    common = max(
        set(fitting or signatures),
        key=lambda sign: ((fitting or signatures).count(sign), -signatures.index(sign))
    )
    # one shape exactly: they stack
    return {i for i, sign in enumerate(signatures) if sign == common}


def _fits(shape: tuple[int, ...], spec: TensorSpec) -> bool:
    """Whether an item of ``shape`` is one of ``spec``'s (fixed) items, alone or saved whole with a
    batch of 1."""
    if not all(isinstance(d, int) for d in spec.shape):
        return False
    whole = tuple(1 if a == spec.batch_axis else d for a, d in enumerate(spec.shape))
    return shape in (tuple(spec.item_shape), whole)


def other_shapes(path: str | Path | None, inputs: Sequence[TensorSpec]) -> tuple[Batch, ...]:
    """The data's items at other shapes than the search's (see :func:`_main_group`), each a batch of
    one, in file order: the shipped model, whose dims stay dynamic, is checked on them against the
    given model."""
    if path is None:
        return ()
    path = Path(path)
    files = data_files(path)
    if path.is_file() or not all(f.suffix.lower() in ARRAY_SUFFIXES for f in files):
        return ()
    names = [i.name for i in inputs]
    items: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for f in files:  # (read once already by load_items, which said what is wrong with any of them)
        if f.suffix.lower() == ".npy":
            items[names[0]].append(np.load(f, allow_pickle=False))
            continue
        with np.load(untrusted.npz_checked(f, f"--data {f}"), allow_pickle=False) as found:
            for item in _file_items({n: found[n] for n in names}, inputs):
                for n in names:
                    items[n].append(item[n])
    _one_form(items, inputs)
    main = _main_group(items, inputs)
    batches = []
    for i in range(len(items[names[0]])):
        if i in main:
            continue
        batch = {}
        for spec in inputs:
            item = np.asarray(items[spec.name][i], dtype=spec.dtype)
            whole = spec.batch_axis is None or item.ndim == len(spec.shape)
            batch[spec.name] = item if whole else np.expand_dims(item, spec.batch_axis)
        batches.append(batch)
    return tuple(batches)


def _made_for_prompts(files: list[Path], inputs: Sequence[TensorSpec], decoder: Decoder | None) -> list[str]:
    """The inputs a decoder's prompt file leaves out, which :func:`prompt_only` made."""
    if decoder is None or len(files) != 1 or files[0].suffix.lower() != ".npz":
        return []
    with np.load(files[0], allow_pickle=False) as npz:
        return [i.name for i in inputs if i.name not in npz.files]


def _stack_of_items(array: np.ndarray, path: Path, name: str) -> np.ndarray:
    if array.ndim == 0:
        raise DataError(f"--data {path}: array {name} is a single number; store the items stacked "
                        "along a first axis")
    return array


def load_items(path: str | Path, inputs: Sequence[TensorSpec], image: ImageOptions = ImageOptions()
               ) -> dict[str, np.ndarray]:
    """Items stacked per input, checked against the (static) input shapes and dtypes."""
    return _loaded(path, inputs, image)[0]


def _loaded(path: str | Path, inputs: Sequence[TensorSpec], image: ImageOptions, decoder: Decoder | None = None
            ) -> tuple[dict[str, np.ndarray], str]:
    """:func:`load_items`, and how images were read or prompts completed ("" where neither)."""
    path = Path(path)
    files = data_files(path)
    described = ""
    if all(f.suffix.lower() in IMAGE_SUFFIXES for f in files):
        if len(inputs) != 1:
            raise DataError(
                f"--data {path}: images feed one input, but the model has {len(inputs)}; use .npz "
                "files"
            )
        images, how = read_images(files, inputs[0], image)
        items, described = {inputs[0].name: images}, f" ({len(files)} images into {inputs[0].name} as {how})"
    else:
        items = _read_arrays(path, files, inputs, decoder)
        if made := _made_for_prompts(files, inputs, decoder):
            described = f" (prompts alone: {names_text(made)} made as a first run takes them)"
    # inputs given as one tensor for every run (weights fed as an input): repeated for each item
    once = set()
    for spec in inputs:
        arr = items[spec.name]
        want = spec.item_shape
        axis = spec.batch_axis
        if axis is None and spec.shape and arr.shape == tuple(spec.shape):
            arr = arr[None]
            once.add(spec.name)
        if axis is not None and arr.ndim == len(spec.shape) + 1 and arr.shape[1 + axis] == 1 \
                and arr.shape[1 : 1 + axis] + arr.shape[2 + axis :] == want:
            arr = arr.reshape(arr.shape[0], *want)  # items saved whole, with a batch dim of 1
        if axis is None and spec.shape and spec.shape[0] == 1 and arr.shape[1:] == tuple(spec.shape[1:]):
            arr = arr[:, None]  # an input that is not batched, its leading 1 left out
        if arr.shape[1:] != want:
            whole = (
                ""
                if axis is None
                else " (or each saved with a batch dim of 1: "
                     f"{[1 if a == axis else d for a, d in enumerate(spec.shape)]})"
            )
            where = "" if axis in (0, None) else f", batch on axis {axis}"
            raise DataError(
                f"--data {path}: items for input {spec.name} have shape {list(arr.shape[1:])}, but "
                f"the model takes {list(want)} per item (input shape {list(spec.shape)}{where}); "
                f"give items of {list(want)} stacked along a first axis{whole}, or, where the "
                "model's dims are dynamic, a --shape that fits them"
            )
        # a string input: ONNX Runtime takes str objects
        if spec.dtype == "object" and arr.dtype.kind in "US":
            arr = arr.astype(object)
        if np.dtype(arr.dtype).kind != np.dtype(spec.dtype).kind:
            raise DataError(
                f"--data {path}: input {spec.name} is {arr.dtype} in the data, but the model takes "
                f"{dtype_text(spec.dtype)}; convert the arrays"
            )
        items[spec.name] = arr.astype(spec.dtype, copy=False)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            bad = np.flatnonzero(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1))
            raise DataError(
                f"--data {path}: input {spec.name} holds NaN or Inf in {len(bad)} item(s) (the "
                f"first is item {bad[0]}); every accuracy would be infinite: remove or repair "
                "those items"
            )
    counts = {len(a) for name, a in items.items() if name not in once} or {1}
    if len(counts) != 1:
        raise DataError(f"--data {path}: inputs have different item counts {sorted(counts)}; give "
                        "each the same")
    count = next(iter(counts))
    for name in once:  # a view: the one tensor, read as every item's
        items[name] = np.broadcast_to(items[name], (count, *items[name].shape[1:]))
    return items, described


RANDOM_INTEGERS = (0, 100)  # what random data draws integer inputs from, upper bound excluded


def dtype_text(dtype: str) -> str:
    """A tensor type as a user knows it (an ONNX string tensor is numpy's object)."""
    return "string" if dtype == "object" else dtype


def random_items(inputs: Sequence[TensorSpec], count: int, seed: int, size: int = 1) -> dict[str, np.ndarray]:
    """Uniform [0, 1) floats, integers in RANDOM_INTEGERS: only for trying a model without data. An
    input that is not batched gets one value per batch of ``size`` items. A scalar integer input (a
    sample rate, a size, a flag) is a setting, not data: it needs a value."""
    rng = np.random.default_rng(seed)
    items = {}
    for spec in inputs:
        drawn = count if spec.batch_axis is not None else -(-count // size)
        shape = (drawn, *spec.item_shape)
        if spec.dtype == "object":
            raise DataError(f"input {spec.name} takes strings, which random data cannot choose: "
                            f"pass --data with an {spec.name!r} array of strings")
        if not spec.shape and np.dtype(spec.dtype).kind in "iub":
            example = " (e.g. the sample rate it expects)" if np.dtype(spec.dtype).kind in "iu" else " (1 or 0)"
            raise DataError(f"input {spec.name} is a scalar of type {spec.dtype}, which random "
                            f"data cannot choose: pass --const {spec.name}=VALUE{example}, or "
                            f"--data with an array named {spec.name!r}")
        if np.dtype(spec.dtype).kind == "f":
            items[spec.name] = rng.random(shape, dtype=np.float32).astype(spec.dtype)
        elif np.dtype(spec.dtype).kind == "b":
            items[spec.name] = rng.random(shape) < 0.5
        else:
            items[spec.name] = rng.integers(*RANDOM_INTEGERS, shape).astype(spec.dtype)
        if spec.batch_axis is None:
            items[spec.name] = np.repeat(items[spec.name], size, axis=0)[:count]
    return items


def constant_items(inputs: Sequence[TensorSpec], constants: Mapping[str, float], count: int) -> dict[str, np.ndarray]:
    """``--const NAME=VALUE``: every item of input NAME holds VALUE (a scalar input's one value per
    run)."""
    by_name = {i.name: i for i in inputs}
    unknown = sorted(set(constants) - set(by_name))
    if unknown:
        raise DataError(f"--const {unknown[0]}: the model has no input {unknown[0]}; its inputs "
                        f"are {', '.join(by_name)}")
    items = {}
    for name, value in constants.items():
        spec = by_name[name]
        if np.dtype(spec.dtype).kind in "iub" and float(value) != int(value):
            raise DataError(f"--const {name}={value}: input {name} is {spec.dtype}; give a whole "
                            "number")
        items[name] = np.full((count, *spec.item_shape), value, dtype=spec.dtype)
    return items


def batch_size(inputs: Sequence[TensorSpec]) -> int:
    return next((i.batch for i in inputs if i.batch is not None), 1)


def batch_items(items: Mapping[str, np.ndarray], inputs: Sequence[TensorSpec]) -> list[Batch]:
    """Cut items (or their labels) into batches of the model's batch size, each input stacked along
    its batch axis (a scalar input takes its batch's one value); a partial last batch is dropped."""
    size = batch_size(inputs)
    count = len(next(iter(items.values())))
    if count < size:
        raise DataError(
            f"--data: {count} item(s) cannot fill one batch of {size}; give more items or a "
            "smaller batch in --shape"
        )
    axes = {i.name: i.batch_axis for i in inputs}
    batches = []
    for start in range(0, count - size + 1, size):
        batch = {}
        for name, values in items.items():
            part = values[start : start + size]
            axis = axes.get(name, 0)
            if axis is None:
                if (part != part[0]).any():
                    raise DataError(
                        f"--data: input {name} takes one value per run, but items "
                        f"{start}-{start + size - 1} of one batch differ; give them equal values "
                        "or a batch of 1 (--shape)"
                    )
                batch[name] = np.array(part[0])  # 0-d: ascontiguousarray would make it 1-d
            else:
                batch[name] = np.ascontiguousarray(np.moveaxis(part, 0, axis))
        batches.append(batch)
    return batches


def _check_varied(path: str | Path, items: Mapping[str, np.ndarray]) -> None:
    """Refuse data whose items are all one input (a preprocessing that wrote zeros): every plan would
    be judged on that one input, and lose nothing on it."""
    arrays = [a for a in items.values() if len(a) > 1 and a.size]
    if arrays and all(bool((a == a[0]).all()) for a in arrays):
        first = arrays[0].reshape(-1)[0]
        value = f" (every value {first!r:.12})" if all(bool((a == a.reshape(-1)[0]).all()) for a in arrays) else ""
        raise DataError(f"--data {path}: all {len(arrays[0])} items are the same input{value}: "
                        "every plan would be judged on that one input; give varied data, as the "
                        "model sees in deployment")


def build_dataset(
    path: str | Path | None,
    inputs: Sequence[TensorSpec],
    seed: int = 0,
    random_count: int = 8,
    image: ImageOptions = ImageOptions(),
    constants: Mapping[str, float] | None = None,
    decoder: Decoder | None = None,
) -> Dataset:
    """Load (or make) the inputs and split the batches: up to half for calibration, the rest for
    evaluation. ``constants`` (``--const``) feed their inputs one value; the data need not hold
    them; a ``decoder``'s data may hold its prompts alone (:func:`prompt_only`)."""
    constants = dict(constants or {})
    # an unknown name or a fraction for an integer: said before any data is read
    constant_items(inputs, constants, 0)
    fed = [i for i in inputs if i.name not in constants]
    for spec in (i for i in inputs if i.name in constants and i.shape and np.dtype(i.dtype).kind == "f"):
        warnings.warn(f"--const {spec.name}={constants[spec.name]:g}: every item of input {spec.name} "
                      f"{list(spec.shape)} holds that one value, on which calibration and accuracy "
                      "mean little (--const is for settings: a sample rate, a flag); pass --data",
                      RandomDataWarning, stacklevel=2)
    if path is None:
        if fed:
            warnings.warn(
                "no --data given: using random inputs. Accuracy numbers then mean little; "
                "pass --data with real sample inputs",
                RandomDataWarning,
                stacklevel=2,
            )
        size = batch_size(inputs)
        prompts = decoder and random_prompts(decoder, fed, random_count * size, seed, RANDOM_INTEGERS)
        items = prompts or random_items(fed, random_count * size, seed, size)
        source = f"random{' prompts' if prompts else ''} (seed {seed})"
    else:
        items, described = _loaded(path, fed, image, decoder) if fed else ({}, "")
        source = f"{path}{described}"
    count = len(next(iter(items.values()))) if items else random_count * batch_size(inputs)
    items.update(constant_items(inputs, constants, count))
    if constants:
        source += " + " + ", ".join(f"{k}={v:g}" for k, v in constants.items())
    labels = load_labels(path, data_files(Path(path)), fed, count) if path is not None else {}
    batches = batch_items(items, inputs)
    if path is not None:
        _check_varied(path, {spec.name: items[spec.name] for spec in fed})
    truths = batch_items(labels, inputs) if labels else None
    order = np.random.default_rng(seed).permutation(len(batches))
    batches = [batches[i] for i in order]
    truths = [truths[i] for i in order] if truths else None
    fixed = {name: batches[0][name] for name in constants}  # (as every batch feeds them)
    others = tuple({**batch, **fixed} for batch in other_shapes(path, fed)) if fed else ()
    if others:
        source += f" ({len(others)} item(s) at other shapes: judged at their own shapes)"
    if len(batches) == 1:
        return Dataset(tuple(batches), tuple(batches), source + " (one batch: calibration = "
                                                                "evaluation)", path is None,
                       tuple(truths) if truths else None, others, tuple(truths) if truths else None)
    n_calib = max(1, len(batches) // 2)
    return Dataset(tuple(batches[:n_calib]), tuple(batches[n_calib:]), source, path is None,
                   tuple(truths[n_calib:]) if truths else None, others,
                   tuple(truths[:n_calib]) if truths else None)

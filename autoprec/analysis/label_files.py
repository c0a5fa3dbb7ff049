"""Ground truth given beside the inputs (``--data``): labels, texts, boxes and masks, from the .npz files'
arrays or an image folder's labels.json, checked to hold one entry per item."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from autoprec.analysis.images import IMAGE_SUFFIXES
from autoprec.analysis.model_info import TensorSpec
from autoprec.core import untrusted
from autoprec.core.errors import DataError

# Ground truth the data may carry beside the inputs, one entry per item (see accuracy.LABEL_FORMS).
LABEL_ARRAYS = ("labels", "text", "boxes", "masks")
# in an image folder: {"labels" | "text" | "boxes": {file name: value}}
LABELS_SIDECAR = "labels.json"


def load_labels(path: str | Path, files: list[Path], inputs: Sequence[TensorSpec], count: int
                ) -> dict[str, np.ndarray]:
    """Ground truth beside the inputs: arrays named ``labels``/``text``/``boxes``/``masks`` in the
    .npz file(s), or ``labels.json`` in an image folder; checked to hold one entry per item."""
    path = Path(path)
    names = {i.name for i in inputs}
    found: dict[str, np.ndarray] = {}
    if all(f.suffix.lower() in IMAGE_SUFFIXES for f in files):
        found = _sidecar_labels(path, files) if path.is_dir() else {}
    elif all(f.suffix.lower() == ".npz" for f in files):
        per_file: dict[str, list[np.ndarray]] = {}
        for f in files:
            for key, array in _label_arrays(f, names).items():
                per_file.setdefault(key, []).append(array)
        one_stack = len(files) == 1 and path.is_file()
        for key, arrays in per_file.items():
            if len(arrays) != len(files):
                raise DataError(f"--data {path}: only {len(arrays)} of {len(files)} files hold a "
                                f"{key!r} array; give it in every file or in none")
            found[key] = arrays[0] if one_stack else _stacked_labels(arrays, path, key)
    for key, array in found.items():
        _check_labels(path, key, array, count)
    return {key: (array.astype(str) if key == "text" else array) for key, array in found.items()}


def _label_arrays(path: Path, inputs: set[str]) -> dict[str, np.ndarray]:
    """The label arrays one .npz file holds (those not named like an input); an object array (never
    unpickled) is told to be stored as a str or integer array."""
    with np.load(untrusted.npz_checked(path, f"--data {path}"), allow_pickle=False) as npz:
        found = {}
        for key in LABEL_ARRAYS:
            if key in npz.files and key not in inputs:
                try:
                    found[key] = npz[key]
                except untrusted.NUMPY_UNREADABLE:
                    raise DataError(f"--data {path}: its {key!r} array is stored as Python "
                                    "objects, which autoprec never unpickles; store it as a "
                                    "numeric array (np.asarray(labels, dtype=np.int64), or "
                                    "dtype=str for text), then numpy.savez") from None
        return found


def _stacked_labels(arrays: list[np.ndarray], path: Path, key: str) -> np.ndarray:
    shapes = {a.shape for a in arrays}
    if key != "boxes" and len(shapes) == 1:
        return np.stack(arrays)
    if key == "boxes" and all(a.ndim == 2 for a in arrays):  # ragged per file: padded with class -1
        rows = max(len(a) for a in arrays)
        padded = np.full((len(arrays), rows, 5), -1.0)
        for i, a in enumerate(arrays):
            padded[i, : len(a)] = a[:, :5]
        return padded
    raise DataError(f"--data {path}: the files' {key!r} arrays have different shapes "
                    f"{sorted(shapes)}; make them equal")


def _sidecar_labels(folder: Path, files: list[Path]) -> dict[str, np.ndarray]:
    sidecar = folder / LABELS_SIDECAR
    if not sidecar.is_file():
        return {}
    try:
        document = untrusted.parse_json(untrusted.read_bytes(sidecar, "a labels file", given=True))
    except (OSError, ValueError) as exc:
        raise DataError(f"--data {sidecar}: cannot be read as JSON ({exc}); fix or remove it") from None
    if (
        not isinstance(document, dict)
        or not set(document) <= set(LABEL_ARRAYS)
        or not all(isinstance(v, dict) for v in document.values())
    ):
        raise DataError(f"--data {sidecar}: must be an object with \"labels\", \"text\", \"boxes\" "
                        "and/or \"masks\", each mapping an image file name to its value")
    found = {}
    for key, by_file in document.items():
        missing = [f.name for f in files if f.name not in by_file]
        if missing:
            raise DataError(
                f"--data {sidecar}: {key!r} has no entry for {len(missing)} image(s), the first "
                f"{missing[0]!r}; give every image one (a negative class marks one not labelled)"
            )
        values = [by_file[f.name] for f in files]
        try:
            if key == "boxes":
                found[key] = _stacked_labels([np.asarray(v, np.float64).reshape(-1, 5) for v in values], sidecar, key)
            else:
                found[key] = np.asarray(values, str if key == "text" else None)
        except (ValueError, TypeError) as exc:
            raise DataError(
                f'--data {sidecar}: {key!r} values cannot be read ({exc}); see docs/design.md, '
                f'"Labels"'
            ) from None
    return found


def _check_labels(path: Path, key: str, array: np.ndarray, count: int) -> None:
    kind = {"labels": "iu", "text": "US", "boxes": "fiu", "masks": "iu"}[key]
    if array.dtype.kind not in kind or array.ndim == 0:
        raise DataError(f"--data {path}: {key!r} is {array.dtype} shaped {list(array.shape)}: it "
                        "must be "
                        + {"labels": "integer classes, one per item (N or N×T)", "text": "strings, "
                                                                                         "one per "
                                                                                         "item",
                           "boxes": "numbers shaped N×M×5 (class, x1, y1, x2, y2; a negative class "
                                    "pads)",
                           "masks": "integer classes per pixel, N×H×W (negative: not labelled)"}[key])
    if key == "boxes" and (array.ndim != 3 or array.shape[2] != 5):
        raise DataError(f"--data {path}: 'boxes' is shaped {list(array.shape)}, not N×M×5 (class, "
                        "x1, y1, x2, y2)")
    if key == "masks" and array.ndim != 3:
        raise DataError(f"--data {path}: 'masks' is shaped {list(array.shape)}, not N×H×W (a class "
                        "per pixel)")
    if len(array) != count:
        raise DataError(f"--data {path}: {key!r} holds {len(array)} entries for {count} items; "
                        "give one per item")
    if key != "text" and array.size and not (array[..., 0] if key == "boxes" else array).max() >= 0:
        raise DataError(f"--data {path}: {key!r} labels nothing (every " + ("box's class" if key == "boxes" else
                        "class") + " is negative, which marks no label); give the items' true "
                        + ("boxes" if key == "boxes" else "classes") + f", or leave the {key!r} "
                                                                       "array out")

"""An export folder holds the files of one trial: a manifest (``export.json``) names the trial, the
format, the model's sha256 and every file written. An export writes only into a folder that is new,
empty or an export's (its manifest lists everything there, beside what the export's scripts make: an
engine, its layers): it first removes what the earlier export wrote, so no model.plan of another
trial stays beside the new model, and never touches a file of anyone else's. One export at a time
writes into a folder."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Iterator, Sequence

from autoprec.analysis.model import model_sha256
from autoprec.core import atomic, untrusted
from autoprec.core.errors import AutoprecError, FolderError
from autoprec.core.locks import FileLock, host_lock_folder, private_folder
from autoprec.core.profile import ShapeProfile
from autoprec.record.facts import PointCheck
from autoprec.results.files import json_safe

MANIFEST = "export.json"
EXPORT_SCHEMA = "autoprec.export/1"
# What an export's own scripts (build.sh, build_engine.py, check.sh) and --build write beside it: an
# export folder may hold them unlisted; the next export there removes them with its listed files.
SCRIPT_OUTPUTS = ("model.plan", "build_report.json", "layers.json", "profile.json", "timing.cache",
                  "fp32_outputs.json")


def check_destination(folder: Path, result_dir: Path, source: Path, fmt: str) -> None:
    """Refuse an export folder where its files would overwrite others': the result's own (best/, the
    cache, the result files; only its export/ holds exports) or, but for Triton's entry folder, the
    searched model's."""
    where, result = Path(folder).resolve(), Path(result_dir).resolve()
    if where == result or (where.is_relative_to(result) and not where.is_relative_to(result / "export")):
        raise AutoprecError(f"--out {folder}: inside the result {result_dir} (its best/, cache and "
                            "result files); an export there could overwrite what the search "
                            "wrote: give a folder outside it, or leave --out out "
                            f"({Path(result_dir) / 'export' / fmt})")
    if fmt != "triton" and where == source.resolve().parent:
        raise AutoprecError(
            f"--out {folder}: the folder of the model {result_dir} was searched with "
            f"({source.name}); the export's model.onnx and weights would overwrite files there: "
            "give another folder"
        )


def _files(folder: Path) -> list[str]:
    """Every entry under ``folder`` but its folders, relative to it (links and the like included,
    never followed)."""
    found = []
    for root, folders, files in os.walk(folder):
        for name in [*files, *(f for f in folders if os.path.islink(os.path.join(root, f)))]:
            found.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(found)


def _listed(folder: Path) -> set[str]:
    """What the manifest of ``folder`` lists (empty where there is none); a manifest that is not one
    is refused."""
    path = folder / MANIFEST
    if not os.path.lexists(path):
        return set()
    try:
        document = untrusted.read_json(path, f"the export folder {folder}")
        files = document["files"]
        if document.get("schema") != EXPORT_SCHEMA or not all(isinstance(f, str) for f in files):
            raise ValueError(f"not an {EXPORT_SCHEMA} manifest")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FolderError(f"{path}: not the manifest of an autoprec export ({exc}); give another "
                          "--out, or remove the folder's files") from None
    return set(document["files"])


def clear(folder: Path) -> None:
    """Remove what an earlier export wrote into ``folder`` (the files its manifest lists, and what
    its scripts make); refused, touching nothing, where the folder holds anything else."""
    folder = Path(folder)
    listed = _listed(folder)
    allowed = listed | ({MANIFEST, *SCRIPT_OUTPUTS} if listed else set())
    theirs = [name for name in _files(folder) if name not in allowed]
    if theirs:
        named = ", ".join(theirs[:3]) + (", …" if len(theirs) > 3 else "")
        unlisted = f"its {MANIFEST} does not list them" if listed else f"no {MANIFEST} lists them"
        raise FolderError(f"--out {folder}: holds {named}, which no finished autoprec export wrote there "
                          f"({unlisted}: another tool's, or an export stopped before it wrote "
                          f"{MANIFEST}); an export replaces only its own files: give a new or "
                          "empty folder, or move those away")
    for name in _files(folder):  # each listed: never a name a manifest leads out ('../x')
        (folder / name).unlink()  # (a link itself, never what it names)


@contextlib.contextmanager
def exporting(folder: Path) -> Iterator[Path]:
    """``folder`` (made where missing; a real folder, not a link) held for one export and cleared
    for it (see :func:`clear`): another export into it meanwhile is refused, not interleaved with
    this one. An export that fails part-way leaves none of its files (all there are its own, once
    cleared)."""
    folder = untrusted.own_folder(folder, "an export")
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:24]
    lock = FileLock(private_folder(host_lock_folder()) / f"export-{key}.lock")
    if not lock.take(wait=False):
        raise FolderError(f"--out {folder}: another autoprec export is writing there now; wait for "
                          "it to end, or give another --out")
    try:
        clear(folder)
        try:
            yield folder
        except BaseException:
            for name in _files(folder):
                (folder / name).unlink()
            raise
    finally:
        lock.release()


def record(folder: Path, written: Sequence[Path], trial: int, fmt: str, model: Path,
           sha256: str | None = None,
           profile: ShapeProfile | None = None, checks: Sequence[PointCheck] = ()) -> Path:
    """Write ``folder``'s manifest: the trial exported, the format, ``model``'s sha256 (its data
    files included; ``sha256`` where a build report already has it: a large model is read once), the
    deployment profile it is written for and its checks against the given model there."""
    folder = Path(folder)
    files = sorted({str(Path(p).resolve().relative_to(folder.resolve())) for p in written})
    return atomic.write_json(folder / MANIFEST, json_safe({
        "schema": EXPORT_SCHEMA, "trial": trial, "format": fmt,
        "model": str(model.relative_to(folder)),
        "model_sha256": sha256 or model_sha256(model), "files": files,
        "profile": profile.to_json() if profile is not None else None,
        "checked_against_source": [c.to_json() for c in checks]}))

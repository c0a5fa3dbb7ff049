"""An export folder holds the files of one trial: a manifest (``export.json``) names the trial, the format, the
model's sha256 and every file written; exporting into the folder again first removes what the earlier export
wrote, so no model.plan or build report of another trial stays beside the new model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from autoprec.analysis.model import model_sha256
from autoprec.core import atomic
from autoprec.core.errors import AutoprecError
from autoprec.core.profile import ShapeProfile
from autoprec.measure.deployment import PointCheck
from autoprec.results.files import json_safe

MANIFEST = "export.json"
EXPORT_SCHEMA = "autoprec.export/1"
# What export --build adds (an export folder written before manifests existed may hold them unlisted).
BUILD_FILES = ("model.plan", "build_report.json", "layers.json")


def check_destination(folder: Path, result_dir: Path, source: Path, fmt: str) -> None:
    """Refuse an export folder where its files would overwrite others': the result's own (best/, the cache, the
    result files; only its export/ holds exports) or, but for Triton's entry folder, the searched model's."""
    where, result = Path(folder).resolve(), Path(result_dir).resolve()
    if where == result or (where.is_relative_to(result) and not where.is_relative_to(result / "export")):
        raise AutoprecError(f"--out {folder}: inside the result {result_dir} (its best/, cache and result files); an "
                            "export there could overwrite what the search wrote: give a folder outside it, or leave "
                            f"--out out ({Path(result_dir) / 'export' / fmt})")
    if fmt != "triton" and where == source.resolve().parent:
        raise AutoprecError(
            f"--out {folder}: the folder of the model {result_dir} was searched with ({source.name}); "
            "the export's model.onnx and weights would overwrite files there: give another folder"
        )


def clear(folder: Path) -> None:
    """Remove what an earlier export wrote into ``folder``: the files its manifest lists, and a build's."""
    folder = Path(folder)
    listed: list[str] = []
    try:
        listed = list(json.loads((folder / MANIFEST).read_text()).get("files", []))
    except (OSError, ValueError, AttributeError, TypeError):
        pass  # no manifest (a first export, or one by an older autoprec): only the build files go
    root = folder.resolve()
    for name in {*map(str, listed), *BUILD_FILES, MANIFEST}:
        path = folder / name
        if path.resolve().is_relative_to(root) and path.is_file():  # a hand-edited '../x' is not followed
            path.unlink()


def record(folder: Path, written: Sequence[Path], trial: int, fmt: str, model: Path, sha256: str | None = None,
           profile: ShapeProfile | None = None, checks: Sequence[PointCheck] = ()) -> Path:
    """Write ``folder``'s manifest: the trial exported, the format, ``model``'s sha256 (its data files included;
    ``sha256`` where a build report already has it: a large model is read once), the deployment profile it is
    written for and its checks against the given model there."""
    folder = Path(folder)
    files = sorted({str(Path(p).resolve().relative_to(folder.resolve())) for p in written})
    return atomic.write_json(folder / MANIFEST, json_safe({
        "schema": EXPORT_SCHEMA, "trial": trial, "format": fmt, "model": str(model.relative_to(folder)),
        "model_sha256": sha256 or model_sha256(model), "files": files,
        "profile": profile.to_json() if profile is not None else None,
        "checked_against_source": [c.to_json() for c in checks]}))

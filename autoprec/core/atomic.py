"""Atomic file writes: a reader (or a crash) never sees a half-written result."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    path = Path(path)
    if path.is_dir():  # else the rename fails naming the temporary file, not the user's path
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:  # a failed write names no file (disk full): name the one being written
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_bytes(path: Path, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data))


def write_json(path: Path, obj: Any) -> Path:
    return write_bytes(path, (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def write_with(path: Path, writer: Callable[[IO[bytes]], None]) -> Path:
    """For libraries that write to a file object (numpy.savez, matplotlib.savefig)."""
    return _atomic(path, writer)


def remove_stale(folder: Path) -> None:
    """Temporary files a killed writer left behind (the real files were never touched)."""
    if Path(folder).is_dir():
        for tmp in Path(folder).glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

"""Atomic file writes: a reader (or a crash) never sees a half-written result."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from autoprec.core import untrusted


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    path = Path(path)
    if path.is_dir():  # else the rename fails naming the temporary file, not the user's path
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary(path)
    try:
        with naming(path), os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def naming(path: Path, temporary: Path | None = None) -> Iterator[None]:
    """A failed write in the block (a full disk) names ``path``, the file being written, where it
    names no file or only the ``temporary`` one that becomes it."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None or (temporary is not None and exc.filename == str(temporary)):
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def write_bytes(path: Path, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data))


def json_text(obj: Any) -> str:
    """The one JSON encoding of what autoprec writes: strict (NaN and infinities are refused, not
    written as tokens other readers reject)."""
    return json.dumps(obj, indent=2, allow_nan=False)


def write_json(path: Path, obj: Any) -> Path:
    return write_bytes(path, (json_text(obj) + "\n").encode())


def write_keyed(path: Path, key: str, fields: dict[str, Any]) -> Path:
    """A cache file: ``fields`` kept for ``key`` (a content key: what they were measured from)."""
    return write_json(path, {"key": key, **fields})


def read_keyed(path: Path, key: str) -> dict[str, Any] | None:
    """The fields :func:`write_keyed` kept at ``path`` for ``key``; None where the file is absent,
    unreadable, damaged or kept for another key (then they are measured again and written anew). A
    link, FIFO or device there is refused (:mod:`autoprec.core.untrusted`): a cache folder is input
    too."""

    try:
        kept = untrusted.read_json(path, f"the cache {path.parent}")
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.pop("key", None) != key:
        return None
    return kept


def digest(value: Any, sort_keys: bool = False, default: Callable[[Any], Any] | None = None) -> str:
    """The first 16 hex digits of the SHA-256 of ``value`` as JSON: the one content key of plans,
    spaces, preparations and sensitivities (the same value, the same key, in every process)."""
    return hashlib.sha256(json.dumps(value, sort_keys=sort_keys, default=default).encode()).hexdigest()[:16]


def write_with(path: Path, writer: Callable[[IO[bytes]], None]) -> Path:
    """For libraries that write to a file object (numpy.savez, matplotlib.savefig)."""
    return _atomic(path, writer)


def temporary(path: Path) -> tuple[int, Path]:
    """A new temporary file beside ``path`` (a descriptor open for writing, and its name): made
    afresh, never a file already there, and named for this process, so :func:`remove_stale` knows it
    from anyone else's. Its mode is an ordinary file's (mkstemp makes 0600: weights renamed from
    it were unreadable to a server running as another user)."""
    prefix = f".{Path(path).name}.{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=TEMPORARY, dir=Path(path).parent)
    os.chmod(tmp, 0o666 & ~_umask())
    return fd, Path(tmp)


TEMPORARY = ".autoprec.tmp"
_OURS = re.compile(r"\..+\.(\d+)-[^/]*" + re.escape(TEMPORARY))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one of another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_stale(folder: Path) -> None:
    """Temporary files a killed writer of autoprec left behind (the real files were never touched):
    only autoprec's own (see :func:`temporary`), and only those of a process that is gone."""
    if not Path(folder).is_dir():
        return
    for tmp in Path(folder).iterdir():
        found = _OURS.fullmatch(tmp.name)
        if found and not pid_alive(int(found.group(1))):
            tmp.unlink(missing_ok=True)

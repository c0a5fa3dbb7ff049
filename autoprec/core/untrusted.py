"""A folder autoprec reads back (a result, its cache, an export) is input, not trust: whoever had it
last may have put there a link to another file, a FIFO that never ends, a device, a file of any
size, JSON nested past any parser, or code. So autoprec reads there only regular files inside the
folder, each read bounded; makes, replaces or removes there only what it made itself (an export's
manifest says what that is: autoprec.export.folder); and imports no code from it. A file the user
names is read bounded too."""

from __future__ import annotations

import errno
import json
import os
import stat
import zipfile
from pathlib import Path
from typing import Any, Iterable

from autoprec.core.errors import DataError, FolderError

# The most bytes one JSON file autoprec reads back may hold (trials.json of 10,000 trials of 1,000
# units: about 400 MB).
JSON_BYTES = 1 << 30
# What NumPy raises for a file that is not a (readable) .npy/.npz: object arrays need pickle, which
# is never allowed.
NUMPY_UNREADABLE = (ValueError, OSError, EOFError, zipfile.BadZipFile)
# The deepest nesting of a JSON or YAML document autoprec reads (its own files go 6 deep, a search
# space 4).
NESTING = 64
# The most values a YAML document autoprec reads may hold (a search space holds dozens).
YAML_VALUES = 1_000_000

_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words (a link, a FIFO, a device, …)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _refused(path: Path, what: str, found: str) -> FolderError:
    return FolderError(f"{path}: {found}, not a file autoprec wrote in {what}; remove it (or copy "
                       "the real file there) and run again")


def checked_tree(folder: Path, names: Iterable[str], what: str) -> None:
    """Each of ``names`` in ``folder`` (those present), and all under those that are folders, is a
    directory or a regular file: a link (which could lead reads and writes out of ``folder``), FIFO,
    device or socket there is refused naming it. ``what`` names the folder in the refusal (e.g. "the
    result folder R")."""
    pending = [Path(folder) / name for name in names]
    while pending:
        path = pending.pop()
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            pending.extend(path / entry for entry in os.listdir(path))
        elif not stat.S_ISREG(mode):
            raise _refused(path, what, kind(mode))


def only_name(path: Path, what: str) -> None:
    """``path`` (where present) is no hard link: a file autoprec writes in place (a database)
    changes under every name it has, a user's file elsewhere included."""
    try:
        links = os.lstat(path).st_nlink
    except FileNotFoundError:
        return
    if links > 1:
        raise FolderError(f"{path}: a file with {links - 1} other name(s) (a hard link) in {what}, "
                          "which autoprec would write into; copy it there (cp, not ln), or move it "
                          "away")


def own_folder(path: Path, what: str) -> Path:
    """``path`` made where missing (its parents too), else checked to be a real directory, not a
    link to one: a folder autoprec writes into is its own, never one a link leads it to."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        raise FolderError(f"{path}: {kind(mode)}, not a folder of {what}; autoprec writes there "
                          "only into a folder of its own: remove it and run again")
    return path


def open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of ``path``, a regular file: a link is not followed, and a FIFO or
    device is not waited on (opened without blocking, then refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(Path(path), what, "a symbolic link") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refused(Path(path), what, kind(mode))
    return fd


def read_bytes(path: Path, what: str, limit: int = JSON_BYTES, given: bool = False) -> bytes:
    """``path``'s bytes (see :func:`open_regular`), at most ``limit`` of them: a larger file is a
    ValueError. ``given``: a file the user names (a link or a pipe is theirs to give): only its size
    is bounded."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if given else open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        status = os.fstat(fd)
        regular = stat.S_ISREG(status.st_mode)
        too_large = regular and status.st_size > limit  # said before any of it is read
        data = b"" if too_large else f.read((min(limit, status.st_size) if regular else limit) + 1)
    if too_large or len(data) > limit:
        raise ValueError(f"larger than the {limit:,} bytes {what} may hold")
    return data


def nesting_checked(document: Any, most: int | None = None) -> Any:
    """``document`` (parsed JSON or YAML) when its lists and mappings nest at most ``NESTING`` deep
    (and, given ``most``, hold at most that many values, counted as read: YAML's aliases can make a
    few lines a billion values, or a cycle); else a ValueError saying so (read iteratively: no depth
    makes it recurse)."""
    pending = [(document, 1)]
    seen = 0
    while pending:
        value, depth = pending.pop()
        seen += 1
        if most is not None and seen > most:
            raise ValueError(f"more than {most:,} values (aliases repeating one another?)")
        if isinstance(value, (dict, list)):
            if depth > NESTING:
                raise ValueError(f"nested more than {NESTING} levels deep")
            inside = value.values() if isinstance(value, dict) else value
            pending.extend((v, depth + 1) for v in inside)
    return document


def parse_json(text: str | bytes) -> Any:
    """A JSON document, at most ``NESTING`` deep; a ValueError for any other (the parser's own, or
    the nesting)."""
    try:
        return nesting_checked(json.loads(text))
    except RecursionError:
        raise ValueError(f"nested more than {NESTING} levels deep") from None


def parse_yaml(text: str) -> Any:
    """A YAML document (safe: plain data only), at most ``NESTING`` deep; a ValueError for any
    other."""
    import yaml

    try:
        return nesting_checked(yaml.safe_load(text), YAML_VALUES)
    except RecursionError:
        raise ValueError(f"nested more than {NESTING} levels deep") from None
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


def read_json(path: Path, what: str, limit: int = JSON_BYTES, given: bool = False) -> Any:
    """A JSON file of an untrusted folder (``given``: one the user names; see :func:`read_bytes`) of
    at most ``limit`` bytes, at most ``NESTING`` deep."""
    return parse_json(read_bytes(path, what, limit, given))


def fresh_file(path: Path) -> int:
    """A new, empty regular file at ``path`` for writing (whatever was there, a link included, is
    removed first, never followed): a log autoprec rewrites cannot truncate a file a link names."""
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o666)


_DISTRUSTED: set[Path] = set()


def distrust(folder: Path) -> None:
    """From now on in this process, no code is imported from ``folder`` (a result read as input) or
    below it."""
    _DISTRUSTED.add(Path(folder).resolve())


def distrusted(path: Path) -> Path | None:
    """The distrusted folder ``path`` lies in (see :func:`distrust`), or None."""
    where = Path(path).resolve()
    return next((folder for folder in _DISTRUSTED if where.is_relative_to(folder)), None)


def module_origins(name: str) -> list[Path]:
    """The files (and namespace folders) importing module ``name`` would run code from: the module
    and each package above it not imported yet, found as Python's path finder finds them, without
    running any of it."""
    import importlib.machinery
    import sys

    origins: list[Path] = []
    search: list[str] | None = None
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        loaded = sys.modules.get(prefix)
        if loaded is not None:
            search = list(getattr(loaded, "__path__", []))
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(prefix, search)
        except KeyError:  # a namespace package in one not imported yet (Python looks its parent up)
            spec = importlib.machinery.ModuleSpec(prefix, None, is_package=True)
        if spec is None:
            break
        if spec.origin is not None and spec.has_location:  # a module, or a package's __init__
            origins.append(Path(spec.origin))
            search = list(spec.submodule_search_locations or [])
        else:  # a namespace package: its portions, the folders of that name on the path searched
            entries = sys.path if search is None else search
            search = [str(Path(entry) / parts[depth - 1]) for entry in entries
                      if (Path(entry) / parts[depth - 1]).is_dir()]
            origins += map(Path, search)
    return origins


def npz_checked(path: Path, what: str) -> Path:
    """``path``, a NumPy .npz file, where its arrays fit in half this machine's memory once inflated
    (a zip's directory says each member's size, which reading it cannot pass): a small file whose
    arrays inflate past the memory would take the machine down before any array could be judged.
    Refused (DataError) otherwise."""
    try:
        with zipfile.ZipFile(path) as archive:
            inflated = sum(member.file_size for member in archive.infolist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return path  # not a zip: NumPy says what it is
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    if memory and inflated > memory // 2:
        raise DataError(f"{what}: its arrays take {_size(inflated)} once inflated, more than half "
                        f"this machine's memory ({_size(memory)}): give fewer items")
    return path


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


"""Locks across processes and threads: a file lock the OS releases when its holder dies, in a folder only this
user may write (the device a candidate runs on, a study's queue and budget)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from pathlib import Path

from autoprec.core.errors import AutoprecError


class FileLock:
    """One holder at a time (the device, a study's budget), across processes and threads: ``flock``
    on a file, which the OS releases when its holder dies, so a worker killed mid-trial cannot
    leave it locked. The file is opened without following a symbolic link: a link planted where
    the lock goes cannot make autoprec create or open a file elsewhere."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            what = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
            raise AutoprecError(
                f"lock file {self.path} {what}; remove it (autoprec makes its own) and run again"
            ) from None

    def check(self) -> FileLock:
        """Open the lock file once without taking it: a bad lock file is refused here, before any work starts."""
        os.close(self._open())
        return self

    def take(self, wait: bool = True) -> bool:
        """Take the lock; without ``wait``, False at once when another holder has it."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def __enter__(self) -> FileLock:
        self.take()
        return self

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __exit__(self, *exc: object) -> None:
        self.release()


def private_folder(folder: Path) -> Path:
    """``folder`` made (mode 0700) or checked: a real directory owned by this user, so no one else can
    plant links or files in it. Refused with one line otherwise."""
    folder = Path(folder)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = os.lstat(folder)
    except OSError as exc:
        raise AutoprecError(
            f"lock folder {folder}: cannot be made ({exc.strerror}); set TMPDIR to a writable folder"
        ) from None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise AutoprecError(f"lock folder {folder} is not a directory of this user's own (a link, or another user's); "
                            "remove it, or set TMPDIR to a folder of yours")
    if found.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder


def host_lock_folder() -> Path:
    """This user's lock folder on this host (under the temporary directory; made private by :func:`private_folder`)."""
    return Path(tempfile.gettempdir()) / f"autoprec-locks-{os.geteuid()}"

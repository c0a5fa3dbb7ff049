"""Locks across processes and threads: a file lock the OS releases when its holder dies, in a folder
only this user may write (the device a candidate runs on, a study's queue and budget)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from autoprec.core.atomic import json_text, pid_alive
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
        """Open the lock file once without taking it: a bad lock file is refused here, before any
        work starts."""
        os.close(self._open())
        return self

    def take(self, wait: bool = True, shared: bool = False,
             say: Callable[[str], None] | None = None, doing: str = "") -> bool:
        """Take the lock (``shared``: beside other shared holders, never beside an exclusive one);
        without ``wait``, False at once when another holder has it. With ``say``, a wait is not
        silent: who holds the lock and since when is said at once and every SAY_EVERY seconds until
        it is free. The holder notes in the file who it is and what it is ``doing``, for the next
        waiter to say."""
        fd = self._open()
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | (0 if wait and say is None else fcntl.LOCK_NB))
        except BlockingIOError:
            if not wait:
                os.close(fd)
                return False
            self._wait(fd, mode, say)
        self._fd = fd
        _note(fd, doing)
        return True

    def _wait(self, fd: int, mode: int, say: Callable[[str], None]) -> None:
        started, said = time.monotonic(), SAY_AFTER - SAY_EVERY
        while True:
            waited = time.monotonic() - started
            if waited - said >= SAY_EVERY:
                said = waited
                say(f"waiting {waited:.0f} s for the lock {self.path}, held by {self.holder()}")
            time.sleep(POLL_SECONDS)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                continue

    def holder(self) -> str:
        """Who holds the lock, as its last taker noted it: ``pid 812 (autoprec search zoo:magika …),
        timing, since 19:02:11``; where that process is gone or left no note, said so."""
        try:
            note = json.loads(self.path.read_text() or "{}")
            pid, since = int(note["pid"]), float(note["since"])
        except (OSError, ValueError, KeyError, TypeError):
            return "a process that left no note (an older autoprec, or another tool)"
        if not pid_alive(pid):
            return f"pid {pid}, which has ended (the lock is being handed on)"
        doing = f", {note['doing']}" if note.get("doing") else ""
        return (f"pid {pid} ({note.get('command') or 'command unknown'}){doing}, since "
                f"{time.strftime('%H:%M:%S', time.localtime(since))}")

    def __enter__(self) -> FileLock:
        self.take()
        return self

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __exit__(self, *exc: object) -> None:
        self.release()


# a wait this long is said (a shorter one, a search's trials taking turns, is not worth a line)
SAY_AFTER = 2.0
SAY_EVERY = 30.0  # seconds between two lines of a waiter saying who holds the lock
POLL_SECONDS = 0.2


def _note(fd: int, doing: str) -> None:
    """This process noted in the lock file as its holder: its pid, its command (a worker process's:
    its parent's, the search's), what it is doing and since when."""
    command = _command(os.getpid())
    if "multiprocessing" in command:
        command = _command(os.getppid())
    note = json_text({"pid": os.getpid(), "command": command, "doing": doing,
                       "since": time.time()})
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
    except OSError:
        pass  # a note is for saying, never a reason to fail


def _command(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    said = " ".join(a.decode(errors="replace") for a in args if a)
    return said if len(said) <= 120 else said[:119] + "…"


class DeviceTurns:
    """The device's lock as a candidate's measurement takes it: evaluating (its outputs do not
    depend on how busy the device is) shares it with other processes' evaluations, timing holds it
    alone; so a process waits only for another's timing, evaluates while another evaluates, and says
    whom it waits for (``say``)."""

    def __init__(self, lock: FileLock | None, say: Callable[[str], None] | None = None):
        self.lock, self.say = lock, say

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        with self._held(shared=True, doing="evaluating a candidate"):
            yield

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        with self._held(shared=False, doing="timing"):
            yield

    @contextlib.contextmanager
    def _held(self, shared: bool, doing: str) -> Iterator[None]:
        if self.lock is None:
            yield
            return
        self.lock.take(shared=shared, say=self.say, doing=doing)
        try:
            yield
        finally:
            self.lock.release()


def private_folder(folder: Path) -> Path:
    """``folder`` made (mode 0700) or checked: a real directory owned by this user, so no one else
    can plant links or files in it. Refused with one line otherwise."""
    folder = Path(folder)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = os.lstat(folder)
    except OSError as exc:
        raise AutoprecError(
            f"lock folder {folder}: cannot be made ({exc.strerror}); set TMPDIR to a writable "
            "folder"
        ) from None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise AutoprecError(f"lock folder {folder} is not a directory of this user's own (a link, "
                            "or another user's); remove it, or set TMPDIR to a folder of yours")
    if found.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder


def host_lock_folder() -> Path:
    """This user's lock folder on this host (under the temporary directory; made private by
    :func:`private_folder`)."""
    return Path(tempfile.gettempdir()) / f"autoprec-locks-{os.geteuid()}"

"""Whether building an ONNX Runtime CPU session of a graph ends the process that builds it: tried in
a child process, which a crash takes down instead of the caller. One child serves every probe of a
process (a fresh interpreter importing ONNX Runtime for each graph cost more than the build itself:
every FP16 plan a search evaluates is a graph of its own); a child a crash ended is started again
for the next probe."""

from __future__ import annotations

import atexit
import hashlib
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

PROBE_SECONDS = 300.0  # a child building a session longer than this is taken for a crash (hung)
BUILT = "autoprec-probe: built"
SERVE = f"""
import os, sys, onnxruntime
for line in sys.stdin:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    try:
        onnxruntime.InferenceSession(os.fsdecode(bytes.fromhex(line)), options, providers=["CPUExecutionProvider"])
    except Exception:
        pass  # no crash: the real build says what is wrong
    print({BUILT!r}, flush=True)
"""


class SessionProbe:
    """A child interpreter running ``code`` (default: :data:`SERVE`), given one path a line,
    answering BUILT for each path it survived."""

    def __init__(self, code: str = SERVE, seconds: float = PROBE_SECONDS):
        self.code, self.seconds = code, seconds
        self.child: subprocess.Popen | None = None
        self.lock = threading.Lock()
        atexit.register(self.close)

    def _started(self) -> subprocess.Popen:
        if self.child is None or self.child.poll() is not None:
            self.child = subprocess.Popen([sys.executable, "-c", self.code], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True)
        return self.child

    def crashes(self, path: Path | str) -> bool:
        """Whether building ``path``'s session ended the child by a signal, or hung past the seconds
        given."""
        with self.lock:
            child = self._started()
            try:
                child.stdin.write(os.fsencode(path).hex() + "\n")  # a line, whatever the path holds
                child.stdin.flush()
                while select.select([child.stdout], [], [], self.seconds)[0]:
                    line = child.stdout.readline()
                    if not line:  # ended
                        return self._ended() < 0
                    if line.strip() == BUILT:
                        return False
            except BrokenPipeError:
                return self._ended() < 0
            self.close()  # hung
            return True

    def _ended(self) -> int:
        code = self.child.wait()
        self.child = None
        return code

    def close(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()
            self.child = None


_probe = SessionProbe()
_probed: dict[str, bool] = {}  # by the graph's digest: a graph is probed once per process
_probing = [True]  # this process's: see probe_builds


def probe_builds(on: bool) -> None:
    """Whether this process probes builds (:func:`build_crashes`). A measuring worker, which a crash
    cannot take down, builds at once (a probe doubled each FP16 plan's build): its parent starts it
    again probing after a crash by a signal, and asks again (autoprec.measure.isolation)."""
    _probing[0] = on


def build_crashes(path: Path) -> bool:
    """Whether building an ONNX Runtime CPU session of the model at ``path`` with every optimizer on
    ends the process that builds it (once per graph); False where this process does not probe."""
    if not _probing[0]:
        return False
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if digest not in _probed:
        _probed[digest] = _probe.crashes(path)
    return _probed[digest]

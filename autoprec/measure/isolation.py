"""Candidates measured in a child process: a crash, hang or runaway allocation fails one trial, not
the search.

One worker process lives for the whole search (the evaluation data, FP32 reference and the prepared
model's graph with its calibrated ranges are sent to it once); each candidate is sent as its plan,
which the worker lowers itself (the weights stay in the prepared model's folder, read by the engine
from there). With several workers (``--build-workers``),
candidates are built side by side while a device lock lets one at a time run on the device. The
parent enforces a time limit and a memory limit (the worker's resident set, read from /proc) and
kills the worker when either is exceeded.
A dead worker is replaced before the next candidate. What the worker printed on stderr
(faulthandler's traceback for a segfault, the engine's own messages) is kept for the trial record.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import multiprocessing
import os
import queue
import re
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Sequence

from autoprec.analysis.data import Batch, Workload
from autoprec.core import untrusted
from autoprec.core.errors import AutoprecError, MetricError, first_line
from autoprec.core.locks import DeviceTurns, FileLock, host_lock_folder, private_folder
from autoprec.core.plan import Plan
from autoprec.measure.accuracy import Judge
from autoprec.measure.downstream import Captures
from autoprec.measure.measurement import (
    KeptSession,
    Lowering,
    Measurer,
    Rejected,
    Screen,
    accuracy_loss,
    measured,
    reset_peak,
    resident_bytes,
    time_compared,
    time_paired,
)
from autoprec.record.trial import Measurement, Paired, Screened
from autoprec.record.verdict import Rounds

log = logging.getLogger("autoprec")

STARTUP_SECONDS = 120.0
POLL_SECONDS = 0.05
# A candidate unanswered this long (at most half its time limit) is said, with where the worker is.
NOTICE_SECONDS = 30.0
WHERE_SIGNAL = signal.SIGUSR1  # the worker writes its Python stack to its stderr log on it
# The end of the worker's stderr log read for a crash's cause (a loop may have filled the log).
TAIL_BYTES = 256 << 10


class TrialCrash(AutoprecError):
    """The worker died, hung or outgrew its memory limit while measuring a candidate (``by_signal``:
    it died of a signal of its own, a segmentation fault or the like)."""

    def __init__(self, cause: str, by_signal: bool = False):
        super().__init__(cause)
        self.by_signal = by_signal


class TrialError(AutoprecError):
    """The candidate raised an error in the worker (deterministic: not retried)."""


def total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class Limits:
    """Per-candidate limits. ``memory_bytes`` None means no memory limit."""

    seconds: float = 600.0
    memory_bytes: int | None = None

    @classmethod
    def default(cls, seconds: float = 600.0, memory_gb: float | None = None, workers: int = 1) -> Limits:
        """Default memory limit: 75 % of this machine's RAM shared by the workers, so the search
        itself survives; the time limit includes waiting for the device."""
        if memory_gb is not None:
            return cls(seconds, int(memory_gb * 2**30))
        total = total_memory_bytes()
        return cls(seconds, int(total * 0.75 / workers) if total else None)


def device_lock_path(backend: str, device: int) -> Path:
    """One lock per engine and device on this host, shared by every autoprec process of this user on
    it: workers of one study (or of several) take turns on the device, so none times a candidate
    while another runs."""
    return private_folder(host_lock_folder()) / f"{backend}-device{device}.lock"


def _worker(conn, stderr_path: str) -> None:
    """Child process: its stderr to the log, then what it works with, sent down the pipe (not as the
    process's arguments: those the parent writes before the child reads them, and a child that died
    starting left the parent blocked on that write for ever — a script calling autoprec.search
    without a __main__ guard hung so)."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)  # the file start() made
    os.dup2(fd, 2)
    faulthandler.enable()  # a segfault leaves a Python traceback in the stderr tail
    faulthandler.register(WHERE_SIGNAL, all_threads=False)  # where it is, when asked (see _where)
    # what the server imported lives as long as the worker: no collection walks it (nor copies its pages)
    gc.freeze()
    _serve(conn, *conn.recv())


def _serve(conn, backend_name: str, device: int, cache_dir, device_lock, batches, judge,
           lowering: Lowering, threads: int, work: Workload | None, careful: bool) -> None:
    """Lower and measure each plan the parent sends until told to stop (None); ``careful``: a worker
    before it died of a signal, so sessions are built as the search's own process builds them."""
    from autoprec.analysis.session_probe import probe_builds
    from autoprec.backends import get_backend

    probe_builds(careful)
    backend = get_backend(backend_name, device, cache_dir, threads)
    # taken to run a candidate, not to build it; a wait for it is said to the parent
    on_device = DeviceTurns(device_lock, lambda said: conn.send(("note", said)))
    # also imports a user's metric module here, before the first candidate
    ranking = judge.for_ranking()
    work = work or (Workload.of(batches[0]) if batches else None)
    kept = KeptSession()  # the all-FP32 session, from one re-timed plan to the next
    captures = Captures()  # all-FP32's tensors for the sensitivity pass's plans
    conn.send(("ready", None))
    while True:
        message = conn.recv()
        if message is None:
            return
        kind, *args = message
        if kind != "retime":
            kept.close()
        if kind != "loss" or not args[3]:  # kept while the pass's one-unit plans come, then given back
            captures.clear()
        try:
            if kind == "retime":  # ("retime", the all-FP32 plan, a plan, rounds, dominated_ms)
                reference, plan, rounds, dominated_ms = args
                models = lowering(backend, reference), lowering(backend, plan)
                with on_device.timing():
                    paired = time_paired(backend, *models, work, rounds, (kept, reference.key()), dominated_ms)
                conn.send(("ok", paired.to_json()))
            # ("compare", the all-FP32 plan, the contending plans, seconds, apart)
            elif kind == "compare":
                with on_device.timing():
                    found = time_compared(backend, lowering, *args[:2], work, *args[2:])
                conn.send(("ok", found.to_json()))
            # ("loss", plan, number of batches, the constraint's judge or the ranking's, a one-unit plan)
            elif kind == "loss":
                plan, count, constraint, one_unit = args
                model = lowering(backend, plan)
                with on_device.evaluating():
                    loss = accuracy_loss(backend, model, batches[:count],
                                         judge if constraint else ranking,
                                         lowering.downstream(backend, captures, batches[:count]) if one_unit else None)
                conn.send(("ok", loss))
            else:  # ("measure", plan, screen or None)
                plan, screen = args
                conn.send(("ok",
                           measured(backend, lowering, plan, batches, judge, screen, on_device,
                                    work).to_json()))
        except Rejected as rejected:
            conn.send(("rejected", rejected.screened.to_json()))
        except MetricError as exc:  # the parent stops the search with it
            conn.send(("metric", str(exc)))
        except Exception as exc:  # reported to the parent, which fails the trial with it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _sent(conn: multiprocessing.connection.Connection, data: memoryview) -> None:
    try:
        conn.send_bytes(data)  # (received by conn.recv(), which unpickles it)
    except OSError:  # the worker died starting: said by the start, with its exit
        pass


@dataclass
class Spawned:
    """A worker process started before what it measures is known: its interpreter and imports (about
    a second) overlap the search's calibration instead of following it. It waits for its data."""

    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection

    def kill(self) -> None:
        """Ends the worker, unless a measurer took it and ended it already."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)


def worker_context() -> multiprocessing.context.BaseContext:
    """How workers start: forked from a server process that imported the measuring code once
    (multiprocessing's forkserver, where the system has one), so a worker (each search's, one
    replacing a crashed one) starts without importing it again (0.5-0.7 s of CPU each on a 2-core
    VM, a tenth of the test suite's); spawned, importing it, elsewhere. Either way the worker is a
    fresh process: none of the search's threads, sessions or locks."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    _short_socket_folder()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


# A Unix socket's path: 104 bytes on macOS, 108 on Linux, its terminating zero included.
SOCKET_PATH_MAX = 103


def _short_socket_folder() -> None:
    """multiprocessing's own folder (where its forkserver's socket lives: <folder>/pymp-XXXXXXXX/
    listener-XXXXXXXX) made under /tmp where the temporary directory's path leaves no room for that
    name (a TMPDIR deep in a CI's or a test's folders: "AF_UNIX path too long"); the temporary
    directory stays what it is for everything else."""
    from multiprocessing import util

    if len(os.fsencode(tempfile.gettempdir())) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") <= SOCKET_PATH_MAX:
        return
    kept, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        util.get_temp_dir()  # made once per process, and kept
    except OSError:
        pass  # no /tmp to write in: the long path's own error then says it
    finally:
        tempfile.tempdir = kept


def start_worker_server(also_imported: Sequence[str] = ()) -> None:
    """The forkserver started now (where workers fork from one), so that it imports the measuring code
    (and the modules ``also_imported``: what other work forked from it needs) while the caller goes on
    (a search analysing its model) and the first worker forks at once instead of waiting on those
    imports (0.9 s of a search's set-up on a 2-core VM)."""
    context = worker_context()
    if context.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        context.set_forkserver_preload([__name__, *also_imported])
        forkserver.ensure_running()


def spawn_worker(stderr_log: Path) -> Spawned:
    """A worker process started, its stderr to ``stderr_log`` (made anew), waiting for its data."""
    context = worker_context()
    parent, child = context.Pipe()
    os.close(untrusted.fresh_file(stderr_log))
    process = context.Process(target=_worker, args=(child, str(stderr_log)), daemon=True)
    process.start()
    child.close()  # the worker's end, here: a worker gone makes a send fail, not wait
    return Spawned(process, parent)


class IsolatedMeasurer(Measurer):
    """``measure(model)`` in a worker process, within ``limits``. Use as a context manager."""

    def __init__(
        self,
        backend_name: str,
        batches: Sequence[Batch],
        judge: Judge,
        limits: Limits,
        stderr_log: Path,
        device: int = 0,
        cache_dir: Path | None = None,
        device_lock: FileLock | None = None,
        lowering: Lowering | None = None,
        threads: int = 0,
        work: Workload | None = None,
    ):
        """``stderr_log`` receives the worker's stderr (rewritten at each worker start);
        ``cache_dir`` is the engine's (see :func:`autoprec.backends.get_backend`); ``device_lock``
        is shared by the workers of one device; ``lowering`` turns the plans it is sent into models;
        ``threads``: the engine's (see :func:`autoprec.backends.get_backend`); ``work``: what a
        latency times (default: the first batch)."""
        self.args = (backend_name, device, cache_dir, device_lock, list(batches), judge, lowering,
                     threads, work)
        self.limits = limits
        self.process = None
        self.conn = None
        self.stderr = Path(stderr_log)
        self.careful = False  # a worker died of a signal: see _serve

    def start(self, spawned: Spawned | None = None) -> None:
        """Start the worker now (it also starts on demand, and again after a crash), or give its data
        to one ``spawned`` earlier with this measurer's stderr log."""
        # where this raises, no unstarted process is kept to kill
        spawned = spawned or spawn_worker(self.stderr)
        self.process, self.conn = process, parent = spawned.process, spawned.conn
        # pickled here (what cannot be is this call's error), sent from a thread: a worker alive but
        # not reading (stuck starting) would block a send of more than the pipe holds for ever; so
        # the start's time limit holds, and the kill ends the send
        data = ForkingPickler.dumps((*self.args, self.careful))
        threading.Thread(target=_sent, args=(parent, data), daemon=True).start()
        try:
            self._wait(time.monotonic() + STARTUP_SECONDS, starting=True)
        except TrialCrash:
            if process.exitcode != 1 or self._stderr_end():
                raise
            raise AutoprecError(
                "the worker process ended (status 1) before it ran any of autoprec's code, its error "
                "printed above: Python starts each worker by running the main script again, so a "
                "script that calls autoprec.search must call it under "
                "'if __name__ == \"__main__\":'") from None

    def _stderr_end(self) -> str:
        """The end of the worker's stderr log (its last ``TAIL_BYTES``; "" where unreadable)."""
        try:
            with os.fdopen(untrusted.open_regular(self.stderr, "the cache"), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
                return f.read(TAIL_BYTES).decode(errors="replace")
        except (OSError, AutoprecError):
            return ""

    def _stderr_tail(self, lines: int = 15) -> str:
        kept = self._stderr_end().strip().splitlines()
        tail = kept[-lines:]
        # the cause, above a deep stack
        fatal = [line for line in kept if line.startswith("Fatal Python error")]
        if fatal and fatal[-1] not in tail:
            tail = [fatal[-1], "…", *tail[2 - lines:]]
        return "\n".join(tail)[-2000:]

    def _kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join(5)
        self.process = None

    def _crash(self, cause: str, by_signal: bool = False) -> TrialCrash:
        tail = self._stderr_tail()
        self._kill()
        return TrialCrash(cause + (f"; worker stderr: {tail}" if tail else ""), by_signal)

    def _exit_cause(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"worker killed by signal {signal.Signals(-code).name}"
        return f"worker exited with status {code}"

    def _check_memory(self, peak: bool) -> None:
        """The worker's resident memory now (or at its peak since this candidate was sent) against
        the limit."""
        rss = resident_bytes(self.process.pid, peak)
        limit = self.limits.memory_bytes
        if limit is not None and rss is not None and rss > limit:
            raise self._crash(f"memory limit exceeded: worker RSS {rss / 2**30:.2f} GiB > "
                              f"{limit / 2**30:.2f} GiB"
                              + (" (at its peak)" if peak else ""))

    def _where(self) -> tuple[str, list[str]]:
        """Where the worker is now, as its Python stack says it (the innermost frame in words, and
        every frame's file): asked of it by a signal, read from its stderr log."""
        try:
            os.kill(self.process.pid, WHERE_SIGNAL)
        except ProcessLookupError:  # it ended meanwhile: its exit is said instead
            return "", []
        time.sleep(0.2)
        stack = self._stderr_end().rpartition("(most recent call first):")[2]
        frames = re.findall(r'File "(.*)", line (\d+) in (\S+)', stack)
        if not frames:
            return "", []
        path, line, function = frames[0]
        return f"{function} ({Path(path).name}, line {line})", [path for path, _, _ in frames]

    def _timed_out(self, what: str, seconds: float) -> Exception:
        """The time limit's verdict: the user's metric named where it is what hangs (its fault, not
        the plan's), else a crash of this trial saying where the worker was."""
        where, files = self._where()
        judge = self.args[5]
        code = getattr(judge.metric.user_function, "__code__", None)
        if code is not None and code.co_filename in files:
            self._kill()
            return MetricError(f"--metric {judge.metric.name}: no answer within --trial-timeout "
                               f"{seconds:g} s (it was in {where}); make it faster, or give a "
                               "larger --trial-timeout")
        said = f" (in {where})" if where else ""
        return self._crash(f"time limit exceeded: {what} took over {seconds:g} s{said}")

    def _wait(self, deadline: float, starting: bool = False):
        asked = time.monotonic()  # (the final timing's rounds have their own time past the limit)
        limit = self.limits.seconds
        notice = None if starting else deadline - limit + min(NOTICE_SECONDS, limit / 2)
        while True:
            try:
                if self.conn.poll(POLL_SECONDS):
                    reply = self.conn.recv()
                    # a candidate done between two looks is held to the limit too
                    self._check_memory(peak=True)
                    return reply
            except (EOFError, OSError):
                pass
            if not self.process.is_alive():
                self.process.join(1)
                raise self._crash(self._exit_cause() + (" while starting" if starting else ""),
                                  by_signal=(self.process.exitcode or 0) < 0)
            self._check_memory(peak=False)
            if notice is not None and time.monotonic() > notice:
                notice = None
                where = self._where()[0] or "no Python code"
                log.info(f"a candidate is unanswered after {time.monotonic() - asked:.0f} s (the "
                         f"time limit is {deadline - asked:.0f} s); the worker is in {where}")
            if time.monotonic() > deadline:
                what = "starting" if starting else "measuring the candidate"
                raise self._timed_out(what, STARTUP_SECONDS if starting else limit)

    def _ask(self, message: tuple, seconds: float):
        """The worker's answer; asked again once of a careful worker where one building sessions at
        once died of a signal (a session build ONNX Runtime's layout transformer crashes)."""
        try:
            return self._answer(message, seconds)
        except TrialCrash as crash:
            if self.careful or not crash.by_signal:
                raise
            self.careful = True
            log.warning(f"the measuring worker died ({first_line(crash)}); asked again of one that "
                        "first tries each session's build in a process of its own")
            return self._answer(message, seconds)

    def _answer(self, message: tuple, seconds: float):
        if self.process is None or not self.process.is_alive():
            self.start()
        reset_peak(self.process.pid)
        self.conn.send(message)
        deadline = time.monotonic() + seconds
        kind, payload = self._wait(deadline)
        while kind == "note":  # the worker waits for the device: said; waited for within the limit
            log.warning(payload)
            kind, payload = self._wait(deadline)
        if kind == "error":
            raise TrialError(payload)
        if kind == "metric":
            raise MetricError(payload)
        if kind == "rejected":
            raise Rejected(Screened.from_json(payload))
        return payload

    def measure(self, plan: Plan, screen: Screen | None = None) -> Measurement:
        return Measurement.from_json(self._ask(("measure", plan, screen), self.limits.seconds))

    def accuracy_loss(self, plan: Plan, batches: int, constraint: bool = False, one_unit: bool = False) -> float:
        """:meth:`Measurer.accuracy_loss`, in the worker."""
        return self._ask(("loss", plan, batches, constraint, one_unit), self.limits.seconds)

    def time_paired(self, reference: Plan, plan: Plan, rounds: int, dominated_ms: float | None = None) -> Paired:
        """:func:`autoprec.measure.measurement.time_paired` in the worker, within the time limit."""
        return Paired.from_json(self._ask(("retime", reference, plan, rounds, dominated_ms), self.limits.seconds))

    def time_compared(self, fp32: Plan, contenders: Sequence[Plan], seconds: float, apart: bool) -> Rounds:
        """:meth:`Measurer.time_compared` in the worker, within the time limit (and the rounds'
        own)."""
        return Rounds.from_json(self._ask(("compare", fp32, list(contenders), seconds, apart),
                                          self.limits.seconds + seconds))

    def close(self) -> None:
        if self.process is not None and self.process.is_alive():
            try:
                self.conn.send(None)
                self.process.join(5)
            except (OSError, BrokenPipeError):
                pass
        self._kill()

    def __enter__(self) -> IsolatedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MeasurerPool(Measurer):
    """Several workers behind one measurer: each call takes a free worker (thread-safe)."""

    def __init__(self, measurers: Sequence[IsolatedMeasurer]):
        self.free: queue.Queue[IsolatedMeasurer] = queue.Queue()
        for measurer in measurers:
            self.free.put(measurer)

    @contextlib.contextmanager
    def _worker(self):
        measurer = self.free.get()
        try:
            yield measurer
        finally:
            self.free.put(measurer)

    def measure(self, plan: Plan, screen: Screen | None = None) -> Measurement:
        with self._worker() as measurer:
            return measurer.measure(plan, screen)

    def accuracy_loss(self, plan: Plan, batches: int, constraint: bool = False, one_unit: bool = False) -> float:
        with self._worker() as measurer:
            return measurer.accuracy_loss(plan, batches, constraint, one_unit)

    def time_paired(self, reference: Plan, plan: Plan, rounds: int, dominated_ms: float | None = None) -> Paired:
        with self._worker() as measurer:
            return measurer.time_paired(reference, plan, rounds, dominated_ms)

    def time_compared(self, fp32: Plan, contenders: Sequence[Plan], seconds: float, apart: bool) -> Rounds:
        with self._worker() as measurer:
            return measurer.time_compared(fp32, contenders, seconds, apart)

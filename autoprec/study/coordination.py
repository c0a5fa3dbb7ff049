"""Many workers, one study: what lets processes on several hosts share an Optuna study safely.

Optuna is the distributed engine: workers share the study through its RDB storage, running trials
beat a heartbeat, and a trial whose worker died is failed and queued again by Optuna's
:class:`~optuna.storages.RetryHeartbeatStaleTrialCallback`. What Optuna leaves to its user, and
this module adds, are three short critical sections, each under a lock every worker honours:

- starting a trial, so the budget is the study's total, not each worker's;
- measuring a plan, so a plan one worker is measuring is not started by another (it waits, then
  reuses the measurement);
- computing the calibration ranges, FP32 reference and sensitivity, once per study; the others
  download them from Optuna's artifact store, checked against the content hashes in the study.

The locks are PostgreSQL advisory locks for a ``postgresql://`` storage (held by a connection, so
a dead worker's are released with it), otherwise ``flock`` files beside the storage (workers on
one host).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import sqlite3
import time
import warnings
import weakref
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from autoprec.analysis.model import file_sha256
from autoprec.core import untrusted
from autoprec.core.errors import StudyError, first_line
from autoprec.core.locks import FileLock, host_lock_folder, private_folder

# A running trial's worker records a heartbeat this often (seconds); one silent for
# GRACE_BEATS beats is taken as dead, failed and queued again (once).
DEFAULT_HEARTBEAT = 10
GRACE_BEATS = 4
# user attr of a trial: {"id": host:pid[:gpuN] of the worker running it, "trial": its number}
# (a re-run inherits its original's user attrs; the number tells whose they are)
WORKER_ATTR = "worker"
# A database server that accepts a connection and never answers is given up after this many seconds.
CONNECT_SECONDS = 10


def redacted(url: str) -> str:
    """A storage URL fit to write or show: its password replaced by ``***`` (SQLAlchemy's own
    rendering)."""
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: hide anything between ':' and '@' after the scheme
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def without_password(text: str, url: str) -> str:
    """``text`` (e.g. a driver's error message) with ``url``'s password, wherever it appears,
    hidden."""
    import sqlalchemy

    try:
        password = sqlalchemy.engine.make_url(url).password
    except Exception:  # noqa: BLE001
        password = None
    if not password:
        return text
    # where it stands as a word of its own: a password "e" is not the e of "connection"
    return re.sub(rf"(?<![^\W_]){re.escape(str(password))}(?![^\W_])", "***", text)


def storage_hint(message: str) -> str:
    """What to do about a storage failure, from its driver's message: a full disk, a server that
    stopped or cannot be reached, or something else about the database."""
    text = message.lower()
    if any(word in text for word in ("malformed", "not a database", "file is encrypted")):
        return ("the database file is damaged (truncated, or not an SQLite database): restore it, "
                "or move it away to start a new study there")
    if "disk i/o error" in text:
        return ("reading or writing the database file failed: free space on its disk (or check the "
                "disk and the file) and run the same command again (finished trials are kept)")
    if any(word in text for word in ("no space", "or disk is full", "file too large", "disk full")):
        return "its disk is full: free space and run the same command again (finished trials are kept)"
    if any(word in text for word in ("connect", "server closed", "terminating connection",
                                     "refused", "timeout",
                                     "shutting down", "could not receive", "the database system "
                                                                           "is")):
        return ("the database server stopped or cannot be reached: start it (or check the URL and "
                "the network) and run the same command again (finished trials are kept)")
    return "check the database and run the same command again (finished trials are kept)"


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` storage URL; None for other storages (and in-memory
    SQLite)."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        from sqlalchemy.engine import make_url

        return Path(make_url(url).database)  # as SQLAlchemy opens it: '%20' is a space
    return None


def check_storage(url: str, existing: bool = False) -> None:
    """Refuse, before anything is made, a SQLite storage whose folder does not exist (SQLAlchemy
    would create the database, and the locks beside it the folder) or, with ``existing``, whose file
    does not."""
    path = sqlite_path(url)
    if path is None:
        return
    if path.exists() and not path.is_file():
        found = untrusted.kind(os.stat(path).st_mode)
        raise StudyError(f"--storage {redacted(url)}: {path} is {found}, not a database file; give "
                         "the path of a file (e.g. sqlite:///results/study.db)")
    if existing and not path.is_file():
        raise StudyError(f"--storage {redacted(url)}: no such database file {path}; give the "
                         "storage a search wrote")
    if not path.parent.is_dir():
        raise StudyError(
            f"--storage {redacted(url)}: folder {path.parent} does not exist; create it or choose "
            "another path"
        )


def worker_id(device: int | None = None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}" + (f":gpu{device}" if device is not None else "")


def storage_for(url: str, heartbeat: int = DEFAULT_HEARTBEAT) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats on: a trial left running by a dead worker is failed
    after ``GRACE_BEATS`` silent beats and queued again once."""
    # SQLite: wait up to 30 s for a write lock (default 5 s), which a loaded machine's heartbeat
    # thread, artifact writes and the trial's own commits can exceed between them.
    server = url.startswith(("postgresql", "mysql"))
    engine_kwargs = ({"pool_pre_ping": True, **server_options(url)} if server else
                     {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {})
    _quiet_heartbeat_notices()
    opened = partial(
        optuna.storages.RDBStorage,
        url,
        engine_kwargs=engine_kwargs,
        heartbeat_interval=heartbeat,
        grace_period=GRACE_BEATS * heartbeat,
        heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
    )
    path = sqlite_path(url)
    for attempt in range(1, SCHEMA_ATTEMPTS):
        try:
            return written_ahead(opened(), path)
        except Exception as exc:  # SQLAlchemy's errors, which Optuna passes on as they are
            if not _schema_race(exc):
                raise
            time.sleep(0.2 * attempt)
    return written_ahead(opened(), path)


SCHEMA_ATTEMPTS = 5
# File systems on which SQLite's write-ahead log must not be used: several hosts cannot share its
# index in memory (sqlite.org/wal.html), and a host's own processes may not either.
NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "lustre", "gpfs", "ceph",
                        "glusterfs", "afs", "beegfs", "fuse")


def written_ahead(storage: optuna.storages.RDBStorage, path: Path | None) -> optuna.storages.RDBStorage:
    """An SQLite ``storage`` (its database at ``path``) on a local disk, switched to SQLite's
    write-ahead log (synchronous=NORMAL): a commit is then a write, not a sync of the disk, and
    Optuna commits every parameter of a trial on its own (63 syncs per trial of yolov8n: 1.9 s of a
    16-trial search on this project's VM). A crashed process loses nothing committed; a power cut
    may lose the last commits, never the database. The log is folded back into the database when
    the last connection closes (here: when the storage goes, or the process ends); a killed
    process leaves it beside the database (study.db-wal), where the next open reads it."""
    if path is None or file_system(path).split(".")[0] in NETWORK_FILE_SYSTEMS:
        return storage
    from sqlalchemy import event

    def log_ahead(connection, _record) -> None:
        try:
            if connection.execute("PRAGMA journal_mode=WAL").fetchone()[0].lower() == "wal":
                connection.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.DatabaseError:
            pass  # not a database (a damaged file, /dev/null): Optuna's own statements say so

    event.listen(storage.engine, "connect", log_ahead)
    storage.engine.dispose()  # the connections Optuna opened to make its tables
    weakref.finalize(storage, storage.engine.dispose)
    _LOGGING_AHEAD.add(storage.engine)
    return storage


_LOGGING_AHEAD: weakref.WeakSet = weakref.WeakSet()  # this process's engines of SQLite studies so switched


@contextlib.contextmanager
def log_folded(url: str) -> Iterator[None]:
    """The body, then this process's connections to the SQLite study at ``url`` closed (its next
    use opens new ones), so that the write-ahead log is folded into the database where no other
    process holds it: a finished search leaves study.db alone, whole, for a user to copy."""
    try:
        yield
    finally:
        path = sqlite_path(url)
        for engine in list(_LOGGING_AHEAD):
            if path is not None and Path(engine.url.database) == path:
                engine.dispose()


def file_system(path: Path) -> str:
    """The type of the file system holding ``path`` (Linux's mount table; "" where unknown)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    where = str(path.resolve().parent)
    found = ("", "")
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (where == point or where.startswith(point.rstrip("/") + "/")) and len(point) > len(found[0]):
            found = (point, fields[2])
    return found[1]


def _schema_race(exc: BaseException) -> bool:
    """Whether opening a new database failed only because another process created its tables at
    the same moment: Optuna's table creation is not atomic across processes, and autoprec's own
    workers take a lock for it that other readers (Optuna's dashboard, a script, a test polling the
    study) do not; a search started while CI's test polled its new study failed with "table ...
    already exists". Opening again finds the tables."""
    said = str(exc).lower()
    return any(words in said for words in ("already exists", "unique constraint failed: alembic",
                                           "duplicate key value"))


def server_options(url: str) -> dict[str, Any]:
    """SQLAlchemy's engine options for a database server: a connection that gets no answer ends
    (libpq's connect_timeout, for PostgreSQL)."""
    postgresql = url.startswith("postgresql")
    return {"connect_args": {"connect_timeout": CONNECT_SECONDS}} if postgresql else {}


def driver_missing(url: str, exc: BaseException) -> StudyError:
    """The one line for a storage whose database driver is not installed."""
    return StudyError(f"--storage {redacted(url)}: its database driver is not installed ({exc}): "
                      "pip install 'autoprec[postgresql]' (psycopg), or the driver your URL names")


def _quiet_heartbeat_notices() -> None:
    """Optuna marks its heartbeat API experimental and expects heartbeats under ``Study.optimize``;
    autoprec drives them from ask/tell on purpose (``run_study``), so Optuna's notices about exactly
    that are not shown: only those messages, only from Optuna's modules, from the moment autoprec
    switches heartbeats on (not at import)."""
    warnings.filterwarnings(
        "ignore",
        message=r".*(heartbeat_interval|fail_stale_trials|RetryHeartbeatStaleTrialCallback|Heartbeat of storage).*",
        module="optuna",
    )


class StudyLocks:
    """Named locks shared by every worker of one study."""

    def __init__(self, storage_url: str | None, study_name: str):
        self.study_name = study_name
        self._engine = None
        self._folder: Path | None = None
        storage_url = storage_url or ""
        self._url = storage_url
        database = sqlite_path(storage_url)
        if storage_url.startswith("postgresql"):
            import sqlalchemy
            from sqlalchemy.pool import NullPool

            try:
                options = server_options(storage_url)
                self._engine = sqlalchemy.create_engine(storage_url, poolclass=NullPool, **options)
            except ImportError as exc:
                raise driver_missing(storage_url, exc) from None
        else:
            self._folder = database.parent / ".autoprec-locks" if database is not None else host_lock_folder()

    @property
    def ever_held(self) -> bool:
        """Whether a lock of this study may have been taken (a reader that finds none need not make
        one)."""
        return self._engine is not None or self._folder.is_dir()

    def _key(self, name: str) -> int:
        digest = hashlib.sha256(f"{self.study_name}\0{name}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    @contextlib.contextmanager
    def hold(self, name: str, wait: bool = True) -> Iterator[bool]:
        """Hold lock ``name`` for the body; without ``wait``, the body is told False at once (and
        holds nothing) when another worker has it."""
        if self._engine is not None:
            import sqlalchemy

            key = self._key(name)
            try:
                connection = self._engine.connect()
            except sqlalchemy.exc.SQLAlchemyError as exc:
                first = without_password(first_line(exc.orig or exc, None, empty=""), self._url)
                raise StudyError(f"--storage {redacted(self._url)}: cannot be reached ({first}); "
                                 "check the server, the URL and the network") from None
            with connection:
                if wait:
                    connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
                elif not connection.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"),
                                            {"k": key}).scalar():
                    yield False
                    return
                try:
                    yield True
                finally:
                    connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            return
        lock = FileLock(private_folder(self._folder) / f"{self._key(name) & 0xFFFFFFFFFFFF:012x}.lock")
        if not lock.take(wait):
            yield False
            return
        try:
            yield True
        finally:
            lock.release()


# Optuna beats only inside Study.optimize; for ask/tell it has no public heartbeat API, so the two
# functions below use its private heartbeat module and Study._storage (pinned by
# tests/test_faults.py, which kills workers mid-trial and checks each plan is re-run once).
def heartbeat_interval(study: optuna.Study) -> int | None:
    from optuna.storages._heartbeat import (
        BaseHeartbeat,  # Optuna's own check (is_heartbeat_enabled) reads the same
    )

    storage = study._storage
    return storage.get_heartbeat_interval() if isinstance(storage, BaseHeartbeat) else None


def fail_dead_trials(study: optuna.Study) -> None:
    """Fail (and queue again, once) the running trials whose worker died.

    Optuna's :func:`~optuna.storages.fail_stale_trials` finds those whose heartbeat stopped; a
    worker on this host whose process is gone is known dead at once, without waiting for its
    heartbeat to go stale; a worker killed between creating a trial and its first beat leaves a
    trial with no heartbeat and no beating worker, failed here once it is older than the grace
    period. Call it holding the study's "queue" lock, so two workers do not both queue the same
    re-run."""
    interval = heartbeat_interval(study)
    if interval is None:
        return
    optuna.storages.fail_stale_trials(study)
    horizon = datetime.now() - timedelta(seconds=GRACE_BEATS * interval)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get(WORKER_ATTR, {})
        beat = worker.get("trial") == trial.number  # a re-run copies its original's
        if (beat and _gone_from_this_host(worker.get("id", ""))) or (
                not beat and trial.datetime_start and trial.datetime_start < horizon):
            # queued again before it is failed: a kill in between leaves a re-run, not a lost plan
            RetryHeartbeatStaleTrialCallback(max_retry=1)(study, trial)
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)


def _gone_from_this_host(worker: str) -> bool:
    """A worker id (host:pid[:gpuN]) of this host whose process no longer exists."""
    host, _, rest = worker.partition(":")
    pid = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's): alive
        return False
    return False


def retried_trial(trial: FrozenTrial) -> int | None:
    """The trial a re-run repeats (the one whose worker died), or None."""
    return RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)


@contextlib.contextmanager
def beating(study: optuna.Study, trial: optuna.Trial, worker: str) -> Iterator[None]:
    """Heartbeats for a running trial (Optuna's own thread); its worker recorded once the first beat
    is in, so that a trial marked as beating always has a heartbeat that can go stale."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    if heartbeat_interval(study) is not None:
        # before the thread's own first beat: see above
        study._storage.record_heartbeat(trial._trial_id)
    with get_heartbeat_thread(trial._trial_id, study._storage):
        trial.set_user_attr(WORKER_ATTR, {"id": worker, "trial": trial.number})
        yield


def give_back(study: optuna.Study, trial: optuna.Trial) -> None:
    """A trial this worker stops unfinished (Ctrl-C, an error): queued again and failed at once, as
    if it had died."""
    frozen = study.get_trials(deepcopy=False)[trial.number]
    if frozen.state == TrialState.RUNNING:
        RetryHeartbeatStaleTrialCallback(max_retry=1)(study, frozen)
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)


def default_artifacts(storage_url: str) -> Path:
    """Beside a SQLite storage, else in this host's autoprec cache: where every worker on this
    host finds them (workers on other hosts need a shared --artifacts directory)."""
    database = sqlite_path(storage_url)
    if database is not None:
        return database.parent / "artifacts"
    from autoprec.zoo import cache_root

    return cache_root() / "artifacts"


class SharedInputs:
    """Files every worker of a study must use alike (calibration ranges, FP32 reference,
    sensitivity): computed by the first worker, shared through Optuna's artifact store, each
    download checked against the sha256 recorded in the study."""

    ATTR = "autoprec:shared_inputs"

    def __init__(self, study: optuna.Study, store_dir: Path):
        self.study = study
        self.store_dir = Path(store_dir)
        try:
            self.store_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StudyError(f"{store_dir}: a file stands where the study's artifact store "
                             "(--artifacts) goes; move it away, or give --artifacts another folder"
                             ) from None
        self.store = optuna.artifacts.FileSystemArtifactStore(str(self.store_dir))

    @contextlib.contextmanager
    def once(self, locks: StudyLocks, name: str, files: list[Path], worker: str,
             while_waiting: Callable[[], None] | None = None) -> Iterator[bool]:
        """Hold ``name`` while this worker fetches ``files`` or, when the study has none yet,
        computes them (the body, told False) and publishes them. A worker that finds another
        computing them calls ``while_waiting`` (its share of that work) before it waits."""
        if while_waiting is not None:
            with locks.hold(f"inputs:{name}", wait=False) as first:
                if first:
                    with self._fetched_or_computed(name, files, worker) as fetched:
                        yield fetched
                    return
            while_waiting()
        with locks.hold(f"inputs:{name}"), self._fetched_or_computed(name, files, worker) as fetched:
            yield fetched

    @contextlib.contextmanager
    def _fetched_or_computed(self, name: str, files: list[Path], worker: str) -> Iterator[bool]:
        fetched = self.fetch(name, files)
        yield fetched
        if not fetched:
            self.publish(name, files, worker)

    def published(self, name: str) -> bool:
        return bool(self.study.user_attrs.get(f"{self.ATTR}:{name}"))

    def file_names(self, name: str) -> set[str]:
        """The names of the files the study shares as ``name``."""
        return {entry["name"] for entry in self.study.user_attrs.get(f"{self.ATTR}:{name}", ())}

    def fetch(self, name: str, files: list[Path]) -> bool:
        """Download the study's shared files into ``files`` (same names). False when the study has
        none yet."""
        shared = self.study.user_attrs.get(f"{self.ATTR}:{name}")
        if not shared:
            return False
        by_name = {entry["name"]: entry for entry in shared}
        missing = [f.name for f in files if f.name not in by_name]
        if missing:
            raise StudyError(
                f"study {self.study.study_name!r} shares inputs computed from other data or "
                f"another model ({', '.join(sorted(by_name))}; this worker needs "
                f"{', '.join(missing)}): start it with the study's model, data and settings, or "
                "use another --study-name"
            )
        for path in files:
            entry = by_name[path.name]
            if path.exists() and file_sha256(path) == entry["sha256"]:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                optuna.artifacts.download_artifact(artifact_store=self.store,
                                                   artifact_id=entry["artifact_id"],
                                                   file_path=str(path.with_suffix(".download")))
            except FileNotFoundError:
                raise StudyError(
                    f"study {self.study.study_name!r}: its shared {path.name} (artifact "
                    f"{entry['artifact_id']}, uploaded by {entry['worker']} to {entry['store']}) "
                    f"is not in {self.store_dir}: give every worker the same --artifacts directory "
                    "(a shared file system across hosts)"
                ) from None
            downloaded = path.with_suffix(".download")
            if file_sha256(downloaded) != entry["sha256"]:
                downloaded.unlink()
                raise StudyError(
                    f"shared {path.name} does not match its recorded sha256: the artifact store "
                    "was altered"
                )
            os.replace(downloaded, path)
        return True

    def publish(self, name: str, files: list[Path], worker: str) -> None:
        entries = []
        for path in files:
            artifact_id = optuna.artifacts.upload_artifact(artifact_store=self.store,
                                                           file_path=str(path),
                                                           study_or_trial=self.study)
            entries.append({"name": path.name, "sha256": file_sha256(path),
                            "artifact_id": artifact_id,
                            "worker": worker, "store": str(self.store_dir)})
        self.study.set_user_attr(f"{self.ATTR}:{name}", entries)


class SharedSteps:
    """The steps of a pass computed once per study, spread over its workers: the sensitivity pass's
    one-unit plans (the worker computing the pass takes each step in order, the workers waiting for
    it take the steps from the end) and the front's re-timing (each worker takes the steps no other
    holds). Each step's result (a value JSON holds) is stored in the study under its lock, so no
    step is measured twice and a resumed pass keeps what was measured."""

    ATTR = "autoprec:step"

    def __init__(self, shared: SharedInputs, locks: StudyLocks, name: str, worker: str):
        self.shared, self.locks, self.name, self.worker = shared, locks, name, worker

    def _attr(self, step: str) -> str:
        return f"{self.ATTR}:{self.name}:{step}"

    def _stored(self, step: str) -> dict[str, Any] | None:
        return self.shared.study.user_attrs.get(self._attr(step))

    def _measure(self, step: str, compute: Callable[[], Any]) -> dict[str, Any]:
        try:
            found = {"value": compute(), "worker": self.worker}
        except StepFailure as failure:
            found = {"error": failure.text, "worker": self.worker}
        self.shared.study.set_user_attr(self._attr(step), found)
        return found

    def result(self, step: str, compute: Callable[[], Any]) -> Any:
        """The step's value: stored by any worker, else computed here (waiting while another
        computes it). Raises :class:`StepFailure` when it failed, wherever it was computed."""
        with self.locks.hold(f"step:{self._attr(step)}"):
            found = self._stored(step) or self._measure(step, compute)
        if "error" in found:
            raise StepFailure(found["error"])
        return found["value"]

    def help(self, steps: Sequence[tuple[str, Callable[[], Any]]]) -> int:
        """While the pass is not published: compute, from the last, each step no worker stored or
        holds. Returns how many this worker computed."""
        computed = 0
        for step, compute in reversed(steps):
            if self.shared.published(self.name):
                break
            if self._stored(step) is not None:
                continue
            with self.locks.hold(f"step:{self._attr(step)}", wait=False) as mine:
                if mine and self._stored(step) is None:
                    self._measure(step, compute)
                    computed += 1
        return computed

    def spread(self, steps: Sequence[tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
        """Every step's result (a :class:`StepFailure` for one that failed): first each step no
        worker stored or holds, computed here in order; then the others, as the workers holding them
        store them (computed here where one stopped without)."""
        for step, compute in steps:
            if self._stored(step) is None:
                with self.locks.hold(f"step:{self._attr(step)}", wait=False) as mine:
                    if mine and self._stored(step) is None:
                        self._measure(step, compute)
        return {step: each_result(partial(self.result, step, compute)) for step, compute in steps}

    def workers_of(self, steps: Sequence[str]) -> set[str]:
        """The workers that stored ``steps``."""
        stored = self.shared.study.user_attrs
        return {stored[attr]["worker"] for step in steps if (attr := self._attr(step)) in stored}

    def computed_elsewhere(self, steps: Sequence[str]) -> int:
        """How many of ``steps`` another worker stored."""
        stored = self.shared.study.user_attrs
        return sum(stored.get(self._attr(step), {}).get("worker", self.worker) != self.worker for step in steps)


class StepFailure(Exception):
    """A step that failed (on this worker or another): its one-line reason travels in the study."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def each_result(compute: Callable[[], Any]) -> Any:
    """``compute()``, or the :class:`StepFailure` it raised."""
    try:
        return compute()
    except StepFailure as failure:
        return failure

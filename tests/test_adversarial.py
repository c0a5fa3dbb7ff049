"""The command line against hostile input: nothing unsafe happens, and every failure is one line.

Each probe runs ``autoprec`` as a user would (a subprocess, its own working directory and TMPDIR)
and checks the exit status, that stderr is one ``autoprec: error:`` line without a traceback,
and that nothing was written where it must not be.
"""

import os
import subprocess
import sys
from pathlib import Path

import builders
import pytest


def autoprec(*args, cwd: Path, tmp: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    tmp = tmp or cwd.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "AUTOPREC_CACHE": str(cwd.parent / "cache")}
    return subprocess.run([sys.executable, "-m", "autoprec.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, *phrases: str) -> str:
    """The failure's last stderr line: ``autoprec: error: ...`` holding ``phrases``; exit 2; no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("autoprec: error: "), proc.stderr[-3000:]
    for phrase in phrases:
        assert phrase in last, last
    return last


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def workdir(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    builders.save(builders.conv_net(), folder / "conv.onnx")
    return folder


# --- unsafe: where files are created ---

def test_a_planted_symlink_where_a_lock_goes_is_refused_and_followed_nowhere(workdir, tmp_path):
    locks = tmp_path / f"autoprec-locks-{os.geteuid()}"
    locks.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    (locks / "ort-cpu-device0.lock").symlink_to(victim)  # dangling: following it would create the victim
    proc = autoprec("search", "conv.onnx", "--budget", 1, "--no-progress", cwd=workdir, tmp=tmp_path)
    one_line_error(proc, "ort-cpu-device0.lock is a symbolic link")
    assert not victim.exists()


def test_a_lock_folder_that_is_a_link_is_refused(workdir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"autoprec-locks-{os.geteuid()}").symlink_to(elsewhere)
    proc = autoprec("search", "conv.onnx", "--budget", 1, "--no-progress", cwd=workdir, tmp=tmp_path)
    one_line_error(proc, "is not a directory of this user's own")
    assert not any(elsewhere.iterdir())


def test_an_empty_out_is_refused(workdir):
    before = files(workdir)
    one_line_error(autoprec("search", "conv.onnx", "--out", "", "--budget", 1, cwd=workdir), "--out '': empty")
    assert files(workdir) == before


def test_a_model_named_dot_dot_writes_into_autoprec_out_not_above_it(workdir):
    os.rename(workdir / "conv.onnx", workdir / "...onnx")
    proc = autoprec("search", "...onnx", "--budget", 1, "--no-progress", "--no-warm-start", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert (workdir / "autoprec_out" / "model" / "pareto.json").is_file()
    assert {p.name for p in workdir.iterdir()} == {"...onnx", "autoprec_out"}


def test_status_of_a_missing_sqlite_database_creates_nothing(workdir):
    before = files(workdir)
    one_line_error(autoprec("status", "--storage", "sqlite:///missing.db", "--study-name", "s", cwd=workdir),
                   "no such database file missing.db")
    assert files(workdir) == before


def test_a_storage_in_a_missing_folder_is_refused_not_created(workdir, tmp_path):
    url = f"sqlite:///{tmp_path / 'nonexistent' / 'dir' / 'x.db'}"
    one_line_error(autoprec("search", "conv.onnx", "--storage", url, "--budget", 1, cwd=workdir), "does not exist")
    assert not (tmp_path / "nonexistent").exists()

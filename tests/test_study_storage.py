"""The study's storage, where a search keeps its trials: a missing, unreachable, damaged or full one is one line,
nothing created where it was not asked for and nothing of the study lost; the same command afterwards resumes it."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from cli import autoprec, clean, files, one_line_error, run
from searching import SHORTEST_FINAL_TIMING


def test_status_of_a_missing_sqlite_database_creates_nothing(workdir):
    before = files(workdir)
    one_line_error(autoprec("status", "--storage", "sqlite:///missing.db", "--study-name", "s", cwd=workdir),
                   "no such database file missing.db")
    assert files(workdir) == before


def test_a_storage_in_a_missing_folder_is_refused_not_created(workdir, tmp_path):
    url = f"sqlite:///{tmp_path / 'nonexistent' / 'dir' / 'x.db'}"
    one_line_error(autoprec("search", "conv.onnx", "--storage", url, "--budget", 1, cwd=workdir), "does not exist")
    assert not (tmp_path / "nonexistent").exists()


def test_unreachable_storages_and_stores_are_one_line(workdir, tmp_path, capsys):
    pytest.importorskip("psycopg")
    for extra in (["--storage", "postgresql://user:pw@127.0.0.1:1/nodb"], ["--artifacts", workdir / "conv.onnx"]):
        code, err = run(
            ["search", workdir / "conv.onnx", "--budget", 1, "--no-progress", "--out", tmp_path / "o", *extra], capsys
        )
        clean(code, err, allowed=(2,))
        assert ":pw@" not in err


def test_a_damaged_study_value_is_one_line_and_the_study_is_kept(conv_result, tmp_path, capsys):
    import sqlite3

    out = tmp_path / "r"
    shutil.copytree(conv_result, out)
    with sqlite3.connect(out / "study.db") as db:  # a value Optuna stored, damaged on disk
        db.execute("UPDATE trial_user_attributes SET value_json = '\"garbage\"' WHERE key = 'measurement'")
    facts = json.loads((out / "pareto.json").read_text())
    before = sorted((out / "best").iterdir())
    code, err = run(
        [
            "search",
            facts["model"]["path"],
            "--data",
            facts["search"]["data_path"],
            "--max-loss",
            facts["search"]["max_loss"],
            "--budget",
            5,
            "--out",
            out,
            "--no-progress",
        ],
        capsys,
    )
    clean(code, err, allowed=(2,))
    assert "stored plan or measurement is damaged" in err.strip().splitlines()[-1]
    assert sorted((out / "best").iterdir()) == before and (out / "pareto.json").is_file()  # nothing lost


def test_disk_full_mid_search_is_one_line_and_the_search_resumes(workdir, tmp_path):
    """A file-size limit stands in for a full disk: once the study's database has grown a page (4 KiB) past it,
    its writes fail (EFBIG, as ENOSPC would), a trial or two into the run. The same command afterwards, with room
    again, finishes the budget (6: each trial here costs the suite seconds of a subprocess)."""
    import resource
    import signal

    out = workdir / "out"
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def search(budget, limit=None):
        def limited():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        cmd = [
            sys.executable,
            "-m",
            "autoprec.app.cli",
            "search",
            "conv.onnx",
            "--budget",
            str(budget),
            "--no-progress",
            "--no-warm-start",
            *SHORTEST_FINAL_TIMING,
            "--out",
            str(out),
        ]
        return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
                              preexec_fn=limited if limit else None)

    assert search(2).returncode == 0
    full = search(6, limit=(out / "study.db").stat().st_size + 4096)
    one_line_error(full, "free space")
    resumed = search(6)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "pareto.json").read_text())["search"]["trials"] == 6


@pytest.mark.parametrize("message, said", [
    ("connection failed: connection to server at \"127.0.0.1\", port 5432 failed: Connection refused", "stopped"),
    ("consuming input failed: server closed the connection unexpectedly", "stopped"),
    ("database or disk is full", "disk is full"),
])
def test_a_storage_failure_says_what_fits_its_cause(message, said):
    from autoprec.study.coordination import storage_hint

    assert said in storage_hint(message) and (said == "disk is full") == ("disk" in storage_hint(message))


def test_a_resume_past_its_budget_says_so(workdir, capsys):
    out = workdir / "o"
    for budget in (3, 2):
        code, err = run(["search", workdir / "conv.onnx", "--budget", budget, "--out", out, "--no-warm-start"], capsys)
        clean(code, err, allowed=(0,))
    said = " ".join(err.split())
    assert "3 trials done, the budget of 2 reached: no new trial runs" in said and "3 of 2" not in said


def test_a_run_stopped_after_its_sensitivity_pass_is_one_of_the_studys_runs(workdir, capsys, monkeypatch):
    """A run interrupted in its trials, then the same command again: the builds of both runs are the study's (its
    pass's profiles among them), not the one run that wrote a result."""
    import autoprec.app.search as search

    out, given = workdir / "o", search.run_warm_started

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "run_warm_started", interrupted)
    code, err = run(["search", workdir / "conv.onnx", "--budget", 3, "--out", out, "--no-isolation"], capsys)
    assert code == 130, err[-2000:]
    monkeypatch.setattr(search, "run_warm_started", given)
    code, err = run(["search", workdir / "conv.onnx", "--budget", 3, "--out", out, "--no-isolation"], capsys)
    clean(code, err, allowed=(0,))
    facts = json.loads((out / "pareto.json").read_text())["search"]
    assert "its 2 run(s)" in facts["engine_builds_scope"] and facts["engine_builds_by_phase"]["profiles"] > 0


def test_processes_opening_one_new_sqlite_study_at_the_same_moment_all_open_it(tmp_path):
    """Optuna creates a new database's tables without a lock across processes: of two first openers
    one failed with "table ... already exists" (a search started while CI's test polled its study).
    Six processes open one new file at one instant (each waits until all have imported Optuna);
    every one opens it."""
    openers = 6
    opener = (
        "import os, sys, time\n"
        "from autoprec.study.coordination import storage_for\n"
        "ready = sys.argv[2]\n"
        "open(os.path.join(ready, str(os.getpid())), 'w').close()\n"
        f"while len(os.listdir(ready)) < {openers}:\n"
        "    time.sleep(0.001)\n"
        "storage_for('sqlite:///' + sys.argv[1])\n"
    )
    (tmp_path / "ready").mkdir()
    started = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", opener, str(tmp_path / "study.db"),
                                 str(tmp_path / "ready")], stderr=subprocess.PIPE, text=True)
               for _ in range(openers)]
    failures = [err[-500:] for err in (p.communicate(timeout=120)[1] for p in started) if err]
    assert not failures and all(p.returncode == 0 for p in started), failures


def test_a_finished_search_leaves_its_study_in_one_file(conv_result):
    """The study commits through SQLite's write-ahead log (a write per commit, not a sync of the disk: Optuna commits
    each parameter of a trial on its own); a search that ends folds the log back, leaving study.db whole."""
    import sqlite3

    assert not [p.name for p in conv_result.iterdir() if p.name.startswith("study.db-")]
    with sqlite3.connect(conv_result / "study.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM trials").fetchone()[0] >= 4


def test_a_killed_process_loses_no_committed_trial(tmp_path):
    """A process killed with its write-ahead log unfolded: the log stays beside the database, and the next open
    reads every trial it committed."""
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    killed = (
        "import os, sys, optuna\n"
        "from autoprec.study.coordination import storage_for\n"
        "study = optuna.create_study(storage=storage_for(sys.argv[1]), study_name='s')\n"
        "for value in range(3):\n"
        "    trial = study.ask()\n"
        "    study.tell(trial, trial.suggest_float('x', 0, 1) + value)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-W", "ignore", "-c", killed, url], check=True, timeout=120)
    assert (tmp_path / "study.db-wal").stat().st_size > 0
    assert len(optuna.load_study(study_name="s", storage=url).get_trials()) == 3


def test_a_study_on_a_network_file_system_keeps_the_rollback_journal(tmp_path, monkeypatch):
    """SQLite's write-ahead log needs an index every process shares in memory, which a network file system
    (NFS, SMB, FUSE mounts) cannot give several hosts: a study there keeps its rollback journal."""
    import sqlite3

    import optuna

    from autoprec.study import coordination

    for found, journal in (("nfs4", "delete"), ("fuse.sshfs", "delete"), ("ext4", "wal")):
        monkeypatch.setattr(coordination, "file_system", lambda path, found=found: found)
        path = tmp_path / f"{found}.db"
        optuna.create_study(storage=coordination.storage_for(f"sqlite:///{path}"), study_name="s").ask()
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == journal, found

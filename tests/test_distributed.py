"""Many workers, one study, on a real PostgreSQL server (Debian's package, started on loopback).

Skipped where no PostgreSQL server binaries are installed, unless AUTOPREC_REQUIRE_POSTGRES is set
(CI sets it: there a missing server is a failure, not a skip).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import builders
import numpy as np
import optuna
import postgres
import pytest
from searching import SHORTEST_FINAL_TIMING

from autoprec.study.coordination import WORKER_ATTR, StudyLocks, retried_trial
from autoprec.study.reading import counted
from autoprec.study.retiming import pareto_front


@pytest.fixture(scope="module")
def postgres_url():
    binaries = postgres.server_binaries()
    if binaries is None:
        if os.environ.get("AUTOPREC_REQUIRE_POSTGRES"):
            pytest.fail(
                "AUTOPREC_REQUIRE_POSTGRES is set but no PostgreSQL server is installed (apt-get install postgresql)"
            )
        pytest.skip("no PostgreSQL server installed (apt-get install postgresql)")
    pytest.importorskip("psycopg")
    with postgres.local_server(binaries) as url:
        yield url


# A metric that takes its time: each trial lasts long enough for the test to catch one running and kill it.
SLOW_METRIC = """
import time
import numpy as np

def loss(reference, candidate):
    time.sleep(0.3)
    return float(np.mean([np.abs(r[k] - c[k]).mean() for r, c in zip(reference, candidate) for k in r]))
"""


def _worker(url, model, data, out, budget=15):
    (Path(out).parent / "slow_metric.py").write_text(SLOW_METRIC)
    cmd = [sys.executable, "-m", "autoprec.app.cli", "search", str(model), "--data", str(data), "--out", str(out),
           "--storage", url, "--study-name", "shared", "--budget", str(budget), "--heartbeat", "1", "--no-progress",
           "--metric", "slow_metric:loss", *SHORTEST_FINAL_TIMING]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=Path(out).parent)


def test_three_workers_share_one_study_and_a_killed_ones_trial_is_rerun(tmp_path, postgres_url):
    model, data = builders.conv_with_data(tmp_path, 8)
    workers = [_worker(postgres_url, model, data, tmp_path / f"out{i}") for i in range(3)]
    victim = f"{socket.gethostname()}:{workers[0].pid}"
    killed_trial = None
    deadline = time.monotonic() + 240
    while killed_trial is None and time.monotonic() < deadline and workers[0].poll() is None:
        try:
            with StudyLocks(postgres_url, "shared").hold("identity"):  # as workers open it: not mid-schema-creation
                study = optuna.load_study(study_name="shared", storage=postgres_url)
            running = [t for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                       if t.user_attrs.get(WORKER_ATTR, {}).get("id") == victim]
        except KeyError:  # the study is not created yet
            running = []
        if running:
            os.killpg(workers[0].pid, signal.SIGSTOP)  # frozen: it cannot finish the trial while we look
            if study.get_trials()[running[0].number].state == optuna.trial.TrialState.RUNNING:
                os.killpg(workers[0].pid, signal.SIGKILL)  # mid-trial: it and its measuring child die at once
                killed_trial = running[0].number
            else:
                os.killpg(workers[0].pid, signal.SIGCONT)
        time.sleep(0.02)
    if killed_trial is None:
        ended = workers[0].poll() is not None
        pytest.fail("the first worker never ran a trial while it was watched"
                    + (f"; it exited {workers[0].returncode}: {workers[0].communicate()[1][-3000:]}" if ended else ""))
    logs = [w.communicate(timeout=300) for w in workers[1:]]
    assert all(w.returncode == 0 for w in workers[1:]), [err[-2000:] for _, err in logs]

    study = optuna.load_study(study_name="shared", storage=postgres_url)
    trials = study.get_trials()
    assert sum(counted(t) for t in trials) == 15  # the budget is the study's, not each worker's
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    measured = [t.user_attrs["plan_key"] for t in trials
                if t.state == optuna.trial.TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    assert len(measured) == len(set(measured))  # no plan measured twice, across all workers
    assert trials[killed_trial].state == optuna.trial.TrialState.FAIL
    rerun = [t for t in trials if retried_trial(t) == killed_trial]
    assert len(rerun) == 1 and rerun[0].params == trials[killed_trial].params and counted(rerun[0])
    assert {t.user_attrs[WORKER_ATTR]["id"] for t in trials if WORKER_ATTR in t.user_attrs} >= {victim}

    stored_front = {r.number for r in pareto_front(study)}
    for i in (
        1,
        2,
    ):  # what each surviving worker wrote is the storage's front, less what its re-timing showed dominated
        written = json.loads((tmp_path / f"out{i}" / "pareto.json").read_text())
        assert {t["trial"] for t in written["front"]} <= stored_front and written["front"]
        assert written["search"]["trials"] == sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    shared = study.user_attrs["autoprec:shared_inputs:reference"]
    computed_by = {entry["worker"] for entry in shared}
    assert len(computed_by) == 1  # calibration and reference computed once ...
    fetched = ["from its artifact store" in " ".join(err.split()) for _, err in logs]
    assert sum(fetched) >= 1  # ... and the others downloaded them
    steps = [v for k, v in study.user_attrs.items() if k.startswith("autoprec:step:sensitivity:")]
    assert len({step["worker"] for step in steps}) >= 2  # the sensitivity pass spread over the workers waiting for it
    written = [json.loads((tmp_path / f"out{i}" / "pareto.json").read_text()) for i in (1, 2)]
    steps = [k for k in study.user_attrs if k.startswith("autoprec:step:retiming:")]
    retiming = written[0]["search"]["retiming"]  # the plans re-timed beside all-FP32 (and all-FP32), those that failed
    assert len(steps) == max(0, len(retiming["retimed"]) - 1) + len(retiming["failed"])  # each plan once, by one ...
    assert [t["trial"] for t in written[0]["front"]] == [t["trial"] for t in written[1]["front"]]  # ... read by both
    asked = [t.user_attrs["asked"] for t in trials if counted(t)]  # what each trial waited for the queue, and held it
    assert len(asked) == 15 and all(a["queue_wait_s"] >= 0 and a["queue_held_s"] > 0 for a in asked)

    status = subprocess.run([sys.executable, "-m", "autoprec.app.cli", "status", "--storage", postgres_url,
                             "--study-name", "shared", "--json"], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)
    assert reported["counted"] == 15 and reported["workers"][victim]["died"] == 1
    assert {t["trial"] for t in reported["front"]} == stored_front

    other = tmp_path / "other.npz"  # a worker with other data refuses to join
    np.savez(other, x=builders.image_like(8) + 1.0)
    stranger = _worker(postgres_url, model, other, tmp_path / "out3")
    _, err = stranger.communicate(timeout=120)
    assert stranger.returncode == 2 and "made for a different search" in " ".join(err.split())


def test_a_password_in_the_storage_url_is_never_written_nor_shown(tmp_path, postgres_url):
    secret = "S3cret-pw"
    url = postgres_url.replace(
        "autoprec@", f"autoprec:{secret}@"
    )  # the test server trusts loopback: any password works
    model = builders.save(builders.conv_net(), tmp_path / "conv.onnx")
    out = tmp_path / "out"
    search = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoprec.app.cli",
            "search",
            str(model),
            "--out",
            str(out),
            "--storage",
            url,
            "--study-name",
            "pw",
            "--budget",
            "2",
            "--no-progress",
            "--no-warm-start",
            *SHORTEST_FINAL_TIMING,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert search.returncode == 0, search.stderr
    shown = [search.stdout, search.stderr]
    for verb in (["report", str(out)], ["show", str(out), "--json"], ["status", "--storage", url, "--study-name", "pw"],
                 ["status", "--storage", url, "--study-name", "nope"]):
        proc = subprocess.run(
            [sys.executable, "-m", "autoprec.app.cli", *verb], capture_output=True, text=True, timeout=120
        )
        shown += [proc.stdout, proc.stderr]
    assert proc.returncode == 2 and "no study 'nope'" in proc.stderr and "autoprec:***@" in proc.stderr
    written = [p.read_text(errors="replace") for p in out.rglob("*") if p.suffix in (".json", ".html", ".txt", ".log")]
    assert len(written) >= 4 and json.loads((out / "pareto.json").read_text())["search"]["storage"].count("***") == 1
    assert not [text for text in shown + written if secret in text]

"""Candidates that crash, hang, run out of memory or raise: each fails its trial, the study goes on."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import builders
import numpy as np
import onnx
import optuna
import pytest
import searching
from searching import SHORTEST_FINAL_TIMING

import autoprec
from autoprec.study.coordination import retried_trial

MISBEHAVING = '''
import os, signal, time
import numpy as np

def _exact(reference, candidate):
    return all(np.array_equal(r[k], c[k]) for r, c in zip(reference, candidate) for k in r)

def segfault(reference, candidate):
    if not _exact(reference, candidate):
        os.kill(os.getpid(), signal.SIGSEGV)
    return 0.0

def hang(reference, candidate):
    # stopped, as a worker deadlocked in native code is: no Python stack to say (a metric that
    # sleeps in its own code is the metric's fault, and stops the search: test_untrusted_results.py)
    if not _exact(reference, candidate):
        os.kill(os.getpid(), signal.SIGSTOP)
    return 0.0

def segfault_once(reference, candidate):
    # the first call ends its worker; the next says whether its worker probes session builds
    if not os.path.exists("crashed"):
        open("crashed", "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)
    from autoprec.analysis import session_probe
    with open("probing", "w") as f:
        f.write(str(session_probe._probing[0]))
    return 0.0

def hog(reference, candidate):
    hoard = []
    while not _exact(reference, candidate):
        hoard.append(np.ones(2**25))  # 256 MiB more each step, until the parent kills the worker
        time.sleep(0.02)
    return 0.0

'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "misbehaving.py").write_text(MISBEHAVING)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _errors(out):
    study = optuna.load_study(study_name=optuna.get_all_study_names(f"sqlite:///{out / 'study.db'}")[0],
                              storage=f"sqlite:///{out / 'study.db'}")
    return study, {t.number: t.user_attrs.get("error") for t in study.trials if t.state.name == "FAIL"}


@pytest.mark.parametrize(
    "function, options, cause",
    [
        ("segfault", {}, "worker killed by signal SIGSEGV; worker stderr: Fatal Python error: Segmentation fault"),
        # no sensitivity pass: each of its one-unit plans would hang to the limit too (12 s of the suite)
        (
            "hang",
            {"trial_timeout": 2, "warm_start": False},
            "time limit exceeded: measuring the candidate took over 2 s",
        ),
        ("hog", {"trial_memory_gb": 0.75}, "memory limit exceeded: worker RSS [0-9.]+ GiB > 0.75 GiB"),
    ],
)
def test_a_crashing_candidate_fails_its_trial_and_the_study_goes_on(plugin, mlp_model, function, options, cause,
                                                                   monkeypatch):
    # a device lock of this test's own: the limit counts waits for the device, which another test's
    # timing on this machine would otherwise hold past the hang case's 2 s
    monkeypatch.setattr(tempfile, "tempdir", str(plugin))
    out = plugin / "out"
    config = autoprec.SearchConfig(
        autoprec.InputSpec(mlp_model),
        judge=autoprec.JudgeSpec(f"misbehaving:{function}"),
        study=autoprec.StudySpec(budget=3, warm_start=options.pop("warm_start", True)),
        isolation=autoprec.IsolationSpec(**options),
        out=out,
    )
    result = searching.search(config)
    # The seeded all-fp32 plan is exact and completes; all-fp16 and all-int8 crash twice each.
    assert [t.plan.counts()["fp32"] for t in result.trials] == [3]
    assert result.chosen is not None and result.chosen.number == 0
    study, errors = _errors(out)
    assert sorted(errors) == [1, 2]
    for error in errors.values():
        assert error.startswith("TrialCrash: crashed twice, not retried again")
        assert len(__import__("re").findall(cause, error)) == 2, error
    assert json.loads((out / "pareto.json").read_text())["search"]["trials"] == 1


def test_a_worker_that_died_of_a_signal_is_started_again_probing_and_asked_again(plugin, mlp_model, caplog):
    """A measuring worker builds each session at once (in the search's process a build is first
    tried in a child: ONNX Runtime's layout transformer ended the process on a ViT's FP16 model);
    where it dies of a signal, the question is asked again of a worker that probes, once, and
    nothing fails."""
    out = plugin / "out"
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(mlp_model),
        judge=autoprec.JudgeSpec("misbehaving:segfault_once"),
        study=autoprec.StudySpec(budget=3),
        out=out,
    ))
    assert len(result.trials) == 3 and _errors(out)[1] == {}
    assert (plugin / "probing").read_text() == "True"
    said = [r.getMessage() for r in caplog.records if "asked again" in r.getMessage()]
    assert len(said) == 1 and "worker killed by signal SIGSEGV" in said[0], said


def test_an_error_a_candidate_raises_is_not_retried_and_a_failed_plan_is_not_measured_again(tmp_path, mlp_model,
                                                                                            monkeypatch):
    """An engine error on some plans (in this process: a worker's comes back the same way, as one failed trial). A
    user's metric that raises is no such error: it stops the search (tests/test_accuracy.py)."""
    from autoprec.core.errors import BackendError
    from autoprec.measure.measurement import InProcessMeasurer

    measure, attempts = InProcessMeasurer.measure, []

    def broken_off_fp32(self, plan, screen=None):
        if plan.counts()["fp16"]:
            attempts.append(plan.key())
            raise BackendError("the engine cannot build this candidate")
        return measure(self, plan, screen)

    monkeypatch.setattr(InProcessMeasurer, "measure", broken_off_fp32)
    out = tmp_path / "out"
    # fc0 and fc1 in fp16 or fp32, head fixed: 4 distinct plans, 9 trials.
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model),
            space=autoprec.SpaceSpec(overrides=["*=fp16,fp32", "head=fp32"]),
            study=autoprec.StudySpec(budget=9),
            isolation=autoprec.IsolationSpec(isolate=False),
            out=out,
        )
    )
    study, errors = _errors(out)
    measured = [e for e in errors.values() if "cannot build this candidate" in e]
    assert measured and len(attempts) == len(set(attempts)) == len(measured) <= 3  # each failing plan tried once
    assert all("failed in trial" in e for e in errors.values() if e not in measured)
    assert not any("crashed" in e for e in errors.values())


def test_no_isolation_measures_in_process(tmp_path, mlp_model):
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model),
            study=autoprec.StudySpec(budget=3),
            isolation=autoprec.IsolationSpec(isolate=False),
            out=tmp_path / "out",
        )
    )
    assert len(result.trials) == 3


def _valid_results(out):
    """Every result file present is complete: JSON parses, ONNX loads, no temporary file is visible as real."""
    for path in list(out.glob("*.json")) + list(out.glob("best/*.json")):
        json.loads(path.read_text())
    for path in out.glob("best/*.onnx"):
        onnx.checker.check_model(onnx.load(str(path)))


def test_kill_9_at_any_moment_then_the_same_command_finishes(tmp_path):
    model, data = builders.conv_with_data(tmp_path, 8)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "autoprec.app.cli", "search", str(model), "--data", str(data), "--out", str(out),
           "--budget", "6", "--no-progress", "--heartbeat", "1", *SHORTEST_FINAL_TIMING]
    kills, ended = 0, ""
    # Kill during start-up, calibration, trials and result writing, a little later each time.
    for delay in (0.4, 1.0, 1.8, 2.6, 3.4, 4.2, 5.2, 6.4):
        with open(tmp_path / "stderr.log", "w+") as stderr:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
            try:
                proc.wait(timeout=delay)
                stderr.seek(0)
                ended = f"run {kills + 1} ended by itself (exit {proc.returncode}): {stderr.read()[-1500:]}"
                break  # it finished before the kill
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
        _valid_results(out)
    assert kills >= 3, ended
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    _valid_results(out)
    study = optuna.load_study(study_name="autoprec-conv-ort-cpu", storage=f"sqlite:///{out / 'study.db'}")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 6
    retried = [retried_trial(t) for t in study.trials]
    for failed in (t for t in study.trials if t.state.name == "FAIL"):  # interrupted, then re-run once
        assert "error" not in failed.user_attrs
        if retried_trial(failed) is not None:
            continue  # a re-run interrupted again is given up, by design
        if failed.params or failed.system_attrs.get("fixed_params"):
            assert retried.count(failed.number) == 1, failed.number
    assert not list(out.rglob(".*.tmp"))
    pareto = json.loads((out / "pareto.json").read_text())
    assert pareto["search"]["trials"] == 6
    time.sleep(0.1)


def test_a_script_without_a_main_guard_is_told_so_not_left_hanging(tmp_path):
    """Python starts a worker by running the user's script again, where autoprec.search cannot start another:
    the worker died before it read its data, and the search waited for ever to write it (data over a pipe's
    64 KB)."""
    model = builders.save(builders.conv_net(), tmp_path / "conv.onnx")
    np.savez(tmp_path / "data.npz", x=builders.image_like(8))
    (tmp_path / "script.py").write_text(
        "import autoprec\n"
        f"autoprec.search(autoprec.SearchConfig(autoprec.InputSpec({str(model)!r}, data='data.npz'), "
        "study=autoprec.StudySpec(budget=1), out='out'))\n"
    )
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith(
        "a script that calls autoprec.search must call it under 'if __name__ == \"__main__\":'"), done.stderr[-2000:]


def test_a_worker_that_cannot_start_raises_its_own_error_not_a_cleanup_one(tmp_path, monkeypatch):
    """multiprocessing refuses to start a worker from a script without a __main__ guard; that error is
    what the user sees, not one from cleaning up a process that never started."""
    from autoprec.measure.isolation import IsolatedMeasurer, Limits, worker_context

    def unstartable(process):
        raise RuntimeError("An attempt has been made to start a new process before the current process has finished")

    monkeypatch.setattr(worker_context().Process, "start", unstartable)
    measurer = IsolatedMeasurer("ort-cpu", [], None, Limits(60), tmp_path / "stderr.log")
    with pytest.raises(RuntimeError, match="finished"):
        with measurer:
            measurer.start()


def test_a_worker_alive_but_not_reading_its_data_is_a_start_past_its_time_limit_not_a_hang(tmp_path, monkeypatch):
    """The data a worker is sent (the evaluation batches) is more than a pipe holds: a worker stuck before it reads
    (its interpreter starting, say) blocked the search's send for ever, the start's time limit never reached."""
    import multiprocessing
    import threading
    from types import SimpleNamespace

    from autoprec.measure import isolation

    monkeypatch.setattr(isolation, "STARTUP_SECONDS", 2.0)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    stuck = context.Process(target=time.sleep, args=(600,), daemon=True)  # alive, never reads
    stuck.start()  # (its end of the pipe stays open here, unread, as a stuck worker's would)
    batches = [{"x": np.zeros((4, 1 << 20), np.float32)}]  # 16 MiB
    judge = SimpleNamespace(metric=SimpleNamespace(user_function=None))
    measurer = isolation.IsolatedMeasurer("ort-cpu", batches, judge, isolation.Limits(60), tmp_path / "stderr.log")
    (tmp_path / "stderr.log").write_text("")
    raised = []

    def start():
        try:
            measurer.start(isolation.Spawned(stuck, parent))
        except Exception as exc:  # noqa: BLE001 - what it raised is the test's to check
            raised.append(exc)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    starting.join(60)
    try:
        assert not starting.is_alive(), "the start hung in its send"
        assert len(raised) == 1 and isinstance(raised[0], isolation.TrialCrash), raised
    finally:
        stuck.kill()
        child.close()


def test_data_a_worker_cannot_be_sent_is_the_starts_own_error_at_once(tmp_path):
    """What cannot be pickled for the worker (a judge made of a lambda, through the Python API) fails the start
    there and then, as the send's own error: not a worker waiting out the start's time limit for data never sent."""
    from autoprec.measure import isolation

    measurer = isolation.IsolatedMeasurer("ort-cpu", [], lambda: 0, isolation.Limits(60), tmp_path / "stderr.log")
    started = time.monotonic()
    with pytest.raises(Exception, match="pickle"):
        with measurer:
            measurer.start()
    assert time.monotonic() - started < isolation.STARTUP_SECONDS / 4


def test_a_search_stopped_before_its_workers_get_their_data_leaves_no_worker_behind(tmp_path, monkeypatch):
    """The worker processes start while the search calibrates; a search that stops there (a calibration that
    fails) ends them with it, its error the one the user sees."""
    import multiprocessing

    import autoprec.app.search

    model, data = builders.conv_with_data(tmp_path, items=4)
    earlier = set(multiprocessing.active_children())  # (another test's, in this process)

    def calibration_fails(*args, **kwargs):
        assert set(multiprocessing.active_children()) - earlier, "no worker was started before the calibration"
        raise autoprec.AutoprecError("the calibration failed")

    monkeypatch.setattr(autoprec.app.search, "shared_inputs", calibration_fails)
    with pytest.raises(autoprec.AutoprecError, match="the calibration failed"):
        autoprec.search(autoprec.SearchConfig(autoprec.InputSpec(model, data=data), out=tmp_path / "out",
                                              study=autoprec.StudySpec(budget=2)))
    assert not set(multiprocessing.active_children()) - earlier

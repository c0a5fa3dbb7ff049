"""Candidates measured side by side: builds overlap, the device runs one candidate at a time."""

import json
import logging
import multiprocessing
import os
import re
import threading
import time

import numpy as np
import optuna
import pytest
import searching

import autoprec
from autoprec.backends.base import Backend, Runner
from autoprec.core.locks import DeviceTurns, FileLock
from autoprec.core.timing import Timing
from autoprec.measure.accuracy import Judge, Metric
from autoprec.measure.measurement import measure
from autoprec.record.trial import EngineInfo
from autoprec.study.coordination import SharedInputs, SharedSteps, StepFailure, StudyLocks


class SlowRunner(Runner):
    def __init__(self, log, name):
        self.log, self.name = log, name

    def _phase(self, what: str, seconds: float):
        start = time.perf_counter()
        time.sleep(seconds)
        self.log.append((self.name, what, start, time.perf_counter()))

    def run(self, batch):
        self._phase("evaluate", 0.05)
        return {"y": batch["x"]}

    def time(self, batch, runs=None):
        self._phase("time", 0.1)
        return Timing(1.0, 1.0, 1.0, 10, 3)


class SlowBackend(Backend):
    """Builds take 0.3 s, running and timing 0.15 s: records when each phase ran."""

    name = "slow"

    def __init__(self):
        self.log = []

    def info(self):
        return EngineInfo("slow", "test", "0", "none", "none", "tensorrt")

    def runner(self, model):
        start = time.perf_counter()
        time.sleep(0.3)
        name = threading.current_thread().name
        self.log.append((name, "build", start, time.perf_counter()))
        return SlowRunner(self.log, name)


def _overlaps(a, b) -> bool:
    return a[2] < b[3] and b[2] < a[3]


def test_builds_overlap_while_the_device_times_one_candidate_at_a_time(tmp_path):
    backend = SlowBackend()
    batches = [{"x": np.ones(2, np.float32)}]
    reference = [{"y": np.ones(2, np.float32)}]
    threads = [
        threading.Thread(target=measure, name=f"w{i}", args=(
            backend, None, batches, Judge(Metric(), reference), None,
            DeviceTurns(FileLock(tmp_path / "dev.lock"))))
        for i in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    builds = [e for e in backend.log if e[1] == "build"]
    timed = [e for e in backend.log if e[1] == "time"]
    device = [e for e in backend.log if e[1] in ("evaluate", "time")]
    assert len(builds) == 2 and _overlaps(*builds)  # built side by side
    # nothing beside a timing
    assert not any(_overlaps(a, b) for a in timed for b in device if a[0] != b[0])


def test_a_wait_for_the_device_says_who_holds_it_and_evaluations_share_it(tmp_path):
    """Issue 69: a trial waited 257 s for the machine-wide timing lock, held by another search, with
    nothing on the terminal. The waiter says who holds it (pid, command, what it does, since when)
    after SAY_AFTER seconds and every SAY_EVERY seconds (a shorter wait is said by no line); evaluations
    (whose outputs do not depend on the machine's load) take it beside each other, never beside a timing."""
    path = tmp_path / "cpu.lock"
    holder, waiter, said, got = FileLock(path), FileLock(path), [], threading.Event()
    holder.take(doing="timing")
    thread = threading.Thread(target=lambda: (waiter.take(say=said.append), got.set()), daemon=True)
    thread.start()
    time.sleep(1.0)
    assert not said
    for _ in range(200):
        if said:
            break
        time.sleep(0.05)
    waited = f"waiting 2 s for the lock {path}, held by pid {os.getpid()}"
    assert said and said[0].startswith(waited)
    assert ", timing, since " in said[0] and not got.is_set()
    holder.release()
    assert got.wait(10)
    waiter.release()
    evaluating, beside = FileLock(path), FileLock(path)
    assert evaluating.take(shared=True) and beside.take(wait=False, shared=True)
    assert not FileLock(path).take(wait=False)  # a timing waits for both
    evaluating.release(), beside.release()


def _hold(path, ready):
    with FileLock(path):
        ready.set()
        time.sleep(60)


def test_a_worker_killed_while_holding_the_device_does_not_leave_it_locked(tmp_path):
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_hold, args=(tmp_path / "gpu.lock", ready))
    holder.start()
    assert ready.wait(30)
    holder.kill()
    holder.join()
    acquired = threading.Event()
    waiter = threading.Thread(target=lambda: (FileLock(tmp_path / "gpu.lock").__enter__(), acquired.set()), daemon=True)
    waiter.start()
    assert acquired.wait(5), "the lock of a killed worker was not released"


def test_a_plan_held_by_one_worker_waits_in_another(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    order = []

    def first():
        with StudyLocks(url, "s").hold("plan:a"):  # each worker has its own locks on the same study
            order.append("first in")
            time.sleep(0.3)
            order.append("first out")

    def second(name):
        time.sleep(0.1)
        with StudyLocks(url, "s").hold(name):
            order.append(f"second in {name}")

    threads = [threading.Thread(target=first), threading.Thread(target=second, args=("plan:a",)),
               threading.Thread(target=second, args=("plan:b",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == ["first in", "second in plan:b", "first out", "second in plan:a"]


def test_a_pass_one_worker_computes_is_spread_over_the_workers_waiting_for_it(tmp_path):
    """The first worker measures the steps in order, a worker waiting for the pass measures them from the end;
    each step is measured once, a failure measured by one is a failure for the other, and the waiting worker
    then takes the published result."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=url)
    steps = [f"step{i}" for i in range(10)]
    measured: list[tuple[str, str]] = []

    def compute(worker, step):
        def measure():
            time.sleep(0.1)
            measured.append((worker, step))
            if step == "step8":
                raise StepFailure("IndexError: no such axis")
            return float(step[4:])
        return measure

    def worker(name, out, seen, start_after):
        time.sleep(start_after)
        study = optuna.load_study(study_name="s", storage=url)
        shared = SharedInputs(study, tmp_path / "artifacts")
        locks = StudyLocks(url, "s")
        spread = SharedSteps(shared, locks, "pass", name)
        done = out / "pass.json"
        helping = lambda: spread.help([(s, compute(name, s)) for s in steps])  # noqa: E731
        with shared.once(locks, "pass", [done], name, while_waiting=helping) as fetched:
            if not fetched:
                for step in steps:
                    try:
                        seen[step] = spread.result(step, compute(name, step))
                    except StepFailure as failure:
                        seen[step] = failure.text
                out.mkdir()
                done.write_text(json.dumps(seen))
        seen["fetched"] = fetched

    first, second = {}, {}
    threads = [threading.Thread(target=worker, args=("a", tmp_path / "a", first, 0.0)),
               threading.Thread(target=worker, args=("b", tmp_path / "b", second, 0.15))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(step for _, step in measured) == sorted(steps)  # each step once
    by_b = [step for who, step in measured if who == "b"]
    assert by_b and by_b[0] == "step9" and len(by_b) < len(steps)  # b helped, from the end
    assert first["step8"] == "IndexError: no such axis" and first["step3"] == 3.0
    assert not first["fetched"] and second["fetched"]
    assert json.loads((tmp_path / "b" / "pass.json").read_text()) == {k: v for k, v in first.items() if k != "fetched"}


def test_the_fronts_retiming_is_spread_over_the_workers_and_each_gets_all_of_it(tmp_path):
    """Two workers re-timing the same front: each plan is timed beside all-FP32 once, by one of them, both do
    some, and both end with the same re-timing (a failure included); b's device is slower (all-FP32 10 ms against
    8), so each plan's rounds are read against its own device's all-FP32."""
    from autoprec.core.plan import Plan
    from autoprec.record.trial import Measurement, Paired, TrialRecord
    from autoprec.study.retiming import retime

    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=url)
    trials = [TrialRecord(n, Plan.from_mapping({f"u{n}": "fp16" if n else "fp32"}),
                          Measurement(Timing(9.0 - n, 9.0 - n, 9.0 - n, 10, 3), {}, 0.0, {}), True) for n in range(8)]
    timed: list[tuple[str, int]] = []

    def timer(worker):
        def time_paired(fp32, plan, rounds, dominated_ms=None):
            number = next(t.number for t in trials if t.plan.key() == plan.key())
            time.sleep(0.05)
            timed.append((worker, number))
            if number == 5:
                raise RuntimeError("CUDA error: out of memory")
            fp32_ms = 8.0 if worker == "a" else 10.0
            runs = [Timing(m, m, m, 10, 3) for m in (fp32_ms * k / 8 for k in (1 + number, 2 + number, 3 + number))]
            return Paired([Timing(fp32_ms, fp32_ms, fp32_ms, 10, 3)] * rounds, runs[:rounds], 2, False)
        return time_paired

    found, both_ready = {}, threading.Barrier(2)

    def worker(name):
        study = optuna.load_study(study_name="s", storage=url)
        steps = SharedSteps(SharedInputs(study, tmp_path / "artifacts"), StudyLocks(url, "s"), "retiming:8", name)
        both_ready.wait()
        found[name] = retime(trials, trials[0], timer(name), 3, steps)

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(n for _, n in timed) == list(range(1, 8))  # each plan once, all-FP32 only beside them
    assert {who for who, _ in timed} == {"a", "b"}
    a, b = found["a"], found["b"]
    assert a == b and a.failed == ({"trial": 5, "error": "RuntimeError: CUDA error: out of memory"},)
    fp32 = a.trials[0].retimed_ms  # every round beside the six plans timed, on one scale
    assert len(fp32) == 3 * 6 and len(set(fp32)) == 1 and a.builds == 12
    assert [ms / fp32[0] for ms in a.trials[3].retimed_ms] == pytest.approx([4 / 8, 5 / 8, 6 / 8])


def _search_with_workers(out, model, data, budget: int, workers: int) -> None:
    searching.search(autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=budget),
                                           isolation=autoprec.IsolationSpec(build_workers=workers), out=out))


def test_search_with_two_workers_keeps_the_budget_and_measures_each_plan_once(tmp_path, conv_model, conv_data, caplog):
    out = tmp_path / "result"
    _search_with_workers(out, conv_model, conv_data, budget=12, workers=2)
    pareto = json.loads((out / "pareto.json").read_text())
    trials = json.loads((out / "trials.json").read_text())["trials"]
    assert pareto["search"]["build_workers"] == 2 and pareto["search"]["trials"] == 12 and len(trials) == 12
    measured = [json.dumps(t["plan"]["precisions"], sort_keys=True) for t in trials if t["duplicate_of"] is None]
    assert len(measured) == len(set(measured))
    assert all(t["seconds"]["device_wait"] >= 0 for t in trials if t["duplicate_of"] is None)
    for seconds in (t["seconds"] for t in trials if t["duplicate_of"] is None and "trial" in t["seconds"]):
        assert {"lookup", "lower", "build", "evaluate", "time", "release", "judge"} <= seconds.keys()
        assert sum(v for k, v in seconds.items() if k != "trial") <= seconds["trial"]  # parts of the whole
    assert (out / "cache" / "worker-1-stderr.log").exists()
    assert "can disturb its latency" in caplog.text  # above ort-cpu's default: said (logged), not hidden


def test_a_worker_free_while_the_uniform_plans_are_measured_runs_the_samplers_trial_meanwhile(
        tmp_path, conv_model, conv_data, caplog):
    """Four workers, three uniform plans: the fourth does not wait for them to finish (it runs a sampler's trial);
    the warm-start plans, built from the uniform plans' latencies, are queued once they are all measured (none
    where neither INT8 nor FP16 timed faster than FP32 on this busy machine: then the search says so)."""
    caplog.set_level(logging.INFO, logger="autoprec")
    out = tmp_path / "result"
    _search_with_workers(out, conv_model, conv_data, budget=10, workers=4)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    uniform = trials[:3]  # queued first: all-FP32, all-FP16, all-INT8
    assert all("fixed_params" in t.system_attrs for t in uniform)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) == 10
    measured = max(t.datetime_complete for t in uniform)
    before = [t for t in trials if t not in uniform and t.datetime_start and t.datetime_start < measured]
    assert before  # no worker waited for them
    warm = [t for t in trials if "fixed_params" in t.system_attrs and t not in uniform]
    # queued once they were measured: numbered after every trial begun before then (a trial's number is given
    # when it is queued or asked), begun after; one the budget left waiting never begins
    if not warm:  # none made (neither INT8 nor FP16 faster), or each one already a trial of the study (a sampler's)
        said = re.search(r"warm start: (\d+) plan\(s\) from the sensitivity ranking(?: \((\d+) already in the study)?",
                         caplog.text)
        made, earlier = int(said.group(1)), int(said.group(2) or 0)
        assert (made == 0 and "not faster than FP32" in caplog.text) or 0 < made == earlier, caplog.text
    assert all(w.number > t.number for w in warm for t in before)
    assert all(t.datetime_start >= measured for t in warm if t.datetime_start)


def test_build_workers_need_worker_processes(conv_model):
    with pytest.raises(autoprec.AutoprecError, match="--build-workers 2 needs worker processes"):
        searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(conv_model),
                study=autoprec.StudySpec(budget=2),
                isolation=autoprec.IsolationSpec(build_workers=2, isolate=False),
            )
        )


def test_a_worker_per_gpu_gets_its_share_of_the_hosts_cores(monkeypatch):
    """ONNX Runtime's default, a thread per core in every session, would have four GPUs' workers spin against each
    other: each gets the cores over the GPUs; with one GPU, the engine's default."""
    from autoprec.backends import gpus

    monkeypatch.setattr(gpus.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for listed, share in ((4, 16), (2, 32), (1, 0), (0, 0)):
        monkeypatch.setattr(gpus, "gpu_facts", lambda listed=listed: [{"name": "H100"}] * listed)
        assert gpus.cores_per_gpu() == share
    monkeypatch.setattr(gpus, "gpu_facts", lambda: [{"name": "H100"}] * 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the GPUs this process may use: two of the four
    assert gpus.cores_per_gpu() == 32
    monkeypatch.setattr(gpus.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert gpus.cores_per_gpu() == 1


def test_the_plan_to_ship_is_chosen_and_timed_by_one_worker_and_read_by_the_others(tmp_path, conv_model, conv_data,
                                                                                  caplog):
    """Two workers of one study, the second done with its trials when the first has chosen: the second neither
    judges nor times again (its final timing is never called), and ships the plan the first chose, with the first's
    speed-ups."""
    caplog.set_level(logging.INFO, logger="autoprec")
    timed = []

    def final_timing(measurer, fp32, contenders, seconds, apart):
        timed.append([c.number for c in contenders])
        return autoprec.study.choice.timed_until_known(measurer, fp32, contenders, seconds, apart)

    def worker(out, timing) -> dict:
        config = autoprec.SearchConfig(
            autoprec.InputSpec(conv_model, data=conv_data), out=out, retime_seconds=0.1,
            study=autoprec.StudySpec(budget=6, storage=f"sqlite:///{tmp_path / 'shared.db'}", study_name="s"))
        autoprec.search(config, final_timing=timing)
        return json.loads((out / "pareto.json").read_text())

    first = worker(tmp_path / "a", final_timing)
    second = worker(tmp_path / "b", lambda *args: pytest.fail("the second worker timed the choice again"))
    assert len(timed) <= 1 and "chosen and timed by another worker" in caplog.text
    assert second["chosen"] == first["chosen"] and second["chosen_vs_source"] == first["chosen_vs_source"]
    assert [t["trial"] for t in second["front"]] == [t["trial"] for t in first["front"]]

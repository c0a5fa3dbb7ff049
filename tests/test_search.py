import gc
import json
import math
import os
import shutil
import statistics
import time
from dataclasses import replace

import builders
import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
import searching

import autoprec
from autoprec.analysis.data import Workload, build_dataset
from autoprec.analysis.model import analyse
from autoprec.core import atomic
from autoprec.core.plan import Plan, Precision
from autoprec.core.search_space import load_search_space
from autoprec.core.stored import StoredModel
from autoprec.core.timing import Runs, Timing
from autoprec.measure.accuracy import compare, loss_from_metrics
from autoprec.record.facts import Drift, SearchFacts
from autoprec.record.trial import Measurement, TrialRecord
from autoprec.record.verdict import Versus
from autoprec.results.console import chosen_summary
from autoprec.results.files import read_result_dir
from autoprec.study.coordination import retried_trial


@pytest.fixture(scope="module")
def conv_search(tmp_path_factory):
    import builders

    root = tmp_path_factory.mktemp("search")
    model, data = builders.conv_with_data(root, 12)
    out = root / "out"
    result = searching.search(conv_config(model, data, out, budget=8), plots=True)  # its figures are checked
    # what existed before it was kept out of the search's collections, and handed back after (a process that
    # searches again and again collects what each search left)
    assert gc.get_freeze_count() == 0
    return model, data, out, result


def conv_config(model, data, out, budget, max_loss=0.02):
    """The conv search the tests below resume and vary: one seed, one result folder."""
    return autoprec.SearchConfig(autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec(max_loss=max_loss),
                                 study=autoprec.StudySpec(budget=budget, seed=1), out=out)


def test_result_files_and_schema(conv_search):
    _, _, out, result = conv_search
    pareto = json.loads((out / "pareto.json").read_text())
    assert pareto["schema"] == "autoprec.pareto/1"
    assert pareto["engine"]["engine"] == "onnxruntime" and pareto["engine"]["provider"] == "CPUExecutionProvider"
    assert pareto["engine"]["measured"] is True and pareto["engine"]["device"]
    assert pareto["search"]["budget"] == 8 and pareto["search"]["trials"] == 8
    assert set(pareto["uniform"]) == {"fp32", "fp16", "int8"}  # the seeded uniform plans ran
    front = pareto["front"]
    assert front and [t["final_latency_ms"] for t in front] == sorted(t["final_latency_ms"] for t in front)
    fp32_number, retiming = pareto["uniform"]["fp32"], pareto["search"]["retiming"]
    # the front was re-timed, each plan beside all-FP32 in 2 or 3 interleaved rounds (3 where 2 left its place open)
    assert all(len(t["retimed_ms"]) in (2, 3) for t in front if t["trial"] != fp32_number)
    assert all(t["final_latency_ms"] == pytest.approx(statistics.median(t["retimed_ms"])) for t in front)
    # each plan's session built once, all-FP32's once for all of them (kept in the worker from plan to plan)
    others = len(retiming["retimed"]) - 1
    assert retiming["rounds"] == 3 and not retiming["failed"] and retiming["builds"] == others + (others > 0)
    for t in front:
        lat = t["latency_ms"]
        assert lat["p10_ms"] <= lat["median_ms"] <= lat["p90_ms"] and lat["runs"] >= 10
        assert set(t["metrics"]["probs"]) >= {"cosine", "rel_l2", "max_abs", "snr_db", "top1"}
        assert t["feasible"] and t["accuracy_loss"] <= 0.02
    # No front member is dominated by any plan timed in the same re-timing rounds (final latencies).
    trials = json.loads((out / "trials.json").read_text())["trials"]
    assert len(trials) == 8
    retimed = [t for t in trials if t["retimed_ms"]]
    for t in front:
        for other in retimed:
            better = other["final_latency_ms"] <= t["final_latency_ms"] and other["accuracy_loss"] <= t["accuracy_loss"]
            strictly = other["final_latency_ms"] < t["final_latency_ms"] or other["accuracy_loss"] < t["accuracy_loss"]
            assert not (better and strictly and other["plan"] != t["plan"])
    chosen = next(t for t in front if t["trial"] == pareto["chosen"])
    feasible = [t for t in front if t["accuracy_loss"] <= 0.02]
    assert chosen["final_latency_ms"] == min(t["final_latency_ms"] for t in feasible)
    plan = json.loads((out / "best" / "plan.json").read_text())
    assert plan["schema"] == "autoprec.plan/1" and plan["trial"] == chosen["trial"]
    assert plan["plan"] == chosen["plan"]
    assert [u["name"] for u in plan["units"]] == ["conv0", "conv1", "conv2", "fc"]
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.chosen.number == chosen["trial"]
    versus = pareto["chosen_vs_fp32"]
    assert versus["fp32_trial"] == pareto["uniform"]["fp32"]
    fp32 = next(t for t in trials if t["trial"] == versus["fp32_trial"])
    # all-FP32 in each round beside the first plan re-timed (2 or 3), in the middle one beside each later plan
    assert (len(fp32["retimed_ms"]) - (others - 1) in (2, 3) if others else not fp32["retimed_ms"]) and versus["retimed"]
    assert versus["speedup"] == pytest.approx(fp32["final_latency_ms"] / chosen["final_latency_ms"])
    assert versus["beyond_timing_noise"] == (max(chosen["retimed_ms"]) < min(fp32["retimed_ms"]))
    # How far the trials' latencies lie from their re-timing, over every re-timed plan.
    drift, pairs = pareto["search"]["timing_drift"], [(t["latency_ms"], t["final_latency_ms"]) for t in retimed]
    assert drift["plans"] == len(pairs) >= len(front)
    assert drift["outside_trial_spread"] == sum(not lat["p10_ms"] <= ms <= lat["p90_ms"] for lat, ms in pairs)
    assert drift["largest_percent"] == pytest.approx(100 * max(abs(lat["median_ms"] / ms - 1) for lat, ms in pairs))


@pytest.mark.parametrize("largest, outside, said", [(35.0, 2, True), (35.0, 0, False), (4.0, 3, False)])
def test_a_drift_beyond_the_trials_spread_is_said_where_the_latency_is_shown(largest, outside, said):
    drift = Drift(plans=5, largest_percent=largest, outside_trial_spread=outside)
    line = drift.said()
    assert (line is not None) == said
    if said:
        assert f"up to {largest:.0f} %" in line and f"{outside} of 5 plans" in line
    chosen = TrialRecord(3, Plan.from_mapping({"a": "int8", "b": "fp32", "c": "fp32", "d": "fp32"}),
                         Measurement(Timing(2.0, 1.9, 2.1, 10, 3), {}, 0.001, {}), True)
    facts = SearchFacts("cosine", 0.01, 8, 8, 0, "tpe", 0, "max", "s", "sqlite://", "random", (1, 1), True, 1.0,
                        drift=drift)
    summary = chosen_summary(facts, Versus(), chosen)
    assert any(line in row for row in summary) if said else not any("drifted" in row for row in summary)


def test_the_result_says_where_the_wall_clock_went(conv_search):
    _, _, out, _ = conv_search
    search = json.loads((out / "pareto.json").read_text())["search"]
    stages = search["stage_seconds"]
    assert list(stages) == ["set_up", "sensitivity", "trials", "retiming", "held_out_and_final_timing", "deployment"]
    assert all(seconds >= 0 for seconds in stages.values()) and stages["trials"] > 0
    # the stages follow one another inside the wall clock (what lies between them, e.g. closing the measuring
    # processes, is the wall's rest)
    assert sum(stages.values()) <= search["wall_seconds"] + 0.1
    shown = read_result_dir(out).facts.wall_said()
    assert shown.startswith(f"{search['wall_seconds']:.1f} s (set-up ") and "trials" in shown and "final timing" in shown


def test_best_model_keeps_the_given_models_metadata(tmp_path):
    """What deployment code reads around the graph (a recognizer's character set, a classifier's labels, the
    model's version and doc string) ships in best/ as it came: graphsurgeon's export had left it out."""
    model = builders.conv_net()
    onnx.helper.set_model_props(model, {"labels": "cat,dog,eel,fox,gnu", "character": "abc"})
    model.doc_string, model.model_version = "a classifier", 7
    path = builders.save(model, tmp_path / "labelled.onnx")
    data = tmp_path / "data.npz"
    np.savez(data, x=builders.image_like(8))
    searching.search(autoprec.SearchConfig(autoprec.InputSpec(path, data=data), study=autoprec.StudySpec(budget=2),
                                           out=tmp_path / "out"))
    shipped = onnx.load(str(tmp_path / "out" / "best" / "model.onnx"))
    assert {p.key: p.value for p in shipped.metadata_props} == {"labels": "cat,dog,eel,fox,gnu", "character": "abc"}
    assert (shipped.doc_string, shipped.model_version) == ("a classifier", 7)


def test_best_model_runs_and_matches_its_reported_accuracy(conv_search):
    model, data, out, _ = conv_search
    plan = json.loads((out / "best" / "plan.json").read_text())
    best = onnx.load(str(out / "best" / "model.onnx"))
    onnx.checker.check_model(best)
    info = analyse(model, load_search_space())
    dataset = build_dataset(data, info.inputs, seed=1)  # the search's split (same data, same seed)
    fp32 = ort.InferenceSession(str(model))
    session = ort.InferenceSession(str(out / "best" / "model.onnx"))
    reference = [{"probs": fp32.run(None, b)[0]} for b in dataset.evaluation]
    candidate = [{"probs": session.run(None, b)[0]} for b in dataset.evaluation]
    metrics = compare(reference, candidate)
    assert loss_from_metrics(metrics, "cosine") == pytest.approx(plan["accuracy_loss"], abs=1e-6)
    assert metrics["probs"]["max_abs"] == pytest.approx(plan["metrics"]["probs"]["max_abs"], rel=1e-4, abs=1e-7)


def test_rerun_with_a_larger_budget_resumes_without_remeasuring(conv_search, caplog):
    model, data, out, _ = conv_search
    storage = f"sqlite:///{out / 'study.db'}"
    before = {
        t.number: (t.values, t.params)
        for t in optuna.load_study(study_name="autoprec-conv-ort-cpu", storage=storage).trials
    }
    with caplog.at_level("INFO", logger="autoprec"):
        searching.search(conv_config(model, data, out, budget=10))
    trials = optuna.load_study(study_name="autoprec-conv-ort-cpu", storage=storage).trials
    assert len(trials) == 10
    for t in trials[:8]:
        assert (t.values, t.params) == before[t.number]  # kept, not re-measured
    warm = next(r.message for r in caplog.records if r.message.startswith("warm start:"))
    planned = int(warm.split()[2])  # the first run queued (and ran) them: not said as queued now
    assert planned == 0 or (f"({planned} already in the study: a uniform plan of this run, or one another worker or an "
                            "earlier run queued)") in warm, warm


def test_study_for_another_setting_is_refused(conv_search):
    model, data, out, _ = conv_search
    with pytest.raises(autoprec.AutoprecError, match="different search.*max_loss"):
        searching.search(conv_config(model, data, out, budget=10, max_loss=0.5))


def test_a_process_that_froze_its_heap_finds_it_frozen_after_a_search(conv_search):
    """A search freezes what exists when it starts and thaws it at its end; in a process that froze its own
    objects (a server before it forks) it leaves them frozen, whatever the search ends in."""
    model, data, out, _ = conv_search
    own = ["an object of the process's own"]
    gc.freeze()
    try:
        with pytest.raises(autoprec.AutoprecError, match="different search"):
            searching.search(conv_config(model, data, out, budget=10, max_loss=0.5))
        assert not any(o is own for o in gc.get_objects())  # (frozen objects are in no generation)
    finally:
        gc.unfreeze()
    assert any(o is own for o in gc.get_objects())


def test_duplicate_plans_reuse_the_stored_measurement(tmp_path, mlp_model):
    # Two searchable units x 3 precisions = 9 distinct plans: a budget of 14 repeats some, or ends early
    # once all 9 are measured (the sampler's proposals follow the measured latencies: either may happen).
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model),
            space=autoprec.SpaceSpec(overrides=["head=fp32"]),
            study=autoprec.StudySpec(budget=14),
            out=tmp_path / "out",
        )
    )
    first = {}
    for t in result.trials:
        key = t.plan.key()
        if t.duplicate_of is None:
            assert key not in first, "a plan was measured twice"
            first[key] = t
        else:
            original = first[key]
            assert t.duplicate_of == original.number
            assert t.measurement == original.measurement
    assert len(result.trials) == 14 or len(first) == 9
    assert len(result.trials) > len(first), "no plan was proposed twice: nothing was reused"


def test_interrupted_trial_is_rerun_and_finished_ones_kept(tmp_path, mlp_model):
    out = tmp_path / "out"
    # No warm start: its plans would stay queued ahead of the re-run at this small budget.
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model), study=autoprec.StudySpec(budget=3, warm_start=False, heartbeat=1), out=out
        )
    )
    storage = f"sqlite:///{out / 'study.db'}"
    study = optuna.load_study(study_name="autoprec-mlp-ort-cpu", storage=storage)
    finished = {t.number: t.values for t in study.trials}
    # A trial left RUNNING with no heartbeat, as a process killed right after creating it leaves it.
    from autoprec.app.resolve import engine_space
    from autoprec.backends import get_backend
    from autoprec.study.optimize import distributions

    space, _, _ = engine_space(load_search_space(), get_backend("ort-cpu"), None)  # the space the search searched
    info = analyse(mlp_model, space)
    dangling = study.ask(distributions(info))
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model), study=autoprec.StudySpec(budget=5, warm_start=False, heartbeat=1), out=out
        )
    )
    trials = optuna.load_study(study_name="autoprec-mlp-ort-cpu", storage=storage).trials
    states = {t.number: t.state for t in trials}
    assert states[dangling.number] == optuna.trial.TrialState.FAIL
    retry = [t for t in trials if retried_trial(t) == dangling.number]
    assert len(retry) == 1 and retry[0].params == dangling.params and retry[0].state.name == "COMPLETE"
    assert sum(t.state.name == "COMPLETE" for t in trials) == 5
    assert all(trials[n].values == v for n, v in finished.items())


def test_a_dead_workers_trial_is_rerun_once_with_its_plan(tmp_path):
    from autoprec.study.coordination import fail_dead_trials, storage_for

    study = optuna.create_study(storage=storage_for(f"sqlite:///{tmp_path / 's.db'}", heartbeat=1),
                                directions=["minimize", "minimize"])
    plan = {"conv1": "int8", "conv2": "fp16"}
    study.enqueue_trial(plan)
    queued = study.ask()  # its worker died before suggesting anything: the plan lives only in the queue
    study._storage.record_heartbeat(queued._trial_id)
    fail_dead_trials(study)
    assert study.trials[queued.number].state.name == "RUNNING"  # beating a moment ago: alive
    time.sleep(5)  # four silent beats
    fail_dead_trials(study)
    fail_dead_trials(study)  # a second look (another worker) queues nothing more
    retries = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert study.trials[queued.number].state.name == "FAIL"
    assert (
        len(retries) == 1
        and retries[0].system_attrs["fixed_params"] == plan
        and retried_trial(retries[0]) == queued.number
    )
    rerun = study.ask()  # the re-run dies too: given up, not queued a third time
    assert rerun.number == retries[0].number
    time.sleep(5)
    fail_dead_trials(study)
    assert study.trials[rerun.number].state.name == "FAIL"
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))


def test_without_max_loss_the_knee_is_chosen(tmp_path, mlp_model):
    result = searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(mlp_model), study=autoprec.StudySpec(budget=5), out=tmp_path / 'out')
    )
    assert result.search["max_loss"] is None
    assert result.chosen in result.front
    pareto = json.loads((tmp_path / "out" / "pareto.json").read_text())
    assert all(t["feasible"] for t in pareto["front"])


def test_atomic_write_leaves_the_old_file_on_failure(tmp_path):
    path = atomic.write_json(tmp_path / "r.json", {"ok": 1})

    def broken(f):
        f.write(b'{"half": ')
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic.write_with(path, broken)
    assert json.loads(path.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_nonfinite_numbers_survive_strict_json():
    from autoprec.results.files import json_safe

    written = json.loads(json.dumps(json_safe({"a": [math.inf, 1.0], "b": -math.inf}), allow_nan=False))
    assert written == {"a": ["inf", 1.0], "b": "-inf"}
    assert float(written["a"][0]) == math.inf and float(written["b"]) == -math.inf


def test_timing_noise_verdict():
    from autoprec.core.timing import Timing
    from autoprec.record.verdict import faster_beyond_noise

    assert Timing(1.0, 0.9, 1.1, 10, 3).spread == pytest.approx(0.2)
    assert faster_beyond_noise([1.0, 1.1], [1.2, 1.3]) and not faster_beyond_noise([1.0, 1.25], [1.2, 1.3])
    assert faster_beyond_noise([1.0], []) is None  # a trial's own timing, never re-timed: no verdict


def _clock_engine(events: list, alive: list, failing: str | None = None):
    """A fake engine whose runners time each run one later than the last (drift), recording builds, timings
    and how many runners are alive; building ``failing`` raises as an engine crash would."""
    from autoprec.backends.base import Backend, Runner
    from autoprec.core.errors import BackendError
    from autoprec.core.timing import Timing

    class Clock(Runner):
        def __init__(self, name):
            self.name = name
            alive.append(name)
            events.append(("alive", len(alive)))

        def run(self, batch):
            return {}

        def time(self, batch, runs=None):
            events.append(("time", self.name))
            n = sum(e[0] == "time" for e in events)
            return Timing(n, n, n, 10, 3)

        def close(self):
            alive.remove(self.name)

    class Engine(Backend):
        name = "fake"

        def info(self):
            raise NotImplementedError

        def runner(self, model):
            events.append(("build", model))
            if model == failing:
                raise BackendError("engine crashed")
            return Clock(model)

    return Engine()


def test_retiming_pairs_each_plan_with_fp32_in_interleaved_rounds_and_says_when_one_fails():
    from autoprec.core.plan import Plan
    from autoprec.core.timing import Timing
    from autoprec.measure.measurement import time_paired
    from autoprec.record.trial import Measurement, TrialRecord
    from autoprec.study.retiming import retime

    events, alive = [], []
    engine = _clock_engine(events, alive, failing="int8")

    def record(number, ms, precision):  # (losses rising with the number: re-timed in that order)
        return TrialRecord(
            number, Plan.from_mapping({"u": precision}), Measurement(Timing(ms, ms, ms, 10, 3), {}, number / 10, {}), True
        )

    def pair(reference, plan, rounds, dominated_ms):  # (no plan left early: the clock's rounds all differ)
        return time_paired(engine, reference["u"].value, plan["u"].value, Workload.of({}), rounds)

    trials = [record(0, 9.0, "fp32"), record(1, 8.0, "fp16"), record(2, 7.0, "int8"), record(3, 6.5, "fp16")]
    retiming = retime(trials, trials[0], pair, rounds=3)
    assert max(n for kind, n in events if kind == "alive") == 2  # never more than two engines at once
    # each pairing interleaved round by round, each round starting with the other of the two (no order favoured)
    assert [e[1] for e in events if e[0] == "time"] == ["fp32", "fp16", "fp16", "fp32", "fp32", "fp16"] * 2
    fp32, fp16 = retiming.trials[0], retiming.trials[1]
    assert fp16.retimed_ms == (2, 3, 6) and fp32.retimed_ms == (1, 4, 5, 7, 10, 11)  # FP32's rounds: all its pairings'
    assert 2 not in retiming.trials and retiming.failed == ({"trial": 2, "error": "BackendError: engine crashed"},)
    assert retiming.builds == 4 and not retiming.apart


def test_a_kept_fp32_session_is_built_once_and_timed_once_for_every_later_plan_and_survives_a_failed_one():
    from autoprec.core.plan import Plan
    from autoprec.core.timing import Timing
    from autoprec.measure.measurement import KeptSession, time_paired
    from autoprec.record.trial import Measurement, TrialRecord
    from autoprec.study.retiming import retime

    events, alive = [], []
    engine, kept = _clock_engine(events, alive, failing="int8"), KeptSession()

    def record(number, precision):
        return TrialRecord(number, Plan.from_mapping({"u": precision}), Measurement(Timing(9, 9, 9, 10, 3), {}, 0.0, {}),
                           True)

    def pair(reference, plan, rounds, dominated_ms):  # (no plan left early: the clock's rounds all differ)
        return time_paired(engine, reference["u"].value, plan["u"].value, Workload.of({}), rounds,
                           (kept, reference.key()))

    trials = [record(0, "fp32"), record(1, "fp16"), record(2, "int8"), record(3, "fp16")]
    retiming = retime(trials, trials[0], pair, rounds=3)
    assert [model for kind, model in events if kind == "build"] == ["fp32", "fp16", "int8", "fp16"]
    assert max(n for kind, n in events if kind == "alive") == 2 and alive == ["fp32"]
    assert retiming.builds == 3 and set(retiming.trials) == {0, 1, 3}
    # every round beside the first plan, the middle one beside each later plan: 4 runs of FP32, not 6
    assert [e[1] for e in events if e[0] == "time"] == ["fp32", "fp16", "fp16", "fp32", "fp32", "fp16",
                                                        "fp16", "fp16", "fp32", "fp16"]
    assert retiming.trials[0].retimed_ms == (1, 4, 5, 9) and retiming.trials[3].retimed_ms == (7, 8, 10)
    assert kept.of("another reference") is None and alive == []  # another all-FP32 model: the kept one closed


def test_a_plan_is_re_timed_a_third_time_only_where_two_rounds_leave_its_place_on_the_front_open():
    """Two rounds within 3 % of each other, or both slower than a plan at no more loss re-timed before it, decide
    what a third could not change (a median of three lies between two of them); two rounds apart, a third runs."""
    from autoprec.backends.base import Backend, Runner
    from autoprec.core.plan import Plan
    from autoprec.core.timing import Timing
    from autoprec.measure.measurement import KeptSession, time_paired
    from autoprec.record.trial import Measurement, TrialRecord
    from autoprec.study.retiming import retime

    rounds_ms = {"fp32": iter([10.0] * 9), "steady": iter([5.0, 5.1, 9.0]), "slower": iter([7.0, 6.0, 4.0]),
                 "apart": iter([6.0, 4.0, 5.0]), "unsteady and least loss": iter([4.0, 6.0, 5.0])}
    timed = []

    class Scripted(Runner):
        def __init__(self, name):
            self.name = name

        def run(self, batch):
            return {}

        def time(self, batch, runs=None):
            timed.append(self.name)
            ms = next(rounds_ms[self.name])
            return Timing(ms, ms, ms, 10, 1)

    class Engine(Backend):
        name = "fake"

        def info(self):
            raise NotImplementedError

        def runner(self, model):
            return Scripted(model)

    kept = KeptSession()

    def pair(reference, plan, rounds, dominated_ms):
        return time_paired(Engine(), reference.precisions[0][0], plan.precisions[0][0], Workload.of({}), rounds,
                           (kept, reference.key()), dominated_ms)

    def record(number, name, loss):  # (a plan of one unit, named as the engine's model)
        return TrialRecord(number, Plan.from_mapping({name: "fp32" if number == 0 else "fp16"}),
                           Measurement(Timing(9, 9, 9, 10, 3), {}, loss, {}), True)

    trials = [record(0, "fp32", 0.0), record(1, "steady", 0.1), record(2, "slower", 0.2), record(3, "apart", 0.05),
              record(4, "unsteady and least loss", 0.01)]
    retimed = retime(trials, trials[0], pair, rounds=3).trials
    assert retimed[1].retimed_ms == (5.0, 5.1)  # steady: 2 rounds
    # 7 and 6 ms, both slower than trial 4 (at less loss: re-timed first, 5 ms): it leaves the front, 2 rounds
    assert retimed[2].retimed_ms == (7.0, 6.0)
    assert retimed[4].retimed_ms == (4.0, 6.0, 5.0) and retimed[3].retimed_ms == (6.0, 4.0, 5.0)  # apart: 3
    assert kept.of("another reference") is None


def test_an_engine_too_large_to_keep_two_of_is_rebuilt_each_round_one_at_a_time(monkeypatch):
    from autoprec.measure import measurement

    events, alive = [], []
    grown = iter([0, 3 << 30])  # the all-FP32 engine takes 3 GiB
    monkeypatch.setattr(measurement, "resident_bytes", lambda pid=None: next(grown, 3 << 30))
    kept = measurement.KeptSession()  # (asked to keep it: never kept beside another)
    paired = measurement.time_paired(_clock_engine(events, alive), "fp32", "int8", Workload.of({}), 3, (kept, "fp32"))
    assert paired.apart and paired.builds == 6 and len(paired.reference) == len(paired.candidate) == 3
    assert kept.runner is None and alive == []
    assert max(n for kind, n in events if kind == "alive") == 1
    assert [e[1] for e in events if e[0] == "time"] == ["fp32", "int8", "int8", "fp32", "fp32", "int8"]


def test_precisions_narrow_the_search_and_are_recorded(tmp_path, mlp_model):
    out = tmp_path / "out"
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model),
            space=autoprec.SpaceSpec(precisions=["fp16", "fp32"]),
            study=autoprec.StudySpec(budget=4),
            out=out,
        )
    )
    assert result.trials and all(t.plan.counts()["int8"] == 0 for t in result.trials)
    assert {"fp16", "fp32"} <= set(result.uniform())
    facts = json.loads((out / "pareto.json").read_text())["search"]
    assert facts["precisions"] == ["fp16", "fp32"] and "int8" in facts["left_out"]
    with pytest.raises(
        autoprec.AutoprecError, match="different search"
    ):  # the same study with INT8 back is another search
        searching.search(
            autoprec.SearchConfig(autoprec.InputSpec(mlp_model), study=autoprec.StudySpec(budget=5), out=out)
        )


def test_an_engine_that_runs_int8_slowly_leaves_it_out_unless_asked():
    from autoprec.app.resolve import engine_space
    from autoprec.backends.onnxruntime import OrtCudaBackend
    from autoprec.core.plan import Precision

    engine = object.__new__(OrtCudaBackend)  # its declaration only: no GPU needed
    space, searched, left_out = engine_space(load_search_space(), engine, None)
    assert searched == ["fp16", "fp32"] and "Q/DQ INT8 as float ops" in left_out["int8"]
    assert Precision.INT8 not in space.allowed("conv", "Conv")
    space, searched, _ = engine_space(load_search_space(), engine, ["int8", "fp16", "fp32"])
    assert Precision.INT8 in space.allowed("conv", "Conv") and searched == ["int8", "fp16", "fp32"]
    assert space.allowed("softmax", "Softmax") == (Precision.FP16, Precision.FP32)  # GPU engines search sensitive ops


def test_onnx_runtime_cpu_keeps_sensitive_ops_fp32_and_says_why():
    from autoprec.app.resolve import engine_space
    from autoprec.backends import get_backend

    space, _, left_out = engine_space(load_search_space(), get_backend("ort-cpu"), None)
    assert {"Softmax", "LayerNormalization", "ReduceMean"} <= space.pinned_fp32
    assert "no FP16 kernels" in left_out["sensitive ops"]


@pytest.mark.parametrize("backend", ["ort-cpu", "tensorrt-rtx"])
def test_an_engine_without_an_integer_convtranspose_searches_it_in_float_only(backend):
    """ONNX Runtime's CPU provider and TensorRT for RTX run a ConvTranspose between Q/DQ as float arithmetic
    around a float kernel: no INT8 for it, unless --precisions asks; Conv keeps INT8."""
    from autoprec.app.resolve import engine_space
    from autoprec.backends import backend_class
    from autoprec.core.plan import Precision

    engine = object.__new__(backend_class(backend))  # its declaration only: no engine needed
    space, _, _ = engine_space(load_search_space(), engine, None)
    assert Precision.INT8 not in space.allowed("up", "ConvTranspose") and Precision.INT8 in space.allowed("c", "Conv")
    space, _, _ = engine_space(load_search_space(), engine, ["int8", "fp16", "fp32"])
    assert Precision.INT8 in space.allowed("up", "ConvTranspose")


@pytest.mark.parametrize("moment", ["created", "starting to beat"])
def test_ctrl_c_as_a_trial_is_created_gives_it_back_at_once(tmp_path, mlp_model, monkeypatch, moment):
    """SIGINT right after the storage created the trial (inside Study.ask), or as its heartbeat starts:
    the trial is failed and queued again at once, not left RUNNING for a heartbeat to find."""
    import signal

    from autoprec.study import optimize

    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model),
            study=autoprec.StudySpec(budget=1, warm_start=False),
            isolation=autoprec.IsolationSpec(isolate=False),
            out=out,
        )
    )
    real_ask = optuna.Study.ask

    def ask_then_interrupted(self, *args, **kwargs):
        trial = real_ask(self, *args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # delivered to this (the main) thread as the trial exists in the storage
        return trial

    def beating_interrupted(study, trial, worker):
        raise KeyboardInterrupt  # what Python's SIGINT handler raises, here as the heartbeat would start

    if moment == "created":
        monkeypatch.setattr(optuna.Study, "ask", ask_then_interrupted)
    else:
        monkeypatch.setattr(optimize, "beating", beating_interrupted)
    with pytest.raises(KeyboardInterrupt):
        searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(mlp_model),
                study=autoprec.StudySpec(budget=3, warm_start=False),
                isolation=autoprec.IsolationSpec(isolate=False),
                out=out,
            )
        )
    monkeypatch.undo()
    study = optuna.load_study(study_name="autoprec-mlp-ort-cpu", storage=f"sqlite:///{out / 'study.db'}")
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    interrupted = study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(interrupted) == 1 and [retried_trial(t) for t in waiting].count(interrupted[0].number) == 1
    started = time.monotonic()
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model),
            study=autoprec.StudySpec(budget=3, warm_start=False),
            isolation=autoprec.IsolationSpec(isolate=False),
            out=out,
        )
    )
    assert time.monotonic() - started < 30  # no wait for a stale heartbeat (4 beats of 10 s)
    study = optuna.load_study(study_name="autoprec-mlp-ort-cpu", storage=f"sqlite:///{out / 'study.db'}")
    assert sum(t.state.name == "COMPLETE" for t in study.trials) == 3


def test_a_trial_whose_worker_process_is_gone_from_this_host_is_rerun_at_once(tmp_path):
    """No waiting for four silent heartbeats when the worker's own host can see its process is gone."""
    import socket
    import subprocess
    import sys

    from autoprec.study.coordination import WORKER_ATTR, fail_dead_trials, storage_for

    study = optuna.create_study(storage=storage_for(f"sqlite:///{tmp_path / 's.db'}", heartbeat=60),
                                directions=["minimize", "minimize"])
    study.enqueue_trial({"conv1": "int8"})
    orphan = study.ask()
    study._storage.record_heartbeat(orphan._trial_id)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    orphan.set_user_attr(WORKER_ATTR, {"id": f"{socket.gethostname()}:{gone}", "trial": orphan.number})
    alive = study.ask()
    study._storage.record_heartbeat(alive._trial_id)
    alive.set_user_attr(WORKER_ATTR, {"id": f"{socket.gethostname()}:{os.getpid()}", "trial": alive.number})
    fail_dead_trials(study)  # a minute's heartbeat has not gone stale: only the process check can tell
    states = {t.number: t.state.name for t in study.trials}
    assert states[orphan.number] == "FAIL" and states[alive.number] == "RUNNING"
    assert [retried_trial(t) for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))] == [orphan.number]


def test_the_front_after_re_timing_is_a_front_in_the_re_timed_numbers():
    """A member the trial timings put on the front, but the re-timing shows slower than all-FP32 at more
    loss, leaves it: no plan listed is dominated by another plan shown beside it."""
    from autoprec.study.retiming import retimed_front

    study, time_plans = _timed_study([(("fp32", "fp32"), 10.0, 0.0, 8.0), (("fp16", "fp32"), 9.0, 1e-4, 9.5),
                                      (("int8", "int8"), 6.0, 1e-2, 5.0)])
    front, retiming = retimed_front(study, time_plans)
    assert [r.number for r in front] == [2, 0] and [r.latency_ms for r in front] == [5.0, 8.0]
    shown = list(retiming.trials.values())
    assert not [(a.number, b.number) for a in front for b in shown
                if b.number != a.number and b.latency_ms <= a.latency_ms and b.loss <= a.loss]


def test_plans_tied_on_a_coarse_loss_are_re_timed_not_only_the_one_the_front_kept():
    """A task metric on a few items ties many plans at one loss; the front keeps the one a single trial
    timed fastest. The fastest plans within --max-loss are re-timed beside it, and the choice follows."""
    from autoprec.study.choice import fastest_within
    from autoprec.study.retiming import retimed_front

    study, time_plans = _timed_study([
        (("fp32", "fp32"), 10.0, 0.0, 10.0),
        (("int8", "fp32"), 7.0, 0.0, 10.2),  # a lucky single timing: on the front, alone at loss 0
        (("int8", "int8"), 7.5, 0.0, 6.0),  # as accurate, and the one really faster
    ])
    front, _ = retimed_front(study, time_plans, max_loss=0.01)
    assert fastest_within(front, 0.01).number == 2
    front, _ = retimed_front(study, time_plans)  # without a limit, only the front and all-FP32 are timed again
    assert fastest_within(front, 0.01).number == 0


def _timed_study(plans):
    """A study of two-unit plans (precisions of units a and b, trial ms, loss, re-timed ms), and a
    ``time_plans`` that re-times each plan at its re-timed ms in 3 rounds."""
    from autoprec.core.plan import Plan
    from autoprec.core.timing import Timing
    from autoprec.record.trial import Measurement, Paired

    study = optuna.create_study(directions=["minimize", "minimize"])
    again_ms = {}
    for (a, b), ms, loss, again in plans:
        trial = study.ask()
        trial.set_user_attr("plan", Plan.from_mapping({"a": a, "b": b}).to_json())
        trial.set_user_attr("measurement", Measurement(Timing(ms, ms, ms, 10, 3), {}, loss, {}).to_json())
        study.tell(trial, [ms, loss])
        again_ms[(a, b)] = again

    def time_paired(reference, plan, rounds, dominated_ms=None):
        reference_ms, plan_ms = (again_ms[tuple(p.value for _, p in each.precisions)] for each in (reference, plan))
        return Paired((Timing(reference_ms, reference_ms, reference_ms, 10, 3),) * rounds,
                      (Timing(plan_ms, plan_ms, plan_ms, 10, 3),) * rounds, 2, False)

    return study, time_paired


def test_a_failed_re_timing_is_said_and_leaves_no_verdict_on_timing_noise(tmp_path, mlp_model, monkeypatch, caplog):
    """Trial timings taken at different moments never decide "beyond timing noise": without the re-timing
    (here it runs out of memory) the speed-up is reported without a verdict, and the failure is said."""
    from autoprec.core.errors import BackendError
    from autoprec.measure import measurement

    def out_of_memory(*args, **kwargs):
        raise BackendError("onnxruntime cannot load the candidate: Failed to allocate memory")

    monkeypatch.setattr(measurement, "time_paired", out_of_memory)
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="autoprec"):
        result = searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(mlp_model),
                judge=autoprec.JudgeSpec(max_loss=1.0),
                study=autoprec.StudySpec(budget=4),
                isolation=autoprec.IsolationSpec(isolate=False),
                out=out,
            )
        )
    pareto = json.loads((out / "pareto.json").read_text())
    failed = pareto["search"]["retiming"]["failed"]
    assert failed and all("Failed to allocate memory" in f["error"] for f in failed)
    assert {t.number for t in result.front if t.number != pareto["uniform"]["fp32"]} <= {f["trial"] for f in failed}
    assert any("re-timing trial" in r.message and "no verdict on timing noise" in r.message for r in caplog.records)
    assert pareto["chosen_vs_fp32"]["beyond_timing_noise"] is None and not pareto["chosen_vs_fp32"]["retimed"]
    files = read_result_dir(out)
    shown_beside_another = replace(files.versus, fp32_trial=-1)  # as shown beside a plan other than all-FP32
    assert "not re-timed: no verdict on timing noise" in chosen_summary(files.facts, shown_beside_another,
                                                                        files.shown_chosen())[1]


OFFSET_METRIC = """
import numpy as np

def loss(reference, candidate):  # an engine whose own FP32 is 0.02 off the reference
    return 0.02 + float(np.mean([np.abs(r[k] - c[k]).mean() for r, c in zip(reference, candidate) for k in r]))
"""


def test_when_not_even_all_fp32_is_within_the_limit_no_plan_is_chosen_and_the_result_reads(tmp_path, mlp_model,
                                                                                          monkeypatch, capsys):
    """A limit no plan meets (the engine's FP32 itself beyond it) chooses nothing, says why, and writes a result
    that every verb reads (it was refused as edited when the knee was chosen in its place)."""
    (tmp_path / "offset_metric.py").write_text(OFFSET_METRIC)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert searching.main(["search", str(mlp_model), "--metric", "offset_metric:loss", "--max-loss", "0.01",
                           "--budget", "4", "--out", str(out), "--no-progress"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "no trial is within --max-loss 0.01, not even all-FP32" in said
    assert json.loads((out / "pareto.json").read_text())["chosen"] is None
    assert searching.main(["show", str(out)]) == 0
    assert "not even all-FP32" in " ".join(capsys.readouterr().out.split())


def test_an_embedding_pinned_to_int4_ships_gathering_from_4_bit_blocks(tmp_path):
    """With INT4 searched, --override 'embed=int4' pins an embedding: every plan gathers its rows from 4-bit blocks,
    best/ ships ONNX Runtime's GatherBlockQuantized and beside it TensorRT's copy, the INT4 table dequantized
    before its Gather; the table's FP32 copy is in neither."""
    table = np.random.default_rng(4).normal(0, 0.5, (300, 256))
    model = builders.save(builders.embedding_lookup(table), tmp_path / "embed.onnx")
    out = tmp_path / "out"
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(model), space=autoprec.SpaceSpec(precisions=["int4", "fp32"], overrides=["embed=int4"]),
        study=autoprec.StudySpec(budget=2), out=out, retime_seconds=1, ship_within_noise=True))
    assert result.trials and all(t.plan.as_dict()["embed"] is Precision.INT4 for t in result.trials)
    best = onnx.load(str(out / "best" / "model.onnx"), load_external_data=False)
    assert {n.name: n.op_type for n in best.graph.node}["embed"] == "GatherBlockQuantized"
    trt = onnx.load(str(out / "best" / "model.tensorrt.onnx"), load_external_data=False)
    gather = next(n for n in trt.graph.node if n.name == "embed")
    dequantize = next(n for n in trt.graph.node if gather.input[0] in n.output)
    assert dequantize.op_type == "DequantizeLinear"
    assert {t.name: t.data_type for t in trt.graph.initializer}[dequantize.input[0]] == onnx.TensorProto.INT4
    assert "table" not in {t.name for graph in (best.graph, trt.graph) for t in graph.initializer}


def test_an_override_naming_an_embedding_that_is_no_unit_says_why(tmp_path, capsys):
    """--override 'embed=int4' with INT4 not searched: the Gather exists but is no unit (an embedding is one only where
    INT4 is searched) — said so, not as a typo ("matches no unit")."""
    from cli import exit_code

    model = builders.save(builders.embedding_lookup(np.random.default_rng(4).normal(0, 0.5, (300, 64))),
                          tmp_path / "e.onnx")
    code = exit_code(["search", model, "--precisions", "int8,fp32", "--override", "embed=int4", "--budget", "2",
                      "--out", tmp_path / "o", "--no-progress"])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "names a Gather node of e.onnx that is no precision unit" in said, said
    assert "where int4 is searched, embeddings" in said


def test_int4_is_searched_when_asked_for_and_its_plans_ship_4_bit_weights(tmp_path):
    """By default INT4 is left out (said why); with --precisions int4,fp32 the study seeds all-INT4, measures
    INT4 plans, and a plan holding INT4 units ships as ONNX Runtime's MatMulNBits, TensorRT's copy beside it."""
    from autoprec.app.resolve import engine_space
    from autoprec.backends import get_backend

    _, searched, left_out = engine_space(load_search_space(), get_backend("ort-cpu"), None)
    assert "int4" not in searched and "--precisions int4,int8,fp16,fp32" in left_out["int4"]
    model = builders.save(builders.weight_only_mlp(batch=1, features=256, hidden=1024, out=256), tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(model), space=autoprec.SpaceSpec(precisions=["int4", "fp32"]),
        study=autoprec.StudySpec(budget=3), out=out, retime_seconds=1, ship_within_noise=True))
    assert any(t.plan.counts().get("int4", 0) == 2 for t in result.trials)
    shipped = json.loads((out / "best" / "plan.json").read_text())["plan"]["counts"].get("int4", 0)  # the re-timing picks
    best = onnx.load(str(out / "best" / "model.onnx"))
    assert [n.op_type for n in best.graph.node].count("MatMulNBits") == shipped
    if shipped:
        trt = onnx.load(str(out / "best" / "model.tensorrt.onnx"))
        assert [t.data_type for t in trt.graph.initializer].count(onnx.TensorProto.INT4) == shipped
    from autoprec.app.verbs import lowered_for_export

    all_int4 = next(t.number for t in result.trials if t.plan.counts().get("int4", 0) == 2)
    exported = lowered_for_export(out, trial=all_int4).model  # lowered again (export --trial): as measured
    assert [n.op_type for n in exported.proto.graph.node].count("MatMulNBits") == 2
    # the kernel measured once, before the trials: level 4 (INT8 activations) only where timed faster than float
    kernels = json.loads((out / "pareto.json").read_text())["search"]["int4_kernels"]
    timed = kernels["integer_over_float"]
    assert timed["low"] <= timed["speedup"] <= timed["high"] and kernels["rounds"] >= 3
    assert kernels["accuracy_level"] == (4 if timed["low"] > 1 else 0)
    zeros = kernels["zero_points"]  # what a zero point per block costs at that level
    assert zeros["low"] <= zeros["speedup"] <= zeros["high"]
    from autoprec.lower.int4 import valid_kernels

    # as kept in the study and beside the model; edited (by hand, by another tool), it is measured again
    assert valid_kernels(kernels) == kernels
    for edited in ({"accuracy_level": 4}, {**kernels, "accuracy_level": 2}, {**kernels, "accuracy_level": "4"},
                   {**kernels, "integer_over_float": {"speedup": "fast"}}, [kernels], None,
                   {**kernels, "zero_points": {**zeros, "speedup": 0}}):
        assert valid_kernels(edited) is None, edited
    levels = {a.i for graph in (best.graph, exported.proto.graph) for n in graph.node if n.op_type == "MatMulNBits"
              for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {kernels["accuracy_level"]}
    # the record decides, not the cache: a result recording the other level, its cache gone, exports at that one
    pareto = json.loads((out / "pareto.json").read_text())
    other = 4 - kernels["accuracy_level"]
    pareto["search"]["int4_kernels"]["accuracy_level"] = other
    (out / "pareto.json").write_text(json.dumps(pareto))
    shutil.rmtree(out / "cache")
    exported = lowered_for_export(out, trial=all_int4).model
    assert {a.i for n in exported.proto.graph.node if n.op_type == "MatMulNBits"
            for a in n.attribute if a.name == "accuracy_level"} == {other}
    import figures

    from autoprec.results import plots

    files = read_result_dir(out)  # the figures say INT4 where the search measured it
    drawn = [plots.sensitivity_figure(files.sensitivity, files.model_name), plots.layers_figure(files)]
    legends = [t.get_text() for fig in drawn for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    fronted = any("int4" in t.precisions.values() for t in files.shown_front())  # the timings decide the front
    assert "int4 alone" in legends and ("int4" in legends) == fronted, legends
    for fig in drawn:
        assert figures.problems(fig) == [] and all("$" not in text for text in figures.tick_texts(fig))


@pytest.mark.parametrize("name", ["ort-cuda", "ort-tensorrt"])
def test_a_cuda_session_only_judged_takes_default_convolutions_and_a_timed_one_searches_them(monkeypatch, name):
    """cuDNN's exhaustive algorithm search (a deployment session's default) costs about a second at each new
    shape's first run, its heuristic query most of that on ppocr-rec: paid where a session is timed, not where
    its outputs are only judged, which one session does at every shape (no second build)."""
    from pathlib import Path

    from autoprec.backends import onnxruntime as ort_backend
    from autoprec.backends.onnxruntime import OrtCudaBackend, OrtTensorRTBackend

    asked, sessions = [], []
    monkeypatch.setattr(ort, "OrtValue", DeviceArray)

    def new_session(ort, model, options, providers):
        asked.append({p[0]: p[1] for p in providers if isinstance(p, tuple)}["CUDAExecutionProvider"])
        return CudaSession(engine.provider, sessions), ()

    monkeypatch.setattr(ort_backend, "new_session", new_session)
    engine = object.__new__(OrtCudaBackend if name == "ort-cuda" else OrtTensorRTBackend)  # no GPU needed
    engine._ort, engine.device, engine.threads, engine.cache = None, 0, 0, Path("unused")
    monkeypatch.setattr(type(engine), "session_options", lambda self: None)
    conv = StoredModel(builders.conv_net("N"), Path("unused"))
    with engine.judging_runner(conv) as runner:
        for batch in (32, 1, 32):
            assert runner.run({"x": np.zeros((batch, 1, 16, 16), np.float32)})["y"].shape[0] == batch
    engine.runner(conv)
    assert [a["cudnn_conv_algo_search"] for a in asked] == ["DEFAULT", "EXHAUSTIVE"]
    assert len(sessions) == 2


@pytest.mark.parametrize("name", ["ort-cuda", "ort-tensorrt"])
def test_a_cuda_session_of_convolutions_never_meets_a_second_shape(monkeypatch, name):
    """ONNX Runtime's CUDA convolutions plan their cuDNN kernels again at every change of input shape
    (about a second each on yolov8n at batch 32): a plan judged and timed at batch 32 and batch 1 in
    turn ran each of its sessions at one shape only, its outputs and timings those of its shape. A
    graph with no convolution, and TensorRT's engines (built for a range of shapes), keep one session."""
    from pathlib import Path

    from autoprec.backends import onnxruntime as ort_backend
    from autoprec.backends.onnxruntime import OrtCudaBackend, OrtTensorRTBackend

    sessions = []
    monkeypatch.setattr(ort, "OrtValue", DeviceArray)
    monkeypatch.setattr(ort_backend, "new_session",
                        lambda ort, model, options, providers: (CudaSession(engine.provider, sessions), ()))
    engine = object.__new__(OrtCudaBackend if name == "ort-cuda" else OrtTensorRTBackend)  # no GPU needed
    engine._ort, engine.device, engine.threads, engine.cache = None, 0, 0, Path("unused")
    monkeypatch.setattr(type(engine), "session_options", lambda self: None)
    at = {batch: {"x": np.zeros((batch, 1, 16, 16), np.float32)} for batch in (32, 1)}
    conv = builders.conv_net("N")
    # a network whose weights a session per shape would hold on the GPU again and again keeps one session
    for graph, weights in ((conv, ort_backend.PER_SHAPE_MAX_WEIGHTS), (builders.mlp(), 1 << 30), (conv, 100)):
        monkeypatch.setattr(ort_backend, "PER_SHAPE_MAX_WEIGHTS", weights)
        sessions.clear()
        with engine.runner(StoredModel(graph, Path("unused"))) as runner:
            outputs = [runner.run(at[32]), runner.run(at[1]), runner.run(at[32])]
            assert [o["y"].shape[0] for o in outputs] == [32, 1, 32]
            for batch in (32, 1, 32, 1):
                assert runner.time(at[batch], Runs(warmup=1, min_seconds=0.0)).runs == 3
        per_shape = name == "ort-cuda" and graph is conv and weights > 100
        assert [len(set(s.shapes)) for s in sessions] == ([1, 1] if per_shape else [2]), (graph.graph.node[0].op_type,
                                                                                       weights)


class CudaSession:
    """A CUDA session's IO-binding calls, each run's input shape kept (``made``: every session)."""

    def __init__(self, provider: str, made: list):
        self.provider, self.shapes = provider, []
        made.append(self)

    def get_providers(self):
        return [self.provider]

    def get_outputs(self):
        return [type("Output", (), {"name": "y"})]

    def io_binding(self):
        return Binding(self)

    def run_with_iobinding(self, binding):
        self.shapes.append(binding.shape)


class Binding:
    """An IO binding whose output has the input's shape."""

    def __init__(self, session: CudaSession):
        self.session, self.shape = session, None

    def bind_ortvalue_input(self, name, value):
        self.shape = value.shape

    def bind_output(self, name, *where):
        pass

    bind_ortvalue_output = bind_output

    def get_outputs(self):
        return [np.zeros(self.shape, np.float32)]

    copy_outputs_to_cpu = get_outputs

    def synchronize_outputs(self):
        pass


class DeviceArray:
    """OrtValue's copy to the device, kept on the host."""

    @staticmethod
    def ortvalue_from_numpy(array, device, device_id):
        return array


def test_a_negative_shape_weight_given_through_the_api_is_one_line_before_any_work(tmp_path):
    """The command line's parser refused a negative weight, the API took it: the search ran to its end and failed
    writing a NaN into its choice."""
    model, data = builders.conv_with_data(tmp_path, 8)
    config = autoprec.SearchConfig(autoprec.InputSpec(model, data=data, shape_weights={"opt": -5}), out=tmp_path / "o")
    with pytest.raises(autoprec.AutoprecError, match=r"--shape-weights opt=-5: runs per request are a whole number"):
        autoprec.search(config)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad, said", [
    (lambda model: autoprec.SearchConfig(autoprec.InputSpec(model), judge=autoprec.JudgeSpec(max_loss="0.01")),
     "--max-loss '0.01': a number"),
    (lambda model: autoprec.SearchConfig(autoprec.InputSpec(model),
                                         isolation=autoprec.IsolationSpec(trial_timeout="10")),
     "--trial-timeout '10': a number"),
    (lambda model: autoprec.SearchConfig(str(model)), r"SearchConfig\(inputs=...\): takes InputSpec\(...\), not a str"),
])
def test_wrong_types_given_through_the_api_are_one_line(tmp_path, bad, said):
    """What the command line's parser refuses by type, the API took and failed on with a TypeError or an
    AttributeError from deep inside."""
    model = builders.save(builders.conv_net(), tmp_path / "conv.onnx")
    with pytest.raises(autoprec.AutoprecError, match=said):
        autoprec.search(bad(model))

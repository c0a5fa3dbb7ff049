"""Builds spent where they decide: the latency model, the reference executor and the proposals."""

import json

import optuna
import pytest
import searching

import autoprec
from autoprec.record.trial import Features
from autoprec.study.latency_model import LatencyModel, median_error_percent
from autoprec.study.proposals import hypervolume


def test_the_latency_model_reads_the_profiles_then_learns_what_a_mixed_plan_costs():
    model = LatencyModel(10.0, {"a": {"int8": 0.3, "fp16": 0.2}, "b": {"int8": 0.1}})
    assert model.predict(Features(0.4, 0.0, 0)) == pytest.approx(6.0)  # before any trial: the profiles' reading
    truth = (0.7, 0.9, 0.05)  # savings hold at 70 % / 90 % in mixed plans; each conversion costs 0.05 ms
    plans = [Features(i8, f16, n) for i8 in (0.0, 0.2, 0.4) for f16 in (0.0, 0.1, 0.3) for n in (0, 4, 12)]
    measured = [
        (f, 10.0 * (1 - truth[0] * f.saved_int8 - truth[1] * f.saved_fp16) + truth[2] * f.conversions) for f in plans
    ]
    model.refit(measured)
    assert model.coefficients == pytest.approx(truth, abs=0.03)
    assert median_error_percent([(model.predict(f), ms) for f, ms in measured]) < 1.0
    assert median_error_percent([(11.0, 10.0), (9.0, 10.0), (10.0, 10.0)]) == 10.0


def test_hypervolume_of_two_dimensional_fronts():
    assert hypervolume([(0.5, 0.5)]) == pytest.approx(0.5)  # (1.5 - 0.5) x (1.0 - 0.5)
    assert hypervolume([(0.5, 0.5), (1.0, 0.2)]) == pytest.approx(0.5 + 0.5 * 0.3)
    assert hypervolume([(0.5, 0.5), (0.6, 0.6), (2.0, 0.0)]) == pytest.approx(0.5)  # dominated or outside: nothing


@pytest.fixture(scope="module")
def proposed(tmp_path_factory):
    import builders

    root = tmp_path_factory.mktemp("proposals")
    model, data = builders.conv_with_data(root, 12)
    out = root / "out"
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data),
            judge=autoprec.JudgeSpec(max_loss=0.01),
            study=autoprec.StudySpec(budget=8, proposals=4),
            out=out,
        )
    )
    return out, result


def test_with_proposals_only_the_plans_that_decide_are_built_and_every_build_is_counted(proposed):
    out, result = proposed
    search = json.loads((out / "pareto.json").read_text())["search"]
    trials = json.loads((out / "trials.json").read_text())["trials"]
    phases = search["engine_builds_by_phase"]
    assert search["trials"] == 8 and phases["trials"] == 8  # --budget counts builds of the target
    assert phases["profiles"] == 3 and phases["retiming"] >= 1  # the FP32 model and the two all-units plans
    assert search["engine_builds"] == sum(phases.values())
    keys = [json.dumps(t["plan"]["precisions"], sort_keys=True) for t in trials]
    assert len(set(keys)) == len(keys)  # no plan built twice
    reference = search["reference"]
    assert reference["proposals_per_build"] == 4 and "the target engine itself" in reference["executor"]
    predictions = reference["predictions"]
    assert predictions and all(p["reference_loss"] <= 0.01 for p in predictions)  # only plans the reference let through
    # the all-FP32 plan is built first (the latency model starts from it), then the other uniform plans the
    # reference let through; every later build was a proposal chosen on its prediction and its reference loss
    assert set(trials[0]["plan"]["precisions"].values()) == {"fp32"}
    assert [p["trial"] for p in predictions] == list(range(8 - len(predictions), 8)) and len(predictions) >= 5
    assert reference["loss_gap"]["max_abs"] == 0.0  # on ort-cpu the reference is the target: same graph, same numbers
    assert reference["median_abs_error_percent"] is not None and reference["latency_model"]["fitted_on"] >= 3
    sensitivity = json.loads((out / "sensitivity.json").read_text())
    assert search["reference_evaluations"] > sensitivity["evaluations"]  # the proposals were judged there, not built
    assert result.chosen.measurement.loss <= 0.01


def test_proposals_live_in_the_study_storage_so_a_resumed_search_keeps_them(proposed):
    out, _ = proposed
    storage = f"sqlite:///{out / 'study.db'}"
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    reference = next(n for n in names if n.endswith("/reference"))
    judged = optuna.load_study(study_name=reference, storage=storage).get_trials()
    assert judged and all("reference_loss" in t.user_attrs and "features" in t.user_attrs for t in judged)


def test_with_proposals_a_uniform_plan_past_the_limit_costs_no_build(tmp_path):
    """The all-INT8 plan far past --max-loss is judged on the reference executor, not built; the warm start
    reads its judged numbers instead."""
    import builders

    model, data = builders.conv_with_data(tmp_path, 12)
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data),
            judge=autoprec.JudgeSpec(max_loss=1e-06),
            study=autoprec.StudySpec(budget=6, proposals=4),
            isolation=autoprec.IsolationSpec(isolate=False),
            out=out,
        )
    )
    built = [t["plan"]["precisions"] for t in json.loads((out / "trials.json").read_text())["trials"]]
    storage = f"sqlite:///{out / 'study.db'}"
    reference = next(
        s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name.endswith("/reference")
    )
    judged = optuna.load_study(study_name=reference, storage=storage).get_trials()
    all_int8 = [t for t in judged if set(t.params.values()) == {"int8"}]
    assert all_int8 and all_int8[0].user_attrs["reference_loss"] > 1e-6  # judged, and past the limit
    assert all_int8[0].params not in built and built[0] == dict.fromkeys(built[0], "fp32")

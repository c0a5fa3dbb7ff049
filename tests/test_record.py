"""One search record that every verb follows: check, diagnose and export start from what the search recorded."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import searching
from builders import save
from cli import refused
from searching import main
from test_tasks import ctc_head

import autoprec
from autoprec.app.recorded import recorded_config


@pytest.fixture(scope="module")
def ctc_result(tmp_path_factory):
    """A CTC recognizer searched with --metric ctc-text and a loss limit (its Softmax is a unit the default
    space has and the CPU engine's space keeps FP32)."""
    root = tmp_path_factory.mktemp("ctc")
    model = save(ctc_head(), root / "rec.onnx")
    np.savez(root / "d.npz", x=np.random.default_rng(1).normal(0, 1, (16, 12, 8)).astype(np.float32))
    out = root / "out"
    assert main(["search", str(model), "--data", str(root / "d.npz"), "--metric", "ctc-text", "--max-loss", "0.5",
                 "--budget", "4", "--out", str(out), "--no-progress"]) == 0
    return model, root / "d.npz", out


def test_the_search_records_its_spec_groups_and_the_api_reads_them_back(ctc_result):
    model, data, out = ctc_result
    config = recorded_config(out)
    assert config.judge == autoprec.JudgeSpec("ctc-text", 0.5)
    assert config.inputs.model == str(model) and config.inputs.data == str(data)
    assert config.engine == autoprec.EngineSpec("ort-cpu") and config.study.budget == 4
    assert recorded_config(model, out / "best" / "plan.json") == config  # best/plan.json carries the same record


def test_check_passes_the_searchs_own_choice_with_no_option_repeated(ctc_result, capsys):
    _, _, out = ctc_result
    chosen = json.loads((out / "best" / "plan.json").read_text())
    assert main(["check", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["metric"] == "ctc-text" and report["max_loss"] == 0.5
    assert report["measurement"]["loss"] == pytest.approx(chosen["accuracy_loss"], abs=1e-9)
    # an option given overrides the recorded one, and says so
    assert main(["check", str(out), "--metric", "cosine", "--max-loss", "1"]) == 0
    said = capsys.readouterr()
    assert "metric cosine instead of the search's ctc-text" in said.err + said.out
    assert main(["check", str(out), "--max-loss", "-1"]) == 2  # the limit is checked where the search's is
    assert capsys.readouterr().err.strip().endswith("--max-loss -1.0: must be a finite loss of 0 or more")


def test_diagnose_a_result_and_a_model_with_its_best_plan(ctc_result, tmp_path):
    model, _, out = ctc_result
    assert main(["diagnose", str(out), "--out", str(tmp_path / "a")]) == 0
    # MODEL + best/plan.json: the search's own space (its Softmax is no unit there), not the default one
    assert main(["diagnose", str(model), "--plan", str(out / "best" / "plan.json"), "--out", str(tmp_path / "b")]) == 0
    units = [u["unit"] for u in json.loads((tmp_path / "b" / "diagnosis.json").read_text())["units"]]
    assert units == [u["unit"] for u in json.loads((tmp_path / "a" / "diagnosis.json").read_text())["units"]]


def test_check_without_a_limit_anywhere_asks_for_one(tmp_path, mlp_model, capsys):
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model), study=autoprec.StudySpec(budget=1, warm_start=False), out=out
        )
    )
    assert main(["check", str(out)]) == 2
    assert "no loss limit; give --max-loss" in capsys.readouterr().err


def test_build_counts_are_the_studys_after_a_resume(tmp_path, mlp_model):
    """A re-run of a finished search counts the study's builds: the sensitivity pass's profiles of the first
    run (read from its cache now), every run's re-timing, every trial once."""
    out = tmp_path / "out"
    config = autoprec.SearchConfig(autoprec.InputSpec(mlp_model), study=autoprec.StudySpec(budget=3), out=out)
    first = searching.search(config).search
    second = searching.search(config).search
    assert second["sensitivity"]["from_cache"] and first["engine_builds_by_phase"]["profiles"] > 0
    phases = first["engine_builds_by_phase"], second["engine_builds_by_phase"]
    assert phases[1]["profiles"] == phases[0]["profiles"] and phases[1]["trials"] == phases[0]["trials"]
    assert phases[1]["retiming"] >= phases[0]["retiming"] and "2 run(s)" in second["engine_builds_scope"]
    assert second["engine_builds"] == sum(phases[1].values())


def test_a_result_that_does_not_record_how_it_measured_is_refused_naming_the_field(ctc_result, tmp_path, capsys):
    import shutil

    _, _, out = ctc_result
    older = shutil.copytree(out, tmp_path / "older")
    for name in ("pareto.json", "trials.json", "best/plan.json"):  # as a result written before it was recorded
        document = json.loads((older / name).read_text())
        del document["search"]["data_fingerprint"]
        (older / name).write_text(json.dumps(document))
    for verb in (["check"], ["diagnose", "--out", str(tmp_path / "d")], ["export", "--format", "markdown"]):
        assert main([verb[0], str(older), *verb[1:]]) == 2
        assert "do not record 'data_fingerprint' (written by an older autoprec)" in capsys.readouterr().err


def test_a_speed_up_shows_the_digits_its_verdict_rests_on():
    """A lower bound of 1.0002 was printed 1.00 beside "beyond timing noise"; 0.9996 likewise beside "within"."""
    from autoprec.record.verdict import Speedup

    beyond = Speedup(1.10, True, 1.0002, 1.18, 0.95, 6)
    assert beyond.text() == "1.10× (1.0002–1.18, 95 %)" and beyond.verdict() == "beyond timing noise"
    assert Speedup(1.02, False, 0.9996, 1.04, 0.95, 6).text() == "1.02× (0.9996–1.04, 95 %)"
    assert Speedup(1.30, True, 1.25, 1.34, 0.95, 8).text() == "1.30× (1.25–1.34, 95 %)"
    assert Speedup(1.0, None).text() == "1.00×"


def test_latencies_show_their_digits_and_a_rival_faster_in_ms_but_not_in_the_rounds_is_said():
    """Issue 69: a range read "0.010–0.010"; a rival listed faster in ms than the chosen plan but
    slower in ×fp32 was left unexplained."""
    from autoprec.core.plan import Plan
    from autoprec.core.timing import Timing
    from autoprec.record.trial import Measurement, TrialRecord
    from autoprec.results.console import ms_range, ms_text
    from autoprec.results.rows import TrialRow, order_said

    assert ms_range(0.0101, 0.0104) == "0.0101–0.0104" and ms_range(13.3, 13.3) == "13.300–13.300"
    assert ms_text(0.0103) == "0.0103" and ms_text(13.3) == "13.300"
    assert ms_range(1.23451, 1.23459) == "1.2345–1.2346"

    def row(number: int, ms: float, over: float) -> TrialRow:
        measured = Measurement(Timing(ms, ms, ms, 10, 3), {}, 0.0, {})
        trial = TrialRecord(number, Plan({}), measured, True, retimed_ms=(ms,))
        return TrialRow(trial, (), over, True)

    assert order_said([row(1, 5.0, 2.0), row(2, 6.0, 1.7)]) is None
    said = order_said([row(1, 5.0, 2.0), row(2, 4.9, 1.9)])
    assert said.startswith("trial 2 reads faster than trial 1 in ms but slower in ×fp32")
    assert "decided" in said


@pytest.fixture(scope="module")
def narrow_result(tmp_path_factory):
    """An MLP whose output holds 3 values per item, searched by cosine (which reads rel_l2 there) with a seed
    and a search space of its own (the head pinned FP32): a data split and a space other than the defaults."""
    from builders import mlp

    root = tmp_path_factory.mktemp("narrow")
    model = save(mlp(), root / "mlp.onnx")
    np.savez(root / "d.npz", x=np.random.default_rng(2).normal(0, 1, (64, 16)).astype(np.float32))
    out = root / "out"
    assert main(["search", str(model), "--data", str(root / "d.npz"), "--max-loss", "0.5", "--budget", "4",
                 "--seed", "5", "--override", "head=fp32", "--out", str(out), "--no-progress"]) == 0
    return model, out


def test_check_and_diagnose_state_the_searchs_own_judge_and_figure(narrow_result, tmp_path, capsys):
    """On an output of 3 values per item the search's cosine is rel_l2 (it says so); check said 'cosine loss' for
    that figure and named the source model, not the plan; diagnose's 'model loss alone' was 1 - cosine, about
    1000x below the sensitivity pass's figure for the same unit. Now both say the judge as the search has it,
    name the plan, and state the figure the search recorded beside theirs; check MODEL --plan best/plan.json
    judges with the search's space and data split (seed 5), so its figure is the recorded one too."""
    model, out = narrow_result
    pareto = json.loads((out / "pareto.json").read_text())
    chosen = next(t for t in pareto["front"] if t["trial"] == pareto["chosen"])
    said = "cosine (as rel_l2 on 'y': 3 value(s) per item)"
    for argv, named in (([str(out)], f"trial {chosen['trial']} of {out}, the chosen plan"),
                        ([str(model), "--plan", str(out / "best" / "plan.json")], f"trial {chosen['trial']} in ")):
        assert main(["check", *argv]) == 0
        line = " ".join(capsys.readouterr().out.split())
        assert line.startswith(f"PASS {named}") and f"{said} loss {chosen['accuracy_loss']:.4g} (the search recorded " \
            f"{chosen['accuracy_loss']:.4g})" in line, line
    trials = {t["trial"]: t for t in json.loads((out / "trials.json").read_text())["trials"]}
    int8 = max(trials, key=lambda n: trials[n]["plan"]["counts"]["int8"])  # every searched unit INT8
    assert trials[int8]["plan"]["counts"]["int8"] == 2
    assert main(["diagnose", str(out), "--trial", str(int8), "--out", str(tmp_path / "d")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"model loss alone: {said}" in printed
    assert f"{said} loss {trials[int8]['accuracy_loss']:.4g} on the" in printed
    assert f"(the search recorded {trials[int8]['accuracy_loss']:.4g})" in printed
    diagnosed = {u["unit"]: u["alone_loss"] for u in json.loads((tmp_path / "d" / "diagnosis.json").read_text())["units"]}
    sensitivity = json.loads((out / "sensitivity.json").read_text())
    assert sensitivity["judged"] == said
    ranked = {u["unit"]: u["loss"]["int8"] for u in sensitivity["units"]}
    for unit, loss in ranked.items():  # the same judge on the same batches: the sensitivity pass's figure
        assert diagnosed[unit] == pytest.approx(loss, rel=1e-3), unit


def _other_precisions(plan: dict) -> None:
    """best/plan.json's plan, unit table and counts, all set alike to another precision than the trial measured."""
    first = plan["units"][0]
    now = plan["plan"]["precisions"][first["name"]]
    other = next(p for p in first["allowed"] if p != now)
    plan["plan"]["precisions"][first["name"]] = first["precision"] = other
    plan["plan"]["counts"][now] -= 1
    plan["plan"]["counts"][other] += 1


EDITS = {  # name: (file, edit, what the line names)
    "best plan of other precisions": ("best/plan.json", _other_precisions, "best/plan.json: trial"),
    "speed-up outside its interval": ("pareto.json", lambda d: d.update(chosen_vs_fp32={
        "fp32_trial": d["uniform"]["fp32"], "speedup": 1e308, "low": 1.1, "high": 1.2, "confidence": 0.95, "rounds": 6,
        "beyond_timing_noise": True}), "speed-up 1e+308 outside its own interval"),
    "beyond noise with an interval below 1": ("pareto.json", lambda d: d.update(chosen_vs_fp32={
        "fp32_trial": d["uniform"]["fp32"], "speedup": 0.9, "low": 0.8, "high": 1.0, "confidence": 0.95, "rounds": 6,
        "beyond_timing_noise": True}), "beyond_timing_noise is True for the interval 0.8–1"),
    "an infeasible loss called feasible": ("trials.json", lambda d: d["trials"][0].update(accuracy_loss=1e308),
                                           "feasible is True with loss 1e+308"),
    "a negative loss": ("trials.json", lambda d: d["trials"][-1].update(accuracy_loss=-0.5),
                        "accuracy_loss is -0.5, not a loss of 0 or more"),
    "a NaN latency": ("trials.json", lambda d: d["trials"][0]["latency_ms"].update(median_ms="nan"),
                      "median_ms is nan, not a time above 0"),
    "counts that are not the units": ("trials.json", lambda d: d["trials"][0]["plan"]["counts"].update(int8=9),
                                      "its plan counts"),
    "a front figure not the trial's": ("pareto.json", lambda d: d["front"][0].update(final_latency_ms=1e-9),
                                       "final_latency_ms is 1e-09"),
}


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_a_record_that_contradicts_itself_is_refused_in_every_view(conv_result, tmp_path, capsys, kind):
    """A hand-edited best/plan.json (every unit FP32) was shown beside the measured plan's speed-up and counts;
    impossible values (a speed-up outside its own interval, a loss 'within --max-loss' above it, negative losses,
    NaN latencies) were shown as they are."""
    name, edit, phrase = EDITS[kind]
    copy = tmp_path / "r"
    shutil.copytree(conv_result, copy)
    document = json.loads((copy / name).read_text())
    edit(document)
    (copy / name).write_text(json.dumps(document))
    for argv in (["show", copy], ["show", copy, "--json"], ["compare", copy, conv_result],
                 ["export", copy, "--format", "markdown", "--out", tmp_path / "md"]):
        refused(argv, capsys, name, phrase)

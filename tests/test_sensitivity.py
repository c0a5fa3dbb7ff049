import json
import math

import numpy as np
import optuna
import pytest
import searching

import autoprec
from autoprec.analysis.data import build_dataset
from autoprec.analysis.model import analyse
from autoprec.backends import get_backend
from autoprec.backends.onnxruntime import attribute_node_times
from autoprec.core.plan import Plan, Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm
from autoprec.measure.accuracy import Judge, Metric
from autoprec.measure.downstream import Downstream
from autoprec.measure.measurement import (
    InProcessMeasurer,
    Lowering,
    Rejected,
    Screen,
    accuracy_loss,
    measure,
)
from autoprec.record.per_unit import Sensitivity, UnitSensitivity
from autoprec.study.sensitivity import (
    analyse_sensitivity,
    cached_sensitivity,
    latency_shares,
    one_unit_plans,
    unit_times,
)
from autoprec.study.warm_start import warm_start_params


@pytest.fixture
def conv_prepared(conv_model, conv_data):
    space = load_search_space()
    # as ort-cpu searches it by default: the softmax stays FP32, INT4 left out
    info = analyse(conv_model, space.with_pinned(space.sensitive).restricted((Precision.INT8, Precision.FP16)))
    dataset = build_dataset(conv_data, info.inputs, seed=0)
    from autoprec.analysis.calibrate import calibrate
    from autoprec.analysis.reference import reference_outputs

    ranges = calibrate(info, dataset.calibration, dataset.fingerprint())
    reference = reference_outputs(info, dataset.evaluation, dataset.fingerprint())
    return info, dataset, ranges, reference


def test_profiled_names_are_mapped_back_to_the_models_nodes():
    import builders

    model = builders.conv_net()
    events = [
        {"name": "conv0_kernel_time", "dur": 100},  # kept its name
        {"name": "c1_nchwc_kernel_time", "dur": 200},  # layout-converted: named after its output tensor (conv1's)
        {"name": "relu2/FusedActivation_kernel_time", "dur": 50},  # fused: named after the first node
        {"name": "ReorderOutput_token_7_kernel_time", "dur": 30},  # inserted by ORT: no original node
        {"name": "InsertedPrecisionFreeCast_c2_nchwc_kernel_time", "dur": 70},  # an FP16 node ORT runs in FP32
        # MatMul+Add+Relu as FusedGemm: "fused " before the MatMul+Add fusion's name (it went to "" before)
        {"name": "fused fc/MatMulAddFusion_kernel_time", "dur": 40},
    ]
    times = attribute_node_times(model, events, runs=10)
    assert times == pytest.approx({"conv0": 1e-5, "conv1": 2e-5, "relu2": 5e-6, "": 3e-6, "conv2": 7e-6, "fc": 4e-6})


def test_latency_shares_come_from_the_engines_profile(conv_prepared):
    info, dataset, _, _ = conv_prepared
    shares, unattributed = latency_shares(info, get_backend("ort-cpu").node_times(info.stored, dataset.evaluation[0]))
    assert set(shares) <= {u.name for u in info.units}
    assert {"conv0", "conv1", "conv2"} <= set(shares)  # the convolutions show up in the profile
    assert all(s > 0 for s in shares.values())
    assert sum(shares.values()) + unattributed <= 1.0 + 1e-9


def test_each_units_loss_is_that_of_the_one_unit_plan_measured_on_its_own(conv_prepared):
    info, dataset, ranges, reference = conv_prepared
    engine = get_backend("ort-cpu")
    batches, refs = dataset.evaluation[:2], reference[:2]
    found = analyse_sensitivity(
        info,
        engine,
        ranges,
        lambda plan: accuracy_loss(engine, engine.lower(info, plan, ranges), batches, Judge(Metric(), refs)),
        batches[0],
        2,
    )
    assert found.evaluations == sum(len(u.allowed) - 1 for u in info.searchable_units)
    assert [u.unit for u in found.units] == [u.name for u in info.searchable_units]
    conv1 = next(u for u in found.units if u.unit == "conv1")
    alone = measure(
        engine, engine.lower(info, info.plan_at(Precision.INT8, ["conv1"]), ranges), batches, Judge(Metric(), refs)
    )
    assert conv1.loss["int8"] == pytest.approx(alone.loss, rel=1e-6, abs=1e-9)
    assert all(
        u.loss["fp16"] < u.loss["int8"] for u in found.units if "int8" in u.loss
    )  # FP16 keeps 10 mantissa bits, INT8 256 levels


def _sens(
    losses: dict[str, tuple[float, float]], shares: dict[str, float], gains: dict[str, dict] | None = None
) -> Sensitivity:
    units = tuple(UnitSensitivity(n, "Conv", shares[n], {"int8": i8, "fp16": f16}, (gains or {}).get(n, {}))
                  for n, (i8, f16) in losses.items())
    return Sensitivity(units, 0.0, 1, 2 * len(units), 0.0, "test")


def test_inserted_qdq_time_is_charged_to_the_lowered_units_beside_it(conv_prepared):
    info, _, ranges, _ = conv_prepared
    engine = get_backend("ort-cpu")
    lowered = engine.lower(info, info.plan_at(Precision.INT8, ["conv0"]), ranges)
    times = {n.name: 1.0 for n in lowered.graph.node}  # one second per node
    spent = unit_times(info, lowered, times, frozenset({"conv0"}))
    inserted = {n.name for n in lowered.graph.node} - {n.name for n in info.model.graph.node}
    assert len(inserted) == 5  # Q/DQ of x, Q/DQ of conv0's output, DQ of its weight
    assert spent["conv0"] == 2 + len(inserted)  # Conv + Relu + all lowering added around it
    assert spent["conv1"] == 3 and spent["conv2"] == 2 and spent["fc"] == 1  # FP32 units: their own nodes only
    # the same Q/DQ between two lowered units is shared between them
    both = engine.lower(
        info,
        Plan.from_mapping(
            {u.name: Precision.INT8 if u.name in ("conv0", "conv1") else Precision.FP32 for u in info.units}
        ),
        ranges,
    )
    shared = unit_times(info, both, {n.name: 1.0 for n in both.graph.node}, frozenset({"conv0", "conv1"}))
    added = {n.name for n in both.graph.node} - {n.name for n in info.model.graph.node}
    assert shared["conv0"] == 2 + 3 + 2 / 2  # its own, x's Q/DQ and its weight's DQ, half the Q/DQ it shares with conv1
    assert shared["conv0"] + shared["conv1"] == 5 + len(added)  # every inserted node charged once


def test_sensitivity_profiles_what_each_unit_saves_in_each_precision(conv_prepared):
    info, dataset, ranges, _ = conv_prepared
    found = analyse_sensitivity(info, get_backend("ort-cpu"), ranges, lambda m: 0.0, dataset.evaluation[0], 1)
    # every unit is found in both profiles (ORT renames FP16 nodes it runs in FP32 between its own Casts)
    assert all(set(u.gain) == {"int8", "fp16"} for u in found.units)
    for u in found.units:  # a unit cannot save more than the time it took in FP32 (separate runs: 2x slack)
        assert all(g < 2 * u.share + 0.05 for g in u.gain.values()), (u.unit, u.gain, u.share)


def test_warm_start_lowers_the_least_sensitive_units_per_latency_first(conv_prepared):
    info = conv_prepared[0]
    names = [u.name for u in info.searchable_units]  # conv0, conv1, conv2, fc
    sens = _sens(
        {names[0]: (1e-3, 1e-6), names[1]: (1e-4, 1e-6), names[2]: (1e-2, 1e-6), names[3]: (1e-4, 1e-6)},
        {names[0]: 0.4, names[1]: 0.4, names[2]: 0.1, names[3]: 0.01},
    )
    # per share: conv1 2.5e-4, conv0 2.5e-3, fc 1e-2, conv2 1e-1
    uniform = {"fp32": (10.0, 0.0), "int8": (6.0, 0.02), "fp16": (12.0, 1e-5)}
    plans = warm_start_params(info, sens, max_loss=0.01, uniform=uniform)
    assert plans and all("fp16" not in p.values() for p in plans)  # all-FP16 was slower than FP32: nothing gained
    lowered = [{n for n, p in plan.items() if p == "int8"} for plan in plans]
    # all-INT8 is faster but past the limit: the units nearest the input are also kept, 1 and 2 of them
    leading = [set(names[1:]), set(names[2:])]
    assert all(s in lowered for s in leading)
    order = [names[1], names[0], names[3], names[2]]
    ranked = [s for s in lowered if s not in leading]
    assert all(s == set(order[: len(s)]) for s in ranked)  # otherwise always a prefix of the ranking
    assert {len(s) for s in ranked} >= {1, 2, 3}
    # Predicted loss = running sum scaled to the uniform plan's (0.02 / 0.0112): 2 * 0.01 is crossed at the
    # 4th unit, 0.0025 at the 2nd; with FP16 fast too, it gets plans of its own.
    faster = warm_start_params(info, sens, 0.01, {**uniform, "fp16": (8.0, 1e-5)})
    assert any("fp16" in p.values() for p in faster) and len(faster) > len(plans)


def test_warm_start_lowers_only_units_that_save_time_even_when_the_all_units_plan_is_slower(conv_prepared):
    info = conv_prepared[0]
    names = [u.name for u in info.searchable_units]
    losses = {n: (1e-4 * (i + 1), 1e-6) for i, n in enumerate(names)}
    shares = dict.fromkeys(names, 0.25)
    # INT8 profiled: the two first units save time, the others lose more; FP16 saves nothing anywhere
    gains = {n: {"int8": g, "fp16": -0.01} for n, g in zip(names, (0.1, 0.05, -0.2, -0.3))}
    uniform = {"fp32": (10.0, 0.0), "int8": (13.0, 0.002), "fp16": (12.0, 1e-5)}
    plans = warm_start_params(info, _sens(losses, shares, gains), max_loss=None, uniform=uniform)
    lowered = [{n for n, p in plan.items() if p != "fp32"} for plan in plans]
    assert {frozenset(s) for s in lowered} == {frozenset(names[:1]), frozenset(names[:2])}
    assert all(set(plan.values()) <= {"int8", "fp32"} for plan in plans)
    # without a profile, the slower all-units plan rules INT8 out
    assert warm_start_params(info, _sens(losses, shares), max_loss=None, uniform=uniform) == []
    # where the all-units plan is faster, lowering pays on the whole: ranked per share, losers included
    faster = warm_start_params(
        info, _sens(losses, shares, gains), max_loss=None, uniform={**uniform, "int8": (7.0, 0.002)}
    )
    assert {frozenset(n for n, p in plan.items() if p == "int8") for plan in faster} >= {frozenset(names[:3])}
    # all-INT8 never timed (rejected early for its loss): not known which holds, so both rankings seed plans
    untimed = {k: v for k, v in uniform.items() if k != "int8"}
    last_saves = {n: {"int8": 0.3 if n == names[-1] else -0.1, "fp16": -0.01} for n in names}
    both = warm_start_params(info, _sens(losses, shares, last_saves), max_loss=0.01, uniform=untimed)
    lowered = {frozenset(n for n, p in plan.items() if p == "int8") for plan in both}
    assert {frozenset(names[-1:]), frozenset(names[:3])} <= lowered  # per time saved; per share


def test_warm_start_mixes_precisions_unit_by_unit_where_each_saves_most_per_loss(tmp_path):
    """Two INT4-capable units: INT4 saves a little more than INT8 at a small loss on "mm" and at a large one on
    "gemm". Within 0.01 the plan that pays best is INT4 on mm and INT8 on gemm, which no plan of one precision
    is: the warm start seeds it (and no mix past the limit's largest target)."""
    import builders

    info = analyse(builders.save(builders.weight_only_mlp(), tmp_path / "mlp.onnx"), load_search_space())
    assert {u.name for u in info.dimensions} == {"mm", "gemm"}
    units = (UnitSensitivity("mm", "MatMul", 0.5, {"int4": 2e-3, "int8": 1e-4, "fp16": 1e-6},
                             {"int4": 0.45, "int8": 0.35, "fp16": -0.1}),
             UnitSensitivity("gemm", "Gemm", 0.5, {"int4": 5e-2, "int8": 2e-4, "fp16": 1e-6},
                             {"int4": 0.4, "int8": 0.3, "fp16": -0.1}))
    sens = Sensitivity(units, 0.0, 1, 6, 0.0, "test")
    uniform = {"fp32": (10.0, 0.0), "int4": (3.0, 0.06), "int8": (4.0, 3e-4), "fp16": (12.0, 1e-6)}
    plans = warm_start_params(info, sens, max_loss=0.01, uniform=uniform)
    assert {"mm": "int4", "gemm": "int8"} in plans
    assert all(not ("int4" in p.values() and "int8" in p.values()) or p == {"mm": "int4", "gemm": "int8"}
               for p in plans)  # INT4 on gemm (0.05) is past 2 × 0.01
    # without a limit the path ends at INT4 everywhere: the uniform plan, seeded apart; no mix
    assert all(len(set(p.values()) - {"fp32"}) == 1 for p in warm_start_params(info, sens, None, uniform))
    # the profile says INT8 on gemm loses time, but all-INT8 measured fastest within the limit: a path starts
    # there too (a unit's profiled loss can be the whole plan's gain)
    slow = Sensitivity((units[0], UnitSensitivity("gemm", "Gemm", 0.5, {"int4": 5e-2, "int8": 2e-4, "fp16": 1e-6},
                                                  {"int4": -0.05, "int8": -0.1, "fp16": -0.2})), 0.0, 1, 6, 0.0, "test")
    assert {"mm": "int4", "gemm": "int8"} in warm_start_params(info, slow, max_loss=0.01, uniform=uniform)


def test_sensitivity_is_read_back_when_measured_the_same_way(tmp_path):
    sens = _sens({"a": (1e-3, 1e-6), "b": (math.inf, 2e-6)}, {"a": 0.5, "b": 0.25})  # b's INT8 plan failed
    calls = []

    def compute():
        calls.append(1)
        return sens

    path = tmp_path / "sensitivity.json"
    first, cached = cached_sensitivity(path, "k1", compute)
    assert not cached and first == sens and json.loads(path.read_text())["key"] == "k1"  # strict JSON, inf kept
    again, cached = cached_sensitivity(path, "k1", compute)
    assert cached and again == sens and len(calls) == 1
    _, cached = cached_sensitivity(path, "k2", compute)  # another model, data or engine: measured again
    assert not cached and len(calls) == 2


def test_screening_rejects_a_candidate_far_past_the_limit_before_timing_it(conv_prepared):
    info, dataset, ranges, reference = conv_prepared
    engine = get_backend("ort-cpu")
    int8 = engine.lower(info, info.plan_at(Precision.INT8, ["conv1"]), ranges)
    full = measure(engine, int8, dataset.evaluation, Judge(Metric(), reference))
    screened = Screen(batches=1, reject_above=full.loss / 1000)
    with pytest.raises(Rejected) as rejected:
        measure(engine, int8, dataset.evaluation, Judge(Metric(), reference), screen=screened)
    found = rejected.value.screened
    assert found.batches == 1 and found.loss > screened.reject_above
    assert "time" not in found.seconds  # stopped before timing
    kept = measure(engine, int8, dataset.evaluation, Judge(Metric(), reference), screen=Screen(1, full.loss * 1000))
    assert kept.loss == pytest.approx(full.loss) and kept.latency.runs >= 10
    assert Screen.for_search(None, 8) is None and Screen.for_search(0.01, 1) is None
    assert Screen.for_search(0.01, 8) == Screen(2, 0.04)


def test_search_runs_the_sensitivity_pass_warm_starts_and_rejects_early(tmp_path, conv_model, conv_data):
    out = tmp_path / "out"
    max_loss = 1e-7  # so tight that lowered plans fail on their first batch
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(conv_model, data=conv_data),
            judge=autoprec.JudgeSpec(max_loss=max_loss),
            study=autoprec.StudySpec(budget=8),
            out=out,
        ),
        plots=True,
    )
    facts = json.loads((out / "pareto.json").read_text())["search"]
    assert facts["sensitivity"]["evaluations"] > 0 and not facts["sensitivity"]["from_cache"]
    assert (out / "sensitivity.json").exists() and (out / "sensitivity.png").read_bytes()[:4] == b"\x89PNG"
    study = optuna.load_study(study_name="autoprec-conv-ort-cpu", storage=f"sqlite:///{out / 'study.db'}")
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert facts["rejected"] and len(facts["rejected"]) == len(pruned)
    assert all(r["loss"] > 4 * max_loss and r["batches"] == facts["early_reject"]["batches"] for r in facts["rejected"])
    assert len(result.trials) + len(pruned) + sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials) == 8
    assert not ({t.number for t in pruned} & {t.number for t in result.trials})  # rejected: never on the front
    # Running it again reuses the sensitivity and the measured trials.
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(conv_model, data=conv_data),
            judge=autoprec.JudgeSpec(max_loss=max_loss),
            study=autoprec.StudySpec(budget=9),
            out=out,
        )
    )
    again = json.loads((out / "pareto.json").read_text())["search"]
    assert again["sensitivity"]["from_cache"] and again["trials"] + len(again["rejected"]) <= 9


def test_sensitivity_command_writes_its_files(tmp_path, conv_model, conv_data, capsys):
    from searching import main

    code = main(
        ["sensitivity", str(conv_model), "--data", str(conv_data), "--out", str(tmp_path / "s"), "--no-progress"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "sensitivity" in printed and "conv1" in printed and "onnxruntime" in printed
    data = json.loads((tmp_path / "s" / "sensitivity.json").read_text())
    assert {u["unit"] for u in data["units"]} == {"conv0", "conv1", "conv2", "fc"}
    assert all(math.isfinite(v) for u in data["units"] for v in u["loss"].values())
    assert (tmp_path / "s" / "sensitivity.png").exists()
    assert main(["sensitivity", str(conv_model), "--data", str(conv_data), "--out", str(tmp_path / "s"),
                 "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluations"] == data["evaluations"]  # read back, same figures


def test_a_sensitive_unit_is_searched_only_where_alone_it_stays_within_the_limit_and_saves_time(tmp_path):
    from autoprec.study.sensitivity import searched_sensitive
    from tests import builders

    info = analyse(builders.save(builders.transformer_block(), tmp_path / "block.onnx"), load_search_space())
    compute = {
        u.name: UnitSensitivity(u.name, u.op_type, 0.2, {"int8": 1e-3, "fp16": 1e-5}, {"int8": 0.05, "fp16": 0.05})
        for u in info.searchable_units
        if not u.sensitive
    }

    def sensitivity(ln: tuple[float, float], softmax: tuple[float, float]) -> Sensitivity:
        found = [UnitSensitivity(name, "x", 0.01, {"fp16": loss}, {"fp16": gain})
                 for name, (loss, gain) in (("ln_mean", ln), ("softmax", softmax))]
        return Sensitivity((*compute.values(), *found), 0.0, 1, 0, 0.0, "test")

    def searched(found, max_loss=0.01):
        kept, facts = searched_sensitive(info, found, max_loss)
        return [u.name for u in kept.searchable_units if u.sensitive], facts, kept

    names, facts, _ = searched(sensitivity((1e-4, 0.01), (1e-5, 0.002)))
    assert names == ["ln_mean", "softmax"] and facts == {"found": 2, "searched": 2, "too_lossy": 0, "no_gain": 0}
    names, facts, kept = searched(sensitivity((0.05, 0.01), (1e-5, -0.001)))  # past the limit alone; slower in FP16
    assert names == [] and facts == {"found": 2, "searched": 0, "too_lossy": 1, "no_gain": 1}
    assert kept.unit("softmax").allowed == (Precision.FP32,) and "kept out of fp16" in kept.notes[-1]
    assert len(kept.searchable_units) == len(compute)  # the compute units are untouched
    names, _, _ = searched(sensitivity((0.05, 0.01), (1e-5, 0.002)), max_loss=None)  # no limit: the loss rules none out
    assert names == ["ln_mean", "softmax"]
    names, facts, _ = searched(None)  # no sensitivity pass: nothing shows that lowering them pays
    assert names == [] and facts["found"] == 2


def test_a_sensitive_unit_kept_fp32_amid_an_fp16_region_is_charged_the_casts_at_its_borders(tmp_path):
    """Its gain in FP16 is what it costs kept FP32 among FP16 neighbours less what it costs lowered with
    them: with every node costing the same, a softmax alone is no faster in FP16, but keeping it FP32
    costs the Cast into it and the Cast out of it."""
    from autoprec.lower import QDQForm, lower_plan
    from autoprec.study.sensitivity import unit_gains
    from tests import builders

    space = load_search_space().restricted((Precision.INT8, Precision.FP16))  # (INT4 left out, as by default)
    info = analyse(builders.save(builders.transformer_block(), tmp_path / "block.onnx"), space)

    class EveryNodeOneSecond:
        def lower(self, info, plan, ranges):
            return lower_plan(info, plan, ranges, QDQForm.TENSORRT)

        def node_times(self, model, batch):
            return {n.name: 1.0 for n in model.graph.node}

    fp32_times = {n.name: 1.0 for n in info.model.graph.node}
    gains, profiled = unit_gains(info, EveryNodeOneSecond(), None, {}, fp32_times, "max")
    assert profiled == 2  # the all-FP16 plan and FP16 with the sensitive units FP32 (INT8 cannot lower without ranges)
    total = len(fp32_times)
    assert gains["fp16"]["softmax"] == pytest.approx(2 / total)  # scores -> Cast -> softmax -> Cast -> context
    assert gains["fp16"]["ln_mean"] == pytest.approx(2 / total)  # one Cast into it, one out to its three readers
    assert all(g <= 0 for u, g in gains["fp16"].items() if not info.unit(u).sensitive)  # no node is faster here


def test_a_loss_alone_is_judged_on_the_engines_judging_runner(conv_prepared):
    from autoprec.backends import get_backend
    from autoprec.core.plan import Precision
    from autoprec.measure.accuracy import Judge, Metric
    from autoprec.measure.measurement import accuracy_loss

    class Counted(type(get_backend("ort-cpu"))):
        judged = 0

        def judging_runner(self, model):
            Counted.judged += 1
            return self.runner(model)

    info, dataset, ranges, reference = conv_prepared
    engine = Counted()
    fp32 = engine.lower(info, info.plan_at(Precision.FP32), ranges)
    loss = accuracy_loss(engine, fp32, dataset.evaluation[:1], Judge(Metric(), reference[:1]))
    assert Counted.judged == 1 and loss == pytest.approx(0.0, abs=1e-6)


@pytest.fixture
def two_outputs(tmp_path):
    """A ResNet block whose stem's Relu is an output too (one output made early, one late), analysed and
    calibrated, with four batches of data."""
    import builders
    from onnx import TensorProto, helper

    from autoprec.analysis.calibrate import calibrate
    from autoprec.analysis.reference import reference_outputs

    model = builders.residual_net()
    model.graph.output.append(helper.make_tensor_value_info("r0", TensorProto.FLOAT, [1, 8, 16, 16]))
    path = builders.save(model, tmp_path / "two.onnx")
    space = load_search_space()
    info = analyse(path, space.restricted((Precision.INT8, Precision.FP16)))
    batches = [{"x": np.random.default_rng(i).normal(size=(1, 8, 16, 16)).astype(np.float32)} for i in range(4)]
    ranges = calibrate(info, batches, "two")
    return info, batches, ranges, reference_outputs(info, batches, "two")


@pytest.mark.parametrize("form", [None, QDQForm.TENSORRT], ids=["ort-cpu form", "TensorRT form"])
def test_a_one_unit_plan_run_from_its_first_change_gives_the_whole_plans_outputs(two_outputs, form):
    """The pass runs each one-unit plan from the last cut before its first changed node, on all-FP32's
    tensors there: the outputs are the whole plan's, the early output all-FP32's where the change comes
    after it; the later units' plans are cut."""
    info, batches, ranges, _ = two_outputs
    engine, lowering = get_backend("ort-cpu"), Lowering(info, ranges, form)
    downstream = Downstream.captured(engine, lowering(engine, info.plan_at(Precision.FP32)), batches)
    plans = one_unit_plans(info, "percentile-99.99")
    cut = []
    for plan in plans:
        model = lowering(engine, plan)
        found = downstream.outputs(engine, model)
        with engine.runner(model) as runner:
            whole = [runner.run(batch) for batch in batches]
        if found is not None:
            cut.append(plan)
            for part, all_of in zip(found, whole):
                assert list(part) == list(all_of)
                for name in all_of:
                    np.testing.assert_allclose(part[name], all_of[name], rtol=1e-5, atol=1e-6)
    assert {u for plan in cut for u in plan.as_dict()} >= {"outer", "last"}


def test_a_capture_over_its_budget_leaves_every_plan_whole(two_outputs):
    info, batches, ranges, reference = two_outputs
    engine = get_backend("ort-cpu")
    fp32 = engine.lower(info, info.plan_at(Precision.FP32), ranges)
    assert Downstream.captured(engine, fp32, batches, budget=1) is None
    judge, plan = Judge(Metric(), reference), info.plan_at(Precision.INT8, ["last"])
    assert accuracy_loss(engine, engine.lower(info, plan, ranges), batches, judge, None) > 0


def test_the_pass_in_a_worker_finds_the_losses_whole_plans_have(two_outputs, tmp_path):
    """One-unit losses from the worker's cut plans are the losses of the whole plans, in this process."""
    from autoprec.measure import isolation

    info, batches, ranges, reference = two_outputs
    judge, lowering = Judge(Metric(), reference), Lowering(info, ranges)
    whole = InProcessMeasurer(get_backend("ort-cpu"), batches, judge, judge, lowering)
    plans = one_unit_plans(info, "percentile-99.99")
    with isolation.IsolatedMeasurer("ort-cpu", batches, judge, isolation.Limits(120), tmp_path / "stderr.log",
                                    lowering=lowering) as worker:
        cut = [worker.accuracy_loss(plan, len(batches), one_unit=True) for plan in plans]
    assert cut == pytest.approx([whole.accuracy_loss(plan, len(batches)) for plan in plans], rel=1e-3, abs=1e-9)
    assert max(cut) > 0


def test_an_engine_that_fuses_across_a_cut_runs_every_plan_whole(two_outputs):
    """An engine whose kernels a cut would change (TensorRT fuses across where it falls) gets no capture: the plans
    it judges itself run whole."""
    from autoprec.backends import backend_class
    from autoprec.backends.onnxruntime import OrtCpuBackend

    class Fusing(OrtCpuBackend):
        runs_from_a_cut = False

    info, batches, ranges, _ = two_outputs
    reference = get_backend("ort-cpu").lower(info, info.plan_at(Precision.FP32), ranges)
    assert Downstream.captured(Fusing(), reference, batches) is None
    assert Downstream.captured(get_backend("ort-cpu"), reference, batches) is not None
    assert not any(backend_class(name).runs_from_a_cut for name in ("tensorrt", "tensorrt-rtx", "ort-tensorrt"))


def test_the_passs_tensors_are_given_back_once_something_else_is_asked(two_outputs):
    info, batches, ranges, reference = two_outputs
    judge = Judge(Metric(), reference)
    measurer = InProcessMeasurer(get_backend("ort-cpu"), batches, judge, judge, Lowering(info, ranges))
    plan = info.plan_at(Precision.INT8, ["last"])
    measurer.accuracy_loss(plan, len(batches), one_unit=True)
    assert measurer.captures.by_count[len(batches)] is not None
    measurer.accuracy_loss(plan, len(batches), constraint=True)
    assert not measurer.captures.by_count

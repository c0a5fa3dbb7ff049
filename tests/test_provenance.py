"""Every result is tied to exactly what produced it: model (external data included), data, seed,
search space and overrides, shapes; check/diagnose/export re-create that analysis or refuse."""

import json
import os
import shutil

import builders
import numpy as np
import onnx
import pytest
import searching
from cli import exit_code, refused, run

import autoprec
from autoprec.app.recorded import plan_context
from autoprec.app.specs import InputSpec
from autoprec.app.verbs import activation_report, tensorrt_build_spec
from autoprec.core.errors import AutoprecError, DataError, SearchFailed, StudyError

FUSE_NOTHING = """units: {Conv: [int8, fp16, fp32], Gemm: [int8, fp16, fp32]}
fusable: []
pinned_fp32: [Softmax]
"""


def _initializers(model: onnx.ModelProto) -> dict[str, bytes]:
    return {i.name: onnx.numpy_helper.to_array(i).tobytes() for i in model.graph.initializer}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A search with --seed 3, a search space that fuses nothing, an override, and a relative model path."""
    root = tmp_path_factory.mktemp("provenance")
    model, data = builders.conv_with_data(root, 16, batch="N")
    space = root / "space.yaml"
    space.write_text(FUSE_NOTHING)
    out = root / "result"
    here = os.getcwd()
    os.chdir(root)
    try:
        result = searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(model.name, data=data),
                space=autoprec.SpaceSpec(search_space=space, overrides=["fc=fp16,fp32"]),
                study=autoprec.StudySpec(budget=6, seed=3),
                out=out,
            )
        )
    finally:
        os.chdir(here)
    return root, out, result


def test_the_result_records_what_re_creates_its_analysis(seeded):
    root, out, result = seeded
    pareto = json.loads((out / "pareto.json").read_text())
    facts = pareto["search"]
    assert (
        facts["seed"] == 3 and facts["data_fingerprint"] and facts["calibration_file"].startswith("cache/calibration-")
    )
    assert facts["search_space"]["fusable"] == [] and facts["search_space"]["overrides"] == [["fc", ["fp16", "fp32"]]]
    assert pareto["model"]["path"] == str(root / "conv.onnx")  # absolute, whatever the working directory was


def test_an_exported_trial_is_the_model_that_was_measured(seeded, tmp_path):
    """--seed 3 split the data its own way; export re-creates that split's calibration, not seed 0's."""
    _, out, result = seeded
    chosen = result.chosen.number
    assert (
        exit_code(["export", str(out), "--format", "triton", "--trial", str(chosen), "--out", str(tmp_path), "--name", "m"])
        == 0
    )
    exported = onnx.load(str(tmp_path / "m" / "1" / "model.onnx"))
    measured = onnx.load(str(out / "best" / "model.onnx"))
    assert _initializers(exported) == _initializers(measured)
    assert [n.op_type for n in exported.graph.node] == [n.op_type for n in measured.graph.node]


def test_the_build_card_lists_the_units_of_the_searched_space(seeded):
    _, out, result = seeded
    assert exit_code(["export", str(out), "--format", "markdown"]) == 0
    card = (out / "export" / "markdown" / "BUILD.md").read_text()
    conv0 = next(line for line in card.splitlines() if line.startswith("| `conv0` |"))
    assert conv0.endswith("| — |")  # the searched space fused nothing into conv0 (the default fuses its Relu)
    spec = tensorrt_build_spec(out)
    assert all(len(u.nodes) == 1 for u in spec.info.units)


def test_a_changed_model_at_the_recorded_path_is_refused(seeded, tmp_path):
    root, out, _ = seeded
    copy = tmp_path / "result"
    shutil.copytree(out, copy)
    pareto = json.loads((copy / "pareto.json").read_text())
    other = builders.save(
        builders.conv_net(batch="N", seed=7), tmp_path / "conv.onnx"
    )  # same architecture, other weights
    pareto["model"]["path"] = str(other)
    (copy / "pareto.json").write_text(json.dumps(pareto))
    with pytest.raises(AutoprecError, match="not the model .* was searched with"):
        plan_context(copy)


def test_changed_data_is_refused_and_other_data_keeps_the_searched_scales(seeded, tmp_path):
    root, out, result = seeded
    copy = tmp_path / "result"
    shutil.copytree(out, copy)
    changed = tmp_path / "data.npz"
    np.savez(changed, x=builders.image_like(16) * 2)
    pareto = json.loads((copy / "pareto.json").read_text())
    pareto["search"]["data_path"] = str(changed)
    (copy / "pareto.json").write_text(json.dumps(pareto))
    with pytest.raises(AutoprecError, match="not the data .* was searched with"):
        plan_context(copy)
    given = plan_context(out, data=changed)  # explicit other data: evaluated there, calibrated as searched
    searched = plan_context(out)
    assert given.baseline.ranges.tensors.keys() == searched.baseline.ranges.tensors.keys()
    assert all(given.baseline.ranges[t].amax("minmax") == searched.baseline.ranges[t].amax("minmax")
               for t in searched.baseline.ranges.tensors)


def test_ranges_of_a_result_are_its_search_calibration(seeded, capsys):
    """`ranges RESULT` shows the ranges the search's INT8 scales came from (its model, seed's split, data),
    not a fresh calibration of options given again; input options that would change them are refused."""
    root, out, _ = seeded
    searched = plan_context(out).baseline.ranges
    rows = {r.tensor: r for r in activation_report(InputSpec(str(out)))}
    assert rows.keys() == searched.tensors.keys()
    assert all(rows[t].max == pytest.approx(searched[t].max) for t in rows)
    assert exit_code(["ranges", str(out), "--image-mean", "0.5"]) == 2
    assert "image_mean given" in capsys.readouterr().err


def test_resuming_with_another_override_or_space_is_refused(seeded):
    root, out, _ = seeded
    with pytest.raises(StudyError, match="made for a different search .*search_space"):
        searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(root / "conv.onnx", data=root / "data.npz"),
                space=autoprec.SpaceSpec(search_space=root / "space.yaml", overrides=["fc=int8,fp32"]),
                study=autoprec.StudySpec(budget=7, seed=3),
                out=out,
            )
        )


def test_changed_external_weights_are_a_different_model(tmp_path):
    model = builders.conv_net()
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    out = tmp_path / "out"

    def search(budget, folder):
        return searching.search(autoprec.SearchConfig(autoprec.InputSpec(tmp_path / "ext.onnx"), out=folder,
                                                     study=autoprec.StudySpec(budget=budget, warm_start=False)))

    search(1, out)
    weights = bytearray((tmp_path / "ext.data").read_bytes())
    weights[8:12] = np.float32(3.0).tobytes()
    (tmp_path / "ext.data").write_bytes(bytes(weights))
    with pytest.raises(AutoprecError, match="another model|model_sha256"):
        search(2, out)
    fresh = search(1, tmp_path / "fresh")
    assert fresh.trials[0].loss == 0.0  # all-FP32 against its own (new) reference, not a stale cached one


def test_a_limit_no_plan_can_hold_says_the_limit_the_least_loss_and_what_to_change(tmp_path, mlp_model, capsys):
    """Overrides that leave every unit INT8 or FP16 and a limit none of them holds: every candidate is rejected for
    its loss, and the one line says so with the least loss seen and the two ways out (it named neither)."""
    last = refused(["search", mlp_model, "--override", "*=int8,fp16", "--max-loss", "1e-12", "--budget", "3",
                    "--out", tmp_path / "o", "--no-plots", "--no-progress"], capsys, "rejected early for their loss")
    assert "far past --max-loss 1e-12" in last and "an --override without fp32" in last


def test_a_study_without_an_all_fp32_plan_says_once_what_that_leaves_out(tmp_path, mlp_model, capsys):
    """Overrides that take FP32 from every unit leave nothing to re-time the plans beside: one line says what that
    costs (no speed-up stated, no faster-than-FP32 test), where each plan's re-timing was said to fail."""
    code, err = run(["search", mlp_model, "--override", "*=int8,fp16", "--budget", "3", "--out", tmp_path / "o",
                     "--no-plots", "--no-progress"], capsys)
    said = " ".join(err.split())
    assert code == 0, err[-2000:]
    assert said.count("no all-FP32 plan in this study") == 1 and "beside all-FP32 failed" not in said
    assert "ships without the test that it runs faster than all-FP32" in said


def test_a_run_that_chooses_nothing_leaves_no_earlier_best_behind(tmp_path, mlp_model, monkeypatch):
    from autoprec.core.errors import BackendError
    from autoprec.measure.measurement import InProcessMeasurer

    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model), study=autoprec.StudySpec(budget=1, warm_start=False), out=out
        )
    )
    assert (out / "best" / "plan.json").is_file()

    def broken(self, plan, screen=None):
        raise BackendError("the engine broke")

    monkeypatch.setattr(InProcessMeasurer, "measure", broken)  # every plan of the next run fails
    with pytest.raises(SearchFailed, match=r"no candidate was measured: of 2 trial\(s\), all 2 failed .*engine broke"):
        searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(mlp_model),
                study=autoprec.StudySpec(budget=2, study_name="another", warm_start=False),
                isolation=autoprec.IsolationSpec(isolate=False),
                out=out,
            )
        )
    assert not (out / "best").exists() or not any((out / "best").iterdir())
    assert json.loads((out / "pareto.json").read_text())["chosen"] is None
    assert exit_code(["export", str(out), "--format", "markdown"]) == 2


def test_data_with_nan_is_refused_before_anything_runs(tmp_path, conv_model):
    data = builders.image_like(8)
    data[5, 0, 3, 3] = np.nan
    np.savez(tmp_path / "nan.npz", x=data)
    with pytest.raises(DataError, match="holds NaN or Inf in 1 item.*item 5"):
        searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(conv_model, data=tmp_path / "nan.npz"),
                study=autoprec.StudySpec(budget=1),
                out=tmp_path / "out",
            )
        )


def test_float64_units_are_not_reported_lowered(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w32"),
             numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float64), "w64")]
    nodes = [helper.make_node("MatMul", ["x", "w32"], ["h"], "fp32_layer"),
             helper.make_node("Cast", ["h"], ["h64"], "to64", to=TensorProto.DOUBLE),
             helper.make_node("MatMul", ["h64", "w64"], ["y"], "fp64_layer")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = builders.IR_VERSION
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(builders.save(model, tmp_path / "mixed.onnx")),
            study=autoprec.StudySpec(budget=3, warm_start=False),
            out=tmp_path / "out",
        )
    )
    units = {u["name"]: u["allowed"] for u in result.units}
    assert units == {"fp32_layer": ["int8", "fp16", "fp32"], "fp64_layer": ["fp32"]}
    assert all(t.plan["fp64_layer"].value == "fp32" for t in result.trials)
    assert any("float type other than float32" in note for note in result.model.preparation)


@pytest.mark.parametrize("damage", ["replaced by another model", "deleted"])
def test_check_and_export_look_at_the_shipped_model(conv_result, tmp_path, capsys, damage):
    """check, the CI gate, printed PASS with best/model.onnx replaced by an unrelated model or deleted."""
    copy = tmp_path / "r"
    shutil.copytree(conv_result, copy)
    shipped = copy / "best" / "model.onnx"
    if damage == "deleted":
        shipped.unlink()
    else:
        builders.save(builders.mlp(), shipped)
    phrase = "missing" if damage == "deleted" else "not the model the search wrote there"
    refused(["check", copy], capsys, "best/model.onnx", phrase)
    refused(["export", copy, "--format", "triton", "--out", tmp_path / "t"], capsys, "best/model.onnx", phrase)


def test_check_verifies_every_model_best_holds(conv_result, tmp_path, capsys):
    copy = tmp_path / "r"
    shutil.copytree(conv_result, copy)
    plan = json.loads((copy / "best" / "plan.json").read_text())
    plan["sha256"]["model.tensorrt.onnx"] = "0" * 64  # as recorded where the plan has INT8 units
    (copy / "best" / "plan.json").write_text(json.dumps(plan))
    builders.save(builders.mlp(), copy / "best" / "model.tensorrt.onnx")
    refused(["check", copy], capsys, "best/model.tensorrt.onnx: not the model the search wrote there")

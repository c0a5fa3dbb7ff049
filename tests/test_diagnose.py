"""Layer-wise diagnosis, activation ranges, calibration methods, the CI gate, and the Triton export."""

import json

import builders
import numpy as np
import onnx
import pytest
import searching
from cli import clean, exit_code, run

import autoprec
from autoprec.analysis.calibrate import TensorRange
from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.specs import InputSpec
from autoprec.app.verbs import activation_report, check_plan, diagnose_plan
from autoprec.measure.diagnosis import culprits, jumps


@pytest.fixture(scope="module")
def fragile_mlp(tmp_path_factory):
    """An MLP with one hidden channel 300× larger (compensated in the next layer): FP32 is unchanged,
    but a per-tensor INT8 scale on fc1's input leaves the other channels almost no levels."""
    root = tmp_path_factory.mktemp("fragile")
    model = builders.mlp()
    weights = {i.name: onnx.numpy_helper.to_array(i).copy() for i in model.graph.initializer}
    weights["w0"][:, 5] *= 300
    weights["b0"][5] *= 300
    weights["w1"][5, :] /= 300
    for i, init in enumerate(model.graph.initializer):
        model.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(weights[init.name], init.name))
    path = builders.save(model, root / "mlp.onnx")
    data = root / "x.npz"
    np.savez(data, x=np.random.default_rng(0).normal(0, 1, (160, 16)).astype(np.float32))
    plan = root / "plan.json"
    plan.write_text(json.dumps({"precisions": {"fc0": "fp16", "fc1": "int8", "head": "fp16"}, "calibration": "minmax"}))
    return path, data, plan, root


def test_diagnose_names_the_culprit_and_sending_it_back_recovers_the_loss(fragile_mlp):
    model, data, plan, root = fragile_mlp
    found = diagnose_plan(model, plan=plan, data=data, out=root / "diag")
    rows, out = found.rows, found.out_dir
    assert [r.unit for r in rows] == ["fc0", "fc1", "head"]
    assert culprits(rows, 1)[0].unit == "fc1"
    assert rows[1].added_rel_l2 > 10 * max(rows[0].added_rel_l2, rows[2].added_rel_l2)
    assert rows[1].rel_l2 > 10 * rows[0].rel_l2  # the error enters at fc1
    assert jumps(rows)[-1].unit == "fc1"
    assert (out / "error_by_layer.png").read_bytes()[:4] == b"\x89PNG"
    written = json.loads((out / "diagnosis.json").read_text())
    assert [u["unit"] for u in written["units"]] == ["fc0", "fc1", "head"]
    worst = check_plan(model, plan, judge=JudgeSpec(max_loss=1.0), data=data).measurement.loss
    fixed = root / "fixed.json"
    fixed.write_text(
        json.dumps({"precisions": {"fc0": "fp16", "fc1": "fp32", "head": "fp16"}, "calibration": "minmax"})
    )
    repaired = check_plan(model, fixed, judge=JudgeSpec(max_loss=1.0), data=data).measurement.loss
    assert repaired < worst / 10


def test_ranges_flag_outliers_and_fp16_hazards(tmp_path):
    model = builders.save(builders.mlp(batch=1024), tmp_path / "wide.onnx")  # few, large batches: a fast calibration
    x = np.random.default_rng(1).normal(0, 1, (5120, 16)).astype(np.float32)
    x[::1024, 3] = 3000.0  # one value per batch (1 in 16384): beyond the 99.99th percentile, yet it sets min-max
    np.savez(tmp_path / "outliers.npz", x=x)
    rows = {r.tensor: r for r in activation_report(InputSpec(model, tmp_path / "outliers.npz"))}
    assert "int8-outliers" in rows["x"].flags
    assert rows["x"].clipped_share["percentile-99.99"] > 0 and rows["x"].clipped_share["minmax"] == 0
    hazards = np.random.default_rng(2).normal(0, 1, (2048, 16)).astype(np.float32)
    hazards[:, :8] *= 1e-9  # half the values flush to zero in FP16
    hazards[:, 8] = 50000.0  # and a column near FP16's largest finite value
    np.savez(tmp_path / "hazards.npz", x=hazards)
    flags = {r.tensor: r.flags for r in activation_report(InputSpec(model, tmp_path / "hazards.npz"))}
    assert "fp16-underflow" in flags["x"] and "fp16-overflow" in flags["x"]


def test_calibration_methods_from_one_histogram():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0, 1, 50_000), 40 * rng.normal(0, 1, 10)]).astype(np.float32)
    top = np.abs(values).max()
    hist, edges = np.histogram(values, 2048, range=(-top, top))
    r = TensorRange(float(values.min()), float(values.max()), hist, edges.astype(np.float64))

    def quantization_mse(amax):
        step = amax / 127
        return float(((np.clip(np.round(values / step), -127, 127) * step - values) ** 2).mean())

    errors = {
        m: quantization_mse(r.amax(m)) for m in ("minmax", "percentile-99.9", "percentile-99.99", "entropy", "mse")
    }
    assert errors["mse"] == min(errors.values())  # the MSE-optimal threshold is what it says
    assert 0 < r.amax("entropy") < r.amax("minmax")


def test_calibration_auto_makes_the_method_a_search_dimension(tmp_path, mlp_model):
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(mlp_model),
            space=autoprec.SpaceSpec(calibration="auto"),
            study=autoprec.StudySpec(budget=8),
            out=tmp_path / "out",
        )
    )
    methods = {t.plan.calibration for t in result.trials}
    assert len(methods) >= 2 and methods <= {"minmax", "percentile-99.9", "percentile-99.99", "entropy", "mse"}


def test_check_is_a_release_gate(fragile_mlp, capsys):
    model, data, plan, _ = fragile_mlp
    assert exit_code(["check", str(model), "--plan", str(plan), "--data", str(data), "--max-loss", "0.001"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "regression: accuracy loss" in out
    assert exit_code(["check", str(model), "--plan", str(plan), "--data", str(data), "--max-loss", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["measurement"]["latency"]["median_ms"] > 0
    assert exit_code(["check", str(model), "--plan", str(plan), "--data", str(data), "--max-loss", "1",
                  "--latency-budget", "0.000001"]) == 1
    assert "regression: latency" in capsys.readouterr().out


def test_triton_export_matches_the_model(tmp_path, conv_model, conv_data, capsys):
    out = tmp_path / "result"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(conv_model, data=conv_data), study=autoprec.StudySpec(budget=4), out=out
        )
    )
    assert exit_code(["export", str(out), "--format", "triton", "--name", "conv"]) == 0
    entry = out / "export" / "triton" / "conv"
    config = (entry / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and 'name: "x"' in config and "dims: [ 1, 3, 16, 16 ]" in config
    assert 'name: "probs"' in config and "TYPE_FP32" in config and "tensorrt_plan" in config
    onnx.checker.check_model(onnx.load(str(entry / "1" / "model.onnx")))
    chosen = json.loads((out / "pareto.json").read_text())["chosen"]
    other = next(t for t in json.loads((out / "trials.json").read_text())["trials"]
                 if t["trial"] != chosen and (t["plan"]["counts"]["int8"] or t["plan"]["counts"]["fp16"]))
    trial, counts = other["trial"], other["plan"]["counts"]
    assert exit_code(["export", str(out), "--format", "triton", "--trial", str(trial), "--out",
                      str(tmp_path / "repo")]) == 0
    assert f"--trial {trial} writes" in (tmp_path / "repo" / "conv" / "config.pbtxt").read_text()
    ops = {n.op_type for n in onnx.load(str(tmp_path / "repo" / "conv" / "1" / "model.onnx")).graph.node}
    assert ("QuantizeLinear" in ops, "Cast" in ops) == (counts["int8"] > 0, counts["fp16"] > 0)  # that trial's plan


def test_diagnose_needs_a_plan_for_a_bare_model(conv_model, capsys):
    assert exit_code(["diagnose", str(conv_model)]) == 2
    assert "give --plan PLAN.json" in capsys.readouterr().err


PLANS = {
    "unknown unit": {"precisions": {"nope": "int8"}},
    "bogus calibration": {"precisions": {"conv0": "int8"}, "calibration": "bogus"},
    "bogus precision": {"precisions": {"conv0": "int4"}},
    "not an object": [1, 2],
    "precisions a list": {"precisions": ["int8"]},
}


@pytest.mark.parametrize("kind", sorted(PLANS))
@pytest.mark.parametrize("verb", ["check", "diagnose"])
def test_bad_plan_files_are_one_line(conv_result, tmp_path, capsys, kind, verb):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLANS[kind]))
    extra = ["--max-loss", "0.1"] if verb == "check" else ["--out", tmp_path / "d"]
    code, err = run([verb, conv_result, "--plan", plan, *extra], capsys)
    clean(code, err, allowed=(2,))

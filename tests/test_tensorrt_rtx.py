"""TensorRT for RTX, the REAL library (PyPI's tensorrt-rtx-cu13-libs/-bindings), on the CPU.

Every test here parses and builds with the real TensorRT for RTX builder, unless it says otherwise.
What needs a GPU it runs on (deserializing, execution, the inspector, the layer profiler) cannot run
on this project's machines: that half is checked against the recording fake (tests/fake_tensorrt.py)
in test_tensorrt.py, and here only for the names it touches, against the real module.

CI sets AUTOPREC_REQUIRE_TENSORRT_RTX: there a missing library fails these tests instead of skipping them.
"""

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import builders
import onnx
import optuna
import pytest
import searching
from cli import exit_code

import autoprec
from autoprec import backends, zoo
from autoprec.analysis.baseline import load_baseline

# imported before any test replaces get_backend: a module first imported while it is replaced would keep the
# replacement for good (every later search of the process then ran on that test's backend)
from autoprec.app import search_setup, sensitivity_pass, verbs  # noqa: F401
from autoprec.backends import get_backend
from autoprec.backends.tensorrt import (
    TENSORRT_RTX,
    TensorRTRtxBackend,
    build_engine,
    import_tensorrt,
    stamp_plan,
)
from autoprec.core import stored
from autoprec.core.errors import BackendError, SearchFailed
from autoprec.core.plan import Plan, Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure import measurers
from autoprec.results.files import read_result_dir

if not any(importlib.util.find_spec(m) for m in TENSORRT_RTX.modules):
    if os.environ.get("AUTOPREC_REQUIRE_TENSORRT_RTX"):
        raise RuntimeError("AUTOPREC_REQUIRE_TENSORRT_RTX is set but TensorRT for RTX is not installed: "
                           "pip install '.[tensorrt-rtx]'")
    pytest.skip("TensorRT for RTX is not installed (pip install '.[tensorrt-rtx]')", allow_module_level=True)

trt = import_tensorrt(TENSORRT_RTX)
# The zoo models CI can fetch from PyPI (MiniLM needs torch to be exported: not available there).
ZOO = ["ppocr-cls", "magika", "yolov8n", "ppocr-rec", "ppocr-det"]


@pytest.fixture
def rtx(monkeypatch):
    """The real TensorRT for RTX backend, told there is an RTX 4090 (its GPU check reads nvidia-smi, and
    this machine has no GPU): builds are real; loading an engine fails here, as it would without a GPU."""
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts",
                        lambda: [{"name": "NVIDIA GeForce RTX 4090", "driver": "580", "compute_capability": "8.9"}])
    return get_backend("tensorrt-rtx")


@pytest.fixture(scope="session")
def zoo_root(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo-cache")


def _mixed(info) -> Plan:
    """Each unit's allowed precisions in turn along the graph (a pattern's units with their head): INT8 beside
    FP16 beside FP32 all through it, every boundary a searched plan can have."""
    heads = {u.name: u.allowed[i % len(u.allowed)] for i, u in enumerate(info.units) if u.tied_to is None}
    return Plan.from_mapping({u.name: heads[u.tied_to or u.name] for u in info.units})


@pytest.mark.parametrize("name", ZOO)
def test_rtx_builds_every_zoo_model_uniform_and_mixed_plans(name, zoo_root, tmp_path, monkeypatch):
    """The all-FP32/FP16/INT8/INT4 plans and a plan mixing them through the graph, in the TensorRT Q/DQ form
    (with the ranges the search calibrates), each parsed and built. The network's types follow every plan; the
    builder's own layer list is checked for every unit, and where TensorRT for RTX 1.7 ran a unit otherwise it is
    a ConvTranspose planned INT8 (ppocr-det: a dequantized float deconvolution) or a MatMul planned INT4 (ppocr-rec's
    head) — what no fake could have told."""
    monkeypatch.setenv("AUTOPREC_CACHE", str(zoo_root))
    fetched = zoo.fetch(name)
    baseline = load_baseline(fetched.model, load_search_space(), fetched.data, fetched.shapes, cache=tmp_path / "cache")
    mixed = _mixed(baseline.info)
    assert all(mixed.counts()[p] for p in ("int8", "fp16", "fp32")), mixed.counts()
    op_type = {u.name: u.op_type for u in baseline.info.units}
    for plan in dict.fromkeys([*(baseline.info.plan_at(p) for p in Precision), mixed]):  # (all-INT4 is all-FP32 on a CNN)
        lowered = lower_plan(
            baseline.info, plan, baseline.ranges, QDQForm.TENSORRT
        )  # what --backend tensorrt-rtx lowers
        built = build_engine(trt, TENSORRT_RTX, stamp_plan(lowered, baseline.info, plan))
        assert len(built.serialized) > 10_000
        checks = built.report["fidelity_checks"]
        assert set(checks) == {"network types", "builder log"}
        assert not checks["network types"]["plan_ignored"], (
            name,
            plan.counts(),
            checks["network types"]["ignored_units"][:3],
        )
        assert (
            checks["network types"]["checked_units"]
            == checks["builder log"]["checked_units"]
            == len(baseline.info.units)
        )
        otherwise = {
            (op_type[u["unit"]], u["planned"], tuple(u["ran"])) for u in checks["builder log"]["ignored_units"]
        }
        # a dequantized deconvolution runs in float: FP32, or FP16 beside an FP16 region of a mixed plan; so may a
        # MatMul's INT4 weight, dequantized for a float GEMM (ppocr-rec's head of 6625 classes: RTX 1.7's choice,
        # which the builder-log check reports to the user as it does here)
        assert all(op in ("ConvTranspose", "MatMul") and planned == {"ConvTranspose": "int8", "MatMul": "int4"}[op]
                   and set(ran) <= {"fp16", "fp32"} for op, planned, ran in otherwise), (name, plan.counts(), otherwise)


def test_rtx_parser_rejects_the_ort_cpu_form_naming_the_node_and_its_message(conv_model, conv_data, rtx):
    baseline = load_baseline(conv_model, load_search_space(), conv_data)
    plan = baseline.info.plan_at(Precision.INT8)
    ort_form = lower_plan(baseline.info, plan, baseline.ranges, QDQForm.ORT_CPU)  # uint8, non-zero zero points
    with pytest.raises(BackendError, match=r"parser rejected the candidate: node '\w+_quantize' \(QuantizeLinear\): "
                                           r".*Non-zero zero point is not supported"):
        rtx.build(ort_form)


def test_rtx_a_trial_the_parser_rejects_fails_with_the_parsers_node_and_message(conv_model, conv_data, rtx, tmp_path,
                                                                                   monkeypatch):
    """A search on the real builder. Candidates lowered in the ORT-CPU Q/DQ form (which this builder refuses)
    fail at parsing with its words; the FP32 candidate builds and then cannot be loaded (no GPU here):
    every trial fails, each with its own cause, and the search says it measured nothing."""
    monkeypatch.setattr(TensorRTRtxBackend, "qdq_form", QDQForm.ORT_CPU)
    for module in (backends, search_setup, measurers):
        monkeypatch.setattr(module, "get_backend", lambda *args, **kwargs: rtx)
    out = tmp_path / "out"
    with pytest.raises(SearchFailed, match="no candidate was measured"):
        searching.search(
            autoprec.SearchConfig(
                autoprec.InputSpec(conv_model, data=conv_data),
                engine=autoprec.EngineSpec(backend="tensorrt-rtx"),
                study=autoprec.StudySpec(budget=3, warm_start=False),
                isolation=autoprec.IsolationSpec(isolate=False),
                out=out,
            )
        )
    study = optuna.load_study(study_name="autoprec-conv-tensorrt-rtx", storage=f"sqlite:///{out / 'study.db'}")
    errors = {
        t.user_attrs["plan"]["counts"]["int8"]: t.user_attrs["error"] for t in study.trials if t.state.name == "FAIL"
    }
    assert "Non-zero zero point is not supported" in errors[4] and "QuantizeLinear" in errors[4]
    assert "could not load the engine it just built" in errors[0]  # all-FP32: built, not loadable without a GPU


def test_rtx_network_types_and_builder_log_catch_a_plan_the_model_does_not_follow(conv_model, conv_data):
    """A model that runs conv1 in FP32 though the plan says FP16: both build-time checks name it."""
    baseline = load_baseline(conv_model, load_search_space(), conv_data)
    names = [u.name for u in baseline.info.units]
    lowered = lower_plan(baseline.info, Plan.uniform(names, Precision.FP32), baseline.ranges)
    claimed = stamp_plan(
        lowered, baseline.info, Plan.from_mapping({n: "fp16" if n == "conv1" else "fp32" for n in names})
    )
    built = build_engine(trt, TENSORRT_RTX, claimed)
    for source in ("network types", "builder log"):
        check = built.report["fidelity_checks"][source]
        assert check["plan_ignored"] and [u["unit"] for u in check["ignored_units"]] == ["conv1"], source
        assert check["ignored_units"][0]["ran"] == ["fp32"]
    assert built.report["plan_fidelity"]["source"] == "builder log"


def test_rtx_builds_the_tensorrt_form_int8_as_planned_and_reads_a_residual_skip_as_int8(tmp_path):
    """The all-INT8 plan of a ResNet block in TensorRT's Q/DQ form: every unit INT8 in the builder's layers,
    no reformat layer, and the Add fused after the last convolution reads the skip tensor in INT8."""
    model = builders.save(builders.residual_net(channels=32, size=32), tmp_path / "block.onnx")
    baseline = load_baseline(model, load_search_space(), None)
    plan = baseline.info.plan_at(Precision.INT8)
    built = build_engine(trt, TENSORRT_RTX, stamp_plan(
        lower_plan(baseline.info, plan, baseline.ranges, QDQForm.TENSORRT), baseline.info, plan))
    check = built.report["fidelity_checks"]["builder log"]
    assert check["checked_units"] == 4 and not check["plan_ignored"]
    assert not [layer for layer in built.layers.layers if layer.layer_type == "Reformat"]
    residual = [layer for layer in built.layers.layers if "residual" in layer.fused_from]
    assert residual and "int8" in {t.dtype for layer in residual for t in layer.inputs}


def test_rtx_backend_refuses_a_machine_without_a_supported_gpu(monkeypatch, conv_model, capsys):
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: [])
    with pytest.raises(BackendError, match="no NVIDIA GPU on this machine.*builds alone run on the CPU"):
        get_backend("tensorrt-rtx")
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts",
                        lambda: [{"name": "NVIDIA H100 80GB HBM3", "driver": "580", "compute_capability": "9.0"}])
    with pytest.raises(BackendError, match=r"H100 80GB HBM3\) has compute capability 9.0.*use --backend tensorrt .*or "
                                           r"--backend ort-cuda"):
        get_backend("tensorrt-rtx")
    monkeypatch.undo()
    assert exit_code(["search", conv_model, "--backend", "tensorrt-rtx", "--budget", 1]) == 2  # this machine, for real
    assert "no NVIDIA GPU on this machine" in capsys.readouterr().err.strip().splitlines()[-1]


def test_rtx_missing_package_names_the_pip_command(monkeypatch, conv_model, capsys):
    for module in TENSORRT_RTX.modules:
        monkeypatch.setitem(sys.modules, module, None)
    assert exit_code(["search", conv_model, "--backend", "tensorrt-rtx", "--budget", 1]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "autoprec: error: --backend tensorrt-rtx needs TensorRT for RTX and cuda-python (PyPI, no extra index): "
        "pip install 'autoprec[tensorrt-rtx]'")


def test_rtx_run_half_uses_only_names_the_real_module_has(monkeypatch, conv_model, conv_data):
    """The GPU half runs on the recording fake (it cannot run here); every TensorRT name it touched, the
    runtime cache's included, must exist in the real TensorRT for RTX module."""
    import fake_tensorrt as fake

    module = fake.reset("1.7.1.116")
    module.__name__ = "tensorrt_rtx"
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", module)
    monkeypatch.setattr("autoprec.backends.tensorrt.cuda_api", lambda device, flavour: fake.FakeCuda())
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts",
                        lambda: [{"name": "NVIDIA RTX A6000", "driver": "580", "compute_capability": "8.6"}])
    baseline = load_baseline(conv_model, load_search_space(), conv_data)
    backend = get_backend("tensorrt-rtx", cache_dir=conv_model.parent / "cache")
    plan = Plan.uniform([u.name for u in baseline.info.units], Precision.FP16)
    with backend.runner(backend.lower(baseline.info, plan, baseline.ranges)) as runner:
        runner.run(baseline.dataset.evaluation[0])
        runner.time(baseline.dataset.evaluation[0])
        runner.layer_times(baseline.dataset.evaluation[0], 2)
    timing = backend.info().timing  # what its latencies would be, and that none was ever measured
    assert "CUDA-event time of one execute_async_v3" in timing and "never executed" in timing
    assert ("ICudaEngine", "create_execution_context", True) in fake.CALLS  # with the runtime config (and its cache)
    assert (conv_model.parent / "cache" / "tensorrt-rtx.runtime-cache").read_bytes() == b"kernels;"
    assert not any(c[1] == "create_timing_cache" for c in fake.CALLS)  # no build-time timing cache on RTX
    missing = sorted(f"{owner}.{name}" for owner, name in fake.ACCESSED
                     if not hasattr(trt if owner == "tensorrt" else getattr(trt, owner, trt), name))
    assert missing == [] and len(fake.ACCESSED) > 30


@pytest.fixture(scope="module")
def quick_start_result(tmp_path_factory):
    """A search of the bundled PP-OCR classifier on its text lines, small budget."""
    out = tmp_path_factory.mktemp("quick") / "result"
    repo = __import__("conftest").REPO
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(
                repo / "datasets" / "ppocr_cls" / "model.onnx", data=repo / "datasets" / "ppocr_cls" / "textlines.npz"
            ),
            judge=autoprec.JudgeSpec(max_loss=0.01),
            study=autoprec.StudySpec(budget=6, warm_start=False),
            out=out,
        )
    )
    return out


def test_rtx_export_build_leaves_the_plan_and_a_build_report(quick_start_result, tmp_path, capsys):
    out = quick_start_result
    chosen = json.loads((out / "best" / "plan.json").read_text())
    folder = tmp_path / "built"
    assert exit_code(["export", out, "--format", "python", "--build", "--out", folder]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert (folder / "model.plan").stat().st_size > 10_000
    report = json.loads((folder / "build_report.json").read_text())
    assert report["built_with"].startswith("tensorrt_rtx") and report["engine_loaded_here"] is False
    assert "cannot load the engine (no NVIDIA GPU here)" in report["note"]
    assert report["fidelity_checks"]["network types"]["checked_units"] == len(chosen["units"])
    assert not report["plan_fidelity"]["plan_ignored"]
    fused = [layer for layer in report["layers"]["layer_table"] if len(layer["fused_from"]) > 1]
    assert fused and any(chosen["units"][0]["name"] in layer["fused_from"] for layer in report["layers"]["layer_table"])
    assert f"plan check ({report['plan_fidelity']['source']})" in printed and "model.plan" in printed


def test_rtx_python_export_script_runs_to_the_serialized_plan(quick_start_result, tmp_path):
    folder = tmp_path / "python"
    assert exit_code(["export", quick_start_result, "--format", "python", "--out", folder]) == 0
    proc = subprocess.run([sys.executable, "build_engine.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (folder / "model.plan").stat().st_size > 10_000 and not (folder / "layers.json").exists()
    assert "cannot be loaded here" in proc.stdout


@pytest.mark.parametrize("fmt, model", [("trtexec", "model.onnx"), ("trt10", "model_fp32.onnx")])
def test_rtx_parses_and_builds_the_trtexec_and_trt10_models(quick_start_result, tmp_path, fmt, model):
    """trt10's build is weak typed (TensorRT <= 10's flags): its FP32 model is what must parse; built here
    strongly typed, i.e. in FP32."""
    folder = tmp_path / fmt
    result = json.loads((quick_start_result / "pareto.json").read_text())
    int8 = result["uniform"]["int8"]
    assert exit_code(["export", quick_start_result, "--format", fmt, "--trial", int8, "--out", folder]) == 0
    profile = read_result_dir(quick_start_result).profile
    assert profile.dynamic  # the bundled classifier's batch: kept dynamic in the exports
    with pytest.raises(BackendError, match="no shape profile"):
        build_engine(trt, TENSORRT_RTX, stored.load(folder / model))
    built = build_engine(trt, TENSORRT_RTX, stored.load(folder / model), profile=profile)
    assert len(built.serialized) > 10_000
    if fmt == "trtexec":
        assert not built.report["plan_fidelity"]["plan_ignored"]
        assert built.report["builder_layers"]["precision_counts"].get("int8", 0) > 0


def test_rtx_builds_a_dynamic_model_for_its_shape_profile(tmp_path, capsys):
    """A recognizer with dynamic batch and width, searched with a min/opt/max profile: export --build and the
    exported Python script both build it with that profile (the dims stay dynamic in the model they parse)."""
    import numpy as np
    from builders import line_reader, save

    model = save(line_reader(), tmp_path / "reader.onnx")
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(
                model, shapes={"x": (1, 3, 8, 16)}, min_shapes={"x": (1, 3, 8, 8)}, max_shapes={"x": (4, 3, 8, 64)}
            ),
            study=autoprec.StudySpec(budget=3, warm_start=False),
            out=out,
        )
    )
    folder = tmp_path / "built"
    assert exit_code(["export", out, "--format", "python", "--build", "--out", folder]) == 0
    report = json.loads((folder / "build_report.json").read_text())
    assert report["shape_profile"]["inputs"][0]["max"] == [4, 3, 8, 64] and report["plan_bytes"] > 1000
    dims = onnx.load(str(folder / "model.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["N", 3, 8, "W"]
    proc = subprocess.run(
        [sys.executable, "build_engine.py", "model.onnx", "script.plan"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (folder / "script.plan").stat().st_size > 1000
    assert np.isfinite(report["build_seconds"])


def test_rtx_export_build_refuses_formats_it_does_not_build(quick_start_result, tmp_path, capsys):
    for fmt in ("trt10", "triton"):
        assert exit_code(["export", quick_start_result, "--format", fmt, "--build", "--out", tmp_path / fmt]) == 2
        assert "is not built by autoprec" in capsys.readouterr().err.strip().splitlines()[-1]
        assert not (tmp_path / fmt).exists()


def test_rtx_inspect_of_a_plan_this_machine_cannot_load_is_one_line(tmp_path, conv_model, capsys):
    built = build_engine(trt, TENSORRT_RTX, stored.load(conv_model))
    (tmp_path / "model.plan").write_bytes(built.serialized)
    assert exit_code(["inspect", tmp_path / "model.plan"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "could not load the engine" in last and "inspect it on a GPU it was built for" in last


@pytest.mark.parametrize("precision", [Precision.INT8, Precision.FP16])
@pytest.mark.parametrize("builder", ["if_model", "loop_model"])
def test_rtx_builds_plans_that_lower_units_inside_if_branches_and_loop_bodies(builder, precision, tmp_path):
    import numpy as np
    import test_control_flow

    from autoprec.analysis.calibrate import calibrate
    from autoprec.analysis.model import analyse

    path = getattr(test_control_flow, builder)(tmp_path / f"{builder}.onnx")
    info = analyse(path, load_search_space(), constants={"sr": 16000} if builder == "if_model" else None)
    rng = np.random.default_rng(0)
    shape = info.inputs[0].shape
    feeds = [{"x": rng.random(shape, dtype=np.float32), **({"sr": np.array(16000)} if builder == "if_model" else {})}
             for _ in range(3)]
    plan = info.plan_at(precision)
    assert any(u.scope for u in info.units if plan[u.name] is precision)
    lowered = lower_plan(info, plan, calibrate(info, feeds, builder), QDQForm.TENSORRT)
    built = build_engine(trt, TENSORRT_RTX, stamp_plan(lowered, info, plan))
    assert built.report["build_seconds"] > 0 and not [w for w in built.report["warnings"] if "already exists" in w]
    # TensorRT names a branch's layers "a | then (then_branch) | If_rate (If)": read as If_rate/then/a, every
    # unit is found at its planned precision, in the network's types and in the builder's own layer list
    checks = built.report["fidelity_checks"]
    assert all(c["checked_units"] == len(info.units) and not c["ignored_units"] for c in checks.values()), checks


def test_an_export_folder_holds_one_trials_files(tmp_path, conv_model, conv_data):
    """export --build, then export --trial N into the same folder: no model.plan or build report of the first
    trial stays beside the second's model; the build report and the manifest name the trial and the model."""
    out = tmp_path / "result"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(conv_model, data=conv_data),
            study=autoprec.StudySpec(budget=3, warm_start=False),
            out=out,
        )
    )
    chosen = json.loads((out / "best" / "plan.json").read_text())["trial"]
    other = next(t["trial"] for t in json.loads((out / "trials.json").read_text())["trials"] if t["trial"] != chosen)
    folder = tmp_path / "trt"
    assert exit_code(["export", out, "--format", "trtexec", "--build", "--out", folder]) == 0
    report, manifest = (json.loads((folder / name).read_text()) for name in ("build_report.json", "export.json"))
    assert report["trial"] == manifest["trial"] == chosen and "model.plan" in manifest["files"]
    assert report["model_sha256"] == manifest["model_sha256"]
    assert exit_code(["export", out, "--format", "trtexec", "--trial", other, "--out", folder]) == 0
    assert not (folder / "model.plan").exists() and not (folder / "build_report.json").exists()
    assert json.loads((folder / "export.json").read_text())["trial"] == other
    assert exit_code(["export", out, "--format", "triton", "--trial", other, "--out", tmp_path / "triton"]) == 0
    config = next((tmp_path / "triton").glob("*/config.pbtxt")).read_text()
    assert f"--format trtexec --trial {other}" in config and "best/model.tensorrt.onnx" not in config


def test_the_doctor_builds_on_the_real_builder_and_names_the_gpu_it_needs(monkeypatch):
    """No GPU here: TensorRT for RTX's real builder passes the build steps (strongly typed, the stamped plan's
    units at their precision, and with a profile); the GPU steps are 'not here', saying which GPUs it runs on."""
    from autoprec.app.doctor import examine

    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: [])
    outcomes = {o.step: o for o in examine("tensorrt-rtx")}
    assert [outcomes[s].result for s in ("import", "lower the plan", "build strongly typed",
                                         "build with a profile (export)")] == ["pass"] * 4
    assert "3 units at their planned precision" in outcomes["build strongly typed"].said
    assert outcomes["GPU"].result == "not here" and "compute capability 8.0, 8.6, 8.9, 12.x" in outcomes["GPU"].fix
    assert {outcomes[s].result for s in ("load (deserialise)", "execute", "time")} == {"skipped"}


@pytest.mark.parametrize("k", [128, 100])
def test_rtx_builds_int4_weights_in_the_dequantize_form_and_reads_them_as_int4(tmp_path, k):
    """An all-INT4 plan of a MatMul and a transposed Gemm with a bias: TensorRT for RTX parses the block-quantized
    DequantizeLinear of INT4 weights, builds, and its network reads each unit's weight from INT4 — also where K is
    not a whole number of blocks (100, 200: the weight and its input padded to whole blocks)."""
    model = builders.save(builders.weight_only_mlp(features=k, hidden=2 * k), tmp_path / "mlp.onnx")
    baseline = load_baseline(model, load_search_space(), None)
    plan = baseline.info.plan_at(Precision.INT4)
    assert plan.counts().get("int4", 0) == 2
    built = build_engine(trt, TENSORRT_RTX, stamp_plan(
        lower_plan(baseline.info, plan, baseline.ranges, QDQForm.TENSORRT), baseline.info, plan))
    for source in ("network types", "builder log"):
        assert not built.report["fidelity_checks"][source]["plan_ignored"], built.report["fidelity_checks"][source]


def test_rtx_builds_an_int4_embedding_and_reads_its_table_as_int4(tmp_path):
    """An embedding at INT4 beside its FP16 projection, then at FP32: TensorRT for RTX parses the INT4 table's block
    DequantizeLinear before the Gather, builds, and both checks find each unit at its planned precision (the gather
    reading INT4; at FP32 a float table)."""
    import numpy as np

    table = np.random.default_rng(2).normal(0, 0.5, (200, 64))
    baseline = load_baseline(builders.save(builders.embedding_lookup(table), tmp_path / "embed.onnx"),
                             load_search_space(), None)
    for mapping in ({"embed": "int4", "proj": "fp16"}, {"embed": "fp32", "proj": "int4"}):
        plan = Plan.from_mapping(mapping)
        built = build_engine(trt, TENSORRT_RTX, stamp_plan(
            lower_plan(baseline.info, plan, baseline.ranges, QDQForm.TENSORRT), baseline.info, plan))
        for source in ("network types", "builder log"):
            check = built.report["fidelity_checks"][source]
            assert check["checked_units"] == 2 and not check["plan_ignored"], (mapping, check)

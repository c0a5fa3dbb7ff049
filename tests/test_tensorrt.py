"""The TensorRT backend, `autoprec inspect` and the TensorRT exports, verified without TensorRT.

TensorRT cannot be installed here. The backend runs against a recording fake (tests/fake_tensorrt.py,
NOT TensorRT); every name it touches is checked against TensorRT 11.4's bindings and the 10.x
stubs (tests/fixtures/tensorrt, origins in its README); inspector JSON parsing runs on real
recorded outputs from NVIDIA's repository.
"""

import json
import os
import runpy
import struct
import sys
from pathlib import Path

import builders
import fake_tensorrt as fake
import numpy as np
import onnx
import pytest
import searching
from cli import exit_code, refused

import autoprec
from autoprec.analysis.calibrate import calibrate, collected_tensors, every_node_tensors
from autoprec.analysis.data import build_dataset
from autoprec.analysis.model import analyse
from autoprec.app.recorded import recreate
from autoprec.backends import get_backend
from autoprec.backends.tensorrt import read_engine_layers
from autoprec.backends.tensorrt.layers import parse_engine_layers, plan_fidelity
from autoprec.core import stored
from autoprec.core.errors import BackendError
from autoprec.core.plan import Plan, Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan
from autoprec.results.files import read_result_dir

FIXTURES = Path(__file__).parent / "fixtures" / "tensorrt"


def _table(name: str) -> set[str]:
    return {line for line in (FIXTURES / name).read_text().splitlines() if line and not line.startswith("#")}


TRT11 = _table("tensorrt_11.4.0.106_identifiers.txt")
TRT10 = _table("tensorrt_stubs_10.13.0.35.1_members.txt")


def in_trt11(name: str) -> bool:
    """In the 11.4 bindings' strings. The linker stores a string that ends another one inside it
    ("num_errors" in "get_num_errors", "INT8" in "UINT8"), so a suffix of an identifier counts."""
    return name in TRT11 or (len(name) >= 4 and any(s.endswith(name) for s in TRT11))


def in_trt10(owner: str, name: str) -> bool:
    return (name if owner == "tensorrt" else f"{owner}.{name}") in TRT10


def unknown_names(accessed) -> list[str]:
    return sorted(f"{owner}.{name}" for owner, name in accessed if not (in_trt11(name) and in_trt10(owner, name)))


@pytest.fixture
def trt(monkeypatch):
    """The fake as ``tensorrt`` (TensorRT 11.4 unless a test resets it to another version)."""
    module = fake.reset()
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    monkeypatch.setattr("autoprec.backends.tensorrt.cuda_api", lambda device, flavour: fake.FakeCuda())
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: fake.GPUS)
    return module


def _full_flow(backend, info, data, ranges, plan):
    model = backend.lower(info, plan, ranges)
    with backend.runner(model) as runner:
        outputs = runner.run(data.evaluation[0])
        timing = runner.time(data.evaluation[0])
        report = runner.build_report()
    node_times = backend.node_times(backend.lower(info, plan, ranges), data.evaluation[0], runs=3)
    return model, outputs, timing, report, node_times


@pytest.mark.parametrize("version", ["11.4.0.106", "10.13.0.35"])
def test_every_tensorrt_name_the_backend_uses_exists_in_tensorrt_11_4_and_10(monkeypatch, trt, conv, version):
    monkeypatch.setitem(sys.modules, "tensorrt", fake.reset(version))
    info, data, ranges = conv
    _full_flow(get_backend("tensorrt"), info, data, ranges, info.plan_at(Precision.INT8))
    assert len(fake.ACCESSED) > 30
    assert unknown_names(fake.ACCESSED) == []
    # the check itself catches a misspelling, on either table
    assert unknown_names({("IBuilderConfig", "set_memory_pool_limt"), ("ICudaEngine", "num_io_tensor")}) == [
        "IBuilderConfig.set_memory_pool_limt", "ICudaEngine.num_io_tensor"]


def test_build_is_strongly_typed_with_workspace_level_detailed_profile_and_a_shared_timing_cache(
    monkeypatch, trt, tmp_path, conv_data
):
    model_path = builders.save(builders.conv_net(batch="N"), tmp_path / "dynamic.onnx")
    info = analyse(model_path, load_search_space(), shapes={"x": (1, 3, 16, 16)})
    plan = Plan.uniform([u.name for u in info.units], Precision.FP16)
    backend = get_backend("tensorrt", cache_dir=tmp_path / "cache")
    with backend.runner(backend.lower(info, plan, None)):
        pass
    calls = fake.CALLS
    assert ("Builder", "create_network", 0) in calls  # TensorRT 11: always strongly typed, no flag
    assert ("IBuilderConfig", "set_memory_pool_limit", "MemoryPoolType.WORKSPACE", 4 << 30) in calls
    assert ("IBuilderConfig", "builder_optimization_level", 3) in calls
    assert any(
        c[:2] == ("IBuilderConfig", "profiling_verbosity") and repr(c[2]) == "ProfilingVerbosity.DETAILED"
        for c in calls
    )
    assert not any(c[0] == "IOptimizationProfile" for c in calls)  # the candidate's inputs are static
    assert ("IBuilderConfig", "create_timing_cache", b"") in calls  # first build of the study: empty cache
    cache_file = tmp_path / "cache" / "tensorrt.timing-cache"
    first = cache_file.read_bytes()
    assert first
    # a later candidate, in another backend (a resumed search, a restarted worker): it starts from the saved cache
    monkeypatch.setitem(sys.modules, "tensorrt", fake.reset("10.13.0.35"))
    again = get_backend("tensorrt", cache_dir=tmp_path / "cache")
    with again.runner(again.lower(info, plan, None)):
        pass
    assert ("IBuilderConfig", "create_timing_cache", first) in fake.CALLS
    assert ("Builder", "create_network", 1 << 1) in fake.CALLS  # 10.x: the STRONGLY_TYPED flag
    assert cache_file.read_bytes().startswith(first) and len(cache_file.read_bytes()) > len(first)


def test_parser_errors_name_the_node_and_operator(trt, conv):
    info, data, ranges = conv
    fake.PARSER_REJECTS.add("Gemm")
    backend = get_backend("tensorrt")
    with pytest.raises(BackendError, match=r"parser rejected.*node 'fc' \(Gemm\): No importer registered"):
        backend.runner(backend.lower(info, Plan.uniform([u.name for u in info.units], Precision.FP32), ranges))


def test_outputs_come_back_from_the_device_and_timing_is_cuda_events_around_execute(trt, conv):
    info, data, ranges = conv
    plan = info.plan_at(Precision.INT8)
    model, outputs, timing, report, node_times = _full_flow(get_backend("tensorrt"), info, data, ranges, plan)
    expected = builders.session(model).run(None, data.evaluation[0])
    np.testing.assert_allclose(outputs["probs"], expected[0], rtol=1e-6)
    assert timing.median_ms == 1.0 and timing.runs == 100 and timing.warmup == 10  # the fake's events: 1 ms each
    executes = [c for c in fake.CALLS if c[1] == "execute_async_v3"]
    assert executes and all(c[2] == 7 for c in executes)  # on the CUDA stream
    assert set(node_times) == {"conv0", "conv1", "conv2", "fc", "softmax"}  # the profiler's layers mapped to ONNX nodes
    assert report["plan_fidelity"] == {"checked_units": len(info.units), "plan_ignored": False, "ignored_units": [],
                                       "source": "engine inspector"}
    assert report["fidelity_checks"]["network types"]["plan_ignored"] is False  # the fake's network, typed by ONNX


def test_plan_fidelity_flags_units_the_engine_did_not_run_as_planned(trt, conv):
    info, data, ranges = conv
    plan = Plan.from_mapping({u.name: "int8" if u.name in ("conv1", "fc") else "fp32" for u in info.units})
    fake.IGNORE_NODES.add("fc")
    backend = get_backend("tensorrt")
    with backend.runner(backend.lower(info, plan, ranges)) as runner:
        fidelity = runner.build_report()["plan_fidelity"]
    assert (
        fidelity["plan_ignored"] and fidelity["checked_units"] == 5
    )  # FP32 units checked too, the softmax unit among them
    assert fidelity["ignored_units"] == [{"unit": "fc", "planned": "int8", "ran": ["fp32"], "layers": ["fc + fused"]}]


def test_search_on_tensorrt_stores_each_builds_report_and_lists_trials_that_ignored_the_plan(
    trt, tmp_path, conv_model, conv_data, caplog
):
    fake.IGNORE_NODES.add("conv2")
    out = tmp_path / "result"
    _search_in_process(conv_model, conv_data, out, budget=5)
    pareto = json.loads((out / "pareto.json").read_text())
    trials = json.loads((out / "trials.json").read_text())["trials"]
    assert pareto["engine"]["engine"] == "tensorrt" and "never been executed" in pareto["engine"]["caveat"]
    ignored = [t["trial"] for t in trials if t["build"]["plan_fidelity"]["plan_ignored"]]
    assert pareto["search"]["plan_ignored"] == ignored
    int8_conv2 = [t["trial"] for t in trials if t["plan"]["precisions"]["conv2"] == "int8"]
    assert int8_conv2 and set(int8_conv2) <= set(ignored)
    assert (out / "cache" / "tensorrt.timing-cache").is_file()
    assert "never been executed" in caplog.text  # the caveat is logged as a warning (the CLI shows it)
    search = pareto["search"]  # builds are slow on TensorRT: plans are judged on the CPU first, 8 per build
    assert search["reference"]["executor"] == "ONNX Runtime CPU running the graph tensorrt builds (tensorrt Q/DQ form)"
    assert search["reference"]["proposals_per_build"] == 8 and search["reference"]["predictions"]
    # the sensitivity pass's profile builds are the first trials' engines: the all-FP32 trial is timed on the
    # engine its profile built, not built again, and is counted once
    on_profiles = [t["trial"] for t in trials if t["build"].get("reused_build")]
    assert 0 in on_profiles and search["trials_on_profile_builds"] == len(on_profiles)
    assert search["engine_builds_by_phase"]["trials"] == 5 - len(on_profiles)
    assert search["engine_builds"] == sum(search["engine_builds_by_phase"].values())
    assert not (out / "cache" / "tensorrt-profiled-engines").exists()  # those no trial took are not left behind
    assert search["reference_evaluations"] > json.loads((out / "sensitivity.json").read_text())["evaluations"]


def test_where_onnx_runtime_cannot_run_the_model_the_target_measures_accuracy_and_the_search_says_so(
        trt, tmp_path, conv_model, conv_data, caplog, monkeypatch):
    from autoprec.backends import onnxruntime

    def lacks_a_kernel(ort, model, options, providers):
        raise BackendError("Could not find an implementation for Conv(11) node with name 'conv1'")

    # the reference executor's sessions (timed or judged) only: the model runs elsewhere
    monkeypatch.setattr(onnxruntime, "new_session", lacks_a_kernel)
    out = tmp_path / "result"
    _search_in_process(conv_model, conv_data, out, budget=4)
    search = json.loads((out / "pareto.json").read_text())["search"]
    assert (
        "the reference executor cannot run this model" in caplog.text
        and "Could not find an implementation" in caplog.text
    )
    assert search["reference"]["executor"] == "tensorrt itself (ONNX Runtime CPU could not run the model)"
    assert (
        search["reference_evaluations"] == 0 and search["engine_builds_by_phase"]["accuracy"] > 0
    )  # counted as builds


def test_selecting_tensorrt_without_it_is_a_one_line_error(monkeypatch, conv_model, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    assert exit_code(["search", str(conv_model), "--backend", "tensorrt", "--budget", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("autoprec: error: --backend tensorrt needs TensorRT's Python package (10.12 or newer) and "
                       "cuda-python: pip install 'autoprec[tensorrt]' --extra-index-url https://pypi.nvidia.com")


# --- inspector / trtexec JSON (real recorded outputs; see fixtures/tensorrt/README.md) ---

def test_detailed_trtexec_layer_info_of_a_qat_mobilenet():
    layers = read_engine_layers(FIXTURES / "mobilenet_qat_layers_excerpt.json")
    assert layers.schema == "tensorrt-10" and layers.detailed
    assert [x["Name"] for x in layers.io_tensors] == ["input1", "1179"]
    compute = {x.name: x for x in layers.compute_layers}
    assert len(layers.layers) == 9 and len(compute) == 5  # Q/DQ and layout reformats, the NoOp squeeze are bookkeeping
    assert layers.precision_counts() == {"int8": 4, "fp16": 1}
    conv94 = compute["features.2.conv.2.weight + QuantizeLinear_90 + Conv_94"]
    assert conv94.precision == "int8" and conv94.outputs[0].dtype == "fp16"  # INT8 kernel writing FP16
    assert compute["GlobalAveragePool_843"].precision == "fp16"
    assert "Clip_16" in compute["features.0.0.weight + QuantizeLinear_8 + Conv_12 + PWN(Clip_16)"].fused_from
    assert layers.summary()["fp32_in_reduced_precision_engine"] == []


def test_layer_names_only_json_is_read_but_has_no_precisions():
    layers = read_engine_layers(FIXTURES / "qat_detector_names_only_excerpt.json")
    assert layers.schema == "names-only" and not layers.detailed
    assert {x.precision for x in layers.layers} == {"unknown"}
    assert plan_fidelity(layers, {"u": {"precision": "int8", "nodes": ["/backbone/conv1/Conv"]}}) is None
    assert "/backbone/conv1/Conv" in layers.layers[4].fused_from


def test_tensorrt_11_schema_split_fields_and_io_tensors():
    layers = read_engine_layers(FIXTURES / "trt11_io_tensors_from_migration_guide.json")
    assert layers.schema == "tensorrt-11"
    assert [(x["Name"], x["IOMode"]) for x in layers.io_tensors] == [("input_0", "Input"), ("output_0", "Output")]
    (conv,) = layers.layers
    assert conv.precision == "fp16" and conv.outputs[0].dtype == "fp32" and conv.outputs[0].format.endswith("(kLINEAR)")
    assert conv.fused_from == ("/features/0/Conv", "/features/0/Relu")  # from Metadata, not the name


def test_fp32_layers_of_a_reduced_precision_engine_are_listed_first():
    def layer(name, dtype):
        return {
            "Name": name,
            "LayerType": "CaskConvolution",
            "Inputs": [{"Name": "t", "Format/Datatype": dtype}],
            "Outputs": [],
        }

    layers = parse_engine_layers(
        {"Layers": [layer("a", "Int8"), layer("b", "Half"), layer("c", "Float")], "Bindings": []}
    )
    assert [x.name for x in layers.ordered()] == ["c", "a", "b"]
    assert layers.summary()["fp32_in_reduced_precision_engine"] == ["c"]


def test_inspect_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "layers.json"
    assert exit_code(["inspect", str(FIXTURES / "mobilenet_qat_layers_excerpt.json"), "--json", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "5 compute layers (9 in all, tensorrt-10 JSON): fp16 1 (20%), int8 4 (80%)" in printed
    written = json.loads(out.read_text())
    assert written["precision_counts"] == {"int8": 4, "fp16": 1} and len(written["layer_table"]) == 5
    pool = next(x for x in written["layer_table"] if x["name"] == "GlobalAveragePool_843")
    assert (
        pool["precision"] == "fp16"
        and pool["inputs"][0]["format"] == "Two wide channel vectorized row major FP16 format"
    )


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_inspect_reads_layer_json_saved_with_a_byte_order_mark(tmp_path, capsys, encoding):
    """A layer JSON a Windows editor or PowerShell's ``>`` saved (a BOM, UTF-16) is JSON, not an engine for TensorRT
    to fail on with a CUDA error."""
    saved = tmp_path / "layers.json"
    saved.write_text((FIXTURES / "mobilenet_qat_layers_excerpt.json").read_text(), encoding=encoding)
    assert exit_code(["inspect", str(saved)]) == 0
    assert "5 compute layers (9 in all, tensorrt-10 JSON)" in " ".join(capsys.readouterr().out.split())


def test_inspect_a_plan_file_without_tensorrt_says_what_is_needed(monkeypatch, tmp_path, capsys):
    for module in ("tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings"):  # no TensorRT of either kind
        monkeypatch.setitem(sys.modules, module, None)
    engine = tmp_path / "model.plan"
    engine.write_bytes(b"\x00ftrt binary engine")
    assert exit_code(["inspect", str(engine)]) == 2
    assert "needs TensorRT's Python package" in capsys.readouterr().err
    assert exit_code(["inspect", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err


# --- TensorRT's documented Q/DQ rules, on the explicit-precision models autoprec writes ---

def check_tensorrt_qdq_rules(model) -> int:
    """Zero points 0 (int8), positive finite scales, per-channel weights on the output-channel axis,
    Q/DQ pairs only in front of Conv/MatMul/Gemm inputs (``model``: a stored model). Returns the number of Q/DQ pairs."""
    inits = {i.name: model.tensor(i.name) for i in model.graph.initializer}
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producer = {out: n for n in model.graph.node for out in n.output}
    pairs = 0
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        scale, zero_point = inits[node.input[1]], inits[node.input[2]]
        assert zero_point.dtype == np.int8 and not zero_point.any(), node.name
        assert np.all(np.isfinite(scale)) and np.all(scale > 0), node.name
        if node.op_type == "QuantizeLinear":
            assert all(c.op_type == "DequantizeLinear" for c in consumers[node.output[0]]), node.name
            continue
        pairs += 1
        for consumer in consumers[node.output[0]]:
            assert consumer.op_type in ("Conv", "MatMul", "Gemm"), (node.name, consumer.op_type)
        if node.input[0] in inits:  # a weight: per output channel
            weight, (consumer,) = inits[node.input[0]], consumers[node.output[0]]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            transposed = any(a.name == "transB" and a.i for a in consumer.attribute)
            expected = 0 if consumer.op_type == "Conv" or transposed else weight.ndim - 1
            assert scale.shape == (weight.shape[expected],) and axis == expected, node.name
        else:
            assert producer[node.input[0]].op_type == "QuantizeLinear"
    return pairs


@pytest.mark.parametrize("build", [builders.conv_net, builders.mlp, builders.attention])
def test_explicit_precision_models_meet_tensorrts_qdq_rules(tmp_path, build):
    path = builders.save(build(), tmp_path / "m.onnx")
    info = analyse(path, load_search_space())
    data = build_dataset(None, info.inputs)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    names = [u.name for u in info.searchable_units if Precision.INT8 in u.allowed]
    for plan in (
        info.plan_at(Precision.INT8),
        Plan.from_mapping({n: ("int8", "fp16")[i % 2] for i, n in enumerate(names)}),
    ):
        model = lower_plan(info, plan, ranges, QDQForm.TENSORRT)
        builders.check(model)
        assert check_tensorrt_qdq_rules(model) >= plan.counts()["int8"]


# --- exports, from a real search result ---

@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("trt-export")
    model, data = builders.conv_with_data(root, 12, batch="N", name="dynamic.onnx")
    out = root / "result"
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=4), out=out)
    )
    pareto = json.loads((out / "pareto.json").read_text())
    return out, pareto["uniform"]["int8"], model


def test_trtexec_export_is_a_strongly_typed_build_of_the_explicit_precision_model(result, capsys):
    out, int8_trial, _ = result
    assert exit_code(["export", str(out), "--format", "trtexec", "--trial", str(int8_trial)]) == 0
    folder = out / "export" / "trtexec"
    script = (folder / "build.sh").read_text()
    assert "NOT run by autoprec" in script and "NOT run by autoprec" in capsys.readouterr().err
    for flag in ("--onnx=model.onnx", "--saveEngine=model.plan", "--timingCacheFile=timing.cache",
                 "--profilingVerbosity=detailed", "--exportLayerInfo=layers.json", "--memPoolSize=workspace:4096",
                 "--stronglyTyped"):  # required on 10.12-10.x; 11's trtexec takes it as always on
        assert flag in script
    assert "Builds on TensorRT 10.12 or newer, 11 included" in script
    for not_wanted in ("--fp16", "--int8", "--calib", "--best", "--precisionConstraints"):
        assert not_wanted not in script  # removed in 11
    for point in ("min", "opt", "max"):  # the model keeps its dynamic batch: a profile of the one measured shape
        assert f"--{point}Shapes=x:1x3x16x16" in script
    model = stored.load(folder / "model.onnx")
    assert check_tensorrt_qdq_rules(model) >= 4


def test_trt10_export_constrains_every_node_and_writes_the_calibrated_scales(result):
    out, int8_trial, _ = result
    assert exit_code(["export", str(out), "--format", "trt10", "--trial", str(int8_trial)]) == 0
    folder = out / "export" / "trt10"
    script = (folder / "build_trt10.sh").read_text()
    assert "--int8" in script and "--calib=calibration.cache" in script and "--precisionConstraints=obey" in script
    precisions = script.split("--layerPrecisions=")[1].split()[0].strip("'")
    assert set(precisions.split(",")) >= {"conv0:int8", "conv1:int8", "conv2:int8", "fc:int8"}
    # the FP32 model as autoprec analysed it: every node the flags name is in it, its dynamic batch kept
    assert "--onnx=model_fp32.onnx" in script
    fp32 = onnx.load(str(folder / "model_fp32.onnx"))
    assert {p.split(":")[0] for p in precisions.split(",")} <= {n.name for n in fp32.graph.node}
    assert [d.dim_param or d.dim_value for d in fp32.graph.input[0].type.tensor_type.shape.dim] == ["N", 3, 16, 16]
    assert "--minShapes=x:1x3x16x16" in script
    assert not any(n.op_type in ("QuantizeLinear", "Cast") for n in fp32.graph.node)
    lines = (folder / "calibration.cache").read_text().splitlines()
    assert lines[0] == "TRT-100000-EntropyCalibration2"
    cache = {
        name: struct.unpack(">f", bytes.fromhex(value))[0] for name, value in (line.split(": ") for line in lines[1:])
    }
    # the same scales as the explicit-precision model's activation Q nodes
    assert (
        exit_code(["export", str(out), "--format", "trtexec", "--trial", str(int8_trial), "--out", str(folder / "q")]) == 0
    )
    model = onnx.load(str(folder / "q" / "model.onnx"))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    quantized = {
        n.input[0]: float(inits[n.input[1]])
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits
    }
    assert quantized and all(cache[name] == pytest.approx(scale, rel=1e-6) for name, scale in quantized.items())
    # a scale for every node output of a unit (implicit INT8 holds each node to INT8), where the search histogrammed
    # only what its lowerings quantize
    info = recreate(read_result_dir(out)).info
    assert set(cache) == set(every_node_tensors(info)) > set(collected_tensors(info))


def test_python_export_builds_with_the_api_and_uses_only_real_tensorrt_names(result, trt, monkeypatch, tmp_path):
    out, int8_trial, _ = result
    folder = tmp_path / "python"
    assert exit_code(["export", str(out), "--format", "python", "--trial", str(int8_trial), "--out", str(folder)]) == 0
    fake.ACCESSED.clear()
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["build_engine.py"])
    runpy.run_path(str(folder / "build_engine.py"), run_name="__main__")
    assert (folder / "model.plan").is_file() and (folder / "timing.cache").is_file()
    assert unknown_names(fake.ACCESSED) == [] and len(fake.ACCESSED) > 20
    layers = read_engine_layers(folder / "layers.json")
    assert layers.precision_counts() == {"int8": 4, "fp32": 1}  # and the softmax, a sensitive unit, FP32 as planned


def test_markdown_build_card_carries_the_measured_figures_and_every_unit(result):
    out, int8_trial, _ = result
    assert exit_code(["export", str(out), "--format", "markdown", "--trial", str(int8_trial)]) == 0
    card = (out / "export" / "markdown" / "BUILD.md").read_text()
    trials = {t["trial"]: t for t in json.loads((out / "trials.json").read_text())["trials"]}
    assert f"autoprec trial {int8_trial}" in card and f"{trials[int8_trial]['final_latency_ms']:.3f} ms" in card
    assert "NOT run by autoprec" in card and "```mermaid" in card and "onnxruntime" in card
    for unit in ("conv0", "conv1", "conv2", "fc"):
        assert f"| `{unit}` |" in card
    assert "4 INT8 · 0 FP16 · 0 FP32" in card


def test_builder_log_layers_of_tensorrt_for_rtx_are_read_without_tensorrt():
    """TensorRT for RTX's verbose "Layers:" block (recorded from the real 1.7.1 builder, see the fixtures'
    README): fused layers, their types (weights decide), the ONNX nodes each holds."""
    from autoprec.backends.tensorrt.layers import parse_builder_layers

    layers = parse_builder_layers((FIXTURES / "rtx_1.7.1_builder_layers_conv_net_mixed.txt").read_text())
    assert layers.schema == "builder-log" and len(layers.layers) == 9
    by_name = {x.name: x for x in layers.layers}
    assert by_name["conv0_myl0_1"].precision == "int8" and by_name["conv0_myl0_1"].layer_type == "correlation"
    assert by_name["__myl_CorrSiluCastAdd_myl0_3"].precision == "fp16"  # conv1's FP16 filters, inputs FP32 and FP16
    assert by_name["__myl_CorrSiluCastAdd_myl0_3"].fused_from[:4] == ("conv1", "sig1", "silu1", "residual")
    assert by_name["conv2_myl0_4"].precision == "fp32" and by_name["fc_myl0_6"].precision == "int8"
    planned = {"conv0": "int8", "conv1": "fp16", "conv2": "fp32", "fc": "int8"}
    fidelity = plan_fidelity(layers, {u: {"precision": p, "nodes": [u]} for u, p in planned.items()})
    assert fidelity.to_json() == {
        "checked_units": 4,
        "plan_ignored": False,
        "ignored_units": [],
        "source": "builder log",
    }
    wrong = plan_fidelity(layers, {"conv2": {"precision": "fp16", "nodes": ["conv2"]}})
    assert wrong.ignored == ({"unit": "conv2", "planned": "fp16", "ran": ["fp32"], "layers": ["conv2_myl0_4"]},)


def test_a_fused_kernel_with_casts_inside_and_one_float_type_outside_does_not_refute_the_plan():
    """TensorRT for RTX fuses an FP16 softmax between FP32 neighbours with its two Casts into one kernel whose
    tensors are all FP32 (seen on ppocr-cls and ppocr-rec): the log cannot say the softmax ran FP32; a kernel
    without a Cast in it still can."""
    from autoprec.backends.tensorrt.layers import EngineLayer, EngineLayers, TensorFormat

    def layer(name):
        fp32 = (TensorFormat("t", "fp32", "Row major linear FP32", (1, 2)),)
        return EngineLayer(name=name, layer_type="kgen", precision="fp32", inputs=fp32, outputs=fp32,
                           fused_from=("softmax",))

    planned = {"softmax": {"precision": "fp16", "nodes": ["softmax"]}}
    fused = EngineLayers((layer("__myl_AddCastSlicMaxSubExpAddDivCast_myl0_108"),), (), "builder-log", "builder log")
    assert not plan_fidelity(fused, planned).plan_ignored
    plain = EngineLayers((layer("__myl_MaxSubExpAddDiv_myl0_108"),), (), "builder-log", "builder log")
    assert plan_fidelity(plain, planned).ignored[0]["ran"] == ["fp32"]


def test_the_build_card_keeps_the_searchs_verdict_on_timing_noise(result, tmp_path):
    from autoprec.record.verdict import ratio_text

    out, _, _ = result
    pareto = json.loads((out / "pareto.json").read_text())
    assert exit_code(["export", str(out), "--format", "markdown", "--out", str(tmp_path)]) == 0
    speedup = next(line for line in (tmp_path / "BUILD.md").read_text().splitlines() if line.startswith("Speed-up:"))
    versus = pareto["chosen_vs_fp32"]
    if versus["fp32_trial"] == pareto["chosen"]:
        assert "this is the all-FP32 plan" in speedup
    else:
        assert f"{ratio_text(versus['speedup'])}×" in speedup and "all-FP32" in speedup  # 1.0004 is not "1.00"
        assert ("beyond timing noise" if versus["beyond_timing_noise"] else "WITHIN timing noise") in speedup


def test_layer_metadata_names_nodes_inside_if_branches_by_their_path():
    from autoprec.backends.tensorrt.layers import onnx_nodes

    assert onnx_nodes("[ONNX Layer: stem]") == ["stem"]
    assert onnx_nodes("[ONNX Layer: a | then (then_branch) | If_1 (If)]") == ["If_1/then/a"]
    nested = "[ONNX Layer: conv | else (else_branch) | If_2 (If) | body (body) | Loop_0 (Loop)]"
    assert onnx_nodes(nested) == ["Loop_0/body/If_2/else/conv"]
    assert onnx_nodes("[ONNX Layer: /model/x | odd]") == ["/model/x | odd"]  # not the branch form: kept as written


def _search_in_process(model, data, out, budget):
    """A search on the recording fake TensorRT, in this process (the fake is installed here, not in workers)."""
    searching.search(autoprec.SearchConfig(autoprec.InputSpec(model, data=data), out=out,
                                          engine=autoprec.EngineSpec(backend="tensorrt"),
                                          study=autoprec.StudySpec(budget=budget),
                                          isolation=autoprec.IsolationSpec(isolate=False)))


def test_the_polygraphy_export_is_read_by_polygraphy_and_its_reference_runs(result, tmp_path):
    """Polygraphy (pip) reads inputs.json; the FP32 reference command runs (ONNX Runtime is here); the TensorRT
    comparison, which needs a GPU, is parsed into Polygraphy's own script (--gen-script) without running."""
    import shlex
    import subprocess

    from polygraphy.json import load_json

    out, int8_trial, model = result
    folder = tmp_path / "pg"
    assert exit_code(["export", str(out), "--format", "polygraphy", "--trial", str(int8_trial), "--out", str(folder)]) == 0
    feeds = load_json(str(folder / "inputs.json"))
    assert feeds and all(set(feed) == {"x"} and feed["x"].shape == (1, 3, 16, 16) for feed in feeds)
    script = (folder / "check.sh").read_text()
    commands = [shlex.split(block.replace("\\\n", " ")) for block in script.split("\n\n") if block.startswith("polygraphy")]
    assert [c[:2] for c in commands] == [["polygraphy", "run"], ["polygraphy", "run"], ["polygraphy", "inspect"]]
    polygraphy = str(Path(sys.executable).parent / "polygraphy")
    reference = subprocess.run([polygraphy, *commands[0][1:]], cwd=folder, capture_output=True, text=True, timeout=120)
    assert reference.returncode == 0 and (folder / "fp32_outputs.json").is_file(), reference.stdout[-2000:]
    compare = subprocess.run([polygraphy, *commands[1][1:], "--gen-script", "check.py"], cwd=folder,
                             capture_output=True, text=True, timeout=120)
    assert compare.returncode == 0, compare.stdout[-2000:] + compare.stderr[-2000:]
    generated = (folder / "check.py").read_text()
    assert "strongly_typed=True" in generated and "atol={'probs'" in generated
    assert "Profile().add('x', min=[1, 3, 16, 16]" in generated  # the dynamic batch's profile, as searched
    assert f"polygraphy run {os.path.relpath(model, folder)} --onnxrt" in script and "NOT run by autoprec" in script


def test_polygraphy_tolerances_name_each_output_once_at_its_largest_error_over_the_judged_shapes():
    """A plan judged at several shapes holds ``y``, ``y @ min`` and ``y @ max``: Polygraphy knows ``y`` alone, and
    inputs.json holds every shape's batches, so ``y`` takes the largest of the three."""
    from types import SimpleNamespace

    from autoprec.export.polygraphy import TOLERANCE_FACTOR, tolerances

    metrics = {"y": {"max_abs": 1e-3}, "y @ min": {"max_abs": 4e-3}, "y @ max": {"max_abs": 2e-3},
               "labels": {"max_abs": 0.0}}
    found = tolerances(SimpleNamespace(trial=SimpleNamespace(metrics=metrics)))
    assert set(found) == {"y", "labels"} and found["y"] == pytest.approx(TOLERANCE_FACTOR * 4e-3)


def test_the_polygraphy_check_runs_after_the_result_folder_moves(result, tmp_path):
    """check.sh names the given model relative to its own folder and runs there (it named it by an absolute path,
    and read its inputs from the working directory): moved with the model beside it, its reference still runs."""
    import shutil
    import subprocess

    out, _, model = result
    assert exit_code(["export", str(out), "--format", "polygraphy"]) == 0
    moved = tmp_path / "elsewhere"
    shutil.copytree(out.parent, moved, ignore=shutil.ignore_patterns("study.db", "cache", "artifacts"))
    shutil.rmtree(out / "export" / "polygraphy")
    folder = moved / out.name / "export" / "polygraphy"
    blocks = (folder / "check.sh").read_text().split("\n\n")
    assert "polygraphy run ../../../dynamic.onnx --onnxrt" in blocks[2] and str(model) not in blocks[2]
    (folder / "reference.sh").write_text("\n\n".join(blocks[:3]) + "\n")  # the FP32 reference: TensorRT is not here
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run(["sh", str(folder / "reference.sh")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0 and (folder / "fp32_outputs.json").is_file(), ran.stdout[-2000:] + ran.stderr[-2000:]


LAYER_FILES = {
    "layers of numbers": '{"Layers": [1, 2]}',
    "inputs a number": '{"Layers": [{"Name": "a", "Inputs": 5}]}',
    "bindings a number": '{"Layers": [], "Bindings": 5}',
    "io tensors a string": '{"Layers": [{"Name": "a"}], "I/O Tensors": "x"}',
    "plain text": "this is a text file, not an engine\n",
    "empty": "",
}


@pytest.mark.parametrize("kind", sorted(LAYER_FILES))
def test_inspect_of_odd_files_is_one_line(tmp_path, capsys, kind):
    path = tmp_path / "layers.json"
    path.write_text(LAYER_FILES[kind])
    last = refused(["inspect", path], capsys, f"{path}: ")
    if kind == "plain text":
        assert "TensorRT" not in last


def test_inspect_reads_a_json_file_bounded(tmp_path, capsys):
    """A layer JSON past the bound is refused before it is read whole (a sparse file: no disk is used)."""
    from autoprec.core.untrusted import JSON_BYTES

    path = tmp_path / "layers.json"
    with open(path, "wb") as f:
        f.write(b'{"Layers": [')
        f.truncate(JSON_BYTES + 1)
    assert "larger than" in refused(["inspect", path], capsys, f"{path}: ")

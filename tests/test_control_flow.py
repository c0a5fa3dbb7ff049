"""Models with control flow: units inside If branches and Loop bodies are found, calibrated, lowered
and searched; preparation never breaks a model that runs; scalar and state inputs take data."""

import builders
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import searching
from onnx import TensorProto, helper, numpy_helper

import autoprec
from autoprec.analysis import preparation
from autoprec.analysis.calibrate import calibrate
from autoprec.analysis.data import batch_items, build_dataset, random_items
from autoprec.analysis.model import analyse
from autoprec.analysis.model_info import TensorSpec
from autoprec.analysis.shapes import batch_axes, declared_inputs
from autoprec.analysis.subgraphs import graphs, with_outputs
from autoprec.core.errors import DataError, ModelError
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.accuracy import compare, loss_from_metrics
from autoprec.zoo import ENTRIES

SPACE = load_search_space()
RNG = np.random.default_rng(0)


def _conv(name, x, y, cin, cout, nodes, inits):
    w = numpy_helper.from_array((RNG.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32), f"{name}_w")
    inits.append(w)
    nodes.append(helper.make_node("Conv", [x, w.name], [y], name=name, pads=[1, 1, 1, 1]))


def if_model(path):
    """stem Conv, then If (sr == 16000): two Conv+Relu in the then branch, one Conv in the else branch,
    both reading the stem's output from the outer graph."""
    nodes, inits = [], []
    _conv("stem", "x", "h", 3, 8, nodes, inits)
    then_nodes, then_inits = [], []
    _conv("a", "h", "a_out", 8, 8, then_nodes, then_inits)
    then_nodes.append(helper.make_node("Relu", ["a_out"], ["a_act"], name="a_relu"))
    _conv("b", "a_act", "then_y", 8, 4, then_nodes, then_inits)
    else_nodes, else_inits = [], []
    _conv("c", "h", "else_y", 8, 4, else_nodes, else_inits)
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
    then_graph = helper.make_graph(then_nodes, "then", [], [out("then_y")], then_inits)
    else_graph = helper.make_graph(else_nodes, "else", [], [out("else_y")], else_inits)
    inits.append(numpy_helper.from_array(np.array(16000, np.int64), "wide"))
    nodes += [
        helper.make_node("Equal", ["sr", "wide"], ["is_wide"], name="is_wide"),
        helper.make_node("If", ["is_wide"], ["y"], name="If_rate", then_branch=then_graph, else_branch=else_graph),
    ]
    graph = helper.make_graph(
        nodes, "if_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def loop_model(path):
    """A Loop of 3 iterations whose body runs Conv+Relu on the carried activation."""
    body_nodes, body_inits = [], []
    _conv("step", "h_in", "h_conv", 4, 4, body_nodes, body_inits)
    body_nodes += [helper.make_node("Relu", ["h_conv"], ["h_out"], name="step_relu"),
                   helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")]
    body = helper.make_graph(
        body_nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None),
        ],
        body_inits,
    )
    inits = [numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go")]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], name="Loop_steps", body=body)], "loop_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _run(model, feeds):
    return builders.session(model).run(None, feeds)


def test_units_inside_if_branches_are_found_and_named_by_their_path(tmp_path):
    info = analyse(if_model(tmp_path / "if.onnx"), SPACE, constants={"sr": 16000})
    names = [u.name for u in info.units]
    assert sorted(names) == ["If_rate/else/c", "If_rate/then/a", "If_rate/then/b", "stem"]
    assert info.unit("If_rate/then/a").nodes == ("a", "a_relu") and info.unit("If_rate/then/a").scope == (
        "If_rate",
        "then_branch",
    )
    assert all(u.searchable for u in info.units)


def test_subgraph_tensors_read_off_a_run_empty_where_the_branch_was_not_taken(tmp_path):
    model = onnx.load(if_model(tmp_path / "if.onnx"))
    exposed, read_as = with_outputs(model, ["a_out", "else_y", "h"])
    x = RNG.random((1, 3, 8, 8), dtype=np.float32)
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    wide = session.run(read_as, {"x": x, "sr": np.array(16000, np.int64)})
    narrow = session.run(read_as, {"x": x, "sr": np.array(8000, np.int64)})
    assert [v.shape for v in wide] == [(1, 8, 8, 8), (0,), (1, 8, 8, 8)]
    assert [v.shape for v in narrow] == [(0,), (1, 4, 8, 8), (1, 8, 8, 8)]
    assert read_as[2] == "h"  # a top-graph tensor is read under its own name


@pytest.mark.parametrize("form", list(QDQForm))
def test_lowering_puts_qdq_and_casts_inside_the_branch_and_the_model_still_runs(tmp_path, form):
    info = analyse(if_model(tmp_path / "if.onnx"), SPACE, constants={"sr": 16000})
    feeds = [{"x": RNG.random((1, 3, 8, 8), dtype=np.float32), "sr": np.array(16000, np.int64)} for _ in range(4)]
    ranges = calibrate(info, feeds, "if")
    assert "a_act" in ranges.tensors and "c" not in ranges.tensors
    plan = info.plan_at(Precision.INT8, ["If_rate/then/a", "If_rate/then/b"])
    lowered = lower_plan(info, plan, ranges, form)
    then = next(g for scope, g in graphs(lowered.graph) if scope == ("If_rate", "then_branch"))
    assert sum(n.op_type == "QuantizeLinear" for n in then.node) >= 2
    assert not any(n.op_type == "QuantizeLinear" for n in lowered.graph.node)
    fp16 = lower_plan(info, info.plan_at(Precision.FP16, ["If_rate/else/c"]), None, form)
    other = next(g for scope, g in graphs(fp16.graph) if scope == ("If_rate", "else_branch"))
    assert any(n.op_type == "Cast" for n in other.node)
    for candidate in (lowered, fp16):
        for sr in (16000, 8000):
            got = _run(candidate, {**feeds[0], "sr": np.array(sr, np.int64)})[0]
            want = _run(info.stored, {**feeds[0], "sr": np.array(sr, np.int64)})[0]
            cosine = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
            assert got.shape == want.shape and cosine > 0.98


@pytest.mark.parametrize("form", list(QDQForm))
def test_a_unit_whose_output_only_the_branches_read_is_lowered_to_int8(tmp_path, form):
    """The stem's output is read inside the If's branches alone: they keep reading it raw, so in
    ONNX Runtime's form it takes no output Q/DQ (a DQ nothing reads had no place in the graph)."""
    info = analyse(if_model(tmp_path / "if.onnx"), SPACE, constants={"sr": 16000})
    feeds = [{"x": RNG.random((1, 3, 8, 8), dtype=np.float32), "sr": np.array(16000, np.int64)} for _ in range(4)]
    lowered = lower_plan(info, info.plan_at(Precision.INT8, ["stem"]), calibrate(info, feeds, "if"), form)
    assert any(n.op_type == "QuantizeLinear" for n in lowered.graph.node)
    for sr in (16000, 8000):
        got = _run(lowered, {**feeds[0], "sr": np.array(sr, np.int64)})[0]
        want = _run(info.stored, {**feeds[0], "sr": np.array(sr, np.int64)})[0]
        assert got.shape == want.shape and np.abs(got - want).max() < 0.1 * np.abs(want).max()


def test_units_inside_a_loop_body_are_calibrated_over_every_iteration_and_lowered(tmp_path):
    info = analyse(loop_model(tmp_path / "loop.onnx"), SPACE)
    assert [u.name for u in info.units] == ["Loop_steps/body/step"]
    feeds = [{"x": RNG.random((1, 4, 8, 8), dtype=np.float32)} for _ in range(3)]
    ranges = calibrate(info, feeds, "loop")
    assert ranges["h_out"].max > 0
    lowered = lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.TENSORRT)
    body = next(g for scope, g in graphs(lowered.graph) if scope)
    assert any(n.op_type == "DequantizeLinear" for n in body.node)
    got, want = _run(lowered, feeds[0])[0], _run(info.stored, feeds[0])[0]
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def test_search_with_a_constant_sample_rate_searches_the_taken_branch_and_pins_the_other(tmp_path):
    path = if_model(tmp_path / "if.onnx")
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(path, constants={"sr": 16000}),
            study=autoprec.StudySpec(budget=5),
            isolation=autoprec.IsolationSpec(isolate=False),
            out=tmp_path / "out",
        )
    )
    assert result.search["constants"] == {"sr": 16000}
    assert result.model.searchable_units == 3  # the else branch never runs on sr 16000: pinned FP32
    assert any("never run on the data (e.g. If_rate/else/c" in note for note in result.model.preparation)
    chosen = result.chosen.plan.as_dict()
    assert chosen["If_rate/else/c"] is Precision.FP32
    exported = onnx.load(str(tmp_path / "out" / "best" / "model.onnx"))
    x = RNG.random((1, 3, 8, 8), dtype=np.float32)
    fresh = _run(exported, {"x": x, "sr": np.array(16000, np.int64)})[0]
    original = _run(onnx.load(str(path)), {"x": x, "sr": np.array(16000, np.int64)})[0]
    assert fresh.shape == original.shape and np.isfinite(fresh).all()
    from searching import main

    assert main(["report", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.html").read_text()
    assert "If_rate/then/a" in report and "If_rate/else/c" in report
    assert main(["export", str(tmp_path / "out"), "--format", "trtexec", "--out", str(tmp_path / "exported")]) == 0
    exported = onnx.load(str(next((tmp_path / "exported").glob("*.onnx"))))
    then = next(g for scope, g in graphs(exported.graph) if scope == ("If_rate", "then_branch"))
    assert chosen["If_rate/then/a"] is Precision.FP32 or any(n.op_type in ("QuantizeLinear", "Cast") for n in then.node)


def test_a_scalar_integer_input_needs_a_value_not_random_data(tmp_path):
    info = analyse(if_model(tmp_path / "if.onnx"), SPACE, constants={"sr": 16000})
    with pytest.raises(DataError, match=r"input sr is a scalar of type int64.*--const sr=VALUE"):
        build_dataset(None, info.inputs)
    dataset = build_dataset(None, info.inputs, constants={"sr": 16000})
    assert all(b["sr"].shape == () and b["sr"] == 16000 for b in dataset.evaluation)
    with pytest.raises(DataError, match="--const rate: the model has no input rate"):
        build_dataset(None, info.inputs, constants={"rate": 16000})


def test_a_state_input_batches_along_its_own_axis(tmp_path):
    assert batch_axes([("batch", 576), (2, "batch", 128), ()]) == [0, 1, None]
    assert batch_axes([(None, None), (2, None, 128)]) == [0, 1]  # unnamed dims: the state's only dynamic one
    assert batch_axes([(1, 576), (2, 1, 128)]) == [0, 1]  # all fixed: the axis of the first input's batch size
    assert batch_axes([("seq", 576), (1, 1, 128)]) == [0, None]  # fixed beside a dynamic batch: one per run
    specs = [TensorSpec("input", (4, 576), "float32", 0), TensorSpec("h", (1, 1, 128), "float32", None)]
    batches = batch_items(random_items(specs, 8, 0, 4), specs)
    assert [(b["input"].shape, b["h"].shape) for b in batches] == [((4, 576), (1, 1, 128))] * 2
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])
    state = helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 3])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, "batch", 3])
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "w"], ["g"], name="gemm", transB=1),
            helper.make_node("Add", ["g", "state"], ["out"], name="add"),
        ],
        "state",
        [x, state],
        [out],
        [w],
    )
    path = tmp_path / "state.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    data = tmp_path / "data.npz"
    np.savez(data, input=RNG.random((6, 4), dtype=np.float32), state=RNG.random((6, 2, 1, 3), dtype=np.float32))
    info = analyse(path, SPACE, {"input": (2, 4), "state": (2, 2, 3)})
    dataset = build_dataset(data, info.inputs)  # items saved whole ([2, 1, 3]) are taken per item ([2, 3])
    assert dataset.evaluation[0]["state"].shape == (2, 2, 3) and dataset.evaluation[0]["input"].shape == (2, 4)
    assert [s.batch_axis for s in declared_inputs(onnx.load(str(path)))] == [0, 1]
    np.savez(data, input=RNG.random((6, 4), dtype=np.float32), state=RNG.random((6, 5), dtype=np.float32))
    with pytest.raises(
        DataError, match=r"items for input state have shape \[5\].*takes \[2, 3\] per item.*batch on axis 1"
    ):
        build_dataset(data, info.inputs)
    with pytest.raises(
        ModelError,
        match=r"--shape: inputs input and state share the dim 'batch' but are given 2 and 3 there; give them the same size",
    ):
        analyse(path, SPACE, {"input": (2, 4), "state": (2, 3, 3)})


def test_a_preparation_step_that_breaks_the_model_is_left_out_with_a_note(conv_model, monkeypatch):
    def corrupting(model):
        broken = onnx.ModelProto()
        broken.CopyFrom(model.proto)
        for weight in broken.graph.initializer:
            weight.CopyFrom(numpy_helper.from_array(np.asarray(model.tensor(weight.name)) * 2 + 1, weight.name))
        return model.with_proto(broken), "folded"

    monkeypatch.setattr(preparation, "fold_batchnorms", corrupting)
    info = analyse(conv_model, SPACE)
    assert any("preparation step 'BatchNorm and bias folding' left out" in n and "changed" in n for n in info.notes)
    x = RNG.random(info.inputs[0].shape, dtype=np.float32)
    original = _run(onnx.load(str(conv_model)), {"x": x})[0]
    assert np.allclose(_run(info.stored, {"x": x})[0], original, rtol=1e-3, atol=1e-5)



def test_constants_inside_branches_fold_on_an_onnx_runtime_that_refuses_newer_ir_versions(tmp_path, monkeypatch):
    """ONNX Runtime 1.31 (the GPU machine's) refuses onnx 1.23's newest IR version; folding a branch
    exports it as a model of its own, which must carry the model's IR version, not the newest."""
    path = if_model(tmp_path / "if.onnx")
    model = onnx.load(path)
    then = next(a.g for a in model.graph.node[-1].attribute if a.name == "then_branch")
    then.initializer.extend(
        [numpy_helper.from_array(np.float32(2), "two"), numpy_helper.from_array(np.float32(3), "three")]
    )
    then.node.insert(0, helper.make_node("Mul", ["two", "three"], ["six"], name="constant_scale"))
    then.node.append(helper.make_node("Mul", ["then_y", "six"], ["then_scaled"], name="scale"))
    then.output[0].name = "then_scaled"
    onnx.save(model, path)
    newest = onnx.helper.make_model(helper.make_graph([], "g", [], [])).ir_version
    real_session = ort.InferenceSession

    def older_runtime(model_or_path, *args, **kwargs):
        if isinstance(model_or_path, bytes) and onnx.load_from_string(model_or_path).ir_version >= newest:
            raise RuntimeError(f"Unsupported model IR version: {newest}, max supported IR version: {newest - 1}")
        return real_session(model_or_path, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", older_runtime)
    info = analyse(path, SPACE, constants={"sr": 16000})
    then_nodes = [
        n.name for scope, g in graphs(info.model.graph) if scope == ("If_rate", "then_branch") for n in g.node
    ]
    assert "scale" in then_nodes and "constant_scale" not in then_nodes
def test_silero_vad_is_a_zoo_model_with_speech_data():
    entry = ENTRIES["silero-vad"]
    assert entry.wheel.requirement == "silero-vad==6.2.3" and entry.shapes["sr"] == ()


def _loss_in_fresh_sessions(chosen, original, out) -> float:
    """The chosen plan's loss as autoprec defines it (mean over outputs; per item), measured in fresh ONNX
    Runtime sessions of the exported file against the model as it came, on the search's evaluation share
    of the speech items (re-created from its record): what the limit bounds, the mean there, not any one
    item (a plan within 0.01 there was measured at 0.056 over all 64 items)."""
    from autoprec.app.recorded import recreate
    from autoprec.results.files import read_result_dir

    feeds = recreate(read_result_dir(out)).dataset.evaluation
    sessions = [ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]) for path in (chosen, original)]
    chosen_runs, original_runs = ([{f"out{k}": a[None] for k, a in enumerate(session.run(None, f))} for f in feeds]
                                  for session in sessions)  # one item per batch
    loss = loss_from_metrics(compare(original_runs, chosen_runs), "cosine")
    print(f"loss in fresh sessions over {len(feeds)} items: {loss:.2e}")
    return loss


def _shipped_graphs_run(out, plans) -> None:
    """What the final timing times runs in ONNX Runtime on what it times them on: each plan lowered onto the graph
    best/ ships, and the given model, at their own dims."""
    from autoprec.app.recorded import recreate
    from autoprec.backends import get_backend
    from autoprec.core.stored import StoredModel
    from autoprec.measure.measurement import Lowering
    from autoprec.results.files import read_result_dir

    baseline = recreate(read_result_dir(out))
    engine = get_backend("ort-cpu")
    shipped = Lowering(baseline.info, baseline.ranges).as_shipped(engine)
    models = [shipped(engine, plan) for plan in plans] + [StoredModel(shipped.info.source, shipped.info.folder)]
    for model in models:
        with engine.runner(model) as runner:
            assert all(runner.run(batch) for _, batch, _ in baseline.dataset.workload.parts)


@pytest.fixture(scope="module")
def vad_root(tmp_path_factory):
    """The real thing: pip downloads silero-vad and espeakng-loader from PyPI; eSpeak NG speaks, the FP32
    model listens."""
    from autoprec import zoo

    root = tmp_path_factory.mktemp("cache")
    zoo.fetch("silero-vad", root)
    return root


def test_silero_vad_searched_end_to_end_on_speech(vad_root, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPREC_CACHE", str(vad_root))
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec("zoo:silero-vad"),
            judge=autoprec.JudgeSpec(max_loss=0.01),
            study=autoprec.StudySpec(budget=6),
            out=tmp_path / "out",
        )
    )
    notes = result.model.preparation
    assert any("'input shape fixing' left out: it breaks this model" in n for n in notes)  # and the model still runs
    assert any("6 unit(s) never run on the data" in n for n in notes)  # the 8 kHz branch
    assert result.search["left_out"]["LSTM units"].startswith("kept FP32: ONNX Runtime's CPU kernels")
    assert result.model.searchable_units == 6 and result.model.units == 16
    # what the final timing times: all-FP32 and the chosen plan on the graph best/ ships, at its own dims (once its
    # preparation left that graph one ONNX Runtime could not load)
    _shipped_graphs_run(tmp_path / "out", [result.uniform()["fp32"].plan, result.chosen.plan])
    assert (
        _loss_in_fresh_sessions(
            tmp_path / "out" / "best" / "model.onnx", vad_root / "zoo" / "silero-vad" / "model.onnx", tmp_path / "out"
        )
        < 0.015
    )


# compute units, then sensitive ones (the STFT magnitude's Pow and a ReduceMean: in each If branch where there are two)
@pytest.mark.parametrize(
    "member, units", [("silero_vad_16k_op15.onnx", 8 + 2), ("silero_vad_op18_ifless.onnx", 16 + 4)]
)
def test_the_other_silero_files_are_prepared_without_breaking(vad_root, tmp_path, member, units):
    import zipfile

    from autoprec import zoo

    wheel = zoo.download_wheel(zoo.ENTRIES["silero-vad"].wheel, vad_root / "wheels")
    path = tmp_path / member
    path.write_bytes(zipfile.ZipFile(wheel).read(f"silero_vad/data/{member}"))
    shapes = {"input": (1, 576), "state": (2, 1, 128)}
    info = analyse(path, SPACE, shapes, constants={"sr": 16000})
    assert len(info.units) == units
    feeds = {"input": RNG.random((1, 576), dtype=np.float32) - 0.5, "state": np.zeros((2, 1, 128), np.float32),
             "sr": np.array(16000, np.int64)}
    assert all(
        np.allclose(a, b, atol=1e-5) for a, b in zip(_run(info.stored, feeds), _run(onnx.load(str(path)), feeds))
    )
    data = np.load(vad_root / "zoo" / "silero-vad" / "data.npz")
    samples = tmp_path / "speech.npz"
    np.savez(samples, input=data["input"], state=data["state"])  # sr comes from --const
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(path, data=samples, shapes=shapes, constants={"sr": 16000}),
            judge=autoprec.JudgeSpec(max_loss=0.01),
            study=autoprec.StudySpec(budget=4),
            isolation=autoprec.IsolationSpec(isolate=False),
            out=tmp_path / "out",
        )
    )
    assert result.chosen.measurement.loss <= 0.01
    assert _loss_in_fresh_sessions(tmp_path / "out" / "best" / "model.onnx", path, tmp_path / "out") < 0.015

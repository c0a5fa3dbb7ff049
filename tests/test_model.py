import builders
import numpy as np
import onnx
import pytest
from cli import clean, run
from onnx import TensorProto, helper

from autoprec.analysis.model import analyse, load_onnx
from autoprec.core.errors import ModelError
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space

SPACE = load_search_space()


def test_units_are_compute_layers_in_graph_order_with_fused_neighbours(conv_model):
    info = analyse(conv_model, SPACE)
    assert [u.name for u in info.units] == ["conv0", "conv1", "conv2", "fc", "softmax"]
    units = {u.name: u for u in info.units}
    # BatchNorm is folded into conv0; Relu follows it.
    assert units["conv0"].nodes == ("conv0", "relu0")
    # SiLU (x * sigmoid(x)) is fused as a gated activation; the residual Add is not (two activations).
    assert units["conv1"].nodes == ("conv1", "sig1", "silu1")
    assert units["conv2"].nodes == ("conv2", "relu2")
    assert units["fc"].nodes == ("fc",)  # Softmax is a unit of its own, never fused into a compute unit
    assert all(
        u.allowed == (Precision.INT8, Precision.FP16, Precision.FP32) and not u.sensitive for u in info.units[:3]
    )
    # a Gemm with a constant 2-D weight may also hold it in 4-bit blocks (its K padded to whole blocks)
    assert units["fc"].allowed == (Precision.INT4, Precision.INT8, Precision.FP16, Precision.FP32)
    assert units["softmax"].sensitive and units["softmax"].allowed == (Precision.FP16, Precision.FP32)
    assert not any(n.op_type == "BatchNormalization" for n in info.model.graph.node)


def test_batchnorm_folding_preserves_the_function(conv_model, conv_data):
    import onnxruntime as ort

    info = analyse(conv_model, SPACE)
    x = np.load(conv_data)["x"][:1]
    before = ort.InferenceSession(str(conv_model)).run(None, {"x": x})[0]
    after = builders.session(info.stored).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


def test_matmul_units_fuse_bias_and_activation(mlp_model, attention_model):
    mlp = analyse(mlp_model, SPACE)
    assert [u.nodes for u in mlp.units] == [("fc0", "bias0", "relu0"), ("fc1", "bias1", "relu1"), ("head",)]
    attn = analyse(attention_model, SPACE)
    scores = attn.unit("scores")
    assert scores.weight is None and len(scores.activations) == 2  # activation x activation MatMul


def test_old_opset_is_converted_for_per_channel_qdq(tmp_path):
    path = builders.save(builders.conv_net(opset=11), tmp_path / "old.onnx")
    info = analyse(path, SPACE)
    assert info.model.opset_import[0].version >= 13
    assert any("opset 11" in n for n in info.notes)


def test_dynamic_batch_defaults_to_one_and_shape_option_sets_it(tmp_path):
    path = builders.save(builders.conv_net(batch="N"), tmp_path / "dyn.onnx")
    assert analyse(path, SPACE).inputs[0].shape == (1, 3, 16, 16)
    assert analyse(path, SPACE, {"x": (4, 3, 16, 16)}).inputs[0].shape == (4, 3, 16, 16)


def test_inputs_whose_batch_dim_is_set_to_one_are_said_in_one_line():
    """A decoder's eleven inputs with one dynamic batch dim gave eleven identical lines (issue 69):
    one line now, naming the first inputs and counting the rest; an input --shape sizes through a
    shared dim is not among them."""
    from autoprec.analysis.model_info import TensorSpec
    from autoprec.analysis.shapes import resolve_input_shapes

    specs = [TensorSpec(f"past.{i}", ("batch", 4, 8), "float32") for i in range(11)]
    specs.append(TensorSpec("ids", ("batch", 8), "int64"))
    shapes, notes = resolve_input_shapes(specs, {})
    assert notes == ["inputs past.0, past.1, past.2 and 9 more: dynamic batch dim batch set to 1 "
                     "(use --shape to change)"] and shapes["ids"] == (1, 8)
    shapes, notes = resolve_input_shapes(specs, {"ids": (2, 8)})
    assert shapes["past.3"] == (2, 4, 8) and not any("set to 1" in n for n in notes)


def test_a_past_nothing_sizes_is_empty_and_a_mask_over_it_is_its_sum():
    """Without data, a decoder's past is 0 (its first run) and a mask over past and tokens their sum, however the
    exporter wrote it (``+ sequence_length``, ``+ 1``); a dim named otherwise still asks for --shape."""
    from autoprec.analysis.model_info import TensorSpec
    from autoprec.analysis.shapes import resolve_input_shapes

    specs = [TensorSpec("input_ids", ("batch", "sequence_length"), "int64"),
             TensorSpec("attention_mask", ("batch", "past_sequence_length + sequence_length"), "int64"),
             TensorSpec("past.0", ("batch", 4, "past_sequence_length", 16), "float32")]
    shapes, notes = resolve_input_shapes(specs, {"input_ids": (1, 7)})
    assert shapes["past.0"] == (1, 4, 0, 16) and shapes["attention_mask"] == (1, 7)
    assert any("past_sequence_length set to 0" in n for n in notes)
    one = [TensorSpec("input_ids", ("batch", 1), "int64"), TensorSpec("mask", ("batch", "past_sequence_length + 1"), "int64")]
    assert resolve_input_shapes(one, {})[0]["mask"] == (1, 1)
    with pytest.raises(ModelError, match="input_ids has dynamic dim 1"):
        resolve_input_shapes(specs, {})


def test_dynamic_spatial_dims_need_shape_or_data(tmp_path):
    model = builders.conv_net()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    path = tmp_path / "hw.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match=r"input x has dynamic dim 2 \(H\).*--shape x=1x3xD2xD3 with D2, D3 filled in"):
        analyse(path, SPACE)
    assert analyse(path, SPACE, data_shapes={"x": (3, 16, 16)}).inputs[0].shape == (1, 3, 16, 16)
    with pytest.raises(ModelError, match="does not fit the model's declared shape"):
        analyse(path, SPACE, {"x": (1, 4, 16, 16)})


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        (b"this is not a protobuf \xff\xfe", "not a readable ONNX file|graph is empty"),
        (b"", "graph is empty"),
    ],
)
def test_unreadable_model_files(tmp_path, content, message):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelError, match=message):
        load_onnx(path)


def test_truncated_model(tmp_path, conv_model):
    data = conv_model.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=str(path)):
        load_onnx(path)


def test_unknown_op_domain_is_refused(tmp_path):
    node = helper.make_node("Frobnicate", ["x"], ["y"], "custom", domain="com.example")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    model.ir_version = builders.IR_VERSION
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="com.example.*node custom"):
        load_onnx(path)


def test_model_without_searchable_layers(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], "relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = builders.IR_VERSION
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="no searchable layers"):
        analyse(path, SPACE)


def test_overrides_restrict_allowed_precisions(conv_model):
    space = SPACE.with_overrides(["conv*=fp16,fp32", "conv2=fp32"])
    info = analyse(conv_model, space)
    allowed = {u.name: u.allowed for u in info.units}
    assert allowed["conv0"] == (Precision.FP16, Precision.FP32)
    assert allowed["conv2"] == (Precision.FP32,)
    assert allowed["fc"] == (Precision.INT4, Precision.INT8, Precision.FP16, Precision.FP32)
    assert [u.name for u in info.searchable_units] == ["conv0", "conv1", "fc", "softmax"]


def test_an_already_quantized_model_is_refused_naming_its_integer_ops(tmp_path):
    """ONNX Runtime's dynamic quantization leaves ConvInteger and no float Conv: nothing to choose, and
    the message says why (seen on an OCR model shipped in a PyPI package)."""
    from onnx import numpy_helper

    weight = numpy_helper.from_array(np.ones((4, 1, 3, 3), np.uint8), "w")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], "dq"),
             helper.make_node("ConvInteger", ["xq", "w", "xz"], ["acc"], "conv"),
             helper.make_node("Cast", ["acc"], ["y"], "cast", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = builders.IR_VERSION
    path = builders.save(model, tmp_path / "quantized.onnx")
    with pytest.raises(
        ModelError, match=r"already quantized \(ConvInteger, DynamicQuantizeLinear\).*give autoprec the FP32 model"
    ):
        analyse(path, load_search_space())


def test_sensitive_ops_are_units_of_their_own_and_a_decomposed_layernorm_is_one(tmp_path):
    info = analyse(builders.save(builders.transformer_block(), tmp_path / "block.onnx"), SPACE)
    units = {u.name: u for u in info.units}
    assert [u.name for u in info.units if u.sensitive] == ["ln_mean", "softmax"]
    # ReduceMean, Sub, Pow, ReduceMean, Add(eps), Sqrt: joined directly or through one neutral op; the Div
    # combining them, then scale and shift: the whole LayerNorm, as engines fuse it (and name it after the scale)
    assert units["ln_mean"].nodes == ("ln_mean", "ln_sub", "ln_pow", "ln_var", "ln_eps", "ln_sqrt", "ln_div",
                                      "ln_scale", "ln_shift")
    assert units["ln_mean"].activations == ("h",) and units["ln_mean"].weight is None
    assert units["softmax"].allowed == (Precision.FP16, Precision.FP32)
    assert not any(u.sensitive for u in info.units if u.op_type == "MatMul")
    # an engine without FP16 regions pins them: they are no units at all, as before sensitive ops were searched
    pinned = analyse(tmp_path / "block.onnx", SPACE.with_pinned(SPACE.sensitive))
    assert [u.name for u in pinned.units] == [u.name for u in info.units if not u.sensitive]


def test_a_sequence_input_is_one_line(tmp_path, capsys):
    from onnx import TensorProto, helper

    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    inits = [
        onnx.numpy_helper.from_array(np.array(0, np.int64), "i"),
        onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
    ]
    nodes = [
        helper.make_node("SequenceAt", ["s", "i"], ["t"], "at"),
        helper.make_node("MatMul", ["t", "w"], ["y"], "mm"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [seq], [y], inits), opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = builders.IR_VERSION
    onnx.checker.check_model(model)
    path = builders.save(model, tmp_path / "m.onnx")
    code, err = run(["search", path, "--budget", 1, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert "input s is a sequence, not a tensor" in err.strip().splitlines()[-1]


def test_a_zipmap_output_is_refused_naming_the_option_that_leaves_it_out(tmp_path, capsys):
    """skl2onnx ends a classifier with a ZipMap (its probabilities as a list of dicts) unless told
    not to: the refusal names the option (issue 69)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    label = helper.make_tensor_value_info("label", TensorProto.FLOAT, [2, 3])
    probabilities = helper.make_value_info("probabilities", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64,
                                   helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["label"], "mm"),
             helper.make_node("ZipMap", ["label"], ["probabilities"], "zipmap", domain="ai.onnx.ml",
                              classlabels_int64s=[0, 1, 2])]
    graph = helper.make_graph(nodes, "g", [x], [label, probabilities],
                              [onnx.numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = builders.IR_VERSION
    onnx.checker.check_model(model)
    path = builders.save(model, tmp_path / "m.onnx")
    code, err = run(["search", path, "--budget", 1, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    said = err.strip().splitlines()[-1]
    assert "output probabilities is a sequence, not a tensor" in said
    assert "{'zipmap': False}" in said


def test_a_float16_model_is_told_its_type_not_float64(tmp_path, capsys):
    model = builders.conv_net()
    from onnx import TensorProto, numpy_helper

    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype("float16"), tensor.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    path = builders.save(model, tmp_path / "half.onnx")
    code, err = run(["search", path, "--out", tmp_path / "o", "--budget", "1"], capsys)
    clean(code, err, allowed=(2,))
    last = err.strip().splitlines()[-1]
    assert "compute in float16, not float32" in last and "float64" not in last and "pinned" not in last


def test_a_model_that_disagrees_with_itself_is_refused_naming_its_random_op(tmp_path, capsys):
    """RandomNormalLike: no exact FP32 reference exists, so no loss against it means anything."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32), "w")
    model = builders.graph_model([helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                    helper.make_node("RandomNormalLike", ["a"], ["n"], name="noise"),
                    helper.make_node("Add", ["a", "n"], ["y"], name="add")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [weight])
    code, err = run(["search", builders.save(model, tmp_path / "noisy.onnx"), "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    last = err.strip().splitlines()[-1]
    assert "it draws random values (RandomNormalLike 'noise')" in last


def test_outputs_that_change_between_two_runs_are_refused_whatever_the_cause(tmp_path):
    """The run-time check behind the graph's: any op that makes two runs of one input differ."""
    import numpy as np

    from autoprec.analysis.model import analyse
    from autoprec.analysis.reference import check_deterministic
    from autoprec.core.errors import ModelError
    from autoprec.core.search_space import load_search_space

    info = analyse(builders.save(builders.mlp(), tmp_path / "mlp.onnx"), load_search_space())
    first = {"probs": np.ones((4, 10), np.float32)}
    check_deterministic(info, first, {"probs": first["probs"] + 1e-7})  # reduction order: the same model
    with pytest.raises(ModelError, match="other outputs for the same input on a second run .output probs"):
        check_deterministic(info, first, {"probs": first["probs"] * 2})


@pytest.mark.parametrize("op, attrs", [("RandomNormal", {"seed": 5.0}), ("RandomNormal", {"scale": 0.0}),
                                       ("RandomUniform", {"seed": 3.0, "dtype": 1})])
def test_a_seeded_or_degenerate_random_op_is_refused_before_preparation_folds_it(tmp_path, capsys, op, attrs):
    """Seeded, constant folding froze the draw into a constant and the search shipped that model; with scale 0
    ONNX Runtime aborted the process."""
    from onnx import helper

    path = builders.mlp_then([helper.make_node(op, [], ["r"], name="draw", shape=[1, 32], **attrs),
                      helper.make_node("Add", ["a", "r"], ["y"], name="add")], folder=tmp_path)
    code, err = run(["search", path, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert f"it draws random values ({op} 'draw')" in err.strip().splitlines()[-1]


def test_a_preparation_step_that_broke_the_steps_at_once_is_not_made_again_one_at_a_time(tmp_path):
    """The steps run at once, then (their result refused) one at a time, each checked: a step given the same model
    both times is made once (a graph's constant folding, 0.4 s of silero-vad's preparation), and the step that
    broke it is left out with a note."""
    from autoprec.analysis import preparation
    from autoprec.core.stored import StoredModel

    made = []

    def counted(model):
        made.append(model)
        return model.with_proto(onnx.ModelProto(graph=model.proto.graph, ir_version=model.proto.ir_version)), None

    def emptied(model):
        return model.with_proto(onnx.ModelProto(ir_version=model.proto.ir_version)), None

    model = StoredModel(builders.conv_net(), tmp_path)
    steps = [("counted", counted), ("emptied", emptied)]
    taken, notes, names = preparation._checked_steps(model, steps, lambda m: None if m.proto.graph.node else "no nodes")
    assert len(made) == 1 and names == ["counted"] and list(taken.proto.graph.node) == list(model.proto.graph.node)
    assert any("'emptied' left out: it breaks this model (no nodes)" in note for note in notes)

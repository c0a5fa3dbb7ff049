import collections
import json

import builders
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from autoprec.analysis.calibrate import calibrate
from autoprec.analysis.data import build_dataset
from autoprec.analysis.model import analyse
from autoprec.analysis.reference import reference_outputs
from autoprec.core.plan import Plan, Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan
from autoprec.measure.accuracy import output_metrics


def run(model, batch, optimized_path=None):
    options = ort.SessionOptions()
    if optimized_path:
        options.optimized_model_filepath = str(optimized_path)
    return builders.session(model, options).run(None, batch)[0]


def check_valid(model) -> None:
    builders.check(model)


def ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def test_io_types_are_kept_and_fp16_is_close(conv):
    info, data, ranges = conv
    model = lower_plan(info, Plan.uniform([u.name for u in info.units], Precision.FP16), ranges)
    check_valid(model)
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [onnx.TensorProto.FLOAT]
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [onnx.TensorProto.FLOAT]
    batch = data.evaluation[0]
    m = output_metrics(run(info.stored, batch), run(model, batch))
    # FP16 keeps ~3 decimal digits through 4 layers: stated tolerance cosine > 0.9999, rel-L2 < 1e-2.
    assert m["cosine"] > 0.9999 and m["rel_l2"] < 1e-2


def _casts(model):
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    return ([n for n in casts if n.attribute[0].i == onnx.TensorProto.FLOAT16],
            [n for n in casts if n.attribute[0].i == onnx.TensorProto.FLOAT])


def test_fp16_units_make_one_region_with_casts_only_at_its_borders(conv):
    info, data, ranges = conv
    names = [u.name for u in info.units]
    model = lower_plan(info, Plan.uniform(names, Precision.FP16), ranges, QDQForm.TENSORRT)
    to_half, to_float = _casts(model)
    # Into the region: the model input; out of it: fc's logits into Softmax (not precision-neutral).
    # The residual Add, GlobalAveragePool and Flatten between FP16 units run in FP16 with them.
    assert [n.input[0] for n in to_half] == ["x"] and len(to_float) == 1
    by_name = {n.name: n for n in model.graph.node}
    assert by_name["residual"].input[0].endswith("_fp16") and by_name["gap"].input[0].endswith("_fp16")
    weights = {i.name: i for i in model.graph.initializer}
    assert weights[by_name["conv1"].input[1]].data_type == onnx.TensorProto.FLOAT16
    m = output_metrics(run(info.stored, data.evaluation[0]), run(model, data.evaluation[0]))
    assert m["cosine"] > 0.9999


def _one_unit_in_fp16(model: onnx.ModelProto, unit: str, tmp_path):
    """``model`` analysed, and lowered in the TensorRT form with ``unit`` FP16 (checked valid)."""
    info = analyse(builders.save(model, tmp_path / "model.onnx"), load_search_space())
    lowered = lower_plan(info, Plan.from_mapping({unit: "fp16"}), None, QDQForm.TENSORRT)
    check_valid(lowered)
    return info, lowered


def test_neutral_ops_between_the_region_and_the_graphs_inputs_or_outputs_join_it(tmp_path):
    """The Casts move to the model's input and output, as far as neutral ops reach; a neutral op that
    does not touch the region stays FP32."""
    rng = np.random.default_rng(0)
    info, model = _one_unit_in_fp16(
        builders._model(
            [
                helper.make_node("Transpose", ["x"], ["xt"], "t_in", perm=[0, 1, 3, 2]),
                helper.make_node("Conv", ["xt", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
                helper.make_node("Reshape", ["c", "shape"], ["y"], "flat"),
                helper.make_node("Relu", ["x"], ["z"], "side"),
            ],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
            [
                helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256]),
                helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, 8, 8]),
            ],
            [builders._init("w", rng.normal(0, 0.3, (4, 3, 3, 3))), builders._init("shape", np.array([1, -1]))],
            opset=17,
        ),
        "conv",
        tmp_path,
    )
    to_half, to_float = _casts(model)
    by_name = {n.name: n for n in model.graph.node}
    assert [n.input[0] for n in to_half] == ["x"] and by_name["t_in"].input[0] == to_half[0].output[0]
    assert [n.output[0] for n in to_float] == ["y"] and by_name["flat"].output[0] == to_float[0].input[0]
    assert by_name["side"].input[0] == "x"  # reads the input, feeds an output, touches no FP16 node
    batch = {"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)}
    assert output_metrics(run(info.stored, batch), run(model, batch))["cosine"] > 0.9999


def test_a_region_input_cast_from_integers_is_cast_to_fp16_directly(tmp_path):
    """A one-hot made by Cast(bool -> float32), as Magika makes from its bytes, is cast straight to FP16:
    no FP32 copy of the (large) one-hot is written and converted again."""
    rng = np.random.default_rng(1)
    info, model = _one_unit_in_fp16(builders._model(
        [helper.make_node("Unsqueeze", ["bytes", "axis"], ["b3"], "expand"),
         helper.make_node("Equal", ["b3", "symbols"], ["hot"], "one_hot"),
         helper.make_node("Cast", ["hot"], ["hot_f"], "to_float", to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["hot_f", "w"], ["y"], "embed")],
        [helper.make_tensor_value_info("bytes", TensorProto.INT32, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 8])],
        [builders._init("axis", np.array([-1])), builders._init("symbols", np.arange(4, dtype=np.int32)),
         builders._init("w", rng.normal(size=(4, 8)))], opset=17), "embed", tmp_path)
    to_half, to_float = _casts(model)
    assert [n.input[0] for n in to_half] == ["hot"] and [n.output[0] for n in to_float] == ["y"]
    assert "to_float" not in {n.name for n in model.graph.node}  # nothing else read the FP32 one-hot
    batch = {"bytes": rng.integers(0, 4, (2, 16)).astype(np.int32)}
    assert output_metrics(run(info.stored, batch), run(model, batch))["cosine"] > 0.9999


def test_a_neutral_op_between_precisions_that_disagree_runs_where_its_casts_convert_least(conv):
    info, data, ranges = conv
    plan = Plan.from_mapping({"conv0": "fp16", "conv1": "fp16", "conv2": "fp32", "fc": "fp16"})
    model = lower_plan(info, plan, ranges, QDQForm.TENSORRT)
    by_name = {n.name: n for n in model.graph.node}
    to_half, to_float = _casts(model)
    # The residual Add reads two FP16 tensors and feeds FP32 conv2: FP16, one Cast after it, not two before.
    assert by_name["residual"].input[0].endswith("_fp16") and by_name["residual"].input[1].endswith("_fp16")
    assert "res" in [n.output[0] for n in to_float] and by_name["conv2"].input[0] == "res"
    # The pooling reads FP32 conv2 and feeds FP16 fc: FP32, the Cast after it on 8 values, not before on 2048.
    assert by_name["gap"].input[0] == "r2" and sorted(n.input[0] for n in to_half) == ["gap", "x"]
    assert len(to_float) == 2  # res, and the output
    assert output_metrics(run(info.stored, data.evaluation[0]), run(model, data.evaluation[0]))["cosine"] > 0.999
    # The other way: conv2 FP16, fc FP32: the pooling joins the region and the Cast goes after it.
    plan = Plan.from_mapping({"conv0": "fp16", "conv1": "fp16", "conv2": "fp16", "fc": "fp32"})
    by_name = {n.name: n for n in lower_plan(info, plan, ranges, QDQForm.TENSORRT).graph.node}
    assert by_name["gap"].input[0].endswith("_fp16") and not by_name["fc"].input[0].endswith("_fp16")


def test_fp16_on_the_cpu_form_stays_islands(conv):
    info, _, ranges = conv
    model = lower_plan(info, Plan.uniform([u.name for u in info.units], Precision.FP16), ranges, QDQForm.ORT_CPU)
    to_half, to_float = _casts(model)
    # The CPU provider has no FP16 kernels to gain from regions: each unit converts at its own borders.
    assert len(to_half) == 3 and len(to_float) == 4


def test_mixed_plan_touches_only_its_units(conv):
    info, data, ranges = conv
    plan = Plan.from_mapping({"conv0": "fp32", "conv1": "fp16", "conv2": "int8", "fc": "fp32"})
    model = lower_plan(info, plan, ranges)
    check_valid(model)
    by_name = {n.name: n for n in model.graph.node}
    assert by_name["conv0"].input[1] == next(
        i.name for i in info.model.graph.initializer if i.name == by_name["conv0"].input[1]
    )
    assert any(i.endswith("_dq") for i in by_name["conv2"].input)
    assert not any(i.endswith("_dq") for i in by_name["conv1"].input)
    out = run(model, data.evaluation[0])
    assert output_metrics(run(info.stored, data.evaluation[0]), out)["cosine"] > 0.99


def test_tensorrt_form_qdq_is_signed_symmetric_on_inputs_only(conv):
    info, data, ranges = conv
    model = lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.TENSORRT)
    check_valid(model)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    quantize = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    # One Q per distinct activation input of a quantized layer (x, r0, res, flat), none on outputs.
    assert sorted(n.input[0] for n in quantize) == sorted(
        {t for u in info.units if not u.sensitive for t in u.activations}
    )
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zero_point = inits[n.input[2]]
            assert zero_point.dtype == np.int8 and not zero_point.any()
    conv0 = next(n for n in model.graph.node if n.name == "conv0")
    weight_dq = next(n for n in model.graph.node if n.output[0] == conv0.input[1])
    assert inits[weight_dq.input[0]].dtype == np.int8
    assert inits[weight_dq.input[1]].shape == (8,)  # one scale per output channel
    assert next(a.i for a in weight_dq.attribute if a.name == "axis") == 0
    fc = next(n for n in model.graph.node if n.name == "fc")
    fc_dq = next(n for n in model.graph.node if n.output[0] == fc.input[1])
    assert next(a.i for a in fc_dq.attribute if a.name == "axis") == 0  # Gemm transB=1: rows are outputs
    out = run(model, data.evaluation[0])
    assert output_metrics(run(info.stored, data.evaluation[0]), out)["cosine"] > 0.99


def test_ort_form_becomes_integer_kernels(conv, tmp_path):
    info, data, ranges = conv
    model = lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.ORT_CPU)
    check_valid(model)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    activation_q = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert activation_q and all(inits[n.input[2]].dtype == np.uint8 for n in activation_q)
    optimized = tmp_path / "optimized.onnx"
    run(model, data.evaluation[0], optimized)
    assert ops(onnx.load(str(optimized)))["QLinearConv"] == 3  # every quantized conv ran as an INT8 kernel
    fp32 = run(info.stored, data.evaluation[0])
    assert output_metrics(fp32, run(model, data.evaluation[0]))["cosine"] > 0.99


def test_activation_by_activation_matmul_gets_qdq_on_both_inputs(attention_model):
    info = analyse(attention_model, load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    model = lower_plan(info, Plan.from_mapping({"scores": "int8"}), ranges)
    check_valid(model)
    scores = next(n for n in model.graph.node if n.name == "scores")
    assert all(i.endswith("_dq") for i in scores.input)
    ref = reference_outputs(info, data.evaluation, data.fingerprint())[0]["out"]
    assert output_metrics(ref, run(model, data.evaluation[0]))["cosine"] > 0.99


def test_mlp_all_precisions_run(mlp_model):
    info = analyse(mlp_model, load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    ref = run(info.stored, data.evaluation[0])
    for form in QDQForm:
        for precision in Precision:
            model = lower_plan(info, info.plan_at(precision), ranges, form)
            check_valid(model)
            cosine = output_metrics(ref, run(model, data.evaluation[0]))["cosine"]
            least = {Precision.INT4: 0.98, Precision.INT8: 0.98}.get(precision, 0.9999)
            assert cosine > least, (form, precision, cosine)


def test_unknown_unit_in_plan_is_refused(conv):
    info, _, ranges = conv
    with pytest.raises(KeyError, match="nope"):
        lower_plan(info, Plan.from_mapping({"nope": "fp16"}), ranges)


def test_sensitive_units_in_fp16_join_the_region_and_a_plan_cannot_give_them_int8(tmp_path):
    from tests import builders

    info = analyse(builders.save(builders.transformer_block(), tmp_path / "block.onnx"), load_search_space())
    data = build_dataset(None, info.inputs)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    compute_only = Plan.from_mapping({u.name: "fp32" if u.sensitive else "fp16" for u in info.units})
    everything = info.plan_at(Precision.FP16)
    islands, region = (lower_plan(info, p, ranges, QDQForm.TENSORRT) for p in (compute_only, everything))
    for model in (islands, region):
        check_valid(model)
    # FP32 softmax and LayerNorm split the FP16 region: Casts around each; in FP16 they join it
    assert sum(map(len, _casts(region))) < sum(map(len, _casts(islands)))
    assert sum(map(len, _casts(region))) == 2  # one in, one out
    types = {
        v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(region.proto).graph.value_info
    }
    computes = {n.name: types.get(n.output[0]) for n in region.graph.node}
    # the LayerNorm's ops, the neutral ops after it, the softmax and the residual Add all compute in FP16
    assert all(
        computes[n] == onnx.TensorProto.FLOAT16 for n in ("ln_mean", "ln_div", "ln_shift", "softmax", "residual")
    )
    batch = data.evaluation[0]
    assert output_metrics(run(info.stored, batch), run(region, batch))["cosine"] > 0.999
    with pytest.raises(ValueError, match=r"softmax \(int8; it allows fp16, fp32\)"):
        lower_plan(info, Plan.from_mapping({"softmax": "int8"}), ranges)


def _scaled_between_matmuls(tmp_path):
    """A scaling by 4e4 and back between two MatMuls, not fused into either: out of FP16's range on the data."""
    rng = np.random.default_rng(0)
    return builders.save(builders._model(
        [helper.make_node("MatMul", ["x", "w0"], ["h"], "fc0"),
         helper.make_node("Transpose", ["h"], ["ht"], "turn"),  # not fused into fc0: neutral, between units
         helper.make_node("Mul", ["ht", "big"], ["scaled"], "scale"),
         helper.make_node("Mul", ["scaled", "small"], ["back"], "unscale"),
         helper.make_node("Transpose", ["back"], ["bt"], "turn_back"),
         helper.make_node("MatMul", ["bt", "w1"], ["y"], "fc1")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [builders._init("w0", rng.normal(0, 0.3, (16, 16))), builders._init("big", np.array(4e4)),
         builders._init("small", np.array(2.5e-5)), builders._init("w1", rng.normal(0, 0.3, (16, 8)))], opset=17),
        tmp_path / "model.onnx")


def test_a_neutral_op_out_of_fp16s_range_on_the_data_is_a_unit_fp32_by_default(tmp_path):
    """A scaling by 4e4 and back, between two FP16 MatMuls (not fused into either), would overflow in the FP16 region: on the
    data its tensors pass FP16's safe range, so both Muls form one sensitive unit that the widest plan
    keeps FP32 (where FP16 is searched; without FP16 nothing changes)."""
    from autoprec.analysis.baseline import load_baseline

    path = _scaled_between_matmuls(tmp_path)
    baseline = load_baseline(path, load_search_space())  # on random data
    info = baseline.info
    assert info.out_of_range == ("scale", "unscale")
    unit = info.unit("scale")
    assert unit.sensitive and unit.nodes == ("scale", "unscale") and unit.allowed == (Precision.FP16, Precision.FP32)
    widest = lower_plan(info, info.plan_at(Precision.FP16, [u.name for u in info.units if not u.sensitive]), None)
    check_valid(widest)
    batch = baseline.dataset.evaluation[0]
    assert output_metrics(run(info.stored, batch), run(widest, batch))["cosine"] > 0.999
    kept = {n.name: n for n in widest.graph.node}
    assert not any(t.endswith(("_fp16", "_to_fp16")) for t in (*kept["scale"].input, *kept["unscale"].output))
    every = {n.name: n for n in lower_plan(info, info.plan_at(Precision.FP16), None).graph.node}
    assert every["scale"].input[0].endswith("_fp16")  # where the search tries it: measured on the target
    on_the_cpu = load_baseline(path, load_search_space().restricted([Precision.INT8]))
    assert on_the_cpu.info.out_of_range == () and [u.name for u in on_the_cpu.info.units] == ["fc0", "fc1"]


def test_the_out_of_range_pass_runs_once_per_model_and_data_then_is_read_from_the_cache(tmp_path):
    """A resumed search and every worker prepare the model again: the FP32 pass over the calibration data that
    finds ops out of FP16's range is kept in the cache folder (beside calibration) and read back (the file is not
    written again); a damaged file is measured again (and rewritten)."""
    from autoprec.analysis.baseline import load_baseline

    path = _scaled_between_matmuls(tmp_path)
    cache = tmp_path / "cache"

    def written() -> tuple[int, int]:
        [kept] = cache.glob("out-of-range-*.json")
        return kept.stat().st_ino, kept.stat().st_mtime_ns  # an atomic write is a new file

    first = load_baseline(path, load_search_space(), cache=cache).info.out_of_range
    measured = written()
    again = load_baseline(path, load_search_space(), cache=cache).info.out_of_range
    assert first == again == ("scale", "unscale") and written() == measured
    [kept] = cache.glob("out-of-range-*.json")
    kept.write_text('{"not": "a list"}')
    damaged = written()
    assert load_baseline(path, load_search_space(), cache=cache).info.out_of_range == first and written() != damaged
    assert json.loads(kept.read_text())["names"] == list(first)


def test_ort_form_keeps_int8_through_a_residual_add_between_int8_units(tmp_path):
    """The Add reads both its inputs dequantized (the skip tensor too, quantized for the Conv it also feeds):
    ONNX Runtime runs it as QLinearAdd instead of leaving float between the INT8 convolutions."""
    info = analyse(builders.save(builders.residual_net(), tmp_path / "block.onnx"), load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    model = lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.ORT_CPU)
    optimized = tmp_path / "optimized.onnx"
    out = run(model, data.evaluation[0], optimized)
    kernels = ops(onnx.load(str(optimized)))
    assert kernels["QLinearAdd"] == 1 and kernels["Add"] == 0 and kernels["QLinearConv"] == 3  # the last: the output
    assert output_metrics(run(info.stored, data.evaluation[0]), out)["cosine"] > 0.99


def test_tensorrt_form_quantizes_the_skip_input_of_a_residual_add_and_leaves_the_convolution_output(tmp_path):
    """NVIDIA's residual placement (ModelOpt's too): TensorRT fuses the Add into the INT8 convolution before it
    and reads the skip tensor as INT8; a Q/DQ on the convolution's output would split that fusion."""
    info = analyse(builders.save(builders.residual_net(), tmp_path / "block.onnx"), load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    lowered = {n.name: n for n in lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.TENSORRT).graph.node}
    skip, convolved = lowered["residual"].input
    assert lowered[skip.removesuffix("_dq") + "_dequantize"].op_type == "DequantizeLinear"
    assert convolved == lowered["outer"].output[0]
    fp32_outer = Plan.from_mapping({u.name: "fp32" if "outer" in u.nodes else "int8" for u in info.units})
    lowered = {n.name: n for n in lower_plan(info, fp32_outer, ranges, QDQForm.TENSORRT).graph.node}
    assert lowered["residual"].input[0] == "r0"  # no INT8 convolution to fuse with: the Add stays float


def test_ort_form_leaves_an_fp32_unit_reading_a_quantized_input_unrounded(tmp_path):
    """x feeds an INT8 Conv, an FP32 Conv and the Add of both: the Add reads x dequantized, the FP32 unit x itself."""
    weights = [onnx.numpy_helper.from_array(np.full((4, 4, 1, 1), 0.1 * (i + 1), np.float32), f"w{i}") for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="int8_conv"),
             helper.make_node("Conv", ["x", "w1"], ["b"], name="fp32_conv"),
             helper.make_node("Add", ["x", "a"], ["xa"], name="skip"),
             helper.make_node("Add", ["xa", "b"], ["y"], name="join")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    info = analyse(builders.save(model, tmp_path / "two.onnx"), load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    plan = Plan.from_mapping({u.name: "int8" if "int8_conv" in u.nodes else "fp32" for u in info.units})
    lowered = {n.name: n for n in lower_plan(info, plan, ranges, QDQForm.ORT_CPU).graph.node}
    assert lowered["int8_conv"].input[0].endswith("_dq") and lowered["skip"].input[0].endswith("_dq")
    assert lowered["fp32_conv"].input[0] == "x"


@pytest.mark.parametrize("form", list(QDQForm))
def test_a_copy_of_a_quantized_input_made_a_graph_output_stays_exact(tmp_path, form):
    """x feeds an INT8 MatMul and an Identity that is a graph output: the copy reads x itself, not its
    dequantized value (no Q follows it: nothing to fuse, only error added)."""
    weight = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
             helper.make_node("Identity", ["x"], ["x_copy"], name="copy")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
                               helper.make_tensor_value_info("x_copy", TensorProto.FLOAT, [4, 16])], [weight])
    info = analyse(builders.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                                 tmp_path / "copy.onnx"), load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    lowered = lower_plan(info, info.plan_at(Precision.INT8), ranges, form)
    assert ops(lowered)["QuantizeLinear"] >= 1
    batch = data.evaluation[0]
    assert np.array_equal(builders.session(lowered).run(["x_copy"], batch)[0], batch["x"])


def test_an_int8_conv_of_near_zero_weights_and_a_bias_keeps_its_bias_in_onnx_runtimes_int32(tmp_path):
    """Channels of weights near 0 and a bias (BatchNorm folding's near-zero gamma): at their weights' own scale the
    bias over the input's scale times the weight's left int32, and QLinearConv's output was 0. Their scale is raised
    until the bias fits (their weights then round to 0: the output is the bias, as in float); a Conv of ordinary
    weights is quantized as before."""
    rng = np.random.default_rng(0)
    tiny = rng.standard_normal((8, 8, 1, 1)) * 1e-7
    tiny[:4] = rng.standard_normal((4, 8, 1, 1)) * 0.1  # half the channels ordinary
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="first", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["f"], name="folded"),
             helper.make_node("Conv", ["f", "w3"], ["y"], name="last")]  # (f a unit's output: QLinearConv)
    model = builders._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
                            [builders._init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), builders._init("w2", tiny),
                             builders._init("b2", np.full(8, 5e3)), builders._init("w3", np.eye(8)[:, :, None, None])])
    info = analyse(builders.save(model, tmp_path / "folded.onnx"), load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    lowered = lower_plan(info, info.plan_at(Precision.INT8), ranges, QDQForm.ORT_CPU)
    want, got = run(info.stored, data.evaluation[0]), run(lowered, data.evaluation[0])
    assert output_metrics(want, got)["cosine"] > 0.9999 and np.abs(got - want).max() < 1.0
    names = {t.name for t in lowered.graph.initializer}
    assert any(n.startswith("w2_") and "_bias" in n for n in names)  # its own copy, the scale raised
    assert not any(n.startswith("w1_") and "_bias" in n for n in names)  # no bias: as before


def test_a_bias_added_after_a_conv_is_folded_into_it(tmp_path):
    path = builders.save(builders.residual_net(bias_as_add=True), tmp_path / "paddle.onnx")
    info = analyse(path, load_search_space())
    assert not [n for n in info.model.graph.node if n.name.startswith("bias")]
    assert any("folded 4 bias Add(s) into the Conv before them" in note for note in info.notes)
    data = build_dataset(None, info.inputs, random_count=2)
    given = ort.InferenceSession(str(tmp_path / "paddle.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(run(info.stored, data.evaluation[0]), given.run(None, data.evaluation[0])[0],
                               rtol=1e-5, atol=1e-5)


def test_ort_form_keeps_an_add_and_the_layernorm_after_it_apart(tmp_path):
    """ONNX Runtime's CPU provider would fuse a residual Add into the LayerNormalization reading it (its slow
    SkipLayerNormalization): the CPU form writes the Add as a Sum, which it leaves alone; same outputs, and
    the TensorRT form keeps the Add."""
    rng = np.random.default_rng(3)
    inits = [onnx.numpy_helper.from_array(rng.normal(0, 0.2, (16, 16)).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(np.ones(16, np.float32), "gamma"),
             onnx.numpy_helper.from_array(np.zeros(16, np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="dense"),
             helper.make_node("Add", ["x", "h"], ["sum"], name="residual"),
             helper.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["y"], name="norm", axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    info = analyse(builders.save(model, tmp_path / "block.onnx"), load_search_space())
    data = build_dataset(None, info.inputs, random_count=2)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    for precision in (Precision.FP32, Precision.INT8):
        lowered = lower_plan(info, info.plan_at(precision), ranges, QDQForm.ORT_CPU)
        assert {n.name: n.op_type for n in lowered.proto.graph.node}["residual"] == "Sum"
        run(lowered, data.evaluation[0], tmp_path / "optimized.onnx")
        assert ops(onnx.load(str(tmp_path / "optimized.onnx")))["SkipLayerNormalization"] == 0
    np.testing.assert_allclose(run(lower_plan(info, info.plan_at(Precision.FP32), ranges, QDQForm.ORT_CPU),
                                   data.evaluation[0]), run(info.stored, data.evaluation[0]), rtol=1e-6, atol=1e-6)
    run(info.stored, data.evaluation[0], tmp_path / "fused.onnx")  # the prepared model as ORT would run it
    assert ops(onnx.load(str(tmp_path / "fused.onnx")))["SkipLayerNormalization"] == 1
    tensorrt = lower_plan(info, info.plan_at(Precision.FP32), ranges, QDQForm.TENSORRT)
    assert {n.name: n.op_type for n in tensorrt.proto.graph.node}["residual"] == "Add"


@pytest.mark.parametrize("k", [128, 100])
@pytest.mark.parametrize("form", ["matmul_nbits", "dequantize"])
def test_int4_units_hold_their_weights_in_4_bit_blocks_and_stay_near_fp32(tmp_path, form, k):
    """A MatMul and a transposed Gemm with a bias, both INT4: ONNX Runtime's MatMulNBits (its form) or a block
    DequantizeLinear of INT4 weights (TensorRT's); the FP32 weights gone, the outputs near FP32's (4-bit random
    weights: about a tenth). K need not be a whole number of blocks (100 and 200: an LLaMA MLP's 2730)."""
    from autoprec.lower import Int4Form

    path = builders.save(builders.weight_only_mlp(features=k, hidden=2 * k), tmp_path / "mlp.onnx")
    info = analyse(path, load_search_space())
    assert all(Precision.INT4 in u.allowed for u in info.units)
    lowered = lower_plan(info, info.plan_at(Precision.INT4), None, QDQForm.ORT_CPU, Int4Form(form)).proto
    ops = [n.op_type for n in lowered.graph.node]
    weights = {t.name: t for t in lowered.graph.initializer}
    assert not {"w1", "w2"} & set(weights)
    if form == "matmul_nbits":
        assert ops == ["MatMulNBits", "Relu", "MatMulNBits"]
        assert all({a.name: a.i for a in n.attribute}["bits"] == 4 for n in lowered.graph.node if n.domain)
    else:
        assert ops.count("DequantizeLinear") == 2 and [t.data_type for t in weights.values()].count(TensorProto.INT4) == 2
        assert ops.count("Pad") == (2 if k % 32 else 0)  # TensorRT wants whole blocks
    x = np.random.default_rng(1).normal(size=(4, k)).astype(np.float32)
    want = builders.session(path).run(None, {"x": x})[0]
    got = builders.session(lowered).run(None, {"x": x})[0]
    assert output_metrics(want, got)["rel_l2"] < 0.2  # 4 bits: steps of a block's largest / 7


def test_int4_weights_off_centre_take_a_zero_point_per_block_where_the_engine_reads_one(tmp_path):
    """Weights whose columns sit off zero (as a biased projection's): ONNX Runtime's MatMulNBits takes a zero
    point per block (asymmetric) and its output error is lower than the symmetric rounding's; TensorRT's form
    stays symmetric (no zero point input), centred weights or not."""
    from autoprec.lower import Int4Form

    x = np.random.default_rng(1).normal(size=(4, 128)).astype(np.float32)
    found = {}
    for offset in (0.0, 0.3):
        model = builders.weight_only_mlp()
        w1 = next(t for t in model.graph.initializer if t.name == "w1")
        w1.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w1) + offset, "w1"))
        path = builders.save(model, tmp_path / f"mlp{offset}.onnx")
        info = analyse(path, load_search_space())
        plan = Plan.from_mapping({"mm": "int4", "gemm": "fp32"})
        want = builders.session(path).run(None, {"x": x})[0]
        for form in Int4Form:
            lowered = lower_plan(info, plan, None, QDQForm.ORT_CPU, form)
            node = next(n for n in lowered.proto.graph.node if n.op_type in ("MatMulNBits", "DequantizeLinear"))
            got = run(lowered, {"x": x})
            found[offset, form] = (len([i for i in node.input if i]), output_metrics(want, got)["rel_l2"])
    assert found[0.3, Int4Form.MATMUL_NBITS][0] == 4, found  # A, weights, scales, zero points
    assert found[0.3, Int4Form.MATMUL_NBITS][1] < 0.8 * found[0.3, Int4Form.DEQUANTIZE][1], found
    assert found[0.3, Int4Form.DEQUANTIZE][0] == 2 and found[0.0, Int4Form.DEQUANTIZE][0] == 2, found


def test_int4_zero_points_that_cost_time_ship_only_where_they_cut_the_error_by_twice_that(tmp_path):
    """Where the kernel measurement timed MatMulNBits reading zero points 15 % slower than symmetric blocks, a
    centred weight (a zero point cuts its error by about 12 %) stays symmetric and an off-centre one (71 %) takes
    them; where they timed as fast, both take them."""
    from autoprec.lower import Int4Form
    from autoprec.lower.int4 import keep_kernels

    timed = {"integer_over_float": {"speedup": 3.0, "low": 2.5, "high": 3.5}, "accuracy_level": 4, "rounds": 3,
             "engine": "a test's"}
    found = {}
    for offset in (0.0, 0.3):
        model = builders.weight_only_mlp()
        w1 = next(t for t in model.graph.initializer if t.name == "w1")
        w1.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w1) + offset, "w1"))
        info = analyse(builders.save(model, tmp_path / f"mlp{offset}.onnx"), load_search_space())
        for zero_points in ({"speedup": 0.87, "low": 0.85, "high": 0.89}, {"speedup": 1.01, "low": 0.9, "high": 1.1}):
            keep_kernels(info.stored.folder, {**timed, "zero_points": zero_points})
            lowered = lower_plan(info, Plan.from_mapping({"mm": "int4", "gemm": "fp32"}), None, QDQForm.ORT_CPU,
                                 Int4Form.MATMUL_NBITS)
            node = next(n for n in lowered.proto.graph.node if n.op_type == "MatMulNBits")
            found[offset, zero_points["high"] < 1] = len([i for i in node.input if i]) == 4
    assert found == {(0.0, True): False, (0.3, True): True, (0.0, False): True, (0.3, False): True}, found


def test_int4_embeddings_gather_their_rows_from_4_bit_blocks_in_both_forms(tmp_path):
    """An embedding (a Gather of a constant table's rows) is a unit where INT4 is searched — INT4 or FP32, decided
    as a sensitive unit is — and precision-neutral where it is not, as a Gather of an activation always is, and a
    table whose rows are no whole number of blocks. At INT4 ONNX Runtime gathers from the blocks (GatherBlockQuantized,
    a zero point per block for an off-centre table), TensorRT's form dequantizes the INT4 table before its Gather;
    either way each row read is the row rounded to 4-bit blocks, the FP32 table gone."""
    from autoprec.lower import Int4Form

    rng = np.random.default_rng(5)
    table = (rng.normal(0, 0.5, (200, 96)) + 0.3).astype(np.float32)
    path = builders.save(builders.embedding_lookup(table), tmp_path / "embed.onnx")
    space = load_search_space()
    info = analyse(path, space)
    embed = next(u for u in info.units if u.op_type == "Gather")
    assert (embed.name, embed.allowed, embed.sensitive) == ("embed", (Precision.INT4, Precision.FP32), True)
    assert [u.name for u in info.units] == ["embed", "proj"]  # the activation's Gather is no unit
    assert [u.name for u in analyse(path, space.restricted([Precision.INT8, Precision.FP16])).units] == ["proj"]
    narrow = builders.save(builders.embedding_lookup(table[:, :80], 32), tmp_path / "narrow.onnx")  # 80: no whole blocks of 32
    assert [u.name for u in analyse(narrow, space).units] == ["proj"]
    # an override narrows it as any unit (pinned FP32, or INT4: a precision named twice counts once)
    for override, allowed in (("embed=fp32", (Precision.FP32,)), ("embed=int4,int4", (Precision.INT4,))):
        assert analyse(path, space.with_overrides([override])).units[0].allowed == allowed, override
    ids = rng.integers(0, 200, (2, 5))
    errors = {}
    for form, op, symmetric in ((Int4Form.MATMUL_NBITS, "GatherBlockQuantized", False),
                                (Int4Form.DEQUANTIZE, "Gather", True)):
        lowered = lower_plan(info, Plan.from_mapping({"embed": "int4", "proj": "fp32"}), None, QDQForm.ORT_CPU, form)
        graph = lowered.proto.graph
        node = next(n for n in graph.node if n.name == "embed")
        assert node.op_type == op and "table" not in {t.name for t in graph.initializer}
        assert len([i for i in node.input if i]) == (2 if symmetric else 4)  # (table or data, ids, scales, zeros)
        if form is Int4Form.DEQUANTIZE:
            assert TensorProto.INT4 in [t.data_type for t in graph.initializer]
        graph.output.extend([helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
        got = builders.session(lowered).run(["e"], {"ids": ids})[0]
        blocks = got.reshape(-1, 3, 32)  # each row's 96 values in three blocks of 32, 16 levels at most
        assert max(len(np.unique(b)) for row in blocks for b in row) <= 16
        errors[form] = np.linalg.norm(got - table[ids]) / np.linalg.norm(table[ids])
    assert 0 < errors[Int4Form.MATMUL_NBITS] < errors[Int4Form.DEQUANTIZE] < 0.1, errors


def test_int4_blocks_are_as_long_as_the_search_space_says(tmp_path):
    """int4_block_size: 64 in a search space: both forms read 64 values a scale (and record the knob, which a
    default space leaves unsaid: a result written before it reads alike)."""
    from autoprec.core.search_space import SearchSpace
    from autoprec.lower import Int4Form

    space_file = tmp_path / "space.yaml"
    space_file.write_text("units: {MatMul: [int4, fp32], Gemm: [int4, fp32]}\nint4_block_size: 64\n")
    space = load_search_space(space_file)
    assert SearchSpace.from_json(space.to_json()).int4_block_size == 64
    assert "int4_block_size" not in load_search_space().to_json()
    info = analyse(builders.save(builders.weight_only_mlp(), tmp_path / "mlp.onnx"), space)
    for form in Int4Form:
        lowered = lower_plan(info, info.plan_at(Precision.INT4), None, QDQForm.ORT_CPU, form).proto
        blocks = [a.i for n in lowered.graph.node for a in n.attribute if a.name == "block_size"]
        assert blocks == [64, 64], (form, blocks)


def test_int4_is_offered_only_where_a_unit_has_a_constant_2d_weight(tmp_path):
    """A MatMul of two activations (attention's scores) and a Gemm reading its input transposed take no INT4."""
    nodes = [helper.make_node("MatMul", ["x", "x_t"], ["s"], "scores"),
             helper.make_node("Gemm", ["s", "w"], ["y"], "gemm", transA=1)]
    model = builders._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8]),
                                    helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [8, 8])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])],
                            [builders._init("w", np.ones((8, 4)))])
    info = analyse(builders.save(model, tmp_path / "m.onnx"), load_search_space())
    assert info.units and all(Precision.INT4 not in u.allowed for u in info.units)


def test_int4_scales_a_weight_for_its_loud_input_channels_where_that_lowers_the_error(tmp_path):
    """Inputs with a few channels 30× louder than the rest (as a transformer's outliers): calibration measures
    each channel's power, the lowering scales the weight and its input back (a Mul) in both forms, and the output
    error is lower than round to nearest's; inputs of one loudness keep round to nearest (no Mul)."""
    from autoprec.lower import Int4Form

    path = builders.save(builders.weight_only_mlp(batch=1), tmp_path / "mlp.onnx")
    rng = np.random.default_rng(3)
    loud = rng.normal(size=(64, 128)).astype(np.float32)
    loud[:, :4] *= 30
    errors = {}
    for name, x in (("loud", loud), ("even", rng.normal(size=(64, 128)).astype(np.float32))):
        np.savez(tmp_path / f"{name}.npz", x=x)
        space = load_search_space()
        info = analyse(path, space, {"x": (1, 128)})
        data = build_dataset(tmp_path / f"{name}.npz", info.inputs)
        ranges = calibrate(info, data.calibration, data.fingerprint())
        assert ranges["x"].channel_power is not None and ranges["x"].channel_power.shape == (128,)
        plan = Plan.from_mapping({"mm": "int4", "gemm": "fp32"})
        want = np.concatenate([run(info.stored, b) for b in data.evaluation])
        for form in Int4Form:
            scaled = lower_plan(info, plan, ranges, QDQForm.ORT_CPU, form)
            muls = [n for n in scaled.proto.graph.node if n.op_type == "Mul"]
            plain = lower_plan(info, plan, None, QDQForm.ORT_CPU, form)
            got = np.concatenate([run(scaled, b) for b in data.evaluation])
            rtn = np.concatenate([run(plain, b) for b in data.evaluation])
            errors[name, form] = (len(muls), output_metrics(want, got)["rel_l2"], output_metrics(want, rtn)["rel_l2"])
    for form in Int4Form:
        muls, scaled, rtn = errors["loud", form]
        assert muls == 1 and scaled < 0.9 * rtn, errors
        assert errors["even", form][0] == 0, errors


LOWER_IN_ANOTHER_PROCESS = """
import pickle, sys
from autoprec.lower import Int4Form, QDQForm, int4, lower_plan
info, ranges, plan = pickle.load(open(sys.argv[1], "rb"))
measure, measured = int4.rounding_errors, []
int4.rounding_errors = lambda *a: measured.append(1) or measure(*a)
lowered = lower_plan(info, plan, ranges, QDQForm.ORT_CPU, Int4Form.MATMUL_NBITS).proto
print(len(measured), lowered.SerializeToString().hex()[-64:], lowered.graph.node[0].op_type)
"""


def test_int4_rounding_is_chosen_once_per_model_and_read_by_every_process_that_lowers_it(tmp_path):
    """The INT4 roundings' errors (and activation-aware scales) are measured by the first process lowering the plan
    and kept beside the model: another process (a worker) lowers the same model to the same graph without measuring
    again; a kept measurement that is damaged is measured again."""
    import pickle
    import subprocess
    import sys

    from autoprec.lower import Int4Form

    path = builders.save(builders.weight_only_mlp(batch=1), tmp_path / "mlp.onnx")
    x = np.random.default_rng(3).normal(size=(64, 128)).astype(np.float32)
    x[:, :4] *= 30  # loud channels: the weight is scaled
    np.savez(tmp_path / "x.npz", x=x)
    info = analyse(path, load_search_space(), {"x": (1, 128)})
    data = build_dataset(tmp_path / "x.npz", info.inputs)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    plan = Plan.from_mapping({"mm": "int4", "gemm": "fp32"})
    first = lower_plan(info, plan, ranges, QDQForm.ORT_CPU, Int4Form.MATMUL_NBITS).proto
    assert first.graph.node[0].op_type == "Mul"  # the input scaled back: activation-aware
    (tmp_path / "lowering.pickle").write_bytes(pickle.dumps((info, ranges, plan)))

    def in_another_process() -> list[str]:
        run = subprocess.run([sys.executable, "-c", LOWER_IN_ANOTHER_PROCESS, str(tmp_path / "lowering.pickle")],
                             capture_output=True, text=True, check=True)
        return run.stdout.split()

    same = [first.SerializeToString().hex()[-64:], "Mul"]
    assert in_another_process() == ["0", *same]
    kept, = (info.folder / "derived").glob("int4-rounding-*.json")
    kept.write_text(kept.read_text().replace('"symmetric": [', '"symmetric": [-1.0, '))
    assert in_another_process() == ["1", *same]


def test_fp16_weights_hold_finite_values_to_fp16s_range_across_conversion_blocks(tmp_path, monkeypatch):
    """A weight converted a block at a time (its float32 values never copied whole) gets the numbers it got converted
    at once: finite values past FP16's range held to +-65504, infinities and NaN kept, the rest rounded to FP16 (blocks
    of 7 elements, the odd values at their edges; made to fail by converting without holding to the range)."""
    from autoprec.core.stored import read_tensor
    from autoprec.lower import cast

    model = builders.mlp()
    w1 = np.random.default_rng(0).normal(0, 3e4, (32, 32)).astype(np.float32)
    w1.reshape(-1)[[0, 6, 7, 13, 14, 20, 1023]] = [np.inf, -3.4e38, 65519.0, np.nan, -np.inf, 7e4, -65530.0]
    model.graph.initializer[2].CopyFrom(onnx.numpy_helper.from_array(w1, "w1"))
    info = analyse(builders.save(model, tmp_path / "mlp.onnx"), load_search_space().restricted([Precision.FP16]))
    monkeypatch.setattr(cast, "FP16_BLOCK", 7)
    lowered = lower_plan(info, info.plan_at(Precision.FP16), None, QDQForm.TENSORRT)
    weight = next(t for t in lowered.proto.graph.initializer if t.name.startswith("w1") and t.data_type == TensorProto.FLOAT16)
    limit = np.finfo(np.float16).max
    want = np.where(np.isfinite(w1), np.clip(w1, -limit, limit), w1).astype(np.float16)
    assert np.array_equal(read_tensor(weight, lowered.folder), want, equal_nan=True)
    assert np.isinf(want).sum() == 2 and (np.abs(want) == limit).sum() >= 4

"""Fuzzing the untrusted edges: damaged model files, and generated graphs through analysis and lowering.

Every outcome must be a result or an AutoprecError (a clean one-line message), never another exception.
"""

import os

import builders
import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autoprec.analysis.calibrate import calibrate
from autoprec.analysis.data import build_dataset
from autoprec.analysis.model import analyse, load_onnx
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Plan
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan

SPACE = load_search_space()
# CI runs a quick pass; AUTOPREC_FUZZ_SCALE=20 runs a deep one.
SCALE = int(os.environ.get("AUTOPREC_FUZZ_SCALE", "1"))
SEEDS = [
    builders.conv_net().SerializeToString(),
    builders.mlp().SerializeToString(),
    builders.attention().SerializeToString(),
]

mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=12)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
)


def mutate(data: bytes, operations) -> bytes:
    buf = bytearray(data)
    for op in operations:
        if op[0] == "truncate":
            del buf[int(op[1] * len(buf)):]
        elif op[0] == "flip":
            for where, value in op[1]:
                if buf:
                    buf[min(int(where * len(buf)), len(buf) - 1)] = value
        else:
            at = int(op[1] * len(buf))
            buf[at:at] = op[2]
    return bytes(buf)


@settings(max_examples=150 * SCALE, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.sampled_from(SEEDS), operations=st.lists(mutation, min_size=1, max_size=3))
def test_damaged_model_files_give_clean_errors(tmp_path, seed, operations):
    path = tmp_path / "fuzzed.onnx"
    path.write_bytes(mutate(seed, operations))
    try:
        load_onnx(path)
        analyse(path, SPACE, {})
    except AutoprecError as exc:
        assert str(exc) and "\n" not in str(exc).strip()


layer = st.one_of(
    st.tuples(st.just("conv"), st.sampled_from([4, 8]), st.sampled_from([1, 3]), st.booleans()),
    st.just(("relu",)),
    st.just(("silu",)),
    st.just(("hardswish",)),
    st.just(("bn",)),
    st.just(("bias",)),
    st.just(("residual",)),
    st.just(("pool",)),
)


def build_cnn(layers, head: bool, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, x, channels, size, counter = [], [], "x", 3, 16, iter(range(10_000))
    skip = None
    for spec in layers:
        i = next(counter)
        kind = spec[0]
        out = f"t{i}"
        if kind == "conv":
            _, cout, k, bias = spec
            inits.append(
                numpy_helper.from_array(rng.normal(0, 0.3, (cout, channels, k, k)).astype(np.float32), f"w{i}")
            )
            inputs = [x, f"w{i}"]
            if bias:
                inits.append(numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"b{i}"))
                inputs.append(f"b{i}")
            nodes.append(helper.make_node("Conv", inputs, [out], f"conv{i}", pads=[k // 2] * 4))
            skip, channels = (x if cout == channels else None), cout
        elif kind == "relu":
            nodes.append(helper.make_node("Relu", [x], [out], f"relu{i}"))
        elif kind == "silu":
            nodes += [
                helper.make_node("Sigmoid", [x], [f"s{i}"], f"sig{i}"),
                helper.make_node("Mul", [x, f"s{i}"], [out], f"silu{i}"),
            ]
        elif kind == "hardswish":
            nodes += [
                helper.make_node("HardSigmoid", [x], [f"h{i}"], f"hsig{i}"),
                helper.make_node("Mul", [x, f"h{i}"], [out], f"hswish{i}"),
            ]
        elif kind == "bn":
            for name, values in (("scale", 1 + 0.1 * rng.random(channels)), ("shift", rng.normal(0, 0.1, channels)),
                                 ("mean", rng.normal(0, 0.1, channels)), ("var", 1 + rng.random(channels))):
                inits.append(numpy_helper.from_array(values.astype(np.float32), f"{name}{i}"))
            nodes.append(
                helper.make_node(
                    "BatchNormalization", [x, f"scale{i}", f"shift{i}", f"mean{i}", f"var{i}"], [out], f"bn{i}"
                )
            )
        elif kind == "bias":
            inits.append(numpy_helper.from_array(rng.normal(0, 0.1, (channels, 1, 1)).astype(np.float32), f"c{i}"))
            nodes.append(helper.make_node("Add", [x, f"c{i}"], [out], f"add{i}"))
        elif kind == "residual":
            if skip is None:
                continue
            nodes.append(helper.make_node("Add", [x, skip], [out], f"res{i}"))
            skip = None
        elif kind == "pool":
            if size < 4:
                continue
            nodes.append(helper.make_node("MaxPool", [x], [out], f"pool{i}", kernel_shape=[2, 2], strides=[2, 2]))
            size, skip = size // 2, None
        x = out
    if head:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (channels, 3)).astype(np.float32), "fc_w"))
        nodes += [
            helper.make_node("GlobalAveragePool", [x], ["gap"], "gap"),
            helper.make_node("Flatten", ["gap"], ["flat"], "flat"),
            helper.make_node("MatMul", ["flat", "fc_w"], ["y"], "fc"),
        ]
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    else:
        nodes.append(helper.make_node("Identity", [x], ["y"], "out"))
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])
    graph = helper.make_graph(
        nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])], [y], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = builders.IR_VERSION
    return model


@settings(max_examples=25 * SCALE, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layers=st.lists(layer, min_size=1, max_size=8),
    head=st.booleans(),
    seed=st.integers(0, 1000),
    choices=st.lists(st.sampled_from(["int8", "fp16", "fp32"]), min_size=12, max_size=12),
    form=st.sampled_from(list(QDQForm)),
)
def test_generated_graphs_analyse_and_lower_to_valid_models(tmp_path, layers, head, seed, choices, form):
    model = build_cnn(layers, head, seed)
    path = tmp_path / "generated.onnx"
    onnx.save(model, str(path))
    try:
        info = analyse(path, SPACE)
    except AutoprecError as exc:
        assert "no searchable layers" in str(exc)  # a graph without Conv/MatMul: the only legitimate refusal
        return
    data = build_dataset(None, info.inputs, random_count=2)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    plan = Plan.from_mapping({u.name: c for u, c in zip(info.units, choices)})
    lowered = lower_plan(info, plan, ranges, form)
    builders.check(lowered)
    batch = data.evaluation[0]
    expected = builders.session(info.stored).run(None, batch)[0]
    got = builders.session(lowered).run(None, batch)[0]
    assert got.shape == expected.shape and got.dtype == expected.dtype

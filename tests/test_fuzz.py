"""Fuzzing the untrusted edges: damaged model files, generated graphs through analysis and lowering, and result
files with each field given a wrong value through every verb that reads them.

Every outcome must be a result or an AutoprecError (a clean one-line message), never another exception.
"""

import json
import os
import shutil

import builders
import numpy as np
import onnx
import pytest
from cli import clean, run
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


def _paths(value, prefix=()):
    """Every path into a JSON document."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):
            yield from _paths(v, prefix + (i,))


def _set(document, path, value):
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


REPLACEMENTS = [None, "x", -1, 1e308, [], {}, True]


def _mutations(result_dir):
    """Every (file, path into it, value put there): each field of each result file given a wrong value."""
    cases = []
    for name in ("pareto.json", "trials.json", "best/plan.json", "sensitivity.json"):
        document = json.loads((result_dir / name).read_text())
        for path in _paths(document):
            for value in REPLACEMENTS:
                cases.append((name, path, value))
    return cases


@pytest.mark.parametrize("case", range(30 * SCALE))
def test_damaged_result_files_are_read_or_refused_in_one_line(conv_result, tmp_path, capsys, case):
    cases = _mutations(conv_result)
    name, path, value = cases[(case * 7919) % len(cases)] if SCALE == 1 else cases[case * len(cases) // (30 * SCALE)]
    copy_dir = tmp_path / "r"
    shutil.copytree(conv_result, copy_dir)
    document = json.loads((copy_dir / name).read_text())
    if path:
        _set(document, path, value)
    else:
        document = value
    (copy_dir / name).write_text(json.dumps(document))
    for argv in (["show", copy_dir], ["show", copy_dir, "--json"], ["compare", copy_dir, conv_result],
                 ["export", copy_dir, "--format", "markdown", "--out", tmp_path / "md"]):
        clean(*run(argv, capsys))
    if case % 5 == 0 or SCALE > 1:  # figures and the report take a second each
        for argv in (["plot", copy_dir], ["report", copy_dir]):
            clean(*run(argv, capsys))

"""What exporters write that computes nothing (or computes one op as another) is written one way by preparation,
the outputs kept; and an FP16 plan of such an export casts only at its region's borders."""

import collections

import builders
import numpy as np
import onnx
import onnxruntime as ort

from autoprec.analysis.baseline import load_inputs
from autoprec.analysis.model import analyse
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan

SPACE = load_search_space()


def _ops(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def test_idle_casts_pools_and_channel_scales_are_written_one_way_and_the_outputs_stay(tmp_path):
    path = builders.save(builders.exported_classifier(), tmp_path / "exported.onnx")
    info = analyse(path, SPACE, {"x": (2, 16, 16, 3)})
    ops = _ops(info.model)
    assert ops["Cast"] == 0 and ops["ReduceMean"] == 0 and ops["GlobalAveragePool"] == 1 and ops["Mul"] == 0
    notes = " ".join(info.notes)
    assert "took out 5 Cast(s) that change no value" in notes
    assert "1 ReduceMean(s) over every spatial axis" in notes and "1 scale Mul(s)" in notes
    x = np.random.default_rng(0).random((2, 16, 16, 3), np.float32)
    given = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(builders.session(info.stored).run(None, {"x": x})[0], given, rtol=1e-4, atol=1e-5)
    # the deployable graph (dynamic batch kept) is written the same way
    assert _ops(info.for_deployment().model)["Cast"] == 0


def test_an_all_fp16_plan_of_an_export_casts_at_its_borders_only(tmp_path):
    """Before, each idle Cast inside the region turned its tensor back to FP32: 5 Casts in the model, 12 in its
    FP16 form (the ratio of the ResNet-50 export's 298 idle Casts to its 406 in FP16)."""
    path = builders.save(builders.exported_classifier(), tmp_path / "exported.onnx")
    info = analyse(path, SPACE.restricted([Precision.FP16]), {"x": (2, 16, 16, 3)})
    fp16 = lower_plan(info, info.plan_at(Precision.FP16), None, QDQForm.TENSORRT)
    assert _ops(fp16.proto)["Cast"] == 2  # one in, one out


def test_a_mask_of_float32_lowest_and_an_embedding_stay_in_the_fp16_region(tmp_path):
    """A mask's ``finfo(float32).min`` is no FP16 overflow: its Where joins the region and the constant becomes FP16's
    lowest, not -inf; the embedding table is gathered in FP16; ``Shape(mask, start=1, end=2)`` folds at the fixed
    shapes to the sequence length (graphsurgeon folded it to the whole shape, and the folding was left out)."""
    path = builders.save(builders.masked_encoder(), tmp_path / "encoder.onnx")
    mask = np.ones((16, 8), np.int64)
    mask[:, 6:] = 0
    np.savez(tmp_path / "tokens.npz", ids=np.arange(128).reshape(16, 8) % 32, mask=mask)
    space = SPACE.restricted([Precision.FP16])
    info, dataset, _ = load_inputs(path, space, tmp_path / "tokens.npz", {"ids": (4, 8), "mask": (4, 8)},
                                   judge_shapes=False)  # the graph at the fixed shapes, as one shape measures it
    assert not info.out_of_range and "left out" not in " ".join(info.notes)
    assert _ops(info.model)["Shape"] == 0
    fp16 = lower_plan(info, info.plan_at(Precision.FP16), None, QDQForm.TENSORRT)  # the Softmax too
    casts = [n for n in fp16.proto.graph.node if n.op_type == "Cast" and n.attribute[0].i != 9]  # not the mask's
    assert len(casts) == 1  # the output back: the embedding is gathered from an FP16 table
    lowest = {t.name: t for t in fp16.proto.graph.initializer}
    assert any(t.data_type == 10 and np.frombuffer(t.raw_data, np.float16).tolist() == [-65504.0]
               for t in lowest.values())
    session = builders.session(fp16)
    out = session.run(None, dataset.evaluation[0])[0]
    assert np.isfinite(out).all()


def test_a_shape_path_reads_an_fp16_tensor_without_a_cast_back(tmp_path):
    """In a deployable model (its dims dynamic) Shape nodes read region tensors: they read the FP16 tensor (its
    shape is the same), where each was a Cast of a whole activation back to FP32 (25 in a ViT-S/16 export)."""
    path = builders.save(builders.line_reader(), tmp_path / "reader.onnx")
    info = analyse(path, SPACE.restricted([Precision.FP16]), {"x": (2, 3, 8, 16)})
    deployable = info.for_deployment()
    model = lower_plan(deployable, deployable.plan_at(Precision.FP16), None, QDQForm.TENSORRT).proto
    readers = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    shapes = [n for n in model.graph.node if n.op_type == "Shape"]
    assert shapes and all(not n.input[0].endswith("_cast_fp32") and n.input[0] != "cols" for n in shapes)
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert all(readers.get(n.output[0]) != ["Shape"] for n in casts)
    x = np.random.default_rng(0).random((3, 3, 8, 24), np.float32)  # another batch and width than measured
    got = builders.session(model).run(None, {"x": x})[0]
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=2e-2)


def test_only_a_graph_whose_session_build_crashes_leaves_the_cpu_layout_optimizer_off(tmp_path):
    """ONNX Runtime 1.32's NCHWc transformer ended the process building a CPU session of a ViT-S/16
    export's all-FP16 deployable model. Left off for every FP16 graph (issue 69), a mixed FP16/FP32
    plan was timed with options a user's plain session lacks (0.94× all-FP32, 1.14–1.18× in plain
    sessions): now a graph holding FP16 is built once in a child process, and only one whose build
    crashes there leaves it off."""
    from autoprec.analysis.preparation import cpu_optimizers_left_off
    from autoprec.analysis.session_probe import SessionProbe, build_crashes

    fp32 = builders.exported_classifier()
    half = builders.exported_classifier()
    half.graph.node[1].attribute[0].i = 10  # the input's Cast to FP16
    path = builders.save(half, tmp_path / "half.onnx")
    assert cpu_optimizers_left_off(fp32, path) == [] and cpu_optimizers_left_off(half, path) == []
    assert not build_crashes(path)
    assert cpu_optimizers_left_off(half, path, crashes=lambda p: True) == ["NchwcTransformer"]
    assert cpu_optimizers_left_off(fp32, path, crashes=lambda p: True) == []  # FP32: not probed
    # nor an FP16 graph without a node the transformer starts from (a 300-unit MatMul chain's plans
    # were each built twice)
    half_mlp = builders.mlp()
    half_mlp.graph.node.append(onnx.helper.make_node("Cast", [half_mlp.graph.output[0].name], ["h"], to=10))
    assert cpu_optimizers_left_off(half_mlp, path, crashes=lambda p: True) == []
    # one child serves the probes; one a crash ended is started again for the next, and a hang is a crash
    crashing = SessionProbe("import os, signal, sys\nfor line in sys.stdin:\n"
                            "    if b'crash' in bytes.fromhex(line): os.kill(os.getpid(), signal.SIGSEGV)\n"
                            "    print('autoprec-probe: built', flush=True)\n")
    assert [crashing.crashes(name) for name in ("a", "crash", "b", "crash")] == [False, True, False, True]
    assert not SessionProbe("import sys\nfor line in sys.stdin: print('autoprec-probe: built', flush=True)"
                            ).crashes("x")
    assert not SessionProbe("1 / 0").crashes("x")  # an exception is no crash: the real build says it
    assert SessionProbe("import time\ntime.sleep(60)", seconds=1).crashes("x")


def test_a_cuda_session_is_not_probed_by_a_cpu_build(tmp_path, monkeypatch):
    """The probe builds a CPU session in a child process, against the CPU provider's NCHWc
    transformer: a CUDA session of an FP16 graph does not run that transformer on its nodes, and
    was built beside a CPU session of the same batch-32 model for every FP16 plan."""
    from autoprec.analysis import preparation
    from autoprec.backends.onnxruntime import new_session
    from autoprec.core.stored import StoredModel

    probed = []
    monkeypatch.setattr(preparation, "build_crashes", lambda path: probed.append(path) or False)

    class Ort:
        GraphOptimizationLevel = ort.GraphOptimizationLevel

        @staticmethod
        def InferenceSession(*args, **kwargs):
            return object()

    half = builders.exported_classifier()
    half.graph.node[1].attribute[0].i = 10  # the input's Cast to FP16
    stored = StoredModel(half, tmp_path)
    new_session(Ort, stored, ort.SessionOptions(), [("CUDAExecutionProvider", {}), "CPUExecutionProvider"])
    assert probed == []
    new_session(Ort, stored, ort.SessionOptions(), ["CPUExecutionProvider"])
    assert len(probed) == 1


def test_the_session_options_a_plans_figures_hold_for_are_recorded_and_said():
    """A trial's build report names the optimizers its sessions left off (none for a plain session),
    and the lines and the card say how to build a session its figures hold for."""
    from autoprec.backends.onnxruntime import OrtRunner, session_said

    class Session:
        def get_outputs(self):
            return []

    assert OrtRunner(Session()).build_report() is None
    left_off = OrtRunner(Session(), ("NchwcTransformer",)).build_report()
    assert left_off == {"disabled_optimizers": ["NchwcTransformer"]}
    assert "disabled_optimizers=['NchwcTransformer']" in session_said(left_off)
    assert "plain ONNX Runtime sessions" in session_said(None)


def test_the_tensorrt_form_judged_on_the_cpu_is_its_q_dq_arithmetic_at_any_shape(tmp_path):
    """A classifier in INT8, TensorRT's Q/DQ form (signed activations), on the deployable graph (its dims dynamic):
    ONNX Runtime's integer kernels saturated on this CPU and gave probabilities 0.09 off the fixed-shape graph's,
    which ran the same Q/DQ exactly; the export then fell back to fixed shapes. Judged by autoprec's CPU sessions,
    both are the Q/DQ arithmetic."""
    from autoprec.analysis.baseline import load_baseline
    from autoprec.analysis.preparation import cpu_session

    path = builders.save(builders.line_reader(), tmp_path / "reader.onnx")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).random((12, 3, 8, 16), np.float32))
    baseline = load_baseline(path, SPACE, tmp_path / "d.npz", {"x": (1, 3, 8, 16)})
    info, plan = baseline.info, baseline.info.plan_at(Precision.INT8, ["classifier"])
    fixed = lower_plan(info, plan, baseline.ranges, QDQForm.TENSORRT)
    deployable = lower_plan(info.for_deployment(), plan, baseline.ranges, QDQForm.TENSORRT)
    batch = baseline.dataset.evaluation[0]
    want, got = (cpu_session(m).run(None, batch)[0] for m in (fixed, deployable))
    np.testing.assert_allclose(got, want, atol=1e-5)

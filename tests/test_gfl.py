"""PicoDet / GFL heads (--det-layout picodet): outputs paired from their shapes, boxes decoded from the
distribution bins as PaddleDetection does, judged against FP32's like the YOLO layouts."""

import builders
import numpy as np
import pytest
import searching
from onnx import TensorProto, helper, numpy_helper

import autoprec
from autoprec.core.errors import AutoprecError
from autoprec.tasks import HeadOptions, gfl

REG_BINS = 8  # PicoDet's reg_max 7: 8 bins a side


def _bins(*sides: int) -> np.ndarray:
    """One anchor's distribution: each side certain of its bin."""
    logits = np.full((4, REG_BINS), -50.0, np.float32)
    logits[range(4), sides] = 50.0
    return logits.ravel()


def test_a_box_is_its_cells_centre_plus_the_expected_distances_times_the_stride():
    scores8, boxes8 = np.zeros((1, 16, 3), np.float32), np.zeros((1, 16, 4 * REG_BINS), np.float32)
    scores16, boxes16 = np.zeros((1, 4, 3), np.float32), np.zeros((1, 4, 4 * REG_BINS), np.float32)
    scores8[0, 5, 1] = 0.9  # row 1, column 1 at stride 8: centre (12, 12)
    boxes8[0, 5] = _bins(1, 2, 1, 0)  # left 8, top 16 (beyond the image: clipped), right 8, bottom 0
    scores16[0, 3, 2] = 0.6  # row 1, column 1 at stride 16: centre (24, 24)
    boxes16[0, 3] = _bins(1, 1, 0, 0)
    outputs = {"s8": scores8, "s16": scores16, "b8": boxes8, "b16": boxes16}
    head = gfl.find_head({k: v.shape for k, v in outputs.items()}, (32, 32))
    assert (head.scores, head.boxes, head.strides) == (("s8", "s16"), ("b8", "b16"), ((8,), (16,)))
    found = gfl.detections(outputs, head, conf=0.25, iou=0.45, logits=False)[0]
    np.testing.assert_allclose(found, [[4, 0, 20, 12, 0.9, 1], [8, 8, 24, 24, 0.6, 2]], atol=1e-6)


def test_logit_scores_and_another_bin_count_decode_the_same_boxes():
    """PicoDet-L's 17 bins a side (reg_max 16) over one concatenated pair, its scores as logits: the same box as
    the probabilities give."""
    bins = 17
    scores, boxes = np.full((1, 20, 2), 0.01, np.float32), np.zeros((1, 20, 4 * bins), np.float32)
    scores[0, 17, 1] = 0.8  # stride 16, row 0, column 1: centre (24, 8)
    sides = np.full((4, bins), -50.0, np.float32)
    sides[range(4), (0, 0, 1, 0)] = 50.0  # right 16, the rest 0
    boxes[0, 17] = sides.ravel()
    head = gfl.find_head({"s": scores.shape, "b": boxes.shape}, (32, 32))
    logits = {"s": np.log(scores / (1 - scores)), "b": boxes}
    found = gfl.detections({"s": scores, "b": boxes}, head, 0.25, 0.45, logits=False)[0]
    np.testing.assert_allclose(found, [[24, 8, 32, 8, 0.8, 1]], atol=1e-5)
    np.testing.assert_allclose(gfl.detections(logits, head, 0.25, 0.45, logits=True)[0], found, atol=1e-5)


def test_one_pair_over_every_stride_is_read_too_and_outputs_that_do_not_fit_are_named():
    head = gfl.find_head({"scores": (1, 20, 3), "boxes": (1, 20, 32)}, (32, 32))  # 16 + 4 cells at strides 8, 16
    assert head.strides == ((8, 16),)
    with pytest.raises(AutoprecError, match=r"--det-layout picodet: no outputs pair up.*scores \[1, 16, 3\]"):
        gfl.find_head({"scores": (1, 16, 3), "boxes": (1, 16, 5)}, (32, 32))
    with pytest.raises(AutoprecError, match="no image input"):
        gfl.find_head({"scores": (1, 16, 3), "boxes": (1, 16, 32)}, None)


def _picodet_like(folder):
    """A 32×32 detector: a Conv trunk, then per stride (8, 16) a sigmoid score map and a box distribution map,
    each flattened to N×cells×channels as PaddleDetection exports them (scores first)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b0")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="trunk", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="trunk_relu")]
    outputs = {}
    for stride in (8, 16):
        cells = (32 // stride) ** 2
        nodes.append(helper.make_node("AveragePool", ["r0"], [f"p{stride}"], name=f"pool{stride}",
                                      kernel_shape=[stride, stride], strides=[stride, stride]))
        for kind, channels in (("score", 3), ("box", 4 * REG_BINS)):
            inits += [numpy_helper.from_array(rng.normal(0, 0.5, (channels, 8, 1, 1)).astype(np.float32),
                                              f"w_{kind}{stride}"),
                      numpy_helper.from_array(np.full(channels, -0.5, np.float32), f"b_{kind}{stride}"),
                      numpy_helper.from_array(np.array([1, channels, cells], np.int64), f"shape_{kind}{stride}")]
            made = f"{kind}{stride}"
            nodes.append(helper.make_node("Conv", [f"p{stride}", f"w_{kind}{stride}", f"b_{kind}{stride}"], [made],
                                          name=f"head_{kind}{stride}"))
            if kind == "score":
                nodes.append(helper.make_node("Sigmoid", [made], [made + "_p"], name=f"sigmoid{stride}"))
                made += "_p"
            nodes += [helper.make_node("Reshape", [made, f"shape_{kind}{stride}"], [made + "_r"], name=f"flat_{made}"),
                      helper.make_node("Transpose", [made + "_r"], [f"{kind}s_{stride}"], name=f"last_{made}",
                                       perm=[0, 2, 1])]
            outputs[f"{kind}s_{stride}"] = [1, cells, channels]
    order = ["scores_8", "scores_16", "boxs_8", "boxs_16"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, outputs[n]) for n in order], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = builders.save(model, folder / "picodet.onnx")
    images, boxes = rng.uniform(0, 0.2, (12, 3, 32, 32)).astype(np.float32), np.full((12, 1, 5), -1.0)
    for i in range(12):
        y, x = 2 + i % 9, 4 + (3 * i) % 11
        images[i, :, y:y + 14, x:x + 12] = 1.0
        boxes[i, 0] = (i % 3, x, y, x + 12, y + 14)
    np.savez(folder / "data.npz", x=images, boxes=boxes)
    return path, folder / "data.npz"


def test_a_picodet_detector_is_searched_by_its_decoded_boxes(tmp_path):
    model, data = _picodet_like(tmp_path)
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data),
        judge=autoprec.JudgeSpec("detection@labels", max_loss=0.05, head=HeadOptions(layout="picodet")),
        study=autoprec.StudySpec(budget=5), out=tmp_path / "out"))
    fp32 = next(t for t in result.trials if t.plan.counts()["fp32"] == len(t.plan.precisions))
    assert fp32.measurement.metrics["scores_8"]["map50"] == 1.0 and fp32.loss == 0.0
    for trial in result.trials:
        decided = trial.measurement.metrics["scores_8"]
        assert {"map50", "map50_labels", "box_count_change"} <= set(decided) and 0 <= decided["map50"] <= 1
        assert "map50" not in trial.measurement.metrics["boxs_8"]  # the head is judged once, from all its outputs


def test_picodet_on_a_head_of_another_shape_is_one_line(tmp_path):
    weights = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["maps"], name="conv")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("maps", TensorProto.FLOAT, [1, 4, 32, 32])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = builders.save(model, tmp_path / "maps.onnx")
    with pytest.raises(AutoprecError, match=r"--det-layout picodet: no outputs pair up.*\(outputs: maps \[1, 4, 32, 32\]"):
        searching.search(autoprec.SearchConfig(
            autoprec.InputSpec(path),
            judge=autoprec.JudgeSpec("detection", max_loss=0.05, head=HeadOptions(layout="picodet")),
            study=autoprec.StudySpec(budget=2), out=tmp_path / "out"))

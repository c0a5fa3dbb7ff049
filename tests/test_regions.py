"""Text regions (DBNet maps) and segmentation: the decisions decoded the same way from FP32 and from a plan."""

import json

import builders
import numpy as np
import pytest
import searching
from onnx import TensorProto, helper, numpy_helper

import autoprec
from autoprec.measure.accuracy import Judge, Metric
from autoprec.tasks import regions


def test_regions_are_the_connected_pixels_above_the_threshold_kept_by_their_mean():
    probability = np.zeros((64, 64), np.float32)
    probability[4:12, 5:40] = 0.9  # a text line
    probability[20:30, 50:54] = 0.5  # above the pixel threshold, below the box threshold: dropped
    probability[40:60, 10:12] = 0.95  # two pixels wide: under PaddleOCR's min size
    probability[40:44, 30:60] = 0.8  # an L: one region
    probability[44:60, 56:60] = 0.8
    boxes = regions.text_regions(probability)
    assert boxes.tolist() == [[5, 4, 40, 12], [30, 40, 60, 60]]
    assert regions.region_f_score([boxes], [boxes]) == 1.0
    assert regions.region_f_score([boxes[:1]], [boxes]) == pytest.approx(2 / 3)
    assert regions.region_f_score([np.zeros((0, 4))], [np.zeros((0, 4))]) == 1.0
    shifted = boxes + [0, 0, 0, 30]  # same corner, far taller: IoU below 0.5
    assert regions.region_f_score([shifted[:1]], [boxes[:1]]) == 0.0
    assert regions.text_regions(np.full((8, 8), 0.9, np.float32)).tolist() == [[0, 0, 8, 8]]  # no background pixel


def test_a_long_winding_region_is_one_region():
    mask = np.zeros((40, 200), bool)
    mask[::4, :] = True  # rows joined at alternate ends: a snake 1,000 pixels long
    for row in range(0, 36, 4):
        mask[row:row + 5, 199 if row % 8 == 0 else 0] = True
    assert regions.Runs.of(mask).regions == 1


def _flooded(mask: np.ndarray) -> np.ndarray:
    """4-connected regions by flood fill, labelled 1…K in the raster order of their first pixels: the slow truth."""
    labels, count = np.zeros(mask.shape, int), 0
    for y, x in zip(*np.nonzero(mask)):
        if labels[y, x]:
            continue
        count += 1
        labels[y, x], stack = count, [(y, x)]
        while stack:
            a, b = stack.pop()
            for c, d in ((a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)):
                if 0 <= c < mask.shape[0] and 0 <= d < mask.shape[1] and mask[c, d] and not labels[c, d]:
                    labels[c, d] = count
                    stack.append((c, d))
    return labels


def test_regions_match_a_flood_fill_on_random_maps():
    rng = np.random.default_rng(0)
    for _ in range(60):
        probability = rng.random(tuple(rng.integers(1, 30, 2))).astype(np.float32) ** rng.uniform(0.2, 3)
        mask = probability > regions.DB_THRESHOLD
        runs, truth = regions.Runs.of(mask), _flooded(mask)
        labels = np.zeros(mask.shape, int)
        for row, start, end, region in zip(runs.row, runs.start, runs.end, runs.region):
            labels[row, start:end] = region + 1
        assert np.array_equal(labels, truth)
        expected = []
        for region in range(1, truth.max() + 1):
            ys, xs = np.nonzero(truth == region)
            box = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
            if probability[ys, xs].astype(np.float64).mean() >= regions.DB_BOX_THRESHOLD and min(
                    box[2] - box[0], box[3] - box[1]) >= regions.MIN_SIDE:
                expected.append(box)
        assert regions.text_regions(probability).tolist() == [list(b) for b in expected]


def test_mean_iou_counts_each_class_present():
    truth = np.array([[0, 0, 1, 1], [0, 0, 1, 1]])
    assert regions.mean_iou(truth, truth) == 1.0
    predicted = np.array([[0, 0, 0, 1], [0, 0, 1, 1]])
    assert regions.mean_iou(predicted, truth) == pytest.approx((4 / 5 + 3 / 4) / 2)
    unlabelled = np.where(truth == 1, -1, truth)  # only the left half scored
    assert regions.mean_iou(predicted, unlabelled) == 1.0
    assert regions.mean_iou(np.array([[0, 1, 0, 1], [0, 0, 1, 1]]), unlabelled) == pytest.approx((3 / 4 + 0) / 2)


def _db_like(folder, classes=None):
    """Conv 3×3 layers then a sigmoid map (DBNet's head), or per-pixel class scores (a segmenter)."""
    rng = np.random.default_rng(0)
    out_channels = classes or 1
    weights = [numpy_helper.from_array((rng.normal(0, 0.3, (8, 1, 3, 3)) + 1 / 9).astype(np.float32), "w0"),
               numpy_helper.from_array(np.zeros(8, np.float32), "b0"),
               numpy_helper.from_array((rng.normal(0, 0.1, (out_channels, 8, 3, 3)) + 0.15).astype(np.float32), "w1"),
               numpy_helper.from_array(np.full(out_channels, -2.5, np.float32), "b1")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["logits" if classes else "c1"], name="conv1",
                              pads=[1, 1, 1, 1])]
    if not classes:
        nodes.append(helper.make_node("Sigmoid", ["c1"], ["prob"], name="sigmoid"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 32, 32])],
                              [helper.make_tensor_value_info("logits" if classes else "prob", TensorProto.FLOAT,
                                                             [1, out_channels, 32, 32])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = builders.save(model, folder / ("seg.onnx" if classes else "db.onnx"))
    items, boxes = np.zeros((16, 1, 32, 32), np.float32), np.full((16, 2, 5), -1.0)
    masks = np.zeros((16, 32, 32), np.int64)
    for i in range(16):
        for j, (y, x, h, w) in enumerate([(3 + i % 5, 2, 6, 20), (18, 8 + i % 7, 7, 14)]):
            items[i, 0, y:y + h, x:x + w] = 1.0
            boxes[i, j] = (0, x, y, x + w, y + h)
            masks[i, y:y + h, x:x + w] = j + 1
    masks[:, :, 28:] = -1  # not labelled
    np.savez(folder / "data.npz", x=items, **({"masks": masks} if classes else {"boxes": boxes}))
    return path, folder / "data.npz"


def test_a_text_detector_is_searched_by_its_regions(tmp_path):
    model, data = _db_like(tmp_path)
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec("text-regions@labels", max_loss=0.05),
        study=autoprec.StudySpec(budget=5), out=tmp_path / "out"))
    pareto = json.loads((tmp_path / "out" / "pareto.json").read_text())
    assert pareto["search"]["fp32_on_labels"]["prob"]["region_f_labels"] > 0.5  # the map finds the drawn boxes
    fp32 = next(t for t in result.trials if t.plan.counts()["fp32"] == len(t.plan.precisions))
    assert fp32.measurement.metrics["prob"]["region_f"] == 1.0 and fp32.loss == 0.0
    assert all("region_f" in t.measurement.metrics["prob"] for t in result.trials)


def test_a_segmenter_is_searched_by_its_classes(tmp_path):
    model, data = _db_like(tmp_path, classes=3)
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec("segmentation", max_loss=0.05),
        study=autoprec.StudySpec(budget=5), out=tmp_path / "out"))
    for trial in result.trials:
        metrics = trial.measurement.metrics["logits"]
        assert trial.loss == pytest.approx(1 - metrics["miou"]) and 0 <= metrics["pixel_agreement"] <= 1
    fp32 = next(t for t in result.trials if t.plan.counts()["fp32"] == len(t.plan.precisions))
    assert fp32.measurement.metrics["logits"]["miou"] == 1.0


def test_a_segmenter_is_searched_against_its_masks(tmp_path):
    model, data = _db_like(tmp_path, classes=3)
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec("segmentation@labels", max_loss=0.05),
        study=autoprec.StudySpec(budget=4), out=tmp_path / "out"))
    fp32 = json.loads((tmp_path / "out" / "pareto.json").read_text())["search"]["fp32_on_labels"]["logits"]["miou_labels"]
    assert 0 < fp32 < 1
    for trial in result.trials:  # the drop of the mean IoU against the masks from FP32's own
        assert trial.loss == pytest.approx(fp32 - trial.measurement.metrics["logits"]["miou_labels"])


def test_the_documented_custom_head_metric_judges_a_decoded_box_head(tmp_path, monkeypatch):
    """docs/examples/custom_head.py, as docs/design.md shows it: FP32 scores 0, every plan gets a loss in [0, 1]."""
    from pathlib import Path

    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.normal(0, 0.5, (16, 60)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([1, 10, 6], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="head"),
             helper.make_node("Reshape", ["m", "shape"], ["r"], name="rows"),
             helper.make_node("Sigmoid", ["r"], ["boxes"], name="squash")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 10, 6])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = builders.save(model, tmp_path / "detector.onnx")
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "docs" / "examples"))
    result = searching.search(autoprec.SearchConfig(
        autoprec.InputSpec(path), judge=autoprec.JudgeSpec("custom_head:loss", max_loss=0.5),
        study=autoprec.StudySpec(budget=4), out=tmp_path / "out"))
    fp32 = next(t for t in result.trials if t.plan.counts()["fp32"] == len(t.plan.precisions))
    assert fp32.loss == 0.0 and all(0.0 <= t.loss <= 1.0 for t in result.trials)


def test_a_map_past_one_by_a_rounding_step_is_still_a_probability_map():
    """ONNX Runtime's CPU Sigmoid gave 1.0000001 on one page of PP-OCRv5's map: text-regions was refused for it
    ('no model output it applies to'); so were PicoDet scores read as logits. A map past [0, 1] by more is not one."""
    page = np.zeros((1, 1, 32, 32), np.float32)
    page[0, 0, 4:12, 2:20] = np.nextafter(np.float32(1), np.float32(2))
    judge = Judge(Metric("text-regions", ("text-regions",)), [{"prob": page}])
    judge.check()
    assert judge.metrics([{"prob": page}])["prob"]["region_f"] == 1.0
    assert regions.probabilities(np.float32([-1e-7, 0.5, 1.0000001]))
    assert not regions.probabilities(np.float32([0.0, 1.01])) and not regions.probabilities(np.float32([-0.5, 0.5]))


def test_a_plan_whose_map_overshoots_one_is_judged_against_fp32s_regions():
    fp32 = np.zeros((1, 1, 32, 32), np.float32)
    fp32[0, 0, 4:10, 4:20] = 0.9
    judge = Judge(Metric("text-regions", ("text-regions",)), [{"map": fp32}])
    overshoot = fp32.copy()
    overshoot[0, 0, 4:10, 4:20] = 1.002  # a lowered sigmoid past 1 by more than a rounding
    assert judge.loss_of([{"map": overshoot}]) == 0.0  # the same region
    moved = np.roll(fp32, 12, axis=2)
    assert judge.loss_of([{"map": moved}]) == 1.0  # no region kept its place
    assert judge.loss_of([{"map": fp32}]) == 0.0  # FP32's regions, decoded once, stand for every plan

import math

import numpy as np
import pytest

from autoprec.core.errors import AutoprecError
from autoprec.measure.accuracy import (
    compare,
    loss_from_metrics,
    output_metrics,
    resolve_metric,
)


def test_identical_outputs():
    x = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    m = compare([{"y": x}], [{"y": x.copy()}])["y"]
    assert m["cosine"] == pytest.approx(1.0) and m["rel_l2"] == 0 and m["max_abs"] == 0
    assert m["snr_db"] == math.inf and m["top1"] == 1.0


def test_known_errors():
    ref = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], np.float32)
    scaled = 2 * ref
    m = output_metrics(ref, scaled)
    assert m["cosine"] == pytest.approx(1.0)  # same direction
    assert m["rel_l2"] == pytest.approx(1.0)  # error as large as the signal
    assert m["snr_db"] == pytest.approx(0.0, abs=1e-9)
    assert m["max_abs"] == pytest.approx(2.0)
    orthogonal = np.array([[0.0, 1.0, 0.0], [0.0, 2.0, 0.0]], np.float32)
    m = compare([{"y": ref}], [{"y": orthogonal}])["y"]
    assert m["cosine"] == pytest.approx(0.5)  # item 0 orthogonal (0), item 1 identical (1)
    assert m["top1"] == 0.5
    noisy = ref + np.array([[0.1, 0, 0], [0, 0, 0]], np.float32)
    assert output_metrics(ref, noisy)["snr_db"] == pytest.approx(10 * math.log10(5 / 0.01), rel=1e-5)


def test_top1_only_for_score_like_outputs():
    image, scores = np.ones((2, 3, 8, 8), np.float32), np.ones((2, 7, 10), np.float32)
    assert "top1" not in compare([{"y": image}], [{"y": image}])["y"]
    assert "top1" in compare([{"y": scores}], [{"y": scores}])["y"]


def test_nonfinite_outputs_mean_unbounded_loss():
    ref = np.ones((2, 4), np.float32)
    bad = ref.copy()
    bad[0, 1] = np.inf
    metrics = compare([{"y": ref}], [{"y": bad}])
    assert metrics["y"]["nonfinite"] == 1.0
    for metric in ("cosine", "rel_l2", "max_abs", "top1"):
        assert loss_from_metrics(metrics, metric) == math.inf
    nan = ref.copy()
    nan[1, 0] = np.nan
    assert loss_from_metrics(compare([{"y": ref}], [{"y": nan}]), "cosine") == math.inf


def test_losses_average_over_outputs_and_batches():
    rng = np.random.default_rng(1)
    ref = [{"a": rng.normal(size=(2, 5)), "b": rng.normal(size=(2, 5))} for _ in range(3)]
    cand = [{"a": r["a"], "b": -r["b"]} for r in ref]
    metrics = compare(ref, cand)
    assert metrics["a"]["cosine"] == pytest.approx(1.0) and metrics["b"]["cosine"] == pytest.approx(-1.0)
    assert loss_from_metrics(metrics, "cosine") == pytest.approx(1.0)  # mean of (1-1) and (1-(-1))
    assert loss_from_metrics(metrics, "top1") == pytest.approx(0.5, abs=0.2)


def test_user_metric_is_imported_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_metrics.py").write_text(
        "def worst_abs(reference, candidate):\n"
        "    return max(float(abs(r['y'] - c['y']).max()) for r, c in zip(reference, candidate))\n"
    )
    monkeypatch.chdir(tmp_path)
    metric = resolve_metric("my_metrics:worst_abs")
    assert metric.name == "my_metrics:worst_abs"
    assert metric.user_function([{"y": np.zeros(3)}], [{"y": np.array([0.0, -2.0, 1.0])}]) == 2.0
    with pytest.raises(AutoprecError, match="cannot import"):
        resolve_metric("my_metrics:missing")
    with pytest.raises(AutoprecError, match="unknown --metric"):
        resolve_metric("accuracy")


def test_a_limit_on_a_decision_counting_metric_is_said_in_decisions():
    """With 12 evaluation items, top1 at --max-loss 0.01 allows no changed decision (each is a loss of 1/12): said,
    with the limit that allows one; top1@labels counts the labelled items; a similarity counts none."""
    from autoprec.measure.accuracy import Judge, Metric

    rng = np.random.default_rng(0)
    reference = [{"y": rng.normal(size=(4, 3)).astype(np.float32)} for _ in range(3)]
    said = Judge(Metric("top1", ("top1",)), reference).limit_said(0.01)
    assert said == ("--max-loss 0.01 with --metric top1 over 12 evaluation decision(s) allows 0 changed top-1 "
                    "decision(s): each is a loss of 0.0833; give --max-loss 0.0833 or more to allow one, or more "
                    "evaluation data")
    assert "allows 2 changed" in Judge(Metric("top1", ("top1",)), reference).limit_said(0.2)
    labels = [{"labels": np.array([0, 1, -1, 2])} for _ in range(3)]
    labelled = Judge(Metric("top1@labels", ("top1",)), reference, labels).limit_said(0.1)
    assert "over 9 evaluation decision(s) allows 0 fewer correct answers than FP32's" in labelled
    assert Judge(Metric("cosine"), reference).limit_said(0.01) is None
    assert Judge(Metric("top1", ("top1",)), reference).limit_said(None) is None


def test_an_output_empty_at_a_shape_agrees_with_an_empty_one_and_not_with_values():
    """A merged decoder returns an empty tensor from the branch it did not take: nothing to compare, no error."""
    from autoprec.measure.accuracy import output_metrics

    empty = np.zeros((0, 4, 0, 64), np.float32)
    assert output_metrics(empty, empty.copy())["cosine"] == 1.0
    assert output_metrics(empty, np.zeros((1, 4, 7, 64), np.float32))["cosine"] == 0.0

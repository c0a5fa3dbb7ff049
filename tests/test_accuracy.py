import json
import math
import shutil

import builders
import numpy as np
import pytest
from cli import clean, refused, run
from searching import main

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


@pytest.mark.parametrize("shape", [(3, 70_000), (50_000, 3), (3, 5, 9_000)], ids=["wide items", "many items", "3-d"])
def test_a_large_output_gets_the_figures_of_its_whole_arrays_in_float64(shape):
    """Large outputs (a vocabulary's logits, an OCR head) are summed in pieces: each figure is still
    the whole arrays' own, one item's error counted once, the largest error wherever it lies."""
    rng = np.random.default_rng(3)
    ref = rng.normal(size=shape).astype(np.float32)
    cand = (ref + rng.normal(scale=1e-3, size=shape)).astype(np.float32)
    cand[1].reshape(-1)[0] += 0.5  # the largest error: in neither the first item nor the last piece
    ref[0] = 0.0
    cand[0] = 0.0  # an all-zero item the candidate matches
    r, c = ref.reshape(len(ref), -1).astype(np.float64), cand.reshape(len(cand), -1).astype(np.float64)
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1)
    cosines = np.where(norms > 0, (r * c).sum(axis=1) / np.where(norms > 0, norms, 1.0), 1.0)
    m = output_metrics(ref, cand)
    assert m["cosine"] == pytest.approx(cosines.mean(), rel=1e-12)
    assert m["rel_l2"] == pytest.approx(math.sqrt(((c - r) ** 2).sum() / (r**2).sum()), rel=1e-12)
    assert m["max_abs"] == pytest.approx(np.abs(c - r).max(), rel=1e-12)
    bad = cand.copy()
    bad.reshape(-1)[-2] = np.nan  # in the last piece only
    assert output_metrics(ref, bad)["nonfinite"] == 1.0


def test_a_decoders_logits_loss_is_its_positions_mean_cosine_however_wide_its_vocabulary():
    from autoprec.measure.shaped import cosine_loss

    rng = np.random.default_rng(4)
    ref = rng.normal(size=(4, 3, 70_000)).astype(np.float32)  # a position's logits wider than a piece
    cand = (ref + rng.normal(scale=1e-2, size=ref.shape)).astype(np.float32)
    r, c = ref.reshape(-1, 70_000).astype(np.float64), cand.reshape(-1, 70_000).astype(np.float64)
    cosines = (r * c).sum(1) / (np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1))
    assert cosine_loss(ref, cand) == pytest.approx(1 - cosines.mean(), rel=1e-9)
    cand[2, 1, -1] = np.inf
    assert cosine_loss(ref, cand) == math.inf


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


def test_a_scalar_output_is_judged(tmp_path, capsys):
    from onnx import TensorProto, helper

    path = builders.mlp_then([helper.make_node("ReduceSum", ["a"], ["y"], name="sum", keepdims=0)],
                     outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], folder=tmp_path)
    code, err = run(["search", path, "--out", tmp_path / "o", "--budget", "3"], capsys)
    clean(code, err, allowed=(0,))
    said = json.loads((tmp_path / "o" / "pareto.json").read_text())["search"]["metric_notes"]
    assert any("output 'y' has 1 value(s) per item: cosine cannot see it change" in note for note in said)
    trials = json.loads((tmp_path / "o" / "trials.json").read_text())["trials"]
    assert all(t["accuracy_loss"] == pytest.approx(t["metrics"]["y"]["rel_l2"]) for t in trials)
    int8 = [t for t in trials if t["plan"]["counts"]["int8"]]
    assert int8 and all(t["accuracy_loss"] > 0 for t in int8)  # INT8 moves the sum, and the loss sees it


@pytest.mark.parametrize("body, said", [
    ("return float('nan')", "returned nan for the FP32 outputs against themselves"),
    ("raise RuntimeError('boom')", "raised RuntimeError: boom"),
    ("return 'abc'", "returned str 'abc', not one number"),
])
def test_a_user_metric_that_gives_no_number_stops_the_search_naming_it(workdir, capsys, monkeypatch, body, said):
    monkeypatch.chdir(workdir)
    (workdir / "odd.py").write_text(f"def loss(reference, outputs):\n    {body}\n")
    code, err = run(["search", "conv.onnx", "--metric", "odd:loss", "--budget", "3", "--out", workdir / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert err.strip().splitlines()[-1] == f"autoprec: error: --metric odd:loss: {said}" + (
        "; a loss is a finite number (0: as good as FP32): fix the function" if "nan" in said else
        "; fix the function" if "raised" in said else "; return a float (lower is better, 0: as good as FP32)")


def test_a_user_metric_that_prints_leaves_json_output_whole(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    (workdir / "chatty.py").write_text("def loss(reference, outputs):\n    print('hello from the metric')\n    return 0.0\n")
    out = workdir / "o"
    code, err = run(["search", "conv.onnx", "--budget", "2", "--out", out, "--no-warm-start"], capsys)
    clean(code, err, allowed=(0,))
    assert main(["check", str(out), "--metric", "chatty:loss", "--max-loss", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["passed"] is True and "hello from the metric" in captured.err


def inputs(count: int = 32) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(count, 16)).astype(np.float32)


LABELS = {  # name: (labels for 32 items of a 12-class output, phrases of the refusal)
    "classes the output does not have": (np.full(32, 700), ("'labels' hold class 700", "scores 12 classes (0–11)")),
    "nothing labelled": (np.full(32, -1), ("'labels' labels nothing",)),
    "an object array": (np.array([1] * 32, dtype=object), ("stored as Python objects", "np.int64")),
    "N×3 for N×C scores": (np.zeros((32, 3), np.int64), ("'labels' are shaped [4, 3] per batch",
                                                         "give one class per item, shaped [4]")),
}


@pytest.mark.parametrize("kind", sorted(LABELS))
def test_labels_that_cannot_score_the_output_are_refused_before_any_trial(tmp_path, capsys, kind):
    """Labels 700 for 12 classes made every plan lose 0 against them: --max-loss 0 was vacuous. All -1 stalled the
    search or ended in an internal error; an object array was an internal error; N×3 labels blamed the output."""
    labels, phrases = LABELS[kind]
    np.savez(tmp_path / "d.npz", x=inputs(), labels=labels)
    out = tmp_path / "o"
    refused(["search", builders.classifier_file(tmp_path), "--data", tmp_path / "d.npz", "--metric", "top1@labels", "--max-loss",
             "0", "--budget", "2", "--out", out], capsys, *phrases)
    assert not (out / "pareto.json").exists()
    if kind != "classes the output does not have":
        return
    np.savez(tmp_path / "d.npz", x=inputs(), labels=np.arange(32) % 12)  # corrected: the study left is no obstacle
    code, err = run(["search", builders.classifier_file(tmp_path), "--data", tmp_path / "d.npz", "--metric", "top1@labels",
                     "--max-loss", "0", "--budget", "1", "--no-warm-start", "--out", out], capsys)
    assert code == 0, err[-2000:]


def test_labels_fp32_itself_gets_no_better_than_chance_are_doubted(tmp_path):
    from autoprec.measure.accuracy import Judge, resolve_metric

    reference = [{"y": np.eye(4, 12, dtype=np.float32)}]  # FP32 decides classes 0..3
    judge = Judge(resolve_metric("top1@labels"), reference, [{"labels": np.array([5, 6, 7, 8])}])
    judge.check()
    assert any("FP32 itself scores top-1 vs labels 0.0%" in line and "chance with 12 classes" in line
               for line in judge.doubts())
    right = Judge(resolve_metric("top1@labels"), reference, [{"labels": np.arange(4, dtype=np.uint8)}])
    assert right.check() == {"y": {"top1_labels": 1.0}} and right.doubts() == []  # (uint8 classes were an internal error)


METRICS = {
    "changes the reference in place": ("def loss(reference, outputs):\n    reference[0]['probs'] *= 2\n    return 0.0\n",
                                       "the arrays it is given are read-only"),
    "raises on every plan": ("calls = []\ndef loss(reference, outputs):\n    calls.append(1)\n"
                             "    if len(calls) > 1:\n        raise RuntimeError('on a plan')\n    return 0.0\n",
                             "raised RuntimeError: on a plan; fix the function"),
    "NaN on every plan": ("calls = []\ndef loss(reference, outputs):\n    calls.append(1)\n"
                          "    return 0.0 if len(calls) == 1 else float('nan')\n", "returned nan for a plan"),
}


@pytest.mark.parametrize("kind", sorted(METRICS))
def test_a_broken_user_metric_stops_the_search_before_any_trial(conv_result, tmp_path, capsys, monkeypatch, kind):
    """A metric that changed ``reference`` in place corrupted every later measurement; one raising or giving NaN on
    every plan ended in exit 0 with all-FP32 chosen. Judged on the FP32 plan before the study starts, it stops the
    search there: an earlier result in the folder is kept whole, and the corrected run is not refused."""
    body, phrase = METRICS[kind]
    module = f"broken{sorted(METRICS).index(kind)}"  # a module of its own: a process imports a module once
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{module}.py").write_text(body)
    out = tmp_path / "o"
    shutil.copytree(conv_result, out)  # an earlier run's result
    before = {p: p.read_bytes() for p in (out / "pareto.json", out / "best" / "plan.json", out / "best" / "model.onnx")}
    recorded = json.loads((out / "pareto.json").read_text())
    again = ["search", recorded["model"]["path"], "--data", recorded["search"]["data_path"], "--no-warm-start",
             "--study-name", "other", "--out", out]
    refused([*again, "--metric", f"{module}:loss", "--budget", "2"], capsys, f"--metric {module}:loss", phrase)
    assert {p: p.read_bytes() for p in before} == before
    if kind == sorted(METRICS)[0]:  # the study the refused run made is gone with it
        (tmp_path / "fixed.py").write_text("def loss(reference, outputs):\n    return 0.0\n")
        code, err = run([*again, "--metric", "fixed:loss", "--budget", "1"], capsys)
        assert code == 0, err[-2000:]


def test_a_run_its_metric_stops_after_its_trials_began_leaves_no_earlier_result(tmp_path, capsys, monkeypatch):
    """A run into a folder an earlier run wrote, stopped once its trials began (NaN for a plan that is not FP32),
    leaves that run's result passing for its own no more; its trials stay in the study."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "picky.py").write_text(
        "import numpy as np\n"
        "def loss(reference, outputs):\n"
        "    same = all(np.array_equal(r[k], o[k]) for r, o in zip(reference, outputs) for k in r)\n"
        "    return 0.0 if same else float('nan')\n")
    model, out = builders.classifier_file(tmp_path), tmp_path / "o"
    assert run(["search", model, "--budget", "1", "--no-warm-start", "--out", out], capsys)[0] == 0
    assert (out / "best" / "plan.json").is_file()
    refused(["search", model, "--metric", "picky:loss", "--budget", "6", "--no-warm-start", "--study-name", "other",
             "--precisions", "int8,fp32", "--out", out], capsys, "--metric picky:loss", "returned nan for a plan")
    assert not (out / "pareto.json").exists() and not any((out / "best").iterdir())
    refused(["show", out], capsys, "no pareto.json there")

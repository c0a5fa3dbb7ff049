"""Third adversarial round (issue 55), a test per failure family: results no hand edit, label or user metric can
make false, and refusals before the work rather than after. Each probe runs the command in this process (main(),
as the command line does) and expects exit 0 with a true result, or exit 2 with one line naming the input."""

import json
import shutil
from pathlib import Path

import builders
import numpy as np
import pytest
import searching
from onnx import TensorProto, helper, numpy_helper
from searching import main


def run(argv, capsys) -> tuple[int, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def refused(argv, capsys, *phrases: str) -> str:
    """The command's last line when it exits 2 with one ``autoprec: error:`` line holding ``phrases``."""
    code, err = run(argv, capsys)
    assert "Traceback" not in err, err[-3000:]
    assert code == 2, (code, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("autoprec: error: "), err[-3000:]
    for phrase in phrases:
        assert phrase in last, last
    return last


def classifier(folder: Path, classes: int = 12, batch: int | str = 4, name: str = "cls.onnx") -> Path:
    return builders.save(builders.classifier(classes, batch), folder / name)


def inputs(count: int = 32) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(count, 16)).astype(np.float32)


# --- labels against the outputs they score (items 1, 6, 10) ---

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
    refused(["search", classifier(tmp_path), "--data", tmp_path / "d.npz", "--metric", "top1@labels", "--max-loss",
             "0", "--budget", "2", "--out", out], capsys, *phrases)
    assert not (out / "pareto.json").exists()
    if kind != "classes the output does not have":
        return
    np.savez(tmp_path / "d.npz", x=inputs(), labels=np.arange(32) % 12)  # corrected: the study left is no obstacle
    code, err = run(["search", classifier(tmp_path), "--data", tmp_path / "d.npz", "--metric", "top1@labels",
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


# --- a user's module:function loss (items 2, 8, 12) ---

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
def test_a_broken_user_metric_stops_the_search_before_any_trial(searched, tmp_path, capsys, monkeypatch, kind):
    """A metric that changed ``reference`` in place corrupted every later measurement; one raising or giving NaN on
    every plan ended in exit 0 with all-FP32 chosen. Judged on the FP32 plan before the study starts, it stops the
    search there: an earlier result in the folder is kept whole, and the corrected run is not refused."""
    body, phrase = METRICS[kind]
    module = f"broken{sorted(METRICS).index(kind)}"  # a module of its own: a process imports a module once
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{module}.py").write_text(body)
    out = tmp_path / "o"
    shutil.copytree(searched, out)  # an earlier run's result
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
    model, out = classifier(tmp_path), tmp_path / "o"
    assert run(["search", model, "--budget", "1", "--no-warm-start", "--out", out], capsys)[0] == 0
    assert (out / "best" / "plan.json").is_file()
    refused(["search", model, "--metric", "picky:loss", "--budget", "6", "--no-warm-start", "--study-name", "other",
             "--precisions", "int8,fp32", "--out", out], capsys, "--metric picky:loss", "returned nan for a plan")
    assert not (out / "pareto.json").exists() and not any((out / "best").iterdir())
    refused(["show", out], capsys, "no pareto.json there")


# --- hand-edited or damaged result files (items 3, 11) ---

@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One finished search with a loss limit, whose files the probes edit, each on a copy."""
    import autoprec as api

    root = tmp_path_factory.mktemp("searched")
    model, data = builders.conv_with_data(root, 12)
    out = root / "result"
    searching.search(api.SearchConfig(api.InputSpec(model, data=data), judge=api.JudgeSpec(max_loss=0.5),
                                study=api.StudySpec(budget=4), out=out))
    return out


def _other_precisions(plan: dict) -> None:
    """best/plan.json's plan, unit table and counts, all set alike to another precision than the trial measured."""
    first = plan["units"][0]
    now = plan["plan"]["precisions"][first["name"]]
    other = next(p for p in first["allowed"] if p != now)
    plan["plan"]["precisions"][first["name"]] = first["precision"] = other
    plan["plan"]["counts"][now] -= 1
    plan["plan"]["counts"][other] += 1


def _chosen(document: dict) -> dict:
    return next(t for t in document.get("front", document.get("trials", [])) if t["trial"] == document.get("chosen", 0))


EDITS = {  # name: (file, edit, what the line names)
    "best plan of other precisions": ("best/plan.json", _other_precisions, "best/plan.json: trial"),
    "speed-up outside its interval": ("pareto.json", lambda d: d.update(chosen_vs_fp32={
        "fp32_trial": d["uniform"]["fp32"], "speedup": 1e308, "low": 1.1, "high": 1.2, "confidence": 0.95, "rounds": 6,
        "beyond_timing_noise": True}), "speed-up 1e+308 outside its own interval"),
    "beyond noise with an interval below 1": ("pareto.json", lambda d: d.update(chosen_vs_fp32={
        "fp32_trial": d["uniform"]["fp32"], "speedup": 0.9, "low": 0.8, "high": 1.0, "confidence": 0.95, "rounds": 6,
        "beyond_timing_noise": True}), "beyond_timing_noise is True for the interval 0.8–1"),
    "an infeasible loss called feasible": ("trials.json", lambda d: d["trials"][0].update(accuracy_loss=1e308),
                                           "feasible is True with loss 1e+308"),
    "a negative loss": ("trials.json", lambda d: d["trials"][-1].update(accuracy_loss=-0.5),
                        "accuracy_loss is -0.5, not a loss of 0 or more"),
    "a NaN latency": ("trials.json", lambda d: d["trials"][0]["latency_ms"].update(median_ms="nan"),
                      "median_ms is nan, not a time above 0"),
    "counts that are not the units": ("trials.json", lambda d: d["trials"][0]["plan"]["counts"].update(int8=9),
                                      "its plan counts"),
    "a front figure not the trial's": ("pareto.json", lambda d: d["front"][0].update(final_latency_ms=1e-9),
                                       "final_latency_ms differs from trial"),
}


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_a_record_that_contradicts_itself_is_refused_in_every_view(searched, tmp_path, capsys, kind):
    """A hand-edited best/plan.json (every unit FP32) was shown beside the measured plan's speed-up and counts;
    impossible values (a speed-up outside its own interval, a loss 'within --max-loss' above it, negative losses,
    NaN latencies) were shown as they are."""
    name, edit, phrase = EDITS[kind]
    copy = tmp_path / "r"
    shutil.copytree(searched, copy)
    document = json.loads((copy / name).read_text())
    edit(document)
    (copy / name).write_text(json.dumps(document))
    for argv in (["show", copy], ["show", copy, "--json"], ["compare", copy, searched],
                 ["export", copy, "--format", "markdown", "--out", tmp_path / "md"]):
        refused(argv, capsys, name, phrase)


# --- what ships: check looks at best/model.onnx, export never writes into the result (items 4, 5) ---

@pytest.mark.parametrize("damage", ["replaced by another model", "deleted"])
def test_check_and_export_look_at_the_shipped_model(searched, tmp_path, capsys, damage):
    """check, the CI gate, printed PASS with best/model.onnx replaced by an unrelated model or deleted."""
    copy = tmp_path / "r"
    shutil.copytree(searched, copy)
    shipped = copy / "best" / "model.onnx"
    if damage == "deleted":
        shipped.unlink()
    else:
        builders.save(builders.mlp(), shipped)
    phrase = "missing" if damage == "deleted" else "not the model the search wrote there"
    refused(["check", copy], capsys, "best/model.onnx", phrase)
    refused(["export", copy, "--format", "triton", "--out", tmp_path / "t"], capsys, "best/model.onnx", phrase)


def test_check_verifies_every_model_best_holds(searched, tmp_path, capsys):
    copy = tmp_path / "r"
    shutil.copytree(searched, copy)
    plan = json.loads((copy / "best" / "plan.json").read_text())
    plan["sha256"]["model.tensorrt.onnx"] = "0" * 64  # as recorded where the plan has INT8 units
    (copy / "best" / "plan.json").write_text(json.dumps(plan))
    builders.save(builders.mlp(), copy / "best" / "model.tensorrt.onnx")
    refused(["check", copy], capsys, "best/model.tensorrt.onnx: not the model the search wrote there")


@pytest.mark.parametrize("fmt", ["trtexec", "triton", "markdown", "report"])
@pytest.mark.parametrize("into", ["best", ".", "cache"])
def test_an_export_into_the_results_own_files_is_refused(searched, tmp_path, capsys, fmt, into):
    """export --out RESULT/best overwrote the shipped best/model.onnx with the trtexec form; report --output
    RESULT/best/model.onnx (or pareto.json) replaced it with a page."""
    copy = tmp_path / "r"
    shutil.copytree(searched, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    if fmt == "report":
        target = copy / into / ("model.onnx" if into == "best" else "pareto.json" if into == "." else "r.html")
        refused(["report", copy, "--output", target], capsys, "one of the result's own files")
    else:
        refused(["export", copy, "--format", fmt, "--out", copy / into], capsys, "inside the result")
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


# --- shapes and data, refused before the work (items 6, 7, 9, 10) ---

@pytest.mark.parametrize("dims", ["99999999999999999999x3x16x16", "10000000x3x16x16"])
def test_a_max_shape_this_machine_cannot_run_is_refused_before_the_search(tmp_path, capsys, dims):
    """A huge --max-shape ran the whole search, then the shipped model's check ran out of memory naming --shape
    (or a dim too large to represent was an internal error)."""
    model = builders.save(builders.conv_net(batch="N"), tmp_path / "conv.onnx")
    out = tmp_path / "o"
    refused(["search", model, "--max-shape", f"x={dims}", "--out", out], capsys, f"--max-shape x={dims}",
            "give a smaller --max-shape")
    assert not (out / "study.db").exists()


@pytest.mark.parametrize("option", ["--shape", "--max-shape", "--const"])
def test_an_input_given_twice_is_refused(tmp_path, capsys, option):
    model = builders.save(builders.line_reader(), tmp_path / "line.onnx")
    values = ("1", "2") if option == "--const" else ("1x3x8x32", "1x3x8x64")
    refused(["search", model, *["--shape", "x=1x3x8x32"] * (option == "--max-shape"),
             option, f"x={values[0]}", option, f"x={values[1]}", "--out", tmp_path / "o"], capsys,
            f"{option} x given twice ({values[0]} and {values[1]})")


def test_items_saved_whole_fix_a_dynamic_dim_as_the_docs_say(tmp_path, capsys):
    """Files of items saved with their batch dim of 1, of two widths, without --shape: 'nothing fixes it', though
    the most common shape is searched (docs/cli.md)."""
    folder = tmp_path / "lines"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.savez(folder / f"{i}.npz", x=rng.random((1, 3, 8, 32 if i < 4 else 48), np.float32))
    code, err = run(["search", builders.save(builders.line_reader(), tmp_path / "line.onnx"), "--data", folder,
                     "--budget", "1", "--no-warm-start", "--out", tmp_path / "o"], capsys)
    assert code == 0, err[-2000:]
    assert json.loads((tmp_path / "o" / "pareto.json").read_text())["model"]["inputs"]["x"]["shape"] == [1, 3, 8, 32]


def _sharing_t(folder: Path) -> Path:
    """x[N, T, 16] and m[N, T, 1], multiplied: two inputs that share the dim T."""
    weight = numpy_helper.from_array(np.ones((16, 8), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], "fc"), helper.make_node("Mul", ["h", "m"], ["y"], "mask")]
    model = builders._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 16]),
                                    helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", "T", 1])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 8])], [weight])
    return builders.save(model, folder / "two.onnx")


def test_data_that_disagrees_on_a_shared_dim_is_blamed_on_the_data(tmp_path, capsys):
    """T = 8 and 10 in the data: the message said to check --shape."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((8, 8, 16), np.float32), m=rng.random((8, 10, 1), np.float32))
    refused(["search", _sharing_t(tmp_path), "--data", tmp_path / "d.npz", "--out", tmp_path / "o"], capsys,
            "--data: inputs x and m share the dim 'T'", "give it 8 and 10")


def test_a_shape_one_input_is_given_fixes_the_dims_other_inputs_share(tmp_path, capsys):
    """--shape x=1x8x16 and random data: m's T was 'nothing fixes it', and the line said --data holds no arrays."""
    code, err = run(["search", _sharing_t(tmp_path), "--shape", "x=1x8x16", "--budget", "1", "--no-warm-start",
                     "--out", tmp_path / "o"], capsys)
    assert code == 0, err[-2000:]
    assert json.loads((tmp_path / "o" / "pareto.json").read_text())["model"]["inputs"]["m"]["shape"] == [1, 8, 1]
    last = refused(["search", _sharing_t(tmp_path), "--out", tmp_path / "p"], capsys, "nothing fixes it")
    assert last.endswith("or --data with arrays of that shape")


def test_items_of_the_wrong_shape_are_told_the_item_shape(tmp_path, capsys):
    """'whole inputs of [1, 16]' beside 'input shape [4, 16]' read as a contradiction."""
    np.savez(tmp_path / "d.npz", x=np.zeros((8, 17), np.float32))
    last = refused(["search", classifier(tmp_path), "--data", tmp_path / "d.npz", "--out", tmp_path / "o"], capsys,
                   "give items of [16] stacked along a first axis (or each saved with a batch dim of 1: [1, 16])")
    assert "whole inputs" not in last

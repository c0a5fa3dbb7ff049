"""What the command line does with the inputs a new user gets wrong: labels and metrics, hand-edited or damaged
result files, what ships and where exports go, shape profiles, data, folders an earlier run wrote. Each expects
exit 0 with a true result, or exit 2 with one line naming the input (and the phrase it must hold), never a
traceback. These are the probes of issue 55's adversarial pass (once benchmarks/adversarial_probes.py, a process
each) that no other test covers, run in this process; the rest are in test_adversarial_third.py, test_adversarial.py,
test_untrusted_results.py, test_cli.py, test_profile.py and test_tasks.py."""

import json
import shutil
from pathlib import Path
from typing import Callable

import builders
import numpy as np
import pytest
import searching
from cli import clean, refused, run
from onnx import TensorProto, helper, numpy_helper

QUICK = ["--budget", "1", "--no-warm-start", "--no-progress", "--no-isolation"]
ITEMS = np.random.default_rng(1).normal(size=(32, 16)).astype(np.float32)  # for a classifier of x[4, 16]


def _two_inputs() -> object:
    """x[N, T, 16] and m[N, T, 1]: two inputs that share the dim T."""
    weight = numpy_helper.from_array(np.ones((16, 8), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], "fc"), helper.make_node("Mul", ["h", "m"], ["y"], "mask")]
    return builders._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 16]),
                                   helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", "T", 1])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 8])], [weight])


MODELS = {
    "cls12": lambda: builders.classifier(12, 4),
    "cls512": lambda: builders.classifier(512, 4),
    "clsN": lambda: builders.classifier(12, "N"),
    "score1": lambda: builders.classifier(1, 4),  # N×1: one score, no classes
    "conv": builders.conv_net,
    "convN": lambda: builders.conv_net(batch="N"),
    "line": builders.line_reader,
    "two": _two_inputs,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {name: builders.save(make(), folder / f"{name}.onnx") for name, make in MODELS.items()}


@pytest.fixture(scope="module")
def result(tmp_path_factory, models) -> Path:
    """One finished search with a loss limit (its sensitivity pass, uniform plans and claim), copied by each probe."""
    import autoprec

    root = tmp_path_factory.mktemp("result")
    np.savez(root / "conv.npz", x=builders.image_like(12))
    out = root / "R"
    searching.search(autoprec.SearchConfig(autoprec.InputSpec(models["conv"], data=root / "conv.npz"),
                                           judge=autoprec.JudgeSpec(max_loss=0.5), study=autoprec.StudySpec(budget=4),
                                           out=out))
    return out


def copy(result: Path, tmp_path: Path) -> Path:
    target = tmp_path / "r"
    if not target.exists():
        shutil.copytree(result, target)
    return target


def npz(folder: Path, name: str = "d.npz", **arrays) -> Path:
    np.savez(folder / name, **arrays)
    return folder / name


# --- labels a metric cannot score: refused before any trial ---

N = 32
LABELS = {  # name: (model, the data's arrays beside its inputs, --metric, phrases of the line)
    "one past the last class": ("cls12", {"labels": np.full(N, 12)}, "top1@labels", ("hold class 12",
                                                                                       "scores 12 classes")),
    "a class number of 2**40": ("cls12", {"labels": np.full(N, 2**40)}, "top1@labels", ("hold class 1099511627776",)),
    "stored as floats": ("cls12", {"labels": np.arange(N) % 12 + 0.0}, "top1@labels", ("'labels' is float64",)),
    "stored as bools": ("cls12", {"labels": np.arange(N) % 2 == 0}, "top1@labels", ("'labels' is bool",)),
    "N×1 for N×C scores": ("cls12", {"labels": np.zeros((N, 1), np.int64)}, "top1@labels",
                           ("shaped [4, 1] per batch", "shaped [4] per batch")),
    "one fewer than the items": ("cls12", {"labels": np.zeros(N - 1, np.int64)}, "top1@labels",
                                 ("31 entries for 32 items",)),
    "a model of one score per item": ("score1", {"labels": np.zeros(N, np.int64)}, "top1@labels",
                                      ("no output gives class scores",)),
    "boxes that are all padding": ("cls12", {"boxes": np.full((N, 2, 5), -1.0)}, "cosine", ("'boxes' labels nothing",)),
    "masks of classes for a classifier": ("cls12", {"masks": np.zeros((N, 3), np.int64)}, "cosine",
                                          ("'masks' is shaped",)),
}


@pytest.mark.parametrize("kind", sorted(LABELS))
def test_labels_that_cannot_score_the_output_are_refused(models, tmp_path, capsys, kind):
    model, arrays, metric, phrases = LABELS[kind]
    data = npz(tmp_path, x=ITEMS, **arrays)
    refused(["search", models[model], "--data", data, "--metric", metric, "--max-loss", 0, *QUICK, "--out",
             tmp_path / "o"], capsys, *phrases)


def test_sequence_labels_past_a_sequences_classes_are_refused(models, tmp_path, capsys):
    data = npz(tmp_path, x=np.random.default_rng(2).random((24, 3, 8, 32), np.float32), labels=np.full((24, 32), 6))
    refused(["search", models["line"], "--data", data, "--metric", "top1@labels", *QUICK, "--out", tmp_path / "o"],
            capsys, "hold class 6", "scores 6 classes")


def test_labels_a_metric_does_not_read_are_not_checked(models, tmp_path, capsys):
    code, err = run(["search", models["cls12"], "--data", npz(tmp_path, x=ITEMS, labels=np.full(N, 700)), "--metric",
                     "cosine", *QUICK, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(0,))


def test_the_last_class_of_many_is_a_label():
    from autoprec.measure.accuracy import Judge, resolve_metric

    reference = [{"y": np.eye(4, 512, 508, dtype=np.float32)}]  # FP32 decides classes 508..511
    judge = Judge(resolve_metric("top1@labels"), reference, [{"labels": np.arange(508, 512)}])
    assert judge.check() == {"y": {"top1_labels": 1.0}}


def test_check_with_other_data_whose_classes_the_output_lacks_is_refused(models, tmp_path, capsys):
    labelled = npz(tmp_path, x=ITEMS, labels=np.arange(N) % 12)
    out = tmp_path / "o"
    code, err = run(["search", models["cls12"], "--data", labelled, "--metric", "top1@labels", "--max-loss", 0,
                     *QUICK, "--out", out], capsys)
    clean(code, err, allowed=(0,))
    refused(["check", out, "--data", npz(tmp_path, "bad.npz", x=ITEMS, labels=np.full(N, 40))], capsys,
            "hold class 40")


# --- a user's module:function loss ---

FIRST_OK = "calls = []\ndef loss(r, o):\n    calls.append(1)\n    if len(calls) == 1:\n        return 0.0\n"  # FP32's
METRICS = {  # name: (the module's text, phrases of the line; none: searched)
    "an array of two values": ("def loss(r, o):\n    return [0.0, 1.0]\n", ("not one number",)),
    "None": ("def loss(r, o):\n    return None\n", ("returned NoneType",)),
    "a class": ("class loss:\n    def __init__(self, r, o):\n        pass\n", ("not one number",)),
    "changes the plan's outputs in place": ("def loss(r, o):\n    o[0]['probs'][...] = 0\n    return 0.0\n",
                                            ("read-only",)),
    "calls sys.exit(0)": ("import sys\ndef loss(r, o):\n    sys.exit(0)\n", ("raised SystemExit",)),
    "raises KeyboardInterrupt": ("def loss(r, o):\n    raise KeyboardInterrupt\n", ("raised KeyboardInterrupt",)),
    "no such function": ("def other(r, o):\n    return 0\n", ("cannot import it",)),
    "a tiny negative, then an infinite loss for plans": (
        FIRST_OK + "    return -1e-12 if len(calls) == 2 else float('inf')\n", ()),
    "appends to the reference list and deletes its outputs": (
        "def loss(r, o):\n    r.append({})\n    r[0].pop('probs', None)\n    return 0.0\n", ()),
}


@pytest.mark.parametrize("kind", sorted(METRICS))
def test_a_user_metric_gives_a_number_or_stops_the_search_naming_itself(models, tmp_path, capsys, monkeypatch, kind):
    body, phrases = METRICS[kind]
    module = f"metric{sorted(METRICS).index(kind)}"  # a module of its own: a process imports a module once
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    argv = ["search", models["conv"], "--metric", f"{module}:loss", *QUICK, "--budget", 3, "--out", tmp_path / "o"]
    if phrases:
        refused(argv, capsys, *phrases)
    else:
        clean(*run(argv, capsys), allowed=(0,))


def test_a_metric_named_without_its_function_is_unknown(models, tmp_path, capsys):
    refused(["search", models["conv"], "--metric", "m:", "--out", tmp_path / "o"], capsys, "unknown --metric")


@pytest.mark.parametrize("body, phrase", [("def loss(r, o):\n    r[0]['probs'] += 1\n    return 0.0\n", "read-only"),
                                          ("def loss(r, o):\n    return float('nan')\n", "returned nan")])
def test_check_judges_with_the_users_metric_as_the_search_does(result, tmp_path, capsys, monkeypatch, body, phrase):
    module = f"check{len(phrase)}"
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    refused(["check", copy(result, tmp_path), "--metric", f"{module}:loss", "--max-loss", 1], capsys, phrase)


# --- a result file edited by hand: every view refuses it, naming the file and the field ---

def _first_trial(key: str, value) -> Callable[[dict], None]:
    return lambda d: d["trials"][0].update({key: value})


def _claim(**fields) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        base = {"fp32_trial": d["uniform"]["fp32"], "speedup": 1.2, "low": 1.1, "high": 1.3, "confidence": 0.95,
                "rounds": 6, "beyond_timing_noise": True}
        d["chosen_vs_fp32"] = {k: v for k, v in {**base, **fields}.items() if v is not None}  # None: left out
    return edit


def _units_only(d: dict) -> None:
    unit = d["units"][0]
    unit["precision"] = next(p for p in unit["allowed"] if p != unit["precision"])


def _plan_only(d: dict) -> None:
    name = d["units"][0]["name"]
    d["plan"]["precisions"][name] = next(p for p in d["units"][0]["allowed"] if p != d["plan"]["precisions"][name])


BARE_CLAIM = {"low": None, "high": None, "confidence": None, "rounds": None}
EDITS = {  # name: (file, edit, phrase of the line)
    "the best plan's unit table alone": ("best/plan.json", _units_only, "best/plan.json"),
    "the best plan's plan alone": ("best/plan.json", _plan_only, "best/plan.json"),
    "the best plan's trial number": ("best/plan.json", lambda d: d.update(trial=d["trial"] + 1000),
                                     "best/plan.json"),
    "the chosen trial": ("pareto.json", lambda d: d.update(chosen=-5), "pareto.json"),
    "a speed-up of 0": ("pareto.json", _claim(speedup=0, **BARE_CLAIM), "not a ratio above 0"),
    "a negative speed-up": ("pareto.json", _claim(speedup=-1.2, **BARE_CLAIM), "not a ratio above 0"),
    "an interval whose low is above its high": ("pareto.json", _claim(low=1.4), "outside its own interval"),
    "a confidence of 1.5": ("pareto.json", _claim(confidence=1.5), "confidence"),
    "0 rounds": ("pareto.json", _claim(rounds=0), "rounds"),
    "a comparison against no trial": ("pareto.json", _claim(fp32_trial=999), "999"),
    "a plan not shipped though beyond noise": ("pareto.json", lambda d: d.update(not_shipped={
        "trial": d["chosen"], "speedup": 1.3, "beyond_timing_noise": True, "why": "x"}), "not_shipped"),
    "a rival that is no trial": ("pareto.json", lambda d: d.update(final_rivals=[
        {"trial": 999, "speedup": 1.1, "beyond_timing_noise": None}]), "trial 999"),
    "p10 above p90": ("trials.json", lambda d: d["trials"][0]["latency_ms"].update(p10_ms=9.0, p90_ms=0.001),
                      "not in order"),
    "a loss of -inf": ("trials.json", _first_trial("accuracy_loss", "-inf"), "accuracy_loss is -inf"),
    "a final latency of 0": ("trials.json", _first_trial("final_latency_ms", 0), "final_latency_ms is 0"),
    "a negative re-timed round": ("trials.json", _first_trial("retimed_ms", [-1.0]), "retimed_ms[0]"),
    "a feasible trial marked infeasible": ("trials.json", _first_trial("feasible", False), "feasible is False"),
    "no timed run": ("trials.json", lambda d: d["trials"][0]["latency_ms"].update(runs=0), "latency_ms.runs is 0"),
    "a negative time spent": ("trials.json", lambda d: d["trials"][0]["seconds"].update(build=-5.0),
                              "seconds.build is -5"),
    "a stage of no duration": ("pareto.json", lambda d: d["search"].setdefault("stage_seconds", {}).update(
        trials="nan"), "stage_seconds.trials"),
    "a trial listed twice": ("trials.json", lambda d: d["trials"].append(d["trials"][0]), "appears twice"),
    "search.trials not the trials' count": ("pareto.json", lambda d: d["search"].update(trials=999), "search.trials"),
    "a negative --max-loss recorded": ("pareto.json", lambda d: d["search"].update(max_loss=-1), "search.max_loss"),
    "--max-loss recorded as 1e-30": ("pareto.json", lambda d: d["search"].update(max_loss=1e-30), "feasible"),
    "a held-out loss of NaN": ("pareto.json", lambda d: d["search"].update(held_out={
        "batches": 6, "max_loss": 0.5, "engine": "x", "judged": [{"trial": d["chosen"], "loss": "nan"}]}), "held_out"),
    "the all-FP32 trial named as another": ("pareto.json", lambda d: d["uniform"].update(
        fp32=d["uniform"].get("fp16", d["uniform"].get("int8"))), "uniform.fp32"),
    "trials.json of another run": ("trials.json", lambda d: d["search"].update(run="x:1"), "another run"),
    "best/plan.json of another run": ("best/plan.json", lambda d: d["search"].update(run="x:1"), "another run"),
}


def edited(result: Path, tmp_path: Path, file: str, edit: Callable[[dict], None]) -> Path:
    r = copy(result, tmp_path)
    document = json.loads((r / file).read_text())
    edit(document)
    (r / file).write_text(json.dumps(document))
    return r


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_a_result_file_that_contradicts_itself_is_refused_naming_it(result, tmp_path, capsys, kind):
    file, edit, phrase = EDITS[kind]
    refused(["show", edited(result, tmp_path, file, edit)], capsys, phrase)


@pytest.mark.parametrize("verb", ["report", "plot", "diagnose"])
def test_the_views_the_other_tests_leave_out_refuse_it_too(result, tmp_path, capsys, verb):
    r = edited(result, tmp_path, "best/plan.json", _plan_only)
    refused([verb, r, *(["--output", tmp_path / "page.html"] if verb == "report" else [])], capsys, "best/plan.json")


TOLERATED = {  # an edit a view may take or refuse, never with a traceback
    "a NaN metric value": ("trials.json", lambda d: d["trials"][0]["metrics"].update(extra={"cosine": "nan"})),
    "a sensitivity share of NaN": ("sensitivity.json", lambda d: d["units"][0].update(share="nan")),
}


@pytest.mark.parametrize("kind", sorted(TOLERATED))
def test_an_edit_of_no_figure_the_result_rests_on_is_one_line_at_most(result, tmp_path, capsys, kind):
    clean(*run(["show", edited(result, tmp_path, *TOLERATED[kind])], capsys))


def test_a_result_without_its_best_plan_still_shows(result, tmp_path, capsys):
    r = copy(result, tmp_path)
    (r / "best" / "plan.json").unlink()
    clean(*run(["show", r], capsys), allowed=(0,))


# --- what ships: check looks at the files, export and report write only outside the result ---

def _truncated(r: Path) -> Path:
    shipped = r / "best" / "model.onnx"
    shipped.write_bytes(shipped.read_bytes()[: shipped.stat().st_size // 2])
    return r


def _replaced(r: Path) -> Path:
    builders.save(builders.mlp(), r / "best" / "model.onnx")
    return r


def _without_plan(r: Path) -> Path:
    (r / "best" / "plan.json").unlink()
    return r


def _linked(r: Path) -> Path:
    (r.parent / "link").symlink_to(r / "best")
    return r.parent / "link"


SHIPPING = {  # name: (argv, given the result's copy, its model and the probe's folder; phrase of the line)
    "check of a shipped model cut in half": (lambda r, m, f: ["check", _truncated(r)], "best/model.onnx"),
    "check --max-loss -1": (lambda r, m, f: ["check", r, "--max-loss", -1], "--max-loss"),
    "export --out RESULT/best/sub": (lambda r, m, f: ["export", r, "--format", "trtexec", "--out", r / "best" / "sub"],
                                     "inside the result"),
    "export --out a link to RESULT/best": (lambda r, m, f: ["export", r, "--format", "trtexec", "--out", _linked(r)],
                                           "inside the result"),
    "export triton whose entry is the result": (lambda r, m, f: ["export", r, "--format", "triton", "--out", f,
                                                                 "--name", "r"], "inside the result"),
    "export --out the searched model's folder": (lambda r, m, f: ["export", r, "--format", "markdown", "--out",
                                                                  m.parent], "the folder of the model"),
    "export --trial 999": (lambda r, m, f: ["export", r, "--format", "markdown", "--trial", 999], "999"),
    "export without best/plan.json": (lambda r, m, f: ["export", _without_plan(r), "--format", "markdown"],
                                      "no chosen plan"),
    "diagnose --trial 999": (lambda r, m, f: ["diagnose", r, "--trial", 999], "999"),
    "check --max-shape": (lambda r, m, f: ["check", r, "--max-shape", "x=2x3x16x16"], "unrecognized arguments"),
    "check at another --shape than searched": (lambda r, m, f: ["check", r, "--shape", "x=2x3x16x16"],
                                               "was searched at"),
}


@pytest.mark.parametrize("kind", sorted(SHIPPING))
def test_what_ships_is_checked_and_never_written_over(result, tmp_path, capsys, kind):
    argv, phrase = SHIPPING[kind]
    r = copy(result, tmp_path)
    before = {p: p.read_bytes() for p in result.rglob("*") if p.is_file() and p.suffix != ".db"}
    model = Path(json.loads((result / "pareto.json").read_text())["model"]["path"])
    refused(argv(r, model, tmp_path), capsys, phrase)
    assert {p: p.read_bytes() for p in before} == before


def test_check_json_says_nothing_on_stdout_when_it_refuses(result, tmp_path, capsys):
    refused(["check", _replaced(copy(result, tmp_path)), "--json"], capsys, "best/model.onnx")
    assert capsys.readouterr().out.strip() == ""


@pytest.mark.parametrize("argv", [
    lambda r: ["check", r],  # best/model.onnx rewritten with its own bytes: still the model the search wrote
    lambda r: ["export", r, "--format", "markdown", "--out", r / "export" / "mine"],
    lambda r: ["report", r, "--output", r / "mine.html"],
], ids=["check of its own bytes", "export into RESULT/export", "report into RESULT/mine.html"])
def test_the_result_is_checked_and_written_beside_where_it_may_be(result, tmp_path, capsys, argv):
    r = copy(result, tmp_path)
    (r / "best" / "model.onnx").write_bytes((result / "best" / "model.onnx").read_bytes())
    code, err = run(argv(r), capsys)
    clean(code, err, allowed=(0,))


# --- shape profiles and data, refused before the work ---

SHAPES = {  # name: (model, options, phrase of the line)
    "--shape batch of 10**8": ("convN", ["--shape", "x=100000000x3x16x16"], "--shape x=100000000x3x16x16"),
    "--max-shape given twice alike (not refused for it)": (
        "convN", ["--max-shape", "x=4x3x16x16", "--max-shape", "x=4x3x16x16", "--data", "{x only}"],
        "items for input x have shape [6, 16]"),
    "--min-shape given twice, two sizes": ("convN", ["--shape", "x=4x3x16x16", "--min-shape", "x=1x3x16x16",
                                                     "--min-shape", "x=2x3x16x16"], "--min-shape x given twice"),
    "--min-shape above --max-shape": ("convN", ["--min-shape", "x=4x3x16x16", "--max-shape", "x=2x3x16x16"],
                                      "min <= opt <= max"),
    "--max-shape of an input the model lacks": ("convN", ["--max-shape", "y=4x3x16x16"], "y"),
    "--max-shape with a 0 dim": ("convN", ["--max-shape", "x=0x3x16x16"], "max 0x3x16x16"),
    "--max-shape with a negative dim": ("convN", ["--max-shape", "x=-4x3x16x16"], "dims of 0 or more"),
    "--max-shape of another rank": ("convN", ["--max-shape", "x=4x3x16"], "--max-shape x=4x3x16"),
    "--max-shape disagreeing on a shared dim": ("two", ["--shape", "x=1x8x16", "--max-shape", "x=4x8x16",
                                                        "--max-shape", "m=4x10x1"], "share the dim 'T'"),
    "--shape with a 0 width": ("line", ["--shape", "x=1x3x8x0"], "above 0 (0 only on a dim named for a past"),
    "--time-shapes with a huge --max-shape": ("convN", ["--time-shapes", "--max-shape", "x=100000000x3x16x16"],
                                              "--max-shape"),
    "--max-loss inf": ("cls12", ["--max-loss", "inf"], "--max-loss inf"),
    "two inputs, one missing from the data": ("two", ["--data", "{x only}"], "m"),
}


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_a_shape_or_data_that_cannot_be_is_refused_before_the_search(models, tmp_path, capsys, kind):
    model, options, phrase = SHAPES[kind]
    data = npz(tmp_path, x=np.random.default_rng(0).random((8, 6, 16), np.float32))
    refused(["search", models[model], *[str(data) if o == "{x only}" else o for o in options], *QUICK, "--out",
             tmp_path / "o"], capsys, phrase)
    assert not (tmp_path / "o" / "study.db").exists()


def _items(folder: Path, *shapes, suffixes=(".npz",)) -> Path:
    """A folder of items (one a file), their suffixes in turn."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, shape in enumerate(shapes):
        value, suffix = rng.random(shape, np.float32), suffixes[i % len(suffixes)]
        np.save(folder / f"{i}.npy", value) if suffix == ".npy" else np.savez(folder / f"{i}.npz", x=value)
    return folder


ACCEPTED = {  # name: (model, options given the probe's folder, exits it may end with)
    "float16 data for a float input": ("cls12", lambda f: ["--data", npz(f, x=ITEMS.astype(np.float16))], (0,)),
    "a folder of items of two ranks": ("line", lambda f: ["--data", _items(f / "i", *[(3, 8, 32)] * 4, (8, 32))],
                                       (0, 2)),
    "a folder of .npy and .npz items": ("line", lambda f: ["--data", _items(f / "i", *[(3, 8, 32)] * 5,
                                                                            suffixes=(".npz", ".npy"))], (0, 2)),
}


@pytest.mark.parametrize("kind", sorted(ACCEPTED))
def test_shapes_and_data_a_search_can_take_are_searched(models, tmp_path, capsys, kind):
    model, options, allowed = ACCEPTED[kind]
    clean(*run(["search", models[model], *options(tmp_path), *QUICK, "--out", tmp_path / "o"], capsys), allowed)


# --- a folder an earlier run wrote ---

def test_a_refused_run_into_an_earlier_result_leaves_it_whole(result, models, tmp_path, capsys):
    r = copy(result, tmp_path)
    before = {p: p.read_bytes() for p in r.rglob("*") if p.is_file() and p.suffix != ".db"}
    refused(["search", models["clsN"], "--max-shape", "x=1000000000x16", *QUICK, "--out", r], capsys, "--max-shape")
    refused(["search", models["conv"], "--data", npz(tmp_path, x=np.zeros((32, 17), np.float32)), *QUICK, "--out", r],
            capsys, "--data")
    assert {p: p.read_bytes() for p in before} == before
    clean(*run(["show", r], capsys), allowed=(0,))


def test_a_search_into_a_folder_a_sensitivity_run_wrote(models, tmp_path, capsys):
    out = tmp_path / "o"
    clean(*run(["sensitivity", models["cls12"], "--out", out], capsys), allowed=(0,))
    clean(*run(["search", models["cls12"], *QUICK, "--out", out], capsys), allowed=(0,))
    assert (out / "best" / "model.onnx").is_file()


def test_another_study_into_a_finished_folder(result, tmp_path, capsys):
    r = copy(result, tmp_path)
    recorded = json.loads((r / "pareto.json").read_text())
    code = searching.main(["search", recorded["model"]["path"], "--data", recorded["search"]["data_path"], *QUICK,
                           "--study-name", "other", "--json", "--out", str(r)])
    assert code == 0 and json.loads(capsys.readouterr().out)["search"]["study_name"] == "other"
    assert (r / "best" / "model.onnx").is_file()

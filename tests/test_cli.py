import json
import re

import builders
import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
import searching
from cli import clean, exit_code, run, run_cli
from searching import SHORTEST_FINAL_TIMING, main

import autoprec
from autoprec.core.errors import AutoprecError


def test_search_prints_the_front_and_writes_results(tmp_path, conv_model, conv_data):
    out = tmp_path / "out"
    proc = run_cli("search", conv_model, "--budget", 4, "--data", conv_data, "--out", out, "--no-progress",
                   *SHORTEST_FINAL_TIMING)
    assert proc.returncode == 0, proc.stderr
    assert "Pareto front" in proc.stdout and "chosen: trial" in proc.stdout
    assert "latencies measured by onnxruntime" in proc.stdout
    assert "per-request latency of one batch" in " ".join(proc.stdout.split())  # says what the number is
    pareto = json.loads((out / "pareto.json").read_text())
    search = pareto["search"]
    assert "session.run" in pareto["engine"]["timing"]
    assert (out / "best" / "model.onnx").exists() and (out / "pareto.png").exists()
    # where the time went, as pareto.json records it
    took = re.search(r"searched in ([\d.]+) s \(set-up ([\d.]+), .*re-timing ([\d.]+)", " ".join(proc.stdout.split()))
    assert took and " ".join(proc.stdout.split()).endswith("before writing these files"), proc.stdout  # the last line
    assert float(took[1]) == round(search["wall_seconds"], 1)
    assert float(took[2]) == round(search["stage_seconds"]["set_up"], 1)
    assert float(took[3]) == round(search["stage_seconds"]["retiming"], 1)


def test_random_data_warns_loudly(tmp_path, conv_model):
    proc = run_cli("search", conv_model, "--budget", 3, "--out", tmp_path / "o", "--no-progress", *SHORTEST_FINAL_TIMING)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" in proc.stderr and "random inputs" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["search", "{missing}"], "missing.onnx: no such file"),
        (["search", "{truncated}"], "truncated.onnx: not a readable ONNX file.*re-export"),
        (
            ["search", "{external}"],
            "external.onnx: tensor .* keeps its values in 'external.weights', which is not beside it; "
            "keep the data files next to the model",
        ),
        (["search", "{dynamic}"], r"input x has dynamic dim 2 \(H\).*pass --shape x=1x3xD2xD3 with D2, D3 filled in"),
        (["search", "{model}", "--data", "{missing}"], "--data .*missing.onnx: no such file or folder"),
        (["search", "{model}", "--budget", "0"], "--budget: invalid _positive_int value|must be at least 1"),
        (["search", "{model}", "--budget", "-3"], "must be at least 1"),
        (["search", "{model}", "--shape", "x=1xfoo"], "expected NAME=DIMS"),
        (["search", "{model}", "--shape", "y=1x3x16x16"], "--shape names y"),
        (["search", "{model}", "--data", "{empty}"], "holds no .npy, .npz or image files"),
        (["search", "{model}", "--data", "{wrong_name}"], "has arrays input but the model needs x"),
        (["search", "{model}", "--data", "{wrong_shape}"], r"items for input x have shape \[3, 8, 8\]"),
        (["search", "{model}", "--data", "{wrong_dtype}"], "is int64 in the data, but the model takes float32"),
        (["search", "{model}", "--data", "{bad_image}"], "cannot be read as an image"),
        (["search", "{model}", "--out", "{unwritable}"], "cannot write there"),
        (["search", "{model}", "--storage", "nosuchdb://x"], "--storage nosuchdb://x: cannot be opened"),
        (["search", "{model}", "--override", "conv0"], "expected PATTERN=PRECISIONS"),
        (["search", "{model}", "--override", "conv0=int3"], "is not a list of precisions"),
        (["search", "{model}", "--metric", "nope"], "unknown --metric"),
        (["search", "{model}", "--max-loss", "-1"], "must be a finite loss of 0 or more"),
        (["search", "{model}", "--precisions", "fp16,fp17"], "--precisions.*is not a list of precisions"),
        (["search", "{model}", "--device", "-1"], "must be a GPU index"),
        pytest.param(
            ["search", "{model}", "--backend", "ort-cuda"],
            "--backend ort-cuda: onnxruntime .* has no CUDAExecutionProvider.*pip install onnxruntime-gpu",
            marks=pytest.mark.skipif(
                "CUDAExecutionProvider" in ort.get_available_providers(), reason="this machine has the CUDA provider"
            ),
        ),
    ],
)
def test_bad_input_gets_one_clear_line(tmp_path, conv_model, capsys, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    np.savez(tmp_path / "wrong_name.npz", input=np.zeros((2, 3, 16, 16), np.float32))
    np.savez(tmp_path / "wrong_shape.npz", x=np.zeros((2, 3, 8, 8), np.float32))
    np.savez(tmp_path / "wrong_dtype.npz", x=np.zeros((2, 3, 16, 16), np.int64))
    images = tmp_path / "images"
    images.mkdir()
    (images / "broken.png").write_bytes(b"not a png")
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder is needed")
    data = conv_model.read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(data[: len(data) // 3])
    model = onnx.load(str(conv_model))
    onnx.save_model(model, str(tmp_path / "external.onnx"), save_as_external_data=True, location="external.weights",
                    size_threshold=0)
    (tmp_path / "external.weights").unlink()
    model = onnx.load(str(conv_model))  # save_as_external_data moved the weights out of the first copy
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    onnx.save(model, str(tmp_path / "dynamic.onnx"))
    fill = {
        "model": conv_model,
        "missing": tmp_path / "missing.onnx",
        "empty": empty,
        "truncated": tmp_path / "truncated.onnx",
        "external": tmp_path / "external.onnx",
        "dynamic": tmp_path / "dynamic.onnx",
        "wrong_name": tmp_path / "wrong_name.npz",
        "wrong_shape": tmp_path / "wrong_shape.npz",
        "wrong_dtype": tmp_path / "wrong_dtype.npz",
        "bad_image": images,
        "unwritable": blocker / "out",
    }
    argv = [a.format(**fill) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out" / "model")]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(message, err), err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err
    assert not (tmp_path / "out").exists()  # a refused search leaves no folder it made behind


def test_a_refused_search_keeps_the_folder_it_was_given(tmp_path, conv_model):
    """Only what the refused run made goes: an --out that was there stays, with what it held."""
    out = tmp_path / "kept"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    missing = tmp_path / "missing.npz"
    assert exit_code(["search", str(conv_model), "--data", str(missing), "--out", str(out)]) == 2
    assert (out / "notes.txt").read_text() == "mine"


def test_unmeasured_tensorrt_artifact_is_labelled_as_such(tmp_path, mlp_model):
    out = tmp_path / "out"
    proc = run_cli(
        "search",
        mlp_model,
        "--budget",
        2,
        "--out",
        out,
        "--override",
        "*=int8,fp32",
        "--override",
        "fc*=int8",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((out / "best" / "plan.json").read_text())
    # fc0 and fc1 may only be int8: every plan has INT8 units, so the TensorRT-form artifact exists.
    assert plan["plan"]["precisions"]["fc0"] == "int8"
    assert (out / "best" / "model.tensorrt.onnx").exists()
    said = " ".join(proc.stdout.split())  # (the console wraps its lines where a long path puts them)
    assert "NOT measured" in said and "NOT measured" in plan["files"]["model.tensorrt.onnx"]


def test_a_study_name_made_for_another_model_is_refused(tmp_path, conv_model, mlp_model, capsys):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    common = ["--budget", "2", "--storage", storage, "--study-name", "team-study", "--no-progress"]
    assert exit_code(["search", str(conv_model), "--out", str(tmp_path / "a"), *common]) == 0
    before = len(optuna.load_study(study_name="team-study", storage=storage).trials)
    capsys.readouterr()
    assert exit_code(["search", str(mlp_model), "--out", str(tmp_path / "b"), *common]) == 2
    err = capsys.readouterr().err
    assert "study 'team-study'" in err and "model_sha256" in err and "use another --study-name" in err
    assert len(optuna.load_study(study_name="team-study", storage=storage).trials) == before  # nothing mixed in


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("budget", 0, "--budget 0: must be at least 1 (the number of trials to run)"),
        ("heartbeat", -2, "--heartbeat -2: must be at least 1"),
        ("trial_timeout", 0.0, "--trial-timeout 0.0: must be a finite number more than 0"),
        ("trial_timeout", 1e-9, "--trial-timeout 1e-09: a candidate is built, then timed for at least 0.2 s of runs; "
                                "give 1 second(s) or more"),
        ("max_loss", float("nan"), "--max-loss nan: must be a finite loss of 0 or more"),
        (
            "seed",
            -1,
            "--seed -1: must be a whole number from 0 to 4294967295 (NumPy's and Optuna's samplers take 32-bit seeds)",
        ),
        ("proposals", -1, "--proposals -1: must be 0 (every trial built) or more"),
    ],
)
def test_the_api_and_the_command_line_refuse_a_bad_option_with_the_same_line(
    tmp_path, conv_model, capsys, option, value, said
):
    """One check (SearchConfig) for both ways in, before any work: nothing is written."""
    out = tmp_path / "out"
    with pytest.raises(AutoprecError) as refused:
        group = {"trial_timeout": "isolation", "max_loss": "judge"}.get(option, "study")
        spec = {"study": autoprec.StudySpec, "isolation": autoprec.IsolationSpec, "judge": autoprec.JudgeSpec}[group]
        searching.search(
            autoprec.SearchConfig(autoprec.InputSpec(conv_model), out=out, **{group: spec(**{option: value})})
        )
    assert str(refused.value) == said
    assert main(["search", str(conv_model), "--out", str(out), f"--{option.replace('_', '-')}", str(value)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"autoprec: error: {said}"
    assert not out.exists()


def test_verbose_shows_the_traceback_behind_the_line(tmp_path, capsys):
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    builders.save(builders.conv_net(), tmp_path / "m.onnx")
    code, err = run(
        ["search", tmp_path / "m.onnx", "--data", tmp_path / "bad.npz", "--out", tmp_path / "o", "--verbose"], capsys
    )
    assert code == 2 and "Traceback" in err and "DataError" in err
    assert err.strip().splitlines()[-1].startswith("autoprec: error: --data")


MISC = [  # (argv after the verb's model/result, files to write, phrase the one line must hold)
    (["search", "{model}", "--metric", "broken:f"], {"broken.py": "def f(:\n"}, "importing broken raised SyntaxError"),
    (
        ["search", "{model}", "--metric", "loud:f"],
        {"loud.py": "raise RuntimeError('at import')\n"},
        "raised RuntimeError",
    ),
    (["search", "{model}", "--study-name", ""], {}, "--study-name '': empty"),
    (["search", "{model}", "--artifacts", ""], {}, "--artifacts '': empty"),
    (["search", "{model}", "--trial-memory", "0.01", "--budget", "1"], {}, "--trial-memory"),
    (["report", "{result}", "--output", "{folder}"], {}, "/folder: Is a directory"),
    (["inspect", "{model}"], {}, "an ONNX model, not an engine"),
    (
        ["search", "{model}", "--trial-memory", "inf", "--budget", "1"],
        {},
        "--trial-memory inf: must be a finite number",
    ),
    (
        ["search", "{model}", "--seed", "4294967296", "--budget", "1"],
        {},
        "--seed 4294967296: must be a whole number from 0",
    ),
    (["search", "{model}", "--retime-seconds", "nan", "--budget", "1"], {}, "--retime-seconds nan: must be a finite"),
    (
        ["search", "{model}", "--metric", "top1", "--task-output", "nope", "--budget", "1"],
        {},
        "--task-output nope: the model has no such output; its outputs are: probs",
    ),
    (["search", "{model}", "--trial-timeout", "1e-9"], {}, "--trial-timeout 1e-09: a candidate is built"),
    (["search", "{model}", "--metric", "ctc-text", "--budget", "1"], {}, "; the model's outputs: probs [1, "),
    (
        ["search", "{model}", "--metric", "negative:loss", "--budget", "3", "--no-warm-start"],
        {"negative.py": "def loss(reference, outputs):\n    return -1e308\n"},
        "--metric negative:loss: returned -1e+308 for a plan; a loss is 0 or more",
    ),
]


def test_a_background_threads_failure_is_one_line(capsys):
    """Optuna's heartbeat thread, when the database stops: a warning line, no traceback."""
    import threading

    from autoprec.app import cli

    before = threading.excepthook
    try:
        cli._quiet()
        worker = threading.Thread(target=lambda: 1 / 0, name="optuna-heartbeat")
        worker.start()
        worker.join()
    finally:
        threading.excepthook = before
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip() == "autoprec: warning: optuna-heartbeat failed " \
        "(ZeroDivisionError: division by zero)"


@pytest.mark.parametrize("case", range(len(MISC)), ids=[" ".join(m[0][:3]) + f" {i}" for i, m in enumerate(MISC)])
def test_more_mistakes_are_one_line(conv_result, workdir, capsys, monkeypatch, case):
    argv, files, phrase = MISC[case]
    monkeypatch.chdir(workdir)
    for name, text in files.items():
        (workdir / name).write_text(text)
    (workdir / "folder").mkdir()
    fill = {"{model}": workdir / "conv.onnx", "{result}": conv_result, "{folder}": workdir / "folder"}
    code, err = run([fill.get(a, a) for a in argv] + ["--out", workdir / "o"] * (argv[0] == "search"), capsys)
    clean(code, err, allowed=(2,))
    assert phrase in err.strip().splitlines()[-1]


def test_more_threads_than_the_machine_can_run_are_refused(workdir, capsys):
    code, err = run(["search", workdir / "conv.onnx", "--threads", "100000", "--out", workdir / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert "--threads 100000: more than 4× this machine's" in err.strip().splitlines()[-1]


def test_a_number_that_is_not_one_is_one_line_too(workdir, capsys):
    code, err = run(["search", workdir / "conv.onnx", "--budget", "1.5"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("autoprec: error: argument --budget") and "(see autoprec search --help)" in err

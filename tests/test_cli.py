import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import optuna
import pytest

import builders
from autoprec.cli import main


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "autoprec.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_search_prints_the_front_and_writes_results(tmp_path, conv_model, conv_data):
    out = tmp_path / "out"
    proc = run_cli("search", conv_model, "--budget", 4, "--data", conv_data, "--out", out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "Pareto front" in proc.stdout and "chosen: trial" in proc.stdout
    assert "latencies measured by onnxruntime" in proc.stdout
    assert (out / "best" / "model.onnx").exists() and (out / "pareto.png").exists()


def test_random_data_warns_loudly(tmp_path, conv_model):
    proc = run_cli("search", conv_model, "--budget", 3, "--out", tmp_path / "o", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" in proc.stderr and "random inputs" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["search", "{missing}"], "missing.onnx: no such file"),
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
        (["search", "{model}", "--override", "conv0=int4"], "is not a list of precisions"),
        (["search", "{model}", "--metric", "nope"], "unknown --metric"),
        (["search", "{model}", "--max-loss", "-1"], "must be a loss of 0 or more"),
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
    fill = {
        "model": conv_model, "missing": tmp_path / "missing.onnx", "empty": empty,
        "wrong_name": tmp_path / "wrong_name.npz", "wrong_shape": tmp_path / "wrong_shape.npz",
        "wrong_dtype": tmp_path / "wrong_dtype.npz", "bad_image": images, "unwritable": blocker / "out",
    }
    argv = [a.format(**fill) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(message, err), err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err


def exit_code(argv):
    """main()'s status; argparse's own errors exit through SystemExit(2)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_kill_9_mid_search_then_same_command_resumes(tmp_path):
    model = builders.save(builders.conv_net(), tmp_path / "conv.onnx")
    data = tmp_path / "data.npz"
    np.savez(data, x=builders.image_like(8))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "autoprec.cli", "search", str(model), "--data", str(data), "--out", str(out),
           "--budget", "12", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    storage = f"sqlite:///{out / 'study.db'}"
    deadline = time.monotonic() + 120
    complete = []
    while time.monotonic() < deadline:
        try:
            trials = optuna.load_study(study_name="autoprec-conv-ort-cpu", storage=storage).trials
            complete = [t for t in trials if t.state.name == "COMPLETE"]
        except Exception:
            trials = []
        if len(complete) >= 3:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(complete) >= 3, "the search did not get going"
    before = {t.number: (t.params, t.values) for t in optuna.load_study(study_name="autoprec-conv-ort-cpu", storage=storage).trials
              if t.state.name == "COMPLETE"}
    assert len(before) < 12
    assert not (out / "pareto.json").exists()
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(before)} of 12 trials already done" in resumed.stderr or "interrupted" in resumed.stderr
    trials = optuna.load_study(study_name="autoprec-conv-ort-cpu", storage=storage).trials
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 12
    for number, (params, values) in before.items():
        assert (trials[number].params, trials[number].values) == (params, values)
    for failed in (t for t in trials if t.state.name == "FAIL"):  # the trial the kill interrupted
        assert any(t.user_attrs.get("retry_of") == failed.number and t.params == failed.params for t in complete)
    pareto = json.loads((out / "pareto.json").read_text())
    assert pareto["search"]["trials"] == 12


def test_unmeasured_tensorrt_artifact_is_labelled_as_such(tmp_path, mlp_model):
    out = tmp_path / "out"
    proc = run_cli("search", mlp_model, "--budget", 2, "--out", out, "--override", "*=int8,fp32", "--override", "fc*=int8",
                   "--no-progress")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((out / "best" / "plan.json").read_text())
    # fc0 and fc1 may only be int8: every plan has INT8 units, so the TensorRT-form artifact exists.
    assert plan["plan"]["precisions"]["fc0"] == "int8"
    assert (out / "best" / "model.tensorrt.onnx").exists()
    assert "NOT measured" in proc.stdout and "NOT measured" in plan["files"]["model.tensorrt.onnx"]

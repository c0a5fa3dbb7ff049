"""Names from a crafted model (inputs, nodes, the file itself) in every generated file: data, never code.

A model's names are chosen by whoever made it. Each export is generated from a search of a model
whose names try to break out of shell comments, quotes, Python docstrings, markdown tables and
protobuf strings; the generated scripts are then run (with a recording ``trtexec`` on PATH and
without TensorRT) and nothing the names ask for may happen.
"""

import ast
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import builders
import numpy as np
import onnx
import pytest
import searching
from cli import clean, exit_code, run
from google.protobuf import text_encoding

import autoprec

CANARY = "PWNED"
HOSTILE_INPUT = f"x\ntouch {CANARY}_input\n#"
HOSTILE_NODE = f'conv1 $(touch {CANARY}_subst) `touch {CANARY}_tick` "q" <b>|*'
HOSTILE_FILE = f'm""";__import__("os").system("touch {CANARY}_py");""".onnx'
RECORDING_TRTEXEC = (
    "#!/bin/sh\npython3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" > trtexec_args.json\n"
)


def _hostile_model(node_name: str = HOSTILE_NODE) -> onnx.ModelProto:
    model = builders.conv_net(batch="N")
    model.graph.input[0].name = HOSTILE_INPUT
    for node in model.graph.node:
        node.input[:] = [HOSTILE_INPUT if i == "x" else i for i in node.input]
        if node.name == "conv1":
            node.name = node_name
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def hostile_result(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    model = builders.save(_hostile_model(), root / HOSTILE_FILE)
    data = root / "data.npz"
    np.savez(data, **{HOSTILE_INPUT: builders.image_like(12)})
    out = root / "result"
    result = searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=3), out=out)
    )
    return root, out, result


def _canaries(folder):
    return sorted(p.name for p in folder.rglob(f"{CANARY}*"))


def test_the_crafted_model_is_searched_with_its_names_intact(hostile_result):
    _, out, result = hostile_result
    assert result.chosen is not None
    assert HOSTILE_INPUT in result.model.inputs
    assert any(u["name"] == HOSTILE_NODE for u in result.units)


@pytest.mark.parametrize(
    "fmt, script, precision", [("trtexec", "build.sh", "int8"), ("trt10", "build_trt10.sh", "fp16")]
)
def test_shell_scripts_pass_hostile_names_as_arguments_and_run_nothing_else(
    hostile_result, tmp_path, fmt, script, precision
):
    root, out, result = hostile_result
    folder = tmp_path / fmt
    trial = result.uniform()[precision].number
    assert exit_code(["export", str(out), "--format", fmt, "--trial", str(trial), "--out", str(folder)]) == 0
    text = (folder / script).read_text()
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert CANARY not in comments.replace(f"touch {CANARY}", "")  # the line breaks stayed inside the comment, escaped
    assert "\ntouch" not in text.split("trtexec", 1)[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtexec").write_text(RECORDING_TRTEXEC)
    (bin_dir / "trtexec").chmod(stat.S_IRWXU)
    proc = subprocess.run(["sh", script], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert _canaries(tmp_path) == [] and _canaries(root) == []
    args = json.loads((folder / "trtexec_args.json").read_text())
    if fmt == "trt10":  # the hostile node reaches trtexec as one exact argument value
        precisions = next(a for a in args if a.startswith("--layerPrecisions=")).split("=", 1)[1].split(",")
        assert f"{HOSTILE_NODE}:fp16" in precisions
    else:
        assert "--onnx=model.onnx" in args
    # the hostile input reaches trtexec's shape flags as one exact argument (quoted, its line breaks inside)
    assert f"--minShapes={HOSTILE_INPUT}:1x3x16x16" in args


def test_python_build_script_holds_hostile_names_as_literals_only(hostile_result, tmp_path):
    root, out, result = hostile_result
    folder = tmp_path / "python"
    assert (
        exit_code(["export", str(out), "--format", "python", "--trial", str(result.chosen.number), "--out", str(folder)])
        == 0
    )
    source = (folder / "build_engine.py").read_text()
    tree = ast.parse(source)
    constants = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in
                 ("SOURCE_MODEL", "PROFILE")}
    assert constants["SOURCE_MODEL"] == HOSTILE_FILE.removesuffix(".onnx")
    assert list(constants["PROFILE"]) == [HOSTILE_INPUT]
    assert CANARY not in ast.get_docstring(tree)
    # run it: with TensorRT for RTX installed it builds the hostile model's plan (no GPU needed), else it
    # stops at the import; either way no name ran as code
    proc = subprocess.run(
        [sys.executable, "-I", "build_engine.py"], cwd=folder, capture_output=True, text=True, timeout=300
    )
    if importlib.util.find_spec("tensorrt_rtx_bindings") or importlib.util.find_spec("tensorrt"):
        assert proc.returncode == 0 and (folder / "model.plan").stat().st_size > 0, proc.stderr[-2000:]
    else:
        assert proc.returncode != 0 and "tensorrt" in proc.stderr.lower()
    assert _canaries(tmp_path) == [] and _canaries(root) == []


def test_markdown_card_escapes_hostile_names(hostile_result, tmp_path):
    _, out, result = hostile_result
    folder = tmp_path / "md"
    assert exit_code(["export", str(out), "--format", "markdown", "--out", str(folder)]) == 0
    card = (folder / "BUILD.md").read_text()
    rows = [line for line in card.split("## Per-unit precision")[1].splitlines() if line.startswith("| `")]
    assert len(rows) == len(result.units)  # one table row per unit: no name added or broke a row
    assert all(line.count(" | ") == 3 for line in rows)  # four cells each: the hostile '|' is escaped
    outside_code = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", card)  # code spans show their text as is, HTML included
    assert "<b>" not in outside_code and '"""' not in outside_code and "\ntouch" not in card
    assert f"{HOSTILE_NODE}".replace("|", "\\|") in card


def test_triton_config_strings_decode_back_to_the_exact_names(hostile_result, tmp_path):
    _, out, _ = hostile_result
    assert exit_code(["export", str(out), "--format", "triton", "--out", str(tmp_path), "--name", "hostile"]) == 0
    config = (tmp_path / "hostile" / "config.pbtxt").read_text()
    literals = [line.strip()[len('name: "'):-1] for line in config.splitlines() if line.strip().startswith('name: "')]
    names = [text_encoding.CUnescape(x).decode() for x in literals]
    assert names[0] == "hostile" and HOSTILE_INPUT in names
    assert not any(line.startswith("touch") for line in config.splitlines())


@pytest.mark.parametrize("name", ["..", ".", "a/b", "x\ny", ""])
def test_a_triton_name_that_is_not_one_folder_is_refused(hostile_result, tmp_path, capsys, name):
    _, out, _ = hostile_result
    assert exit_code(["export", str(out), "--format", "triton", "--out", str(tmp_path / "repo"), "--name", name]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot be a folder name" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_trt10_refuses_a_tensor_name_a_calibration_cache_cannot_hold(hostile_result, tmp_path, capsys):
    _, out, result = hostile_result
    trial = result.uniform()["int8"].number
    assert exit_code(["export", str(out), "--format", "trt10", "--trial", str(trial), "--out", str(tmp_path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        last.startswith("autoprec: error: ")
        and "a calibration cache cannot hold a name with a control character" in last
    )
    assert not (tmp_path / "calibration.cache").exists()


def test_trt10_refuses_a_node_name_trtexec_cannot_express(tmp_path, capsys):
    model = builders.save(_hostile_model(node_name="conv1,conv0:fp32"), tmp_path / "comma.onnx")
    data = tmp_path / "data.npz"
    np.savez(data, **{HOSTILE_INPUT: builders.image_like(12)})
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data),
            study=autoprec.StudySpec(budget=1, warm_start=False),
            out=tmp_path / "r",
        )
    )
    assert exit_code(["export", str(tmp_path / "r"), "--format", "trt10", "--out", str(tmp_path / "e")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("autoprec: error: ") and "trtexec's --layerPrecisions cannot name a node" in last
    assert not (tmp_path / "e" / "build_trt10.sh").exists()


def test_figures_draw_hostile_names_as_text_and_read_once_drawn(hostile_result):
    """The names go into the figures as text (math text off: '$\\frac{' is drawn, not parsed), on one line, and the
    figures still read: no raw math text in a tick label, nothing past the canvas' edge, no labels overprinted."""
    import figures

    from autoprec.record.per_unit import UnitError
    from autoprec.results import plots
    from autoprec.results.files import read_result_dir

    _, out, _ = hostile_result
    result = read_result_dir(out)
    mathy = "$\\frac{1}{$ x\ny"
    rows = [UnitError(i, name, "Conv", "int8", "t", 10.0 ** -i, 1.0, 0.1, 10.0 ** -i, 10.0 ** -(i + 2))
            for i, name in enumerate([HOSTILE_NODE, mathy, "conv2"])]
    drawn = [plots.pareto_figure(result), plots.layers_figure(result), plots.errors_figure(rows, HOSTILE_FILE)]
    if result.sensitivity is not None:
        drawn.append(plots.sensitivity_figure(result.sensitivity, result.model_name))
    for fig in drawn:
        assert figures.problems(fig) == []
    texts = [t.get_text() for fig in drawn for t in figures.drawn_texts(fig)]
    assert any(HOSTILE_FILE in t for t in texts)
    assert any(t.endswith(HOSTILE_NODE[-20:]) for t in texts) and "$\\frac{1}{$ x\\ny" in texts


def test_names_holding_math_text_are_drawn_as_text(tmp_path, capsys):
    model = builders.conv_net()
    for node in model.graph.node:
        node.name = f"conv $\\x{{$ {node.name}" if node.op_type == "Conv" else node.name
    path = builders.save(model, tmp_path / "file $\\foo{$.onnx")
    out = tmp_path / "o"
    for argv in (["search", path, "--out", out, "--budget", "2", "--no-warm-start"], ["plot", out], ["report", out]):
        code, err = run(argv, capsys)
        clean(code, err, allowed=(0,))
    import figures

    from autoprec.results import plots
    from autoprec.results.files import read_result_dir

    result = read_result_dir(out)
    drawn = [plots.pareto_figure(result), plots.layers_figure(result)]
    assert [figures.problems(fig) for fig in drawn] == [[], []]
    shown = [t for fig in drawn for t in figures.drawn_texts(fig)]
    texts = [t.get_text() for t in shown]
    assert any("file $\\foo{$.onnx" in t for t in texts) and "conv $\\x{$ conv1" in texts
    assert not [t.get_text() for t in shown if "$" in t.get_text() and t.get_parse_math()]  # text, not math
    page = (out / "report.html").read_text()
    assert "file $\\foo{$" in page and "conv $\\x{$ conv1" in page


def test_braces_in_the_model_name_or_out_never_reach_the_storage_url(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    shutil.copy(workdir / "conv.onnx", workdir / "{brace}.onnx")
    code, err = run(["search", "{brace}.onnx", "--budget", "2"], capsys)
    clean(code, err, allowed=(0,))
    assert (workdir / "autoprec_out" / "_brace_" / "pareto.json").is_file()
    code, err = run(["search", "conv.onnx", "--out", "o{x}", "--budget", "2"], capsys)
    clean(code, err, allowed=(2,))
    assert err.strip().splitlines()[-1].startswith("autoprec: error: --out o{x}: its path holds")
    assert not (workdir / "o{x}").exists()

"""The command line against hostile input: nothing unsafe happens, and every failure is one line.

Each probe runs ``autoprec`` as a user would (a subprocess, its own working directory and TMPDIR)
and checks the exit status, that stderr is one ``autoprec: error:`` line without a traceback,
and that nothing was written where it must not be.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import builders
import numpy as np
import onnx
import pytest
import searching
from searching import SHORTEST_FINAL_TIMING, main


def autoprec(*args, cwd: Path, tmp: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    tmp = tmp or cwd.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "AUTOPREC_CACHE": str(cwd.parent / "cache")}
    return subprocess.run([sys.executable, "-m", "autoprec.app.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, *phrases: str) -> str:
    """The failure's last stderr line: ``autoprec: error: ...`` holding ``phrases``; exit 2; no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("autoprec: error: "), proc.stderr[-3000:]
    for phrase in phrases:
        assert phrase in last, last
    return last


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def workdir(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    builders.save(builders.conv_net(), folder / "conv.onnx")
    return folder


# --- unsafe: where files are created ---

def test_a_planted_symlink_where_a_lock_goes_is_refused_and_followed_nowhere(workdir, tmp_path):
    locks = tmp_path / f"autoprec-locks-{os.geteuid()}"
    locks.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    (locks / "ort-cpu-device0.lock").symlink_to(victim)  # dangling: following it would create the victim
    proc = autoprec("search", "conv.onnx", "--budget", 1, "--no-progress", cwd=workdir, tmp=tmp_path)
    one_line_error(proc, "ort-cpu-device0.lock is a symbolic link")
    assert not victim.exists()


def test_a_lock_folder_that_is_a_link_is_refused(workdir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"autoprec-locks-{os.geteuid()}").symlink_to(elsewhere)
    proc = autoprec("search", "conv.onnx", "--budget", 1, "--no-progress", cwd=workdir, tmp=tmp_path)
    one_line_error(proc, "is not a directory of this user's own")
    assert not any(elsewhere.iterdir())


def test_an_empty_out_is_refused(workdir):
    before = files(workdir)
    one_line_error(autoprec("search", "conv.onnx", "--out", "", "--budget", 1, cwd=workdir), "--out '': empty")
    assert files(workdir) == before


def test_a_model_named_dot_dot_writes_into_autoprec_out_not_above_it(workdir):
    os.rename(workdir / "conv.onnx", workdir / "...onnx")
    proc = autoprec("search", "...onnx", "--budget", 1, "--no-progress", "--no-warm-start", *SHORTEST_FINAL_TIMING,
                    cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert (workdir / "autoprec_out" / "model" / "pareto.json").is_file()
    assert {p.name for p in workdir.iterdir()} == {"...onnx", "autoprec_out"}


def test_status_of_a_missing_sqlite_database_creates_nothing(workdir):
    before = files(workdir)
    one_line_error(autoprec("status", "--storage", "sqlite:///missing.db", "--study-name", "s", cwd=workdir),
                   "no such database file missing.db")
    assert files(workdir) == before


def test_a_storage_in_a_missing_folder_is_refused_not_created(workdir, tmp_path):
    url = f"sqlite:///{tmp_path / 'nonexistent' / 'dir' / 'x.db'}"
    one_line_error(autoprec("search", "conv.onnx", "--storage", url, "--budget", 1, cwd=workdir), "does not exist")
    assert not (tmp_path / "nonexistent").exists()


# --- every failure a user or the environment can cause: one line, exit 2, nothing lost ---
#
# The probes below run in this process (main(), like the command), which keeps them fast. The quick
# form runs in CI; AUTOPREC_ADVERSARIAL=deep runs ten times as many generated result-file variants.

DEEP = os.environ.get("AUTOPREC_ADVERSARIAL") == "deep"


def run(argv, capsys) -> tuple[int, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own refusal (exit 2, usage line)
        code = exc.code
    err = capsys.readouterr().err
    return code, err


def clean(code: int, err: str, allowed=(0, 2)) -> None:
    assert "Traceback" not in err, err[-3000:]
    assert code in allowed, (code, err[-3000:])
    if code == 2:
        last = err.strip().splitlines()[-1]
        assert last.startswith(("autoprec: error: ", "usage:")) or "error:" in last, err[-3000:]


@pytest.fixture(scope="module")
def result_dir(tmp_path_factory):
    """One finished search (with its sensitivity pass) whose files the probes damage, each on a copy."""
    import autoprec as api

    root = tmp_path_factory.mktemp("victim")
    model, data = builders.conv_with_data(root, 12)
    out = root / "result"
    searching.search(api.SearchConfig(api.InputSpec(model, data=data), study=api.StudySpec(budget=4), out=out))
    return out


def _paths(value, prefix=()):
    """Every path into a JSON document."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):
            yield from _paths(v, prefix + (i,))


def _set(document, path, value):
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


REPLACEMENTS = [None, "x", -1, 1e308, [], {}, True]


def _mutations(result_dir):
    """Every (file, path into it, value put there): each field of each result file given a wrong value."""
    cases = []
    for name in ("pareto.json", "trials.json", "best/plan.json", "sensitivity.json"):
        document = json.loads((result_dir / name).read_text())
        for path in _paths(document):
            for value in REPLACEMENTS:
                cases.append((name, path, value))
    return cases


@pytest.mark.parametrize("case", range(300 if DEEP else 30))
def test_damaged_result_files_are_refused_in_one_line(result_dir, tmp_path, capsys, case):
    cases = _mutations(result_dir)
    name, path, value = cases[(case * 7919) % len(cases)] if not DEEP else cases[case * len(cases) // 300]
    copy_dir = tmp_path / "r"
    shutil.copytree(result_dir, copy_dir)
    document = json.loads((copy_dir / name).read_text())
    if path:
        _set(document, path, value)
    else:
        document = value
    (copy_dir / name).write_text(json.dumps(document))
    for argv in (["show", copy_dir], ["show", copy_dir, "--json"], ["compare", copy_dir, result_dir],
                 ["export", copy_dir, "--format", "markdown", "--out", tmp_path / "md"]):
        clean(*run(argv, capsys))
    if case % 5 == 0 or DEEP:  # figures and the report take a second each
        for argv in (["plot", copy_dir], ["report", copy_dir]):
            clean(*run(argv, capsys))


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` × ``height`` pixels (no pixel data follows)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IEND", b"")
    )


def _data_probe(kind: str, folder: Path) -> list:
    images = folder / "images"
    if kind == "corrupt npz":
        (folder / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
        return ["--data", folder / "bad.npz"]
    if kind == "dev null":
        return ["--data", "/dev/null"]
    if kind == "object array":
        np.savez(folder / "obj.npz", x=np.array([object(), 1], dtype=object))
        return ["--data", folder / "obj.npz"]
    if kind == "inf":
        x = builders.image_like(8)
        x[2, 0, 0, 0] = np.inf
        np.savez(folder / "inf.npz", x=x)
        return ["--data", folder / "inf.npz"]
    if kind == "huge image":
        images.mkdir()
        (images / "huge.png").write_bytes(_png_claiming(15000, 15000))
        return ["--data", images]
    if kind == "image std 0":
        images.mkdir()
        from PIL import Image
        Image.new("RGB", (20, 20), (10, 20, 30)).save(images / "a.png")
        return ["--data", images, "--image-std", "0"]
    if kind == "image mean 2 values":
        images.mkdir()
        from PIL import Image
        Image.new("RGB", (20, 20), (10, 20, 30)).save(images / "a.png")
        return ["--data", images, "--image-mean", "0.5,0.5"]
    if kind == "huge shape":
        return ["--shape", "x=1x3x100000x100000"]
    if kind == "npz of a scalar":
        np.savez(folder / "scalar.npz", x=np.float32(3))
        return ["--data", folder / "scalar.npz"]
    if kind == "a folder of one bad npy":
        (folder / "npys").mkdir()
        (folder / "npys" / "a.npy").write_bytes(b"\x93NUMPY garbage")
        return ["--data", folder / "npys"]
    raise AssertionError(kind)


DATA_PROBES = ["corrupt npz", "dev null", "object array", "inf", "huge image", "image std 0", "image mean 2 values",
               "huge shape", "npz of a scalar", "a folder of one bad npy"]


@pytest.mark.parametrize("kind", DATA_PROBES)
def test_bad_data_is_one_line(workdir, capsys, monkeypatch, kind):
    monkeypatch.chdir(workdir)
    argv = [
        "search",
        workdir / "conv.onnx",
        "--budget",
        1,
        "--no-progress",
        "--out",
        workdir / "out",
        *_data_probe(kind, workdir),
    ]
    code, err = run(argv, capsys)
    clean(code, err, allowed=(2,))
    if kind == "object array":  # saved with numpy.savez already: the fix is the array's type
        assert "store its strings as a str array" in err.strip().splitlines()[-1]


SPACES = {
    "units not a mapping": "units: 5\n",
    "precisions not a list": "units: {Conv: 5}\n",
    "fusable not a list": "units: {Conv: [int8, fp32]}\nfusable: 5\n",
    "pinned a mapping": "units: {Conv: [int8, fp32]}\npinned_fp32: {a: 1}\n",
    "overrides a list": "units: {Conv: [int8, fp32]}\noverrides: [a, b]\n",
    "override precisions a number": "units: {Conv: [int8, fp32]}\noverrides: {'conv*': 5}\n",
    "not utf-8": b"\xff\xfe\x00units",
    "a list": "- Conv\n",
    "op name not text": "units: {1: [int8]}\n",
}


@pytest.mark.parametrize("kind", sorted(SPACES))
def test_bad_search_spaces_are_one_line(workdir, capsys, kind):
    space = workdir / "space.yaml"
    text = SPACES[kind]
    space.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, err = run(["search", workdir / "conv.onnx", "--search-space", space, "--budget", 1, "--no-progress",
                     "--out", workdir / "out"], capsys)
    clean(code, err, allowed=(2,))


PLANS = {
    "unknown unit": {"precisions": {"nope": "int8"}},
    "bogus calibration": {"precisions": {"conv0": "int8"}, "calibration": "bogus"},
    "bogus precision": {"precisions": {"conv0": "int4"}},
    "not an object": [1, 2],
    "precisions a list": {"precisions": ["int8"]},
}


@pytest.mark.parametrize("kind", sorted(PLANS))
@pytest.mark.parametrize("verb", ["check", "diagnose"])
def test_bad_plan_files_are_one_line(result_dir, tmp_path, capsys, kind, verb):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLANS[kind]))
    extra = ["--max-loss", "0.1"] if verb == "check" else ["--out", tmp_path / "d"]
    code, err = run([verb, result_dir, "--plan", plan, *extra], capsys)
    clean(code, err, allowed=(2,))


LAYER_FILES = {
    "layers of numbers": '{"Layers": [1, 2]}',
    "inputs a number": '{"Layers": [{"Name": "a", "Inputs": 5}]}',
    "bindings a number": '{"Layers": [], "Bindings": 5}',
    "io tensors a string": '{"Layers": [{"Name": "a"}], "I/O Tensors": "x"}',
    "plain text": "this is a text file, not an engine\n",
    "empty": "",
}


@pytest.mark.parametrize("kind", sorted(LAYER_FILES))
def test_inspect_of_odd_files_is_one_line(tmp_path, capsys, kind):
    path = tmp_path / "layers.json"
    path.write_text(LAYER_FILES[kind])
    code, err = run(["inspect", path], capsys)
    clean(code, err)
    if kind == "plain text":
        assert code == 2 and "TensorRT" not in err.strip().splitlines()[-1]


def test_unwritable_output_paths_are_one_line(result_dir, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for argv in (["report", result_dir, "--output", blocker / "report.html"],
                 ["inspect", Path(__file__).parent / "fixtures" / "tensorrt" / "mobilenet_qat_layers_excerpt.json",
                  "--json", blocker / "x.json"],
                 ["export", result_dir, "--format", "trtexec", "--out", blocker / "e"],
                 ["diagnose", result_dir, "--out", blocker / "d"]):
        code, err = run(argv, capsys)
        clean(code, err, allowed=(2,))
        assert "a-file" in err.strip().splitlines()[-1]


def test_zoo_cache_damage_is_one_line(tmp_path, capsys):
    as_file = tmp_path / "cache-file"
    as_file.write_text("")
    clean(*run(["zoo", "fetch", "ppocr-cls", "--cache", as_file], capsys), allowed=(2,))
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / "rapidocr_onnxruntime-1.4.4-py3-none-any.whl").write_bytes(b"garbage, not a zip")
    clean(*run(["zoo", "fetch", "ppocr-cls", "--cache", cache], capsys), allowed=(2,))
    (cache / "zoo" / "ppocr-cls").mkdir(parents=True)
    (cache / "zoo" / "ppocr-cls" / "source.json").write_text("{not json")
    clean(*run(["zoo", "list", "--cache", cache], capsys), allowed=(0,))


def test_a_sequence_input_is_one_line(tmp_path, capsys):
    from onnx import TensorProto, helper

    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    inits = [
        onnx.numpy_helper.from_array(np.array(0, np.int64), "i"),
        onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
    ]
    nodes = [
        helper.make_node("SequenceAt", ["s", "i"], ["t"], "at"),
        helper.make_node("MatMul", ["t", "w"], ["y"], "mm"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [seq], [y], inits), opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = builders.IR_VERSION
    onnx.checker.check_model(model)
    path = builders.save(model, tmp_path / "m.onnx")
    code, err = run(["search", path, "--budget", 1, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert "input s is a sequence, not a tensor" in err.strip().splitlines()[-1]


def test_a_zipmap_output_is_refused_naming_the_option_that_leaves_it_out(tmp_path, capsys):
    """skl2onnx ends a classifier with a ZipMap (its probabilities as a list of dicts) unless told
    not to: the refusal names the option (issue 69)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    label = helper.make_tensor_value_info("label", TensorProto.FLOAT, [2, 3])
    probabilities = helper.make_value_info("probabilities", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64,
                                   helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["label"], "mm"),
             helper.make_node("ZipMap", ["label"], ["probabilities"], "zipmap", domain="ai.onnx.ml",
                              classlabels_int64s=[0, 1, 2])]
    graph = helper.make_graph(nodes, "g", [x], [label, probabilities],
                              [onnx.numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = builders.IR_VERSION
    onnx.checker.check_model(model)
    path = builders.save(model, tmp_path / "m.onnx")
    code, err = run(["search", path, "--budget", 1, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    said = err.strip().splitlines()[-1]
    assert "output probabilities is a sequence, not a tensor" in said
    assert "{'zipmap': False}" in said


def test_unreachable_storages_and_stores_are_one_line(workdir, tmp_path, capsys):
    pytest.importorskip("psycopg")
    for extra in (["--storage", "postgresql://user:pw@127.0.0.1:1/nodb"], ["--artifacts", workdir / "conv.onnx"]):
        code, err = run(
            ["search", workdir / "conv.onnx", "--budget", 1, "--no-progress", "--out", tmp_path / "o", *extra], capsys
        )
        clean(code, err, allowed=(2,))
        assert ":pw@" not in err


def test_a_damaged_study_value_is_one_line_and_the_study_is_kept(result_dir, tmp_path, capsys):
    import sqlite3

    out = tmp_path / "r"
    shutil.copytree(result_dir, out)
    with sqlite3.connect(out / "study.db") as db:  # a value Optuna stored, damaged on disk
        db.execute("UPDATE trial_user_attributes SET value_json = '\"garbage\"' WHERE key = 'measurement'")
    facts = json.loads((out / "pareto.json").read_text())
    before = sorted((out / "best").iterdir())
    code, err = run(
        [
            "search",
            facts["model"]["path"],
            "--data",
            facts["search"]["data_path"],
            "--budget",
            5,
            "--out",
            out,
            "--no-progress",
        ],
        capsys,
    )
    clean(code, err, allowed=(2,))
    assert "stored plan or measurement is damaged" in err.strip().splitlines()[-1]
    assert sorted((out / "best").iterdir()) == before and (out / "pareto.json").is_file()  # nothing lost


def test_disk_full_mid_search_is_one_line_and_the_search_resumes(workdir, tmp_path):
    """A file-size limit stands in for a full disk: once the study's database has grown past it, its writes fail
    (EFBIG, as ENOSPC would). The same command afterwards, with room again, finishes the budget."""
    import resource
    import signal

    out = workdir / "out"
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def search(budget, limit=None):
        def limited():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        cmd = [
            sys.executable,
            "-m",
            "autoprec.app.cli",
            "search",
            "conv.onnx",
            "--budget",
            str(budget),
            "--no-progress",
            "--no-warm-start",
            *SHORTEST_FINAL_TIMING,
            "--out",
            str(out),
        ]
        return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
                              preexec_fn=limited if limit else None)

    assert search(2).returncode == 0
    full = search(12, limit=(out / "study.db").stat().st_size + 8192)
    one_line_error(full, "free space")
    resumed = search(12)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "pareto.json").read_text())["search"]["trials"] == 12


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


def test_a_float16_model_is_told_its_type_not_float64(tmp_path, capsys):
    model = builders.conv_net()
    from onnx import TensorProto, numpy_helper

    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype("float16"), tensor.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    path = builders.save(model, tmp_path / "half.onnx")
    code, err = run(["search", path, "--out", tmp_path / "o", "--budget", "1"], capsys)
    clean(code, err, allowed=(2,))
    last = err.strip().splitlines()[-1]
    assert "compute in float16, not float32" in last and "float64" not in last and "pinned" not in last


def test_names_holding_math_text_are_drawn_as_text(tmp_path, capsys):
    model = builders.conv_net()
    for node in model.graph.node:
        node.name = f"conv $\\x{{$ {node.name}" if node.op_type == "Conv" else node.name
    path = builders.save(model, tmp_path / "file $\\foo{$.onnx")
    out = tmp_path / "o"
    for argv in (["search", path, "--out", out, "--budget", "2", "--no-warm-start"], ["plot", out], ["report", out]):
        code, err = run(argv, capsys)
        clean(code, err, allowed=(0,))
    assert (out / "pareto.png").stat().st_size > 1000


def _graph(nodes, inputs, outputs, initializers=()):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_model_that_disagrees_with_itself_is_refused_naming_its_random_op(tmp_path, capsys):
    """RandomNormalLike: no exact FP32 reference exists, so no loss against it means anything."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32), "w")
    model = _graph([helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                    helper.make_node("RandomNormalLike", ["a"], ["n"], name="noise"),
                    helper.make_node("Add", ["a", "n"], ["y"], name="add")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [weight])
    code, err = run(["search", builders.save(model, tmp_path / "noisy.onnx"), "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    last = err.strip().splitlines()[-1]
    assert "it draws random values (RandomNormalLike 'noise')" in last


def test_outputs_that_change_between_two_runs_are_refused_whatever_the_cause(tmp_path):
    """The run-time check behind the graph's: any op that makes two runs of one input differ."""
    import numpy as np

    from autoprec.analysis.model import analyse
    from autoprec.analysis.reference import check_deterministic
    from autoprec.core.errors import ModelError
    from autoprec.core.search_space import load_search_space

    info = analyse(builders.save(builders.mlp(), tmp_path / "mlp.onnx"), load_search_space())
    first = {"probs": np.ones((4, 10), np.float32)}
    check_deterministic(info, first, {"probs": first["probs"] + 1e-7})  # reduction order: the same model
    with pytest.raises(ModelError, match="other outputs for the same input on a second run .output probs"):
        check_deterministic(info, first, {"probs": first["probs"] * 2})


def test_a_metric_that_does_not_agree_with_itself_is_refused_before_any_trial(tmp_path, capsys):
    """A head that is no YOLO head, judged with --det-layout yolov5: FP32 against itself must score 0."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(32, 450)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 50, 9], np.int64), "shape")
    model = _graph([helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                    helper.make_node("Reshape", ["a", "shape"], ["y"], name="rs")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 50, 9])], [weight, shape])
    out = tmp_path / "o"
    code, err = run(["search", builders.save(model, tmp_path / "head.onnx"), "--metric", "detection", "--det-layout",
                     "yolov5", "--out", out], capsys)
    clean(code, err, allowed=(2,))
    assert "--metric detection: the FP32 model's outputs score loss" in err.strip().splitlines()[-1]
    assert not (out / "pareto.json").exists()


def test_weights_given_as_an_input_are_fed_whole_with_random_data(tmp_path, capsys):
    """MatMul(x[4,16], w[16,8]) with w an input: w is one tensor per run, not 16 items cut into batches of 4."""
    from onnx import TensorProto, helper

    model = _graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    out = tmp_path / "o"
    code, err = run(["search", builders.save(model, tmp_path / "wi.onnx"), "--out", out, "--budget", "3"], capsys)
    clean(code, err, allowed=(0,))
    assert json.loads((out / "pareto.json").read_text())["search"]["trials"] == 3


def test_string_inputs_are_fed_from_data_and_refused_for_random_data(tmp_path, capsys):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    model = _graph([helper.make_node("Identity", ["s"], ["t"], name="id"),
                    helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("s", TensorProto.STRING, [1]),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                   [helper.make_tensor_value_info("t", TensorProto.STRING, [1]),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    path = builders.save(model, tmp_path / "strings.onnx")
    code, err = run(["search", path, "--out", tmp_path / "random"], capsys)
    clean(code, err, allowed=(2,))
    assert "input s takes strings, which random data cannot choose" in err.strip().splitlines()[-1]
    np.savez(tmp_path / "d.npz", s=np.array([["a"], ["b"]] * 4), x=np.random.default_rng(0).random((8, 8), np.float32))
    code, err = run(["search", path, "--data", tmp_path / "d.npz", "--out", tmp_path / "o", "--budget", "2"], capsys)
    clean(code, err, allowed=(0,))


def test_a_failed_write_names_its_file(tmp_path):
    import errno

    from autoprec.core import atomic

    def full(_):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as raised:
        atomic.write_with(tmp_path / "pareto.json", full)
    assert raised.value.filename == str(tmp_path / "pareto.json") and not list(tmp_path.iterdir())


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


@pytest.mark.parametrize("message, said", [
    ("connection failed: connection to server at \"127.0.0.1\", port 5432 failed: Connection refused", "stopped"),
    ("consuming input failed: server closed the connection unexpectedly", "stopped"),
    ("database or disk is full", "disk is full"),
])
def test_a_storage_failure_says_what_fits_its_cause(message, said):
    from autoprec.study.coordination import storage_hint

    assert said in storage_hint(message) and (said == "disk is full") == ("disk" in storage_hint(message))


@pytest.mark.parametrize("case", range(len(MISC)), ids=[" ".join(m[0][:3]) + f" {i}" for i, m in enumerate(MISC)])
def test_more_mistakes_are_one_line(result_dir, workdir, capsys, monkeypatch, case):
    argv, files, phrase = MISC[case]
    monkeypatch.chdir(workdir)
    for name, text in files.items():
        (workdir / name).write_text(text)
    (workdir / "folder").mkdir()
    fill = {"{model}": workdir / "conv.onnx", "{result}": result_dir, "{folder}": workdir / "folder"}
    code, err = run([fill.get(a, a) for a in argv] + ["--out", workdir / "o"] * (argv[0] == "search"), capsys)
    clean(code, err, allowed=(2,))
    assert phrase in err.strip().splitlines()[-1]


def _mlp_with(extra_nodes, extra_inputs=(), outputs=None, name="m.onnx", folder=None):
    """x[1,16] → MatMul → a[1,32], then ``extra_nodes`` (their last output is y unless ``outputs`` says)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"), *extra_nodes]
    outs = outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])]
    model = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]), *extra_inputs], outs,
                   [weight])
    return builders.save(model, folder / name)


@pytest.mark.parametrize("op, attrs", [("RandomNormal", {"seed": 5.0}), ("RandomNormal", {"scale": 0.0}),
                                       ("RandomUniform", {"seed": 3.0, "dtype": 1})])
def test_a_seeded_or_degenerate_random_op_is_refused_before_preparation_folds_it(tmp_path, capsys, op, attrs):
    """Seeded, constant folding froze the draw into a constant and the search shipped that model; with scale 0
    ONNX Runtime aborted the process."""
    from onnx import helper

    path = _mlp_with([helper.make_node(op, [], ["r"], name="draw", shape=[1, 32], **attrs),
                      helper.make_node("Add", ["a", "r"], ["y"], name="add")], folder=tmp_path)
    code, err = run(["search", path, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert f"it draws random values ({op} 'draw')" in err.strip().splitlines()[-1]


def test_a_scalar_output_is_judged(tmp_path, capsys):
    from onnx import TensorProto, helper

    path = _mlp_with([helper.make_node("ReduceSum", ["a"], ["y"], name="sum", keepdims=0)],
                     outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], folder=tmp_path)
    code, err = run(["search", path, "--out", tmp_path / "o", "--budget", "3"], capsys)
    clean(code, err, allowed=(0,))


def test_an_index_input_random_data_cannot_fill_is_one_line(tmp_path, capsys):
    from onnx import TensorProto, helper

    path = _mlp_with([helper.make_node("Gather", ["a", "k"], ["y"], name="pick", axis=1)],
                     [helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], folder=tmp_path)
    code, err = run(["search", path, "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert "does not run on the evaluation data" in err.strip().splitlines()[-1]


def test_a_yolo_head_without_classes_is_one_line(tmp_path, capsys):
    import numpy as np
    from onnx import helper, numpy_helper

    shape = numpy_helper.from_array(np.array([1, 4, 8], np.int64), "shape")
    path = _mlp_with([helper.make_node("Reshape", ["a", "shape"], ["y"], name="rs")], folder=tmp_path,
                     outputs=[helper.make_tensor_value_info("y", 1, [1, 4, 8])])
    model = onnx.load(str(path))
    model.graph.initializer.append(shape)
    onnx.save(model, str(path))
    code, err = run(["search", path, "--metric", "detection", "--det-layout", "yolov8", "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert "needs 4 box values and at least one class score" in err.strip().splitlines()[-1]


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


def test_more_threads_than_the_machine_can_run_are_refused(workdir, capsys):
    code, err = run(["search", workdir / "conv.onnx", "--threads", "100000", "--out", workdir / "o"], capsys)
    clean(code, err, allowed=(2,))
    assert "--threads 100000: more than 4× this machine's" in err.strip().splitlines()[-1]


def test_a_number_that_is_not_one_is_one_line_too(workdir, capsys):
    code, err = run(["search", workdir / "conv.onnx", "--budget", "1.5"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("autoprec: error: argument --budget") and "(see autoprec search --help)" in err


def test_a_dim_name_two_inputs_share_takes_the_size_one_shape_gives_and_conflicts_are_refused(tmp_path, capsys):
    """x[N,16] and z[16,N]: --shape x=3x16 carries N=3 to z (was z at N=1, an internal error); two --shape values
    that disagree on a shared dim are refused naming both."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(16, dtype=np.float32), "w")
    model = _graph([helper.make_node("Transpose", ["z"], ["zt"], name="t", perm=[1, 0]),
                    helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                    helper.make_node("Add", ["a", "zt"], ["y"], name="add")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16]),
                    helper.make_tensor_value_info("z", TensorProto.FLOAT, [16, "N"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])], [weight])
    path = builders.save(model, tmp_path / "shared.onnx")
    code, err = run(["search", path, "--shape", "x=3x16", "--budget", "2", "--out", tmp_path / "o"], capsys)
    clean(code, err, allowed=(0,))
    assert "input z: dim N set to 3, as --shape x gives it" in err
    code, err = run(["search", path, "--shape", "x=3x16", "--shape", "z=16x2", "--out", tmp_path / "p"], capsys)
    clean(code, err, allowed=(2,))
    assert "--shape: inputs x and z share the dim 'N' but are given 3 and 2 there" in err


def test_a_weight_given_as_an_input_is_one_array_in_the_data(tmp_path, capsys):
    """MatMul(x[4,16], Win[16,32]) with Win an input: the .npz holds Win once, as the model takes it."""
    import numpy as np
    from onnx import TensorProto, helper

    model = _graph([helper.make_node("MatMul", ["x", "Win"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                    helper.make_tensor_value_info("Win", TensorProto.FLOAT, [16, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])])
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((32, 16), np.float32), Win=rng.random((16, 32), np.float32))
    out = tmp_path / "o"
    code, err = run(["search", builders.save(model, tmp_path / "win.onnx"), "--data", tmp_path / "d.npz",
                     "--budget", "3", "--out", out], capsys)
    clean(code, err, allowed=(0,))
    assert "4 calibration / 4 evaluation batch(es)" in " ".join(err.split())


def test_a_resume_past_its_budget_says_so(workdir, capsys):
    out = workdir / "o"
    for budget in (3, 2):
        code, err = run(["search", workdir / "conv.onnx", "--budget", budget, "--out", out, "--no-warm-start"], capsys)
        clean(code, err, allowed=(0,))
    said = " ".join(err.split())
    assert "3 trials done, the budget of 2 reached: no new trial runs" in said and "3 of 2" not in said


def test_a_user_metric_that_prints_leaves_json_output_whole(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    (workdir / "chatty.py").write_text("def loss(reference, outputs):\n    print('hello from the metric')\n    return 0.0\n")
    out = workdir / "o"
    code, err = run(["search", "conv.onnx", "--budget", "2", "--out", out, "--no-warm-start"], capsys)
    clean(code, err, allowed=(0,))
    assert main(["check", str(out), "--metric", "chatty:loss", "--max-loss", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["passed"] is True and "hello from the metric" in captured.err

"""A result folder, its cache and an export folder are input, not trust (issue 67): whatever someone
put there — a link out, a FIFO, a device, a file of their own, code — autoprec reads only regular
files inside the folder (each read bounded), writes and removes there only what it made, and never
runs code from it. Each probe expects exit 0 with a true result, or exit 2 with one line naming the
input, and nothing outside the folder read, run or changed. Grouped by behaviour: what is read, what
is written or removed, what runs, what ends, what is true."""

import json
import os
import shutil
from pathlib import Path

import builders
import numpy as np
import pytest
import searching
from cli import autoprec, exit_code, one_line_error, refused, run

QUICK = (
    "--budget",
    "2",
    "--no-warm-start",
    "--threads",
    "1",
    *searching.SHORTEST_FINAL_TIMING,
    "--no-progress",
)
SECRET = "the user's private key\n"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """One finished search of a small classifier, copied for each probe (see ``copy``)."""
    import autoprec as api

    root = tmp_path_factory.mktemp("untrusted")
    model = builders.save(builders.classifier(12, 4), root / "cls.onnx")
    np.savez(root / "d.npz", x=np.random.default_rng(1).normal(size=(32, 16)).astype(np.float32))
    out = root / "R"
    searching.search(
        api.SearchConfig(
            api.InputSpec(model, data=root / "d.npz"), study=api.StudySpec(budget=2), out=out
        ),
        plots=True,  # the probes replace its figures too
    )
    return out


def copy(result: Path, tmp_path: Path, name: str = "R") -> Path:
    target = tmp_path / name
    shutil.copytree(result, target, symlinks=True)
    return target


def secret(tmp_path: Path) -> Path:
    path = tmp_path / "id_rsa"
    path.write_text(SECRET)
    return path


def untouched(*paths: Path) -> dict[Path, bytes]:
    """Every file under ``paths`` with its bytes: compare before and after."""
    return {p: p.read_bytes() for root in paths for p in [root, *root.rglob("*")] if p.is_file()}


# --- what is read: only regular files inside the folder ---


@pytest.mark.parametrize("figure", ["pareto.png", "layers.png"])
def test_a_report_embeds_no_file_a_figures_link_leads_to(result, tmp_path, capsys, figure):
    """ln -sf ~/.ssh/id_rsa R/pareto.png; autoprec report R --output shared.html put the key in the
    page."""
    r = copy(result, tmp_path)
    (r / figure).unlink()
    (r / figure).symlink_to(secret(tmp_path))
    page = tmp_path / "shared.html"
    refused(["report", r, "--output", page], capsys, figure, "symbolic link")
    assert not page.exists()


@pytest.mark.parametrize("verb", ["report", "show", "plot"])
def test_a_fifo_in_a_result_is_refused_not_waited_on(result, tmp_path, verb):
    """pareto.png replaced by a FIFO: report R blocked forever."""
    r = copy(result, tmp_path)
    (r / "pareto.png").unlink()
    os.mkfifo(r / "pareto.png")
    proc = autoprec(verb, r, cwd=tmp_path, timeout=120)
    one_line_error(proc, "pareto.png", "a FIFO")


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "{r}", "{result}"],
        ["ranges", "{r}"],
        ["check", "{r}"],
        ["diagnose", "{r}"],
        ["export", "{r}", "--format", "trtexec"],
    ],
)
def test_every_verb_refuses_a_result_holding_a_fifo_or_device(result, tmp_path, capsys, argv):
    """Held-out variants of the FIFO: other verbs, other files (the cache a verb reads, best/'s
    model)."""
    r = copy(result, tmp_path)
    calibration = next((r / "cache").glob("calibration-*.npz"))
    calibration.unlink()
    os.mkfifo(calibration)
    (r / "best" / "model.onnx").unlink()
    (r / "best" / "model.onnx").symlink_to("/dev/zero")
    refused([a.format(r=r, result=result) for a in argv], capsys, "not a file autoprec wrote")


@pytest.mark.parametrize("where", ["../secret.npz", "/tmp/secret.npz", "cache/../../secret.npz"])
def test_a_recorded_file_outside_the_results_cache_is_not_read(result, tmp_path, capsys, where):
    """A fresh pass: pareto.json's calibration_file, joined to the result folder, read any .npz on
    the disk (its arrays shown by ranges as the search's ranges)."""
    r = recorded_as(copy(result, tmp_path), lambda search: search.update(calibration_file=where))
    for argv in (["ranges", r], ["check", r, "--max-loss", "1"]):
        refused(argv, capsys, "calibration_file", "outside its cache/")


def test_check_refuses_a_shipped_models_external_data_outside_its_folder_without_reading_it(
    result, tmp_path
):
    """best/model.onnx with external data /dev/zero: check R hashed /dev/zero for ever (it ran
    past 300 s)."""
    import onnx

    r = copy(result, tmp_path)
    shipped = r / "best" / "model.onnx"
    model = onnx.load(str(shipped))
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="/dev/zero")
    onnx.save(model, str(shipped))
    for argv in (["check", r], ["export", r, "--format", "triton", "--out", tmp_path / "t"]):
        one_line_error(autoprec(*argv, cwd=tmp_path, timeout=120), "best/model.onnx", "/dev/zero")


def _forged_best(r: Path) -> None:
    """best/model.onnx replaced by a model far from FP32 (its largest weight drawn anew), and best/plan.json's
    sha256 of it edited alike: a forged result as consistent as its forger can make it."""
    import onnx
    from onnx import numpy_helper

    from autoprec.analysis.model import model_sha256

    shipped = r / "best" / "model.onnx"
    model = onnx.load(str(shipped))
    tensor = max(model.graph.initializer, key=lambda t: numpy_helper.to_array(t).size)
    weights = numpy_helper.to_array(tensor)
    drawn = np.random.default_rng(12345).normal(size=weights.shape).astype(weights.dtype)
    tensor.CopyFrom(numpy_helper.from_array(drawn, tensor.name))
    onnx.save(model, str(shipped))
    plan = json.loads((r / "best" / "plan.json").read_text())
    plan["sha256"]["model.onnx"] = model_sha256(shipped)
    (r / "best" / "plan.json").write_text(json.dumps(plan))


def test_check_measures_the_model_best_holds_not_the_plan_lowered_again(result, tmp_path, capsys):
    """A self-consistent forgery: best/model.onnx replaced and its recorded sha256 edited alike. check measured
    the plan lowered again from the cache and passed, while export ships the forged file."""
    r = copy(result, tmp_path)
    assert run(["check", r, "--max-loss", "0.01"], capsys)[0] == 0
    _forged_best(r)
    code = exit_code(["check", r, "--max-loss", "0.01"])
    said = capsys.readouterr()
    assert code == 1 and "accuracy loss" in said.out, said.err[-2000:]


def test_check_judges_against_the_given_models_outputs_not_the_caches(result, tmp_path, capsys):
    """A cache's FP32 reference of other values (here zeros) made check judge the shipped model against them."""
    r = copy(result, tmp_path)
    for cached in (r / "cache").glob("reference-*.npz"):
        with np.load(cached) as npz:
            arrays = {k: (np.zeros_like(v) if k.startswith("b") else v) for k, v in npz.items()}
        np.savez_compressed(cached, **arrays)
    assert run(["check", r, "--max-loss", "0.01"], capsys)[0] == 0


def _zeroed_reference(r: Path) -> Path:
    cached = next((r / "cache").glob("reference-*.npz"))
    with np.load(cached) as npz:
        arrays = {k: (np.zeros_like(v) if k.startswith("b") else v) for k, v in npz.items()}
    np.savez_compressed(cached, **arrays)
    return cached


def _cache_only(result: Path, tmp_path: Path) -> Path:
    """A folder holding a result's cache/ alone (no study: nothing is fetched from its artifacts)."""
    r = tmp_path / "victim"
    shutil.copytree(result / "cache", r / "cache")
    for kept in (r / "cache").glob("choice*"):
        kept.unlink()
    return r


def test_a_search_into_a_result_measures_a_kept_reference_again(result, tmp_path, capsys):
    """A fresh pass: a cache's reference replaced by another plan's outputs made a search into the
    folder ship INT8 at 'loss 0' past --max-loss 1e-6."""
    r = _cache_only(result, tmp_path)
    cached = _zeroed_reference(r)
    code, err = run(search(result, r), capsys)
    assert code == 0 and "not this model's FP32 outputs" in err, err[-2000:]
    with np.load(cached) as npz:
        assert any(np.abs(v).max() > 0 for k, v in npz.items() if k.startswith("b"))


def test_a_kept_prepared_model_that_is_not_the_given_one_is_refused(result, tmp_path, capsys):
    """A fresh pass: cache/prepared-*/'s weights negated: a search into the folder searched and shipped
    that network (loss 0 against itself), and check passed it."""
    r = copy(result, tmp_path)
    weights = next((r / "cache").glob("prepared-*/source.data"))
    np.negative(np.fromfile(weights, np.float32)).tofile(weights)
    for argv in (search(result, r), ["check", r, "--max-loss", "0.01"]):
        refused(argv, capsys, "prepared-", "does not give the given model's outputs")


def test_a_kept_calibration_no_calibration_measures_is_not_used(result, tmp_path, capsys):
    """A fresh pass: NaN ranges in the cache were an internal error in ranges, and failed every INT8
    trial of a search into the folder without a word."""
    r, victim = copy(result, tmp_path), _cache_only(result, tmp_path)
    for folder in (r, victim):
        cached = next((folder / "cache").glob("calibration-*.npz"))
        with np.load(cached) as npz:
            arrays = dict(npz.items())
        arrays["minmax_0"] = np.array([np.nan, np.nan])
        np.savez(cached, **arrays)
    refused(["ranges", r], capsys, "calibration", "not one a calibration measures")
    code, err = run(search(result, victim, "--precisions", "int8,fp32"), capsys)
    assert code == 0 and "calibrated again" in err, err[-2000:]


# --- what is written or removed: only what autoprec made ---


def search(result: Path, out: Path, *extra) -> list:
    """The command line of a quick search of the fixture's model into ``out``."""
    return [
        "search",
        result.parent / "cls.onnx",
        "--data",
        result.parent / "d.npz",
        "--out",
        out,
        *QUICK,
        *extra,
    ]


@pytest.mark.parametrize(
    "planted", ["cache/worker-stderr.log", ".autoprec-write-test", "study.db", "best", "cache"]
)
def test_a_search_into_a_folder_follows_no_link_planted_there(result, tmp_path, capsys, planted):
    """ln -sf ~/important.txt R/cache/worker-stderr.log, then resuming into R, truncated
    important.txt to 0 bytes; ln -s victim o1/best, then search --out o1, overwrote
    victim/model.onnx and plan.json."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "important.txt").write_text("keep me\n")
    (victim / "model.onnx").write_text("the user's model\n")
    r = copy(result, tmp_path)
    target = r / planted
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    target.symlink_to(victim if planted in ("best", "cache") else victim / "important.txt")
    before = untouched(victim)
    code, err = run(search(result, r), capsys)
    assert code in (0, 2) and "Traceback" not in err, err[-3000:]
    if code == 2:
        assert planted in err.strip().splitlines()[-1] and "symbolic link" in err, err[-3000:]
    assert untouched(victim) == before


def test_a_search_writes_into_no_database_with_another_name(result, tmp_path, capsys):
    """Variant of the planted link: a hard link (cp -al of a result, or ln) made the resumed search
    write into the other name's database too."""
    r = copy(result, tmp_path)
    os.link(r / "study.db", tmp_path / "important.db")
    before = (tmp_path / "important.db").read_bytes()
    refused(search(result, r), capsys, "study.db", "hard link")
    assert (tmp_path / "important.db").read_bytes() == before


def test_a_search_removes_no_temporary_file_it_did_not_leave(result, tmp_path, capsys):
    """search … --out proj deleted every .*.tmp in proj, proj/best and proj/cache at start, whoever
    wrote them."""
    proj = tmp_path / "proj"
    drafts = [
        proj / ".draft.tmp",
        proj / "best" / ".notes.tmp",
        proj / "cache" / ".model.onnx.1234.tmp",
    ]
    for draft in drafts:
        draft.parent.mkdir(parents=True, exist_ok=True)
        draft.write_text("a draft\n")
    code, err = run(search(result, proj), capsys)
    assert code == 0, err[-3000:]
    assert all(draft.read_text() == "a draft\n" for draft in drafts)


@pytest.mark.parametrize("theirs", ["model.plan", "build_report.json", "BUILD.md"])
def test_an_export_replaces_no_file_it_did_not_write(result, tmp_path, capsys, theirs):
    """export R --format markdown --out deploy deleted the user's deploy/model.plan and
    build_report.json (the folder had no export manifest): an export folder holds only what an
    export wrote there."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / theirs).write_text("the user's own\n")
    refused(
        ["export", result, "--format", "markdown", "--out", deploy],
        capsys,
        theirs,
        "no finished autoprec export wrote",
    )
    assert (deploy / theirs).read_text() == "the user's own\n"


def test_an_export_again_replaces_its_own_files_and_what_its_scripts_made(result, tmp_path, capsys):
    out = tmp_path / "e"
    for fmt in ("trtexec", "markdown"):
        code, err = run(["export", result, "--format", fmt, "--out", out], capsys)
        assert code == 0, err[-3000:]
        if fmt == "trtexec":
            (out / "model.plan").write_text("what build.sh made\n")
    assert sorted(p.name for p in out.iterdir()) == ["BUILD.md", "export.json", "model.onnx"]


def test_an_export_removes_nothing_outside_its_folder_whatever_its_manifest_lists(
    result, tmp_path, capsys
):
    out = tmp_path / "e"
    code, err = run(["export", result, "--format", "markdown", "--out", out], capsys)
    assert code == 0, err[-3000:]
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    manifest = json.loads((out / "export.json").read_text())
    manifest["files"].append("../victim.txt")
    (out / "export.json").write_text(json.dumps(manifest))
    code, err = run(["export", result, "--format", "markdown", "--out", out], capsys)
    assert code == 0 and victim.read_text() == "keep me\n", err[-3000:]


@pytest.mark.parametrize("linked", ["export", "export/trtexec"])
def test_an_export_follows_no_link_in_the_result(result, tmp_path, capsys, linked):
    """ln -s victim2 R/export/trtexec; export R --format trtexec deleted victim2/model.plan,
    layers.json and overwrote its model.onnx and build.sh."""
    victim = tmp_path / "victim2"
    victim.mkdir()
    for name in ("model.plan", "layers.json", "model.onnx", "build.sh"):
        (victim / name).write_text(f"the user's {name}\n")
    r = copy(result, tmp_path)
    (r / linked).parent.mkdir(parents=True, exist_ok=True)
    (r / linked).symlink_to(victim)
    before = untouched(victim)
    refused(["export", r, "--format", "trtexec"], capsys, "export", "symbolic link")
    assert untouched(victim) == before


def test_an_export_into_a_folder_another_export_is_writing_is_refused(result, tmp_path, capsys):
    """Two exports (trtexec, polygraphy) into one --out at once both exited 0; check.sh, said
    written, was gone."""
    from autoprec.export import folder

    out = tmp_path / "both"
    with folder.exporting(out):
        refused(
            ["export", result, "--format", "polygraphy", "--out", out],
            capsys,
            "another autoprec export",
        )
    code, err = run(["export", result, "--format", "polygraphy", "--out", out], capsys)
    assert code == 0 and (out / "check.sh").is_file(), err[-3000:]


# --- what runs: no code from a result ---

HOSTILE_METRIC = """import pathlib
pathlib.Path({marker!r}).write_text("ran")


def loss(reference, candidate):
    return 0.0
"""


def recorded_as(r: Path, edit) -> Path:
    """``r`` with the search's record in every file's header changed by ``edit`` (alike in all)."""
    for name in ("pareto.json", "trials.json", "best/plan.json"):
        document = json.loads((r / name).read_text())
        edit(document["search"])
        (r / name).write_text(json.dumps(document))
    return r


def judged_by(r: Path, metric: str) -> Path:
    """``r`` with its recorded metric changed to ``metric``."""
    def edit(search: dict) -> None:
        search["metric"] = search["spec"]["judge"]["metric"] = metric

    return recorded_as(r, edit)


def hostile_module(folder: Path, name: str, marker: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(HOSTILE_METRIC.format(marker=str(marker)))


@pytest.mark.parametrize(
    "verb",
    [
        ["check", ".", "--max-loss", "1"],
        ["diagnose", "."],
        ["check", ".", "--max-loss", "1", "--metric", "evilmetric:loss"],
        ["diagnose", ".", "--metric", "evilmetric:loss"],
    ],
)
def test_a_received_result_runs_no_code_of_its_own(result, tmp_path, verb):
    """A result searched with --metric evilmetric:loss, copied with a hostile evilmetric.py beside
    it: cd copy && autoprec check . (or diagnose .) imported and ran it, no --metric given, no
    notice. Given --metric, the module is still not taken from the result folder."""
    r = judged_by(copy(result, tmp_path), "evilmetric:loss")
    marker = tmp_path / "ran"
    hostile_module(r, "evilmetric", marker)
    proc = autoprec(*verb, cwd=r, timeout=120)
    said = "never runs code from" if "--metric" in verb else "run only when you name it"
    one_line_error(proc, "--metric evilmetric:loss", said)
    assert not marker.exists()


def test_a_recorded_metric_in_a_package_of_the_result_is_not_run_from_its_parent(result, tmp_path):
    """Recorded as autoprec_out.cls12.evil:loss, the hostile module ran from the result's parent
    folder too."""
    work = tmp_path / "work"
    r = judged_by(copy(result, work / "autoprec_out", "cls12"), "autoprec_out.cls12.evil:loss")
    marker = tmp_path / "ran"
    hostile_module(r, "evil", marker)
    for argv in (
        ["check", "autoprec_out/cls12", "--max-loss", "1"],
        [
            "check",
            "autoprec_out/cls12",
            "--max-loss",
            "1",
            "--metric",
            "autoprec_out.cls12.evil:loss",
        ],
    ):
        one_line_error(autoprec(*argv, cwd=work, timeout=120), "autoprec_out.cls12.evil")
    assert not marker.exists()


def test_a_metric_the_user_names_runs_from_their_own_folder(result, tmp_path):
    r = judged_by(copy(result, tmp_path), "mymetric:loss")
    marker = tmp_path / "ran"
    hostile_module(tmp_path / "mine", "mymetric", marker)
    proc = autoprec(
        "check",
        r,
        "--max-loss",
        "1",
        "--metric",
        "mymetric:loss",
        cwd=tmp_path / "mine",
        timeout=120,
    )
    assert proc.returncode == 0 and marker.exists(), proc.stderr[-3000:]


def test_a_name_polygraphy_would_read_as_its_option_is_refused(tmp_path, capsys):
    """An output named --gen-script=/some/path became a Polygraphy option in the exported check.sh
    (its --atol NAME:1e-05 read as an option by Polygraphy 0.53.6), which wrote the file."""
    import autoprec as api

    model = builders.classifier(12, 4)
    hostile = f"--gen-script={tmp_path / 'written.py'}"
    model.graph.node[-1].output[0] = model.graph.output[0].name = hostile
    path = builders.save(model, tmp_path / "cls.onnx")
    out = tmp_path / "R"
    searching.search(
        api.SearchConfig(
            api.InputSpec(path), study=api.StudySpec(budget=2, warm_start=False), out=out
        )
    )
    refused(
        ["export", out, "--format", "polygraphy", "--out", tmp_path / "p"],
        capsys,
        hostile,
        "option",
    )
    assert not [
        p for p in (tmp_path / "p").rglob("*") if p.is_file()
    ]  # nothing of the export half-made


# --- what ends: every read and loop bounded ---

DEEP = "[" * 100_000 + "]" * 100_000


def _deep_result(result: Path, tmp_path: Path) -> list:
    r = copy(result, tmp_path)
    (r / "trials.json").write_text(DEEP)
    return ["show", r]


def _deep_plan(result: Path, tmp_path: Path) -> list:
    (tmp_path / "plan.json").write_text(DEEP)
    return [
        "check",
        result.parent / "cls.onnx",
        "--plan",
        tmp_path / "plan.json",
        "--max-loss",
        "1",
    ]


def _deep_manifest(result: Path, tmp_path: Path) -> list:
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "export.json").write_text(DEEP)
    return ["export", result, "--format", "markdown", "--out", tmp_path / "e"]


def _deep_space(result: Path, tmp_path: Path) -> list:
    (tmp_path / "space.yaml").write_text("units: " + DEEP)
    return search(result, tmp_path / "o", "--search-space", tmp_path / "space.yaml")


def _deep_labels(result: Path, tmp_path: Path) -> list:
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(images / f"{i}.png")
    (images / "labels.json").write_text('{"labels": ' + DEEP + "}")
    model = builders.save(builders.conv_net(), tmp_path / "conv.onnx")
    return ["search", model, "--data", images, "--out", tmp_path / "o", *QUICK]


def _deep_layers(result: Path, tmp_path: Path) -> list:
    (tmp_path / "layers.json").write_text('{"Layers": ' + DEEP + "}")
    return ["inspect", tmp_path / "layers.json"]


DEEP_INPUTS = {
    "trials.json": _deep_result,
    "plan.json": _deep_plan,
    "export.json": _deep_manifest,
    "space.yaml": _deep_space,
    "labels.json": _deep_labels,
    "layers.json": _deep_layers,
}


@pytest.mark.parametrize("name", sorted(DEEP_INPUTS))
def test_a_document_nested_past_any_parser_is_one_line(result, tmp_path, capsys, name):
    """JSON/YAML nested 100,000 deep: RecursionError in show (trials.json), check --plan, an export
    folder's export.json, --search-space, an image folder's labels.json and inspect."""
    refused(DEEP_INPUTS[name](result, tmp_path), capsys, name, "nested more than")


def test_a_database_server_that_never_answers_is_given_up_on(tmp_path, capsys):
    """A PostgreSQL server that accepts and never answers: 131 s to an error."""
    import socket
    import threading
    import time

    server = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(
        target=lambda: held.extend(server.accept() for _ in range(8)), daemon=True
    ).start()
    started = time.monotonic()
    refused(
        [
            "status",
            "--storage",
            f"postgresql://u:p@127.0.0.1:{server.getsockname()[1]}/db",
            "--study-name",
            "s",
        ],
        capsys,
        "cannot be reached",
        "timeout",
    )
    assert time.monotonic() - started < 60
    server.close()


# --- what is said: one clear line ---


def test_a_search_space_whose_aliases_make_a_billion_values_is_one_line(result, tmp_path, capsys):
    """A fresh pass: nine lines of YAML aliases (9^9 values) held the search for ever."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join([*lines, "units: {MatMul: [fp16, fp32]}"]) + "\n")
    refused(search(result, tmp_path / "o", "--search-space", tmp_path / "bomb.yaml"), capsys,
            "bomb.yaml", "more than 1,000,000 values")


def test_a_metric_whose_import_hangs_is_named(result, tmp_path):
    """A fresh pass: a --metric module that hangs as it is imported held the search, nothing
    said."""
    import subprocess
    import sys
    import threading
    import time

    (tmp_path / "stuck.py").write_text("import time\n\ntime.sleep(600)\n")
    argv = [sys.executable, "-m", "autoprec.app.cli",
            *map(str, search(result, tmp_path / "o", "--metric", "stuck:loss"))]
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)
    reader.start()
    notice = "--metric stuck:loss: importing stuck has taken 10 s"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and notice not in " ".join("".join(said).split()):
        time.sleep(0.5)
    proc.kill()
    proc.wait()
    assert notice in " ".join("".join(said).split()), said


@pytest.mark.parametrize("option", ["--plan", "--ctc-charset", "--search-space"])
def test_a_file_the_user_names_is_read_bounded(result, tmp_path, capsys, option):
    """A fresh pass over hostile sizes: --plan /dev/zero (or a charset, a search space) was read for
    ever."""
    argv = {
        "--plan": ["check", result.parent / "cls.onnx", "--plan", "/dev/zero", "--max-loss", "1"],
        "--ctc-charset": search(
            result, tmp_path / "o", "--metric", "ctc-text", "--ctc-charset", "/dev/zero"
        ),
        "--search-space": search(result, tmp_path / "o", "--search-space", "/dev/zero"),
    }[option]
    refused(
        argv,
        capsys,
        f"{option} /dev/zero" if option != "--search-space" else "/dev/zero",
        "larger than",
    )


def test_a_missing_database_driver_is_told_how_to_install(result, tmp_path, capsys, monkeypatch):
    """--storage postgresql://… without the extra: ModuleNotFoundError psycopg, no install hint."""
    for driver in ("psycopg", "psycopg2"):
        monkeypatch.setitem(__import__("sys").modules, driver, None)
    for argv in (
        search(
            result,
            tmp_path / "o",
            "--storage",
            "postgresql://u:p@127.0.0.1:1/db",
            "--study-name",
            "s",
        ),
        ["status", "--storage", "postgresql+psycopg2://u:p@127.0.0.1:1/db", "--study-name", "s"],
    ):
        refused(argv, capsys, "not installed", "pip install 'autoprec[postgresql]'")


def test_a_short_password_is_hidden_without_garbling_the_message(capsys):
    """The password's redaction replaced its text everywhere ("conn***ction fail***d" with password
    e)."""
    last = refused(
        ["status", "--storage", "postgresql://u:e@127.0.0.1:1/db", "--study-name", "s"],
        capsys,
        "connection",
        "u:***@",
    )
    assert "***ction" not in last


@pytest.mark.parametrize("storage", ["device", "truncated"])
def test_a_storage_that_is_no_database_is_not_called_a_full_disk(result, tmp_path, capsys, storage):
    """ "its disk is full" for sqlite:////dev/null and for a truncated study.db."""
    path = Path("/dev/null")
    if storage == "truncated":
        path = tmp_path / "study.db"
        path.write_bytes((result / "study.db").read_bytes()[:20_000])
    for argv in (
        search(result, tmp_path / "o", "--storage", f"sqlite:///{path}", "--study-name", "s"),
        ["status", "--storage", f"sqlite:///{path}", "--study-name", "s"],
    ):
        last = refused(argv, capsys, str(path), "device" if storage == "device" else "damaged")
        assert "disk is full" not in last


def test_a_budget_past_every_distinct_plan_stops_when_each_is_measured(result, tmp_path):
    """search CLS --budget 1000000000 --precisions fp16,fp32: 4 distinct plans exist; 4,244
    duplicate trials had run at 300 s."""
    out = tmp_path / "o"
    proc = autoprec(
        *search(result, out, "--budget", "1000000000", "--precisions", "fp16,fp32"),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "every one of the 4 distinct plans" in proc.stderr, proc.stderr[-3000:]
    trials = json.loads((out / "trials.json").read_text())["trials"]
    assert len({json.dumps(t["plan"]["precisions"], sort_keys=True) for t in trials}) == 4


def test_a_metric_that_hangs_is_named_while_it_runs_and_when_it_is_stopped(result, tmp_path):
    """A metric that sleeps 60 s a call, default limits: killed at 300 s with nothing said about
    what it waits on."""
    (tmp_path / "slowmetric.py").write_text(
        "import time\n\n\ndef loss(reference, candidate):\n    time.sleep(60)\n    return 0.0\n"
    )
    proc = autoprec(
        *search(result, tmp_path / "o", "--metric", "slowmetric:loss", "--trial-timeout", "6"),
        cwd=tmp_path,
        timeout=120,
    )
    one_line_error(proc, "--metric slowmetric:loss", "--trial-timeout", "slowmetric.py")
    assert "slowmetric.py, line 5" in proc.stderr.split("autoprec: error:")[0], proc.stderr[-3000:]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--no-isolation", "--trial-timeout", "5"], "--trial-timeout need(s) worker processes"),
        (["--no-isolation", "--trial-memory", "4"], "--trial-memory need(s) worker processes"),
        (["--precisions", "fp32"], "with FP32 alone there is no choice to search"),
    ],
)
def test_options_that_cannot_do_what_they_say_are_refused(result, tmp_path, capsys, argv, said):
    """--no-isolation --trial-timeout 5 ignored the timeout; --precisions fp32 was told to add op
    types."""
    refused(search(result, tmp_path / "o", *argv), capsys, said)
    if "--precisions" in argv:
        refused(
            ["sensitivity", result.parent / "cls.onnx", "--out", tmp_path / "s", *argv],
            capsys,
            said,
        )


# --- what is true: inputs read as they are ---


def _images(folder: Path, mode: str) -> Path:
    """Four 16×16 gradients (a quarter of the range each) saved in ``mode``: 16-bit grey, float or
    8-bit."""
    from PIL import Image

    folder.mkdir()
    ramp = np.linspace(0, 1, 256).reshape(16, 16)
    for i in range(4):
        values = ramp * (i + 1) / 4
        image = {
            "I;16": lambda v: Image.fromarray((v * 65535).astype(np.uint16)),
            "F": lambda v: Image.fromarray(v.astype(np.float32)),
            "P": lambda v: Image.fromarray((v * 255).astype(np.uint8)).convert("P"),
        }[mode](values)
        image.save(folder / f"{i}.{'tif' if mode == 'F' else 'gif' if mode == 'P' else 'png'}")
    return folder


@pytest.mark.parametrize("mode", ["I;16", "P"])
def test_images_deeper_than_8_bits_or_of_a_palette_are_read_as_they_look(tmp_path, mode):
    """A folder of 16-bit PNGs: exit 0, no word, 96.8 % of the input values exactly 1.0 (PIL clips
    16-bit on RGB conversion); GIF folders "hold no image files"."""
    from autoprec.analysis.data import load_items
    from autoprec.analysis.model_info import TensorSpec

    items = load_items(
        _images(tmp_path / "images", mode), [TensorSpec("x", (1, 3, 16, 16), "float32")]
    )["x"]
    brightest = items.reshape(4, -1).max(axis=1)
    assert np.allclose(brightest, [0.25, 0.5, 0.75, 1.0], atol=0.01), brightest
    assert (items == 1.0).mean() < 0.01


def test_a_float_image_whose_white_is_unknown_is_refused(tmp_path, capsys):
    """Float TIFFs were clipped like 16-bit PNGs, with no word."""
    model = builders.save(builders.conv_net(), tmp_path / "conv.onnx")
    refused(
        [
            "search",
            model,
            "--data",
            _images(tmp_path / "images", "F"),
            "--out",
            tmp_path / "o",
            *QUICK,
        ],
        capsys,
        "0.tif",
        "float",
    )


def test_a_model_quantized_already_in_q_dq_form_is_refused(result, tmp_path, capsys):
    """A QDQ model from quantize_static: exit 0 as 0/0/3, its INT8 baseline called "all-FP32", INT8
    plans quantizing it again."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.left = [
                {"x": np.random.default_rng(i).normal(size=(4, 16)).astype(np.float32)}
                for i in range(4)
            ]

        def get_next(self):
            return self.left.pop() if self.left else None

    quantized = tmp_path / "qdq.onnx"
    quantize_static(
        str(result.parent / "cls.onnx"), str(quantized), Batches(), quant_format=QuantFormat.QDQ
    )
    refused(
        ["search", quantized, "--out", tmp_path / "o", *QUICK],
        capsys,
        "qdq.onnx",
        "already quantized",
        "QuantizeLinear",
        "FP32 model",
    )


@pytest.mark.parametrize("sent", ["SIGTERM", "SIGHUP"])
def test_a_search_ended_by_a_signal_says_so_and_gives_its_trial_back(result, tmp_path, sent):
    """SIGTERM/SIGHUP ended a search with no message, and the resumed run called the killed trial
    "running elsewhere". The metric is slow (1 s a call) in the signalled run alone, so that a trial is
    running when the signal comes; the resumed run needs no such wait."""
    import signal
    import subprocess
    import sys
    import time

    import optuna

    (tmp_path / "slowish.py").write_text(
        "import os\nimport time\n\n\ndef loss(reference, candidate):\n"
        "    time.sleep(float(os.environ.get('SLOWISH_SECONDS', 0)))\n    return 0.0\n"
    )
    argv = [
        sys.executable,
        "-m",
        "autoprec.app.cli",
        *map(str, search(result, tmp_path / "o", "--metric", "slowish:loss", "--budget", "4")),
    ]
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SLOWISH_SECONDS": "1"})
    storage = f"sqlite:///{tmp_path / 'o' / 'study.db'}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        try:
            trials = optuna.load_study(study_name="autoprec-cls-ort-cpu", storage=storage).trials
        except Exception:  # noqa: BLE001 - not made yet
            continue
        if any(t.state.name == "RUNNING" for t in trials):
            break
    proc.send_signal(getattr(signal, sent))
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 128 + getattr(signal, sent), err[-3000:]
    assert (
        err.strip().splitlines()[-1]
        == f"autoprec: ended by {sent}; run the same command again to resume"
    )
    study = optuna.load_study(study_name="autoprec-cls-ort-cpu", storage=storage)
    assert not [t for t in study.trials if t.state.name == "RUNNING"]
    resumed = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "running elsewhere" not in resumed.stderr, resumed.stderr[
        -3000:
    ]


@pytest.mark.parametrize("where", ["afile", "afile/sub"])
def test_an_artifact_store_where_a_file_stands_is_one_clear_line(result, tmp_path, capsys, where):
    """--artifacts pointing at a file: "File exists"."""
    (tmp_path / "afile").write_text("the user's\n")
    refused(
        search(result, tmp_path / "o", "--artifacts", tmp_path / where),
        capsys,
        "artifact store (--artifacts)",
    )
    assert (tmp_path / "afile").read_text() == "the user's\n"


def test_a_full_disk_while_weights_are_written_names_the_file(tmp_path):
    """Disk full: "a file: No space left", naming no file. A file-size limit stands in for the full
    disk."""
    import subprocess
    import sys

    model = builders.save(builders.classifier(12, 4), tmp_path / "cls.onnx")
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from autoprec.core import stored\n"
        "model = stored.load(Path(sys.argv[1]))\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        "try:\n"
        "    stored.save_models({Path(sys.argv[2]) / 'model.onnx': model}, external=True)\n"
        "except OSError as exc:\n"
        "    print(exc.filename)\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script, model, tmp_path / "out"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.stdout.strip() == str(tmp_path / "out" / "model.onnx.data"), found.stderr[-2000:]


def test_a_model_with_local_functions_is_searched_through_them(tmp_path, capsys):
    """ONNX local functions were refused as an unsupported domain, though ONNX Runtime runs them."""
    from onnx import TensorProto, helper, numpy_helper

    linear = helper.make_function(
        "my.local",
        "Linear",
        ["x", "w"],
        ["y"],
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        [helper.make_opsetid("", 13)],
    )
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
        for name, shape in (("w0", (16, 32)), ("w1", (32, 12)))
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Linear", ["x", "w0"], ["h"], "lin0", domain="my.local"),
            helper.make_node("MatMul", ["h", "w1"], ["y"], "fc1"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 12])],
        weights,
    )
    model = helper.make_model(
        graph,
        functions=[linear],
        opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("my.local", 1)],
    )
    model.ir_version = builders.IR_VERSION
    code, err = run(
        ["search", builders.save(model, tmp_path / "fn.onnx"), "--out", tmp_path / "o", *QUICK],
        capsys,
    )
    assert code == 0, err[-3000:]
    assert "2 precision units (2 searched)" in err


def test_a_model_path_that_is_not_utf8_is_blamed_not_the_model(result, tmp_path, capsys):
    """A valid model was blamed ("fails onnx.checker") for a non-UTF-8 file name."""
    folder = os.fsencode(tmp_path)
    shutil.copy(result.parent / "cls.onnx", folder + b"/m\xff.onnx")
    refused(
        ["search", os.fsdecode(folder + b"/m\xff.onnx"), "--out", tmp_path / "o", *QUICK],
        capsys,
        "not UTF-8",
        "rename the file",
    )


def test_a_study_holding_a_value_nested_past_any_parser_is_one_line(result, tmp_path, capsys):
    """A fresh pass over the study a result folder holds (its database is input too): a trial's
    attribute nested 100,000 deep was a RecursionError in status and in the resumed search."""
    import sqlite3

    r = copy(result, tmp_path)
    with sqlite3.connect(r / "study.db") as database:
        database.execute("UPDATE trial_user_attributes SET value_json = ? WHERE rowid = 1", (DEEP,))
    for argv in (
        [
            "status",
            "--storage",
            f"sqlite:///{r / 'study.db'}",
            "--study-name",
            "autoprec-cls-ort-cpu",
        ],
        search(result, r, "--budget", "3"),
    ):
        refused(argv, capsys, "the study's storage", "nested past any parser")


def test_a_search_writes_none_of_its_results_onto_its_own_inputs(result, tmp_path, capsys):
    """A fresh pass: a model at OUT/best/model.onnx was overwritten by the search's own result, and
    --out the --data folder left figures there that the next run read as data."""
    out = tmp_path / "o"
    (out / "best").mkdir(parents=True)
    model = shutil.copy(result.parent / "cls.onnx", out / "best" / "model.onnx")
    refused(["search", model, "--data", result.parent / "d.npz", "--out", out, *QUICK], capsys,
            "best/model.onnx", "replace its own input")
    data = tmp_path / "items"
    data.mkdir()
    shutil.copy(result.parent / "d.npz", data / "d.npz")
    refused(["search", result.parent / "cls.onnx", "--data", data, "--out", data, *QUICK], capsys,
            "the --data folder")


def test_a_search_replaces_no_result_of_another_model_nor_a_file_it_did_not_write(result, tmp_path, capsys):
    """A fresh pass: --out holding another model's result (another file name) was replaced without a word."""
    other = builders.save(builders.classifier(12, 4, seed=7), tmp_path / "other.onnx")
    r = copy(result, tmp_path)
    before = (r / "pareto.json").read_bytes()
    refused(["search", other, "--data", result.parent / "d.npz", "--out", r, *QUICK], capsys,
            "another model (cls.onnx")
    assert (r / "pareto.json").read_bytes() == before
    (r / "pareto.json").write_text("my own notes\n")
    refused(search(result, r), capsys, "pareto.json autoprec did not write")


def test_a_report_replaces_no_file_that_is_not_a_page(result, tmp_path, capsys):
    """A fresh pass: report --output onto the result's own model replaced it with HTML."""
    r = copy(result, tmp_path)
    model = shutil.copy(result.parent / "cls.onnx", tmp_path / "mine.onnx")
    before = model.read_bytes()
    refused(["report", r, "--output", model], capsys, "not an HTML page")
    assert model.read_bytes() == before
    page = tmp_path / "page.html"
    assert run(["report", r, "--output", page], capsys)[0] == 0
    assert run(["report", r, "--output", page], capsys)[0] == 0  # its own page again: replaced


def test_an_override_that_names_no_unit_is_refused(result, tmp_path, capsys):
    """A fresh pass: --override 'FC1=fp32' (the unit is fc1) pinned nothing, without a word."""
    refused(search(result, tmp_path / "o", "--override", "FC1=fp32"), capsys, "'FC1' matches no unit", "fc1")


def test_data_whose_items_are_all_one_input_is_refused(result, tmp_path, capsys):
    """A fresh pass: all-zero items (a broken preprocessing) judged every plan at loss 0."""
    np.savez(tmp_path / "zeros.npz", x=np.zeros((32, 16), np.float32))
    refused(["search", result.parent / "cls.onnx", "--data", tmp_path / "zeros.npz", "--out", tmp_path / "o",
             *QUICK], capsys, "all 32 items are the same input", "every value")


def test_a_sqlite_url_is_read_as_sqlalchemy_opens_it():
    """A fresh pass: search wrote 's x.db' for sqlite:///s%20x.db; status looked for 's%20x.db'."""
    from autoprec.study.coordination import sqlite_path

    assert sqlite_path("sqlite:///runs/s%20x.db?timeout=3") == Path("runs/s x.db")



@pytest.mark.parametrize("case", ["newer schema", "inspect a folder", "out a file", "override all", "data a model"])
def test_a_refusal_names_the_cause_and_its_fix(result, tmp_path, capsys, case):
    """A fresh pass's unclear lines: a newer result told to rerun the search (it would overwrite it), a folder
    given to inspect called missing, --out a file 'File exists', an --override leaving nothing to search blamed
    on the search space, a model given as --data called 'pickled data'."""
    model, data = result.parent / "cls.onnx", result.parent / "d.npz"
    if case == "newer schema":
        r = copy(result, tmp_path)
        document = json.loads((r / "pareto.json").read_text())
        document["schema"] = "autoprec.pareto/99"
        (r / "pareto.json").write_text(json.dumps(document))
        refused(["show", r], capsys, "newer autoprec", "upgrade")
    elif case == "inspect a folder":
        refused(["inspect", tmp_path], capsys, "a folder")
    elif case == "out a file":
        (tmp_path / "afile").write_text("mine\n")
        refused(["search", model, "--data", data, "--out", tmp_path / "afile", *QUICK], capsys, "a file, not a folder")
    elif case == "override all":
        refused(search(result, tmp_path / "o", "--override", "*=fp32"), capsys, "--override")
    else:
        refused(["search", model, "--data", model, "--out", tmp_path / "o", *QUICK], capsys,
                "not a NumPy array file")


def test_a_utf8_path_under_a_c_locale_is_told_to_set_the_locale(result, tmp_path):
    """A fresh pass: under LC_ALL=C (UTF-8 mode off) a UTF-8 path was said to be 'not UTF-8'."""
    import subprocess
    import sys

    folder = tmp_path / "ünï"
    folder.mkdir()
    model = shutil.copy(result.parent / "cls.onnx", folder / "módel.onnx")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    proc = subprocess.run([sys.executable, "-m", "autoprec.app.cli", "search", os.fsencode(model), "--out",
                           tmp_path / "o", *QUICK], capture_output=True, env=env, timeout=300)
    last = proc.stderr.decode(errors="replace").strip().splitlines()[-1]
    assert proc.returncode == 2 and "LANG=C.UTF-8" in last, last


def test_a_model_onnx_runtime_cannot_load_is_said_so_not_blamed_on_shapes(result, tmp_path, capsys):
    """A fresh pass: two nodes of one name (the checker passes it) were 'does not run at input shapes …
    (Load model from …/.candidate-N-0.onnx failed …); check --shape'."""
    import onnx

    model = onnx.load(str(result.parent / "cls.onnx"))
    for node in model.graph.node:
        node.name = "a"
    path = tmp_path / "twins.onnx"
    onnx.save(model, str(path))
    last = refused(["search", path, "--data", result.parent / "d.npz", "--out", tmp_path / "o", *QUICK], capsys,
                   "ONNX Runtime cannot load it", "re-export")
    assert ".candidate" not in last and "--shape" not in last


def test_output_that_cannot_be_written_is_said(result, tmp_path):
    """A fresh pass: show --json with standard output closed exited 0 having written nothing; a reader
    that ended first (| head) left exit 1 and no word."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "autoprec.app.cli", "show", result, "--json"]
    closed = subprocess.run(command, capture_output=False, stderr=subprocess.PIPE, text=True, timeout=120,
                            preexec_fn=lambda: os.close(1))
    assert closed.returncode == 2 and "standard output is closed" in closed.stderr, closed.stderr
    piped = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    piped.stdout.close()  # the reader ends before a line is written
    said = piped.stderr.read()
    assert piped.wait(timeout=120) == 141 and "reader ended" in said, said


def test_weights_given_as_graph_inputs_too_are_said_to_leave_the_shipped_inputs(result, tmp_path, capsys):
    """A fresh pass: an IR 3 style model (its weights listed as inputs too, which a caller may replace)
    shipped best/ taking x alone, unsaid."""
    import onnx

    model = onnx.load(str(result.parent / "cls.onnx"))
    for weight in model.graph.initializer:
        model.graph.input.append(onnx.helper.make_tensor_value_info(weight.name, weight.data_type, weight.dims))
    path = tmp_path / "ir3.onnx"
    onnx.save(model, str(path))
    code, err = run(["search", path, "--data", result.parent / "d.npz", "--out", tmp_path / "o", *QUICK], capsys)
    assert code == 0 and "weight(s) are graph inputs too (w0, w1" in " ".join(err.split()), err[-2000:]


@pytest.mark.parametrize("edit", ["share 1e308", "share nan", "gain inf", "loss nan"])
def test_a_sensitivity_whose_figures_cannot_be_is_refused_in_every_view(result, tmp_path, capsys, edit):
    """Held-out variant of the pass's family: sensitivity.json's share 1e308 or 'nan' was an internal error in
    plot, and a NaN loss was shown as measured."""
    r = copy(result, tmp_path)
    document = json.loads((r / "sensitivity.json").read_text())
    unit = document["units"][0]
    field, value = edit.split()
    target = unit if field == "share" else unit[field]
    key = field if field == "share" else next(iter(target))
    target[key] = float(value) if value == "1e308" else value
    (r / "sensitivity.json").write_text(json.dumps(document))
    for argv in (["show", r], ["plot", r], ["report", r, "--output", tmp_path / "page.html"]):
        refused(argv, capsys, "sensitivity.json", "not as autoprec wrote it")


@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
def test_a_signal_that_lands_in_a_finaliser_still_ends_the_command(sent):
    """A signal handled while Python runs a finaliser or a garbage collector's callback (SQLAlchemy's, in a
    search) raises there, where Python ignores the exception: the command went on as if never signalled (the
    signal tests failed about one suite in eight). It is raised again where the command is."""
    import signal
    import time

    from autoprec.app.terminations import terminations_interrupt

    class Dropped:
        def __del__(self):
            signal.raise_signal(getattr(signal, sent))  # handled inside this finaliser
            for _ in range(1000):
                pass

    # Python's own Ctrl-C handler, as a command has it (a test process may hold another)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), terminations_interrupt():
            Dropped()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the command going on
                time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_finaliser_that_ran_out_of_stack_is_not_said_above_the_one_line(monkeypatch):
    """Reading a stored value nested past any parser, a finaliser that ran while the stack was nearly
    spent raised RecursionError there: Python said it in lines of traceback above the one-line error
    (in the suite, pytest's own report of it ran out of stack too). Another finaliser's error is said
    as before."""
    import gc
    import sys

    from autoprec.app.terminations import terminations_interrupt

    said = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: said.append(unraisable.exc_value))

    class Deep:
        def __del__(self):
            raise RecursionError("maximum recursion depth exceeded")

    class Broken:
        def __del__(self):
            raise ValueError("a finaliser's own error")

    with terminations_interrupt():
        Deep()
        Broken()
        gc.collect()
    assert [type(e) for e in said] == [ValueError]

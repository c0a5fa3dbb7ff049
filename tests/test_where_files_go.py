"""Where a command writes: only where it was told, through no link planted on the way, never into the files of the
result it reads; what it cannot write is one line naming the path. Some probes run ``autoprec`` as a user would (a
process of its own, its own working directory and TMPDIR), the others in this process."""

import os
import shutil
from pathlib import Path

import pytest
from cli import autoprec, clean, files, one_line_error, refused, run
from searching import SHORTEST_FINAL_TIMING


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


def test_a_temporary_directory_too_deep_for_a_socket_still_measures(workdir, tmp_path):
    """multiprocessing's forkserver listens on a Unix socket under the temporary directory: a TMPDIR
    deep in a CI's folders made every search "autoprec: error: a file: AF_UNIX path too long"."""
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    proc = autoprec("search", "conv.onnx", "--budget", 1, "--no-progress", "--no-warm-start",
                    *SHORTEST_FINAL_TIMING, cwd=workdir, tmp=deep)
    assert proc.returncode == 0, proc.stderr
    assert (workdir / "autoprec_out" / "conv" / "pareto.json").is_file()


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


def test_unwritable_output_paths_are_one_line(conv_result, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for argv in (["report", conv_result, "--output", blocker / "report.html"],
                 ["inspect", Path(__file__).parent / "fixtures" / "tensorrt" / "mobilenet_qat_layers_excerpt.json",
                  "--json", blocker / "x.json"],
                 ["export", conv_result, "--format", "trtexec", "--out", blocker / "e"],
                 ["diagnose", conv_result, "--out", blocker / "d"]):
        code, err = run(argv, capsys)
        clean(code, err, allowed=(2,))
        assert "a-file" in err.strip().splitlines()[-1]


def test_a_failed_write_names_its_file(tmp_path):
    import errno

    from autoprec.core import atomic

    def full(_):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as raised:
        atomic.write_with(tmp_path / "pareto.json", full)
    assert raised.value.filename == str(tmp_path / "pareto.json") and not list(tmp_path.iterdir())


@pytest.mark.parametrize("fmt", ["trtexec", "triton", "markdown", "report"])
@pytest.mark.parametrize("into", ["best", ".", "cache"])
def test_an_export_into_the_results_own_files_is_refused(conv_result, tmp_path, capsys, fmt, into):
    """export --out RESULT/best overwrote the shipped best/model.onnx with the trtexec form; report --output
    RESULT/best/model.onnx (or pareto.json) replaced it with a page."""
    copy = tmp_path / "r"
    shutil.copytree(conv_result, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    if fmt == "report":
        target = copy / into / ("model.onnx" if into == "best" else "pareto.json" if into == "." else "r.html")
        refused(["report", copy, "--output", target], capsys, "one of the result's own files")
    else:
        refused(["export", copy, "--format", fmt, "--out", copy / into], capsys, "inside the result")
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before

"""plot, report, show, compare: files exist, render, and carry the numbers of the result they were made from."""
import json
import os
import shutil
import subprocess
from dataclasses import replace

import builders
import numpy as np
import pytest
from PIL import Image

import autoprec
from autoprec.app.cli import main


@pytest.fixture(scope="module")
def result_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    model, data = builders.conv_with_data(root, 8)
    a = root / "a"
    b = root / "b"
    autoprec.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data),
            judge=autoprec.JudgeSpec(max_loss=0.05),
            study=autoprec.StudySpec(budget=6),
            out=a,
        )
    )
    autoprec.search(
        autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=5, seed=7), out=b)
    )
    return a, b


def _code(argv):
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _not_blank(path):
    pixels = np.asarray(Image.open(path).convert("L"), dtype=np.float32)
    return pixels.std() > 10


def test_plot_redraws_both_figures(result_dirs):
    a, _ = result_dirs
    for name in ("pareto.png", "layers.png"):
        (a / name).unlink()
    assert _code(["plot", str(a)]) == 0
    for name in ("pareto.png", "layers.png"):
        image = Image.open(a / name)
        assert image.format == "PNG" and image.width >= 800 and _not_blank(a / name)


def test_show_prints_the_front_and_json_matches_the_files(result_dirs, capsys):
    a, _ = result_dirs
    pareto = json.loads((a / "pareto.json").read_text())
    assert _code(["show", str(a)]) == 0
    out = capsys.readouterr().out
    for trial in pareto["front"]:
        assert f"{trial['final_latency_ms']:.3f}" in out
    assert f"chosen: trial {pareto['chosen']}" in out and "chosen plan (trial" in out and "conv1" in out
    assert _code(["show", str(a), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["chosen"] == pareto["chosen"] and shown["front"] == pareto["front"]


def test_compare_puts_two_runs_side_by_side(result_dirs, capsys):
    a, b = result_dirs
    assert _code(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert str(a) in out.replace("\n", "") or a.name in out
    assert "chosen latency" in out and "units chosen differently" in out and "all fp32" in out


def test_reading_a_folder_that_is_no_result_fails_clearly(tmp_path, capsys):
    assert _code(["show", str(tmp_path)]) == 2
    assert "no pareto.json there" in capsys.readouterr().err


def _chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian's chromium (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return [found, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def test_report_is_self_contained_and_renders_in_chromium(result_dirs, tmp_path):
    a, _ = result_dirs
    assert _code(["report", str(a)]) == 0
    page = (a / "report.html").read_text()
    pareto = json.loads((a / "pareto.json").read_text())
    chosen = next(t for t in pareto["front"] if t["trial"] == pareto["chosen"])
    assert f"{chosen['final_latency_ms']:.4g}" in page
    assert page.count("data:image/png;base64,") == 2 and "src=\"http" not in page
    assert pareto["engine"]["device"] in page and pareto["engine"]["version"] in page
    browser = _chromium() + [f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        browser + ["--dump-dom", (a / "report.html").as_uri()], capture_output=True, text=True, timeout=120
    )
    assert "Pareto front" in dom.stdout and f"Chosen: trial {chosen['trial']}" in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run(browser + ["--window-size=1280,1600", f"--screenshot={shot}", (a / "report.html").as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and _not_blank(shot)


def test_the_report_fits_a_1280_pixel_window_whatever_the_outputs_and_names_a_zoo_model(result_dirs, tmp_path):
    """Six outputs with long names, each with every metric: the page still fits 1280 pixels in chromium (was
    one column per output and metric, cut off at the window's edge); a zoo model is titled by its zoo name."""
    import shutil as sh

    a, _ = result_dirs
    copy = tmp_path / "wide"
    sh.copytree(a, copy)
    for name in ("pareto.json", "trials.json", "best/plan.json"):  # (each file records a trial's metrics alike)
        document = json.loads((copy / name).read_text())
        for trial in document.get("front", document.get("trials", [document])):
            values = next(iter(trial["metrics"].values()))
            trial["metrics"] = {f"detections_at_stride_{8 * 2 ** i}_of_the_feature_pyramid": values for i in range(6)}
        document["search"]["spec"]["inputs"]["model"] = "zoo:ppocr-cls"
        (copy / name).write_text(json.dumps(document))
    assert _code(["report", str(copy)]) == 0
    page = (copy / "report.html").read_text()
    assert "<title>autoprec — zoo:ppocr-cls on " in page
    probe = copy / "probe.html"
    widest = "Math.max(...Array.from(document.querySelectorAll('table'), t => t.getBoundingClientRect().right))"
    probe.write_text(page.replace("</body>", f"<script>document.title = 'width ' + Math.ceil({widest})</script></body>"))
    browser = _chromium() + [f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600"]
    dom = subprocess.run(browser + ["--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    width = int(dom.split("<title>width ")[1].split("<")[0])
    assert width <= 1280, width


@pytest.mark.parametrize("columns", [None, "40"])
def test_show_in_a_log_cuts_no_cell(result_dirs, tmp_path, capsys, monkeypatch, columns):
    """Written to a pipe or a CI log (no terminal, no $COLUMNS), a front table wider than 80 columns keeps every
    number and the chosen mark (rich cut it to 80: "tri…", "×fp…", the mark gone)."""
    import shutil as sh

    a, _ = result_dirs
    copy = tmp_path / "long"
    sh.copytree(a, copy)
    pareto = json.loads((copy / "pareto.json").read_text())
    pareto["search"]["metric"] = "cosine-of-every-output-concatenated"
    (copy / "pareto.json").write_text(json.dumps(pareto))
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:  # a narrow terminal: cells wrap (folded), none is cut
        monkeypatch.setenv("COLUMNS", columns)
    assert _code(["show", str(copy)]) == 0
    shown = capsys.readouterr().out
    assert "…" not in shown
    if columns is None:
        assert "chosen" in shown and "loss (cosine-of-every-output-concatenated)" in shown


def test_the_report_counts_early_rejections_and_the_table_explains_its_warning_mark(result_dirs, tmp_path):
    from rich.console import Console

    from autoprec.results import console
    from autoprec.results.files import read_result_dir
    from autoprec.results.report import write_report

    a, _ = result_dirs
    files = read_result_dir(a)
    rejected = len(files.pareto["search"]["rejected"])
    page = write_report(files, tmp_path / "r.html").read_text()
    assert f"{files.pareto['search']['trials']} measured, {rejected} rejected early" in page
    unstable = json.loads(json.dumps(files.pareto))
    unstable["front"][0]["latency_unstable"] = True
    screen = Console(record=True, width=200)
    screen.print(console.front_table(replace(files, pareto=unstable)))
    text = screen.export_text()
    assert "⚠" in text and "timing stayed spread" in text
    screen = Console(record=True, width=200)
    screen.print(console.front_table(files))
    assert ("timing stayed spread" in screen.export_text()) == any(t["latency_unstable"] for t in files.pareto["front"])

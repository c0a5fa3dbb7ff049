"""plot, report, show, compare: files exist, render, and carry the numbers of the result they were made from."""
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace

import builders
import numpy as np
import pytest
import searching
from cli import exit_code
from PIL import Image

import autoprec


@pytest.fixture(scope="module")
def result_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    model, data = builders.conv_with_data(root, 8)
    a = root / "a"
    b = root / "b"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data),
            judge=autoprec.JudgeSpec(max_loss=0.05),
            study=autoprec.StudySpec(budget=6),
            out=a,
        )
    )
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=5, seed=7), out=b)
    )
    assert not list(a.glob("*.png")) and not list(b.glob("*.png"))  # searched with --no-plots: no figure drawn
    return a, b


def _not_blank(path):
    pixels = np.asarray(Image.open(path).convert("L"), dtype=np.float32)
    return pixels.std() > 10


def test_plot_draws_both_figures_of_a_search_run_without_them(result_dirs):
    a, _ = result_dirs
    for name in ("pareto.png", "layers.png"):
        (a / name).unlink(missing_ok=True)  # (a report drawn before this test drew them)
    assert exit_code(["plot", str(a)]) == 0
    for name in ("pareto.png", "layers.png"):
        image = Image.open(a / name)
        assert image.format == "PNG" and image.width >= 800 and _not_blank(a / name)


def test_figures_drawn_side_by_side_are_the_figures_drawn_in_one_process(result_dirs, tmp_path):
    """A search draws its figures each in a process of its own (issue 68: 1.2 -> 0.6 s of its writing):
    the same files as one process draws, and a figure that fails there fails the search, as it would here."""
    from autoprec.measure.isolation import start_worker_server
    from autoprec.results.files import read_result_dir
    from autoprec.results.plots import DRAWING_MODULES, plot_result_dir

    start_worker_server(DRAWING_MODULES)
    drawn = {}
    for side_by_side in (False, True):
        copy = shutil.copytree(result_dirs[0], tmp_path / str(side_by_side))
        for old in copy.glob("*.png"):
            old.unlink()
        written = plot_result_dir(read_result_dir(copy), side_by_side=side_by_side)
        drawn[side_by_side] = {path.name: path.read_bytes() for path in written}
    assert set(drawn[True]) == {"pareto.png", "layers.png", "sensitivity.png"}
    assert drawn[True] == drawn[False]
    result = read_result_dir(tmp_path / "True")
    (tmp_path / "True" / "pareto.json").write_text("{")  # what the figures' processes read: broken after reading here
    with pytest.raises(Exception, match="pareto.json"):
        plot_result_dir(result, side_by_side=True)


def test_show_prints_the_front_and_json_matches_the_files(result_dirs, capsys):
    a, _ = result_dirs
    pareto = json.loads((a / "pareto.json").read_text())
    assert exit_code(["show", str(a)]) == 0
    out = capsys.readouterr().out
    printed = re.findall(r"\d+\.\d+", out)
    for trial in pareto["front"]:  # to the decimals the table gives it (more where its range needs them)
        value = trial["final_latency_ms"]
        assert any(abs(float(ms) - value) <= 0.501 * 10.0 ** -len(ms.partition(".")[2]) for ms in printed), value
    assert f"chosen: trial {pareto['chosen']}" in out and "chosen plan (trial" in out and "conv1" in out
    assert exit_code(["show", str(a), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["chosen"] == pareto["chosen"] and shown["front"] == pareto["front"]


def test_compare_puts_two_runs_side_by_side(result_dirs, capsys):
    a, b = result_dirs
    assert exit_code(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert str(a) in out.replace("\n", "") or a.name in out
    assert "chosen latency" in out and "units chosen differently" in out and "all fp32" in out
    assert "/ 0.05" in out and "/ none (the knee)" in out and "None" not in out  # b: no --max-loss


def test_reading_a_folder_that_is_no_result_fails_clearly(tmp_path, capsys):
    assert exit_code(["show", str(tmp_path)]) == 2
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
    assert exit_code(["report", str(a)]) == 0
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
    assert exit_code(["report", str(copy)]) == 0
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
    assert exit_code(["show", str(copy)]) == 0
    shown = capsys.readouterr().out
    assert "…" not in shown
    if columns is None:
        assert "chosen" in shown and "loss: cosine-of-every-output-concatenated loss" in shown


def test_the_report_counts_early_rejections_and_the_table_explains_its_warning_mark(result_dirs, tmp_path):
    from rich.console import Console

    from autoprec.results import console
    from autoprec.results.files import read_result_dir
    from autoprec.results.report import write_report

    a, _ = result_dirs
    files = read_result_dir(a)
    page = write_report(files, tmp_path / "r.html").read_text()
    assert f"{files.facts.trials} measured, {files.facts.rejected} rejected early" in page
    first = files.pareto.front[0]
    spread = replace(first.measurement.latency, p90_ms=first.measurement.latency.median_ms * 10)  # timing stayed spread
    unstable = replace(first, measurement=replace(first.measurement, latency=spread))
    screen = Console(record=True, width=200)
    screen.print(console.front_table(replace(files, pareto=replace(files.pareto, front=(unstable,
                                                                                         *files.pareto.front[1:])))))
    text = screen.export_text()
    assert "⚠" in text and "timing stayed spread" in text
    screen = Console(record=True, width=200)
    screen.print(console.front_table(files))
    assert ("timing stayed spread" in screen.export_text()) == any(t.measurement.unstable for t in files.pareto.front)


def _diagnosis_rows(names):
    from autoprec.record.per_unit import UnitError

    return [UnitError(i, name, "Conv", ("int8", "fp16", "fp32")[i % 3], f"{name}_out", 10.0 ** -(i % 7), 1.0, 0.1,
                      10.0 ** -(1 + i % 5) if i % 3 != 2 else 0.0, 10.0 ** -(2 + i % 6) if i % 3 != 2 else 0.0)
            for i, name in enumerate(names)]


def test_every_figure_reads_once_drawn(result_dirs):
    """The trade-off, layers, sensitivity and diagnosis figures, drawn and read back: no tick label in raw math text
    (log axes printed '$\\mathdefault{10^{-2}}$' with math text off), no title or label past the canvas' edge (the
    layers figure cut its title, its row labels and every unit name), no tick labels over one another."""
    import figures

    from autoprec.results import plots
    from autoprec.results.files import read_result_dir

    result = read_result_dir(result_dirs[0])
    assert result.sensitivity is not None
    drawn = {
        "pareto": plots.pareto_figure(result),
        "layers": plots.layers_figure(result),
        "sensitivity": plots.sensitivity_figure(result.sensitivity, result.model_name),
        "diagnosis": plots.errors_figure(_diagnosis_rows([f"block{i}/conv/Conv_{i}" for i in range(30)]), "t"),
    }
    for name, fig in drawn.items():
        assert figures.problems(fig) == [], name
        assert all("$" not in text for text in figures.tick_texts(fig)), name
    assert any(text in ("10⁻³", "0.001") for text in figures.tick_texts(drawn["diagnosis"]))


def test_the_uniform_plans_labels_do_not_print_over_one_another(result_dirs, monkeypatch):
    """All-FP32, all-FP16 and all-INT8 at one point (the closest they can be): their labels stack, each readable."""
    import figures

    from autoprec.results import plots
    from autoprec.results.files import read_result_dir

    result = read_result_dir(result_dirs[0])
    fp32 = result.uniform_trial("fp32")
    monkeypatch.setattr(type(result), "uniform_trial", lambda self, precision: fp32)
    fig = plots.pareto_figure(result)
    labels = [text.get_text() for ax in fig.axes for text in ax.texts]
    assert labels == ["all fp32", "all fp16", "all int8"] and figures.problems(fig) == []


def test_tick_values_read_as_plain_numbers():
    from autoprec.results.plots import number_text

    assert [number_text(v) for v in (0, 0.01, 0.25, 300, 1e-5, 2e-5, -1e-9, 3e5)] == [
        "0", "0.01", "0.25", "300", "10⁻⁵", "2×10⁻⁵", "-10⁻⁹", "3×10⁵"]


def _table_rows(table):
    """A rich table as printed: its rows' cells, by column header."""
    from rich.console import Console

    screen = Console(record=True, width=300)
    screen.print(table)
    lines = [line for line in screen.export_text().splitlines() if line.startswith(("┃", "│"))]
    cells = [[c.strip() for c in line.strip("┃│").split("┃" if line.startswith("┃") else "│")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[1:]]


def test_tables_agree_with_themselves_and_hold_every_trial_a_line_names(result_dirs, tmp_path):
    """A front row's median lies inside its own range (was: the re-timing's median beside the trial's own p10–p90,
    apart where the machine drifted); a trial the lines name (a rival, the plan not shipped, one left out on the
    calibration batches) is a row of the table (was: missing); its ×fp32 cell is the figure the line states (was:
    '—' where all-FP32 shipped, beside a line saying 1.04×); the report's table holds the same rows."""
    from autoprec.results import console
    from autoprec.results.files import read_result_dir
    from autoprec.results.report import write_report

    copy = tmp_path / "named"
    shutil.copytree(result_dirs[0], copy)
    pareto, trials = (json.loads((copy / name).read_text()) for name in ("pareto.json", "trials.json"))
    chosen = pareto["chosen"]
    off = [t["trial"] for t in trials["trials"] if t["trial"] not in {f["trial"] for f in pareto["front"]}]
    assert len(off) >= 2
    for trial in [*pareto["front"], *trials["trials"]]:  # the machine drifted: re-timed 3× faster than its own runs
        if trial["trial"] == chosen:
            trial["retimed_ms"] = [trial["latency_ms"]["median_ms"] / 3 * f for f in (0.95, 1.0, 1.1)]
            trial["final_latency_ms"] = trial["latency_ms"]["median_ms"] / 3
    claim = {"speedup": 1.04, "low": 0.98, "high": 1.1, "confidence": 0.95, "rounds": 6, "beyond_timing_noise": False}
    why = "not faster than all-FP32 beyond timing noise (1.04× (0.98–1.10, 95 %)): best/ holds the all-FP32 plan"
    pareto["not_shipped"] = {"trial": off[0], **claim, "why": why}
    pareto["final_rivals"] = [{"trial": off[1], **claim, "speedup": 1.02}]
    pareto["chosen_vs_fp32"] = None  # all-FP32's numbers stand for the shipped plan's
    pareto["search"]["held_out"] = {"batches": 4, "max_loss": 0.05, "engine": "onnxruntime CPUExecutionProvider",
                                    "judged": [{"trial": off[-1], "loss": 0.5}]}
    plan = json.loads((copy / "best" / "plan.json").read_text())
    edited = next(t for t in trials["trials"] if t["trial"] == plan["trial"])  # best/ records its plan's times too
    plan.update(final_latency_ms=edited["final_latency_ms"], retimed_ms=edited["retimed_ms"])
    for name, document in (("pareto.json", pareto), ("trials.json", trials), ("best/plan.json", plan)):
        (copy / name).write_text(json.dumps(document))
    result = read_result_dir(copy)
    rows = _table_rows(console.front_table(result))
    shown = {int(row["trial"]): row for row in rows}
    lines = " ".join(console.chosen_summary(result.facts, result.versus, result.shown_chosen()))
    named = {int(n) for n in re.findall(r"trial (\d+)", lines)}
    assert named >= {chosen, off[0], off[1], off[-1]} and named <= set(shown)
    for row in rows:
        low, high = map(float, row["range"].split("–"))
        assert low <= float(row["ms"].rstrip(" ⚠")) <= high, row
        assert row["×fp32"] != "—"
    assert shown[off[0]]["×fp32"] == "1.04" and "not shipped" in shown[off[0]][""] and "1.04×" in lines
    assert shown[off[1]]["×fp32"] == "1.02" and "rival" in shown[off[1]][""]
    assert "left out" in shown[off[-1]][""]
    page = write_report(result, tmp_path / "r.html").read_text()
    assert all(f"<td>{n}</td>" in page for n in named)


def test_the_trade_off_draws_what_the_claims_rest_on_and_marks_a_plan_left_out(result_dirs,
                                                                               tmp_path):
    """Issue 69: pareto.png put all-FP32 at 13.3 ms and the chosen plan at 1.84 ms (7.2× by eye)
    beside a claimed 2.45×: absolute figures from other loads. The figure now draws each plan's
    speed-up over all-FP32 as the tables state it (the final timing's for the chosen plan), and a
    front plan past the limit on the calibration batches is marked, off the front line."""
    import figures

    from autoprec.results import plots
    from autoprec.results.files import read_result_dir
    from autoprec.results.rows import trial_rows

    copy = tmp_path / "held"
    shutil.copytree(result_dirs[0], copy)
    pareto = json.loads((copy / "pareto.json").read_text())
    trials = json.loads((copy / "trials.json").read_text())["trials"]
    left = next(t["trial"] for t in [*pareto["front"], *trials] if t["trial"] != pareto["chosen"]
                and t["accuracy_loss"] != "inf")
    pareto["search"]["held_out"] = {"batches": 4, "max_loss": 0.05,
                                    "engine": "onnxruntime CPUExecutionProvider",
                                    "judged": [{"trial": left, "loss": 0.5}]}
    (copy / "pareto.json").write_text(json.dumps(pareto))
    result = read_result_dir(copy)
    stated, _ = plots.claimed_points(result)
    tables = {row.number: row.over_fp32 for row in trial_rows(result)}
    assert {p.trial.number: p.speedup for p in stated} == tables  # the figure and the tables agree
    if result.versus.fp32 is not None:
        chosen = next(p for p in stated if p.trial.number == result.chosen_number)
        assert chosen.speedup == result.versus.fp32.speedup
    fig = plots.pareto_figure(result)
    ax = fig.axes[0]
    texts = [t.get_text() for t in figures.drawn_texts(fig)]
    assert "left out: past --max-loss on the calibration batches" in texts
    assert any(t.startswith("speed-up over all-FP32") for t in texts)
    assert not any("latency" in t for t in texts)
    assert any(t.startswith("loss: cosine loss (1 − cosine)") for t in texts)
    front_x = list(ax.containers[0].lines[0].get_xdata())
    assert tables[left] not in front_x and len(front_x) >= 1
    assert figures.problems(fig) == []
    plots.plot_pareto(result, tmp_path / "pareto.png")


def test_every_view_names_a_figure_once_and_in_one_direction(result_dirs, tmp_path):
    """Issue 69: the report's accuracy table said "cosine 0.981574" (a similarity) beside "cosine
    loss 1.38e-05" elsewhere: every table says the loss (1 − cosine), with its direction, as the
    loss column does."""
    from autoprec.results import console
    from autoprec.results.files import read_result_dir
    from autoprec.results.report import write_report

    result = read_result_dir(result_dirs[0])
    page = write_report(result, tmp_path / "r.html").read_text()
    assert "<th>cosine loss (1 − cos) ↓</th>" in page and "<th>cosine</th>" not in page
    assert "<th>rel. L2 error ↓</th>" in page and "loss: cosine loss (1 − cosine) ↓" in page
    chosen = result.shown_chosen()
    output, values = next(iter(chosen.metrics.items()))
    assert f"<td>{1.0 - values['cosine']:.6g}</td>" in page
    header = _table_rows(console.front_table(result))[0]
    assert any("loss: cosine loss (1 − cosine)" in cell for cell in header)


def test_a_latency_is_shown_inside_the_range_shown_beside_it():
    """A steady machine's range can be narrower than a latency's three significant figures (0.022818–0.022824 beside
    0.0228): the front table's latency takes the range's decimals."""
    from autoprec.results.console import ms_range, ms_within

    for ms, low, high in ((0.02282, 0.022818, 0.022824), (13.3, 12.0, 14.0), (0.0103, 0.0101, 0.0104),
                          (5.00004, 5.00001, 5.00009)):
        shown_low, shown_high = map(float, ms_range(low, high).split("–"))
        assert shown_low <= float(ms_within(ms, low, high)) <= shown_high, (ms, low, high)

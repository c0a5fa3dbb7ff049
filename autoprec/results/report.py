"""One self-contained HTML report of a result directory: figures embedded, every number in
tables."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

from autoprec.core import atomic, untrusted
from autoprec.core.errors import AutoprecError
from autoprec.record.verdict import ratio_text
from autoprec.results.files import ResultFiles
from autoprec.results.plots import plot_result_dir
from autoprec.results.profile_lines import shape_lines
from autoprec.results.rows import (
    COLUMNS_SAID,
    DECISIONS,
    TrialRow,
    decisions,
    figure,
    loss_name,
    order_said,
    roles_said,
    trial_rows,
)

FIGURE_BYTES = 64 << 20  # the most a figure the report embeds may hold (autoprec's own: < 1 MB)

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } th { background: #f4f4f4; }
td.l, th.l { text-align: left; } tr.chosen { background: #fff4d6; font-weight: 600; }
.int8 { background: #E69F00; } .fp16 { background: #0072B2; color: #fff; } .fp32 { background: #eee; }
table.metrics td.l { max-width: 24em; overflow-wrap: anywhere; }
img { max-width: 100%; border: 1px solid #eee; } .note { color: #666; } .warn { color: #a40; font-weight: 600; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: float | str, fmt: str = ".6g") -> str:
    value = float(value)  # result files write infinities as "inf"
    if math.isfinite(value):
        return format(value, fmt)
    return "∞" if value > 0 else "−∞"


def _img(path: Path, alt: str) -> str:
    try:
        data = base64.b64encode(untrusted.read_bytes(path, "a figure", FIGURE_BYTES)).decode()
    except ValueError as exc:
        raise AutoprecError(f"{path}: {exc}; redraw it with autoprec plot {path.parent}") from None
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _facts(result: ResultFiles) -> str:
    engine, search, model = result.engine, result.facts, result.model
    rows = [
        ("model", f"{model.path} (sha256 {model.sha256[:16]}…)"),
        ("inputs", ", ".join(f"{n} {shape} {dtype}" for n, (shape, dtype) in model.inputs.items())),
        ("units", f"{model.units} ({model.searchable_units} searched)"),
        ("preparation", "; ".join(model.preparation) or "—"),
        ("engine", f"{engine.engine} {engine.version}, {engine.provider} ({engine.qdq_form} Q/DQ "
                   "form)"),
        ("device", engine.device),
        ("latency", engine.timing or "—"),
        ("measured", "yes" if engine.measured else "NO — described only, never executed"),
        ("data", f"{search.data} — {search.batches[0]} calibration / {search.batches[1]} "
                 "evaluation batch(es)"),
        ("metric", f"{search.metric}: the loss is the {loss_name(search.metric)} (0 = as FP32)"),
        *(("judged shapes", "; ".join(f"{p.name} ({p.said}; ×{p.runs} in a request)"
                                      for p in search.judged_shapes or ())
           + " — every plan's loss is its worst over them"),) * bool(search.judged_shapes),
        *(("FP32 against the labels", decisions(search.fp32_on_labels)),) * bool(search.fp32_on_labels),
        *(("note", line) for line in search.metric_notes),
        *(("⚠ decisions changed", line) for line in search.decision_changes),
        ("max loss",
         (f"{search.max_loss:g}" + (f" — {search.limit_in_decisions}" if search.limit_in_decisions else ""))
                     if search.max_loss is not None else "none (the knee is chosen)"),
        ("budget", f"{search.budget} trials: {search.trials} measured, {search.rejected} "
                   "rejected early (counted against the budget, as on the terminal)"),
        ("sampler / seed", f"{search.sampler} / {search.seed}"),
        ("calibration", search.calibration),
        ("study", f"{search.study} in {search.storage}"),
        ("wall time", search.wall_said()),
    ]
    body = "".join(f'<tr><th class="l">{_e(k)}</th><td class="l">{_e(v)}</td></tr>' for k, v in rows)
    warning = '<p class="warn">Random inputs were used: accuracy numbers mean little.</p>' if search.random_data else ""
    return f"<table>{body}</table>{warning}"


def _front(result: ResultFiles) -> str:
    """The front and the other trials the summary names (:func:`autoprec.results.rows.trial_rows`),
    then their metrics per output in a table of their own (a row per trial and output), so a model
    with many outputs widens neither past the page."""
    rows = trial_rows(result)
    shaped = any(row.trial.worst_shape for row in rows)
    counted = ["int4"] * any(row.trial.plan.counts().get("int4", 0) for row in rows) + ["int8", "fp16", "fp32"]
    head = ["trial", "ms", "range ms", "×fp32", "re-timed rounds ms", "own runs: median ms",
            "p10–p90 "
                                                                                             "ms", "runs",
            f"loss: {loss_name(result.facts.metric)} ↓", *(["worst at"] if shaped else []),
            *counted, ""]
    cells = []
    for row in rows:
        t, lat = row.trial, row.trial.measurement.latency
        cells.append(_row([t.number, _num(row.ms, ".4g"),
                           f"{_num(row.low, '.4g')}–{_num(row.high, '.4g')}",
                           ratio_text(row.over_fp32) if row.over_fp32 is not None else "—",
                           ", ".join(_num(v, ".4g") for v in t.retimed_ms) or "—",
                           _num(lat.median_ms, ".4g"),
                           f"{_num(lat.p10_ms, '.4g')}–{_num(lat.p90_ms, '.4g')}", lat.runs,
                           _num(t.loss, ".3e"),
                           *([t.worst_shape or "—"] if shaped else []),
                           *(t.plan.counts().get(p, 0) for p in counted), ", ".join(row.roles)],
                          row.chosen, left=(len(head) - 1,)))
    roles = "; ".join(said for said in (roles_said(rows), order_said(rows)) if said)
    return (f'<table><tr>{"".join(f"<th>{_e(h)}</th>" for h in head)}</tr>{"".join(cells)}</table>'
            f"<p class='note'>Highlighted: the chosen plan. Latency is for one batch. "
            f"{_e(COLUMNS_SAID)}. Own runs: the "
            "trial's own timed runs during the search. The re-timing rounds timed the front and "
            "the all-FP32 plan "
            "again, interleaved, after the search (the choice uses them)"
            + (f"; {_e(roles)}" if roles else "") + ".</p>" + _metrics(result, rows))


def _metrics(result: ResultFiles, shown: list[TrialRow]) -> str:
    front = [row.trial for row in shown]
    names = sorted({m for t in front for out in t.metrics.values() for m in out if m not in ("nonfinite", "narrow")})
    labels = dict(DECISIONS)
    rows = [
        _row([t.number, output,
              *(_num(figure(m, values[m], labels)[1]) if m in values else "—" for m in names)],
             t.number == result.chosen_number, left=(1,))
        for t in front for output, values in t.metrics.items()
    ]
    head = "".join(f"<th>{_e(h)}</th>"
                   for h in ["trial", "output", *(figure(m, 0.0, labels)[0] for m in names)])
    return (f'<table class="metrics"><tr>{head}</tr>{"".join(rows)}</table>'
            "<p class='note'>Each output against the FP32 model's on the evaluation batches: "
            "↓ lower is closer to FP32 (0: the same), ↑ higher is (a similarity is shown as its "
            "loss, 1 − cosine, as the loss column and the deployment checks say it); \"vs "
            "labels\": against the data's ground truth.</p>")


def _row(cells: list, chosen: bool, left: tuple[int, ...] = ()) -> str:
    left_cell, chosen_row = ' class="l"', ' class="chosen"'
    tds = "".join(f"<td{left_cell if i in left else ''}>{_e(c)}</td>" for i, c in enumerate(cells))
    return f"<tr{chosen_row if chosen else ''}>{tds}</tr>"


def _plan(result: ResultFiles) -> str:
    if result.plan is None:
        return "<p>No plan was chosen.</p>"
    rows = "".join(
        f'<tr><td>{i}</td><td class="l">{_e(u.name)}</td><td class="l">{_e(u.op_type)}</td>'
        f'<td class="l">{_e(", ".join(u.fused) or "—")}</td><td class="l '
        f'{u.precision}">{u.precision}</td></tr>'
        for i, u in enumerate(result.chosen_units)
    )
    files = "".join(f"<li><code>best/{_e(k)}</code>: {_e(v)}</li>" for k, v in result.best_files.items())
    return ('<table><tr><th>#</th><th class="l">unit</th><th class="l">op</th><th '
            'class="l">fused</th>'
            f'<th class="l">precision</th></tr>{rows}</table><ul>{files}</ul>')


def _summary(result: ResultFiles) -> str:
    """The report's first paragraph: the choice and its speed-ups, as the terminal says them."""
    chosen, versus = result.shown_chosen(), result.versus
    if chosen is None:
        return "No plan was chosen."
    # several shapes timed: a latency is a request's (a decoder's prompt, then its decode steps)
    per = "request" if sum(p.runs > 0 for p in result.facts.judged_shapes or ()) > 1 else "batch"
    summary = (f"Chosen: trial {chosen.number}, {_num(chosen.latency_ms, '.4g')} ms per {per}, "
               f"accuracy loss {_num(chosen.loss)}, int8/fp16/fp32 = {chosen.mix} units.")
    if versus.fp32 and versus.fp32_trial != chosen.number:
        summary += f" Speed-up over all-FP32 {versus.fp32.text()} ({versus.fp32.verdict(short=True)})."
    if rivals := versus.rivals_said():
        summary += f" In the same rounds, the plans the re-timing could not tell from it: {rivals}."
    if versus.source:
        summary += f" Over the given model as it is: {versus.source.text()}."
    for line in result.facts.held_out_said(chosen.number):
        summary += f" {line[0].upper()}{line[1:]}."
    if unproven := versus.not_shipped:
        summary += f" Trial {unproven.trial} was the fastest within the limit but is {unproven.why}."
    for line in shape_lines(result)[1:]:  # (the judged shapes themselves are among the facts)
        said = line.strip().removeprefix("⚠ ")
        summary += f" {said[0].upper()}{said[1:]}."
    for said in (result.facts.drift_said, versus.steadiness.said() if versus.steadiness else None):
        if said:
            summary += f" ⚠ {said[0].upper()}{said[1:]}."
    return summary


def write_report(result: ResultFiles, path: Path | None = None) -> Path:
    """Write ``report.html`` (figures made first if missing) and return its path."""
    figures = {"pareto.png": "latency vs accuracy loss", "layers.png": "precision per unit"}
    if not all((result.out_dir / f).exists() for f in figures):
        plot_result_dir(result)
    engine = result.engine
    title = f"autoprec — {result.model_name} on {engine.engine} {engine.provider}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{_e(title)}</h1>
<p id="summary">{_e(_summary(result))}</p>
<h2>Run</h2>{_facts(result)}
<h2>Trade-off</h2>{_img(result.out_dir / "pareto.png", figures["pareto.png"])}
<h2>Pareto front</h2>{_front(result)}
<h2>Precision per unit</h2>{_img(result.out_dir / "layers.png", figures["layers.png"])}
<h2>Chosen plan</h2>{_plan(result)}
<p class="note">Made by autoprec from {_e(result.out_dir)}. Every latency was measured by the engine named above.</p>
</body></html>
"""
    path = path or result.out_dir / "report.html"
    return atomic.write_bytes(path, page.encode())

"""Figures from a result directory. Reads result files only; never writes results.

Each figure is made by a ``*_figure`` function (what tests read back, drawn) and saved by its
``plot_*`` function. Every text in them is plain: names from the model and the file system are drawn
as they are (math text is off), so tick labels are written as plain text too, and each figure grows
until every text it draws lies inside it."""

from __future__ import annotations

import gc
import math
import os
import textwrap
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from autoprec.core import atomic
from autoprec.core.escape import printable
from autoprec.measure.diagnosis import culprits
from autoprec.measure.isolation import worker_context
from autoprec.record.per_unit import Sensitivity, UnitError
from autoprec.record.trial import TrialRecord
from autoprec.results.files import ResultFiles, read_result_dir
from autoprec.results.rows import loss_name, stated_speedups, trial_rows

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Colour-blind-safe (Okabe–Ito): reduced precisions stand out, FP32 recedes.
PRECISION_COLOURS = {"int4": "#CC79A7", "int8": "#E69F00", "fp16": "#0072B2", "fp32": "#D9D9D9"}
# a unit's name on an axis: its last this many characters (the end tells units apart)
NAME_CHARS = 40
GROWTH_STEPS = 8  # at most this many times a figure grows to hold its texts
SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    # Names come from the model and the file system: '$x$' or '$\\foo{$' in one is text, never math
    # to parse.
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def number_text(value: float) -> str:
    """A tick's value as plain text: ``0.25``, ``300``; beyond them ``10⁻⁵``, ``2×10⁻⁵`` (matplotlib
    writes log ticks as math text, which is off here: it would print
    ``$\\mathdefault{10^{-5}}$``)."""
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)) + 1e-9)  # (log10 of 1e-9 is -9.000000000000002)
    mantissa = round(abs(value) / 10.0**exponent, 2)
    power = "10" + str(exponent).translate(SUPERSCRIPTS)
    return ("-" if value < 0 else "") + (power if mantissa == 1 else f"{mantissa:g}×{power}")


def _plain_log_ticks(ax: Axes) -> None:
    """Log and symlog axes labelled in plain text, at the ticks matplotlib's own formatter would
    label."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def __call__(self, x, pos=None):
            said = super().__call__(x, pos).replace("\N{MINUS SIGN}", "-")
            return number_text(float(said)) if said else ""

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() in ("log", "symlog"):
            axis.set_major_formatter(PlainLogFormatter(10))
            if axis.get_scale() == "log":
                axis.set_minor_formatter(PlainLogFormatter(10, labelOnlyBase=False))


def _wrapped(text: str, width: float, fontsize: float) -> str:
    """Each line of a title wrapped to what a figure ``width`` inches wide holds at ``fontsize``
    points."""
    chars = max(40, int(width * 72 / (0.6 * fontsize)))
    return "\n".join(part for line in text.split("\n") for part in textwrap.wrap(line, chars) or [""])


def _name(text: object) -> str:
    """A unit's name on an axis: one line, its end where it is long."""
    shown = printable(text)
    return shown if len(shown) <= NAME_CHARS else "…" + shown[-(NAME_CHARS - 1):]


def laid_out(fig: Figure) -> Figure:
    """``fig`` with plain tick labels, grown until every text it draws lies inside the canvas, then
    laid out: tight_layout alone shrinks the axes to make room, and cannot where a title or a unit's
    name is longer than the figure (it was cut at the edge)."""
    for ax in fig.axes:
        _plain_log_ticks(ax)
    for _ in range(GROWTH_STEPS):
        with warnings.catch_warnings():
            # "tight layout not applied": the figure grows below
            warnings.simplefilter("ignore", UserWarning)
            fig.tight_layout()
        drawn = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
        width, height = fig.get_size_inches()
        wider = max(0.0, -drawn.x0) + max(0.0, drawn.x1 - width)
        taller = max(0.0, -drawn.y0) + max(0.0, drawn.y1 - height)
        if wider < 0.02 and taller < 0.02:
            break
        fig.set_size_inches(width + wider + 0.1 * (wider > 0), height + taller + 0.1 * (taller > 0))
    return fig


def _saved(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    atomic.write_with(path, lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return path


def _subtitle(result: ResultFiles) -> str:
    engine = result.engine
    loss = loss_name(result.facts.metric)
    return printable(f"{result.model_name} · loss = {loss}") + "\n" + printable(
        f"{engine.engine} {engine.version} {engine.provider} · {engine.device}")


@dataclass(frozen=True)
class Point:
    """A trial on the trade-off: its speed-up over all-FP32 with the range behind it, and its loss.
    """

    trial: TrialRecord
    speedup: float
    low: float
    high: float

    @property
    def loss(self) -> float:
        return self.trial.loss


def claimed_points(result: ResultFiles) -> tuple[list[Point], list[Point]]:
    """What the trade-off draws: each trial of the tables (the front and those the lines name) at
    its speed-up over all-FP32 as the tables state it (the final timing's, with its interval, where
    it timed the plan; else the re-timing's, all-FP32's median over the plan's rounds, between its
    slowest and fastest round), and every other trial at its own timing over all-FP32's own (taken
    at other moments: not what a claim rests on). Overflowed plans (an unbounded loss) are drawn
    nowhere. Empty without an all-FP32 trial."""
    fp32 = result.uniform_trial("fp32")
    if fp32 is None:
        return [], []
    claims, rows = stated_speedups(result), trial_rows(result)
    stated = []
    for row in (r for r in rows if math.isfinite(r.trial.loss)):
        claim = claims.get(row.number)
        if claim is not None and claim.low is not None:
            stated.append(Point(row.trial, claim.speedup, claim.low, claim.high))
        else:
            stated.append(Point(row.trial, row.over_fp32, fp32.latency_ms / row.high,
                                fp32.latency_ms / row.low))
    shown, own = {r.number for r in rows}, fp32.measurement.latency.median_ms
    others = [Point(t, own / t.measurement.latency.median_ms, own / t.measurement.latency.p90_ms,
                    own / t.measurement.latency.p10_ms)
              for t in result.shown_trials() if t.number not in shown and math.isfinite(t.loss)]
    return stated, others


def pareto_figure(result: ResultFiles) -> Figure:
    """Speed-up over all-FP32 against accuracy loss, as the claims stand: the front joined, the
    chosen plan with its interval, a plan past the limit on the calibration batches marked and left
    off the front, every other trial grey."""
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    stated, others = claimed_points(result)
    if others:
        ax.scatter([p.speedup for p in others], [p.loss for p in others], s=14, color="0.8",
                   zorder=1, label="other trials: own timing over all-FP32's own (other moments, "
                   "other loads)")
    held = result.facts.held_out
    left_out = set(held.failed()) if held else set()
    on_front = {t.number for t in result.shown_front()}
    front = sorted((p for p in stated if p.trial.number in on_front - left_out),
                   key=lambda p: p.speedup)
    if front:
        ax.errorbar([p.speedup for p in front], [p.loss for p in front],
                    xerr=[[p.speedup - p.low for p in front], [p.high - p.speedup for p in front]],
                    fmt="o-", color="tab:blue", ms=5, lw=1.5, capsize=2, zorder=3,
                    label="Pareto front (bars: the final timing's 95 % interval, else the "
                    "re-timing's rounds)")
    named = [p for p in stated if p.trial.number not in on_front | left_out]
    if named:
        ax.scatter([p.speedup for p in named], [p.loss for p in named], s=24, color="tab:blue",
                   marker="D", zorder=3, label="rivals and plans the summary names, off the front")
    if left := [p for p in stated if p.trial.number in left_out]:
        ax.scatter([p.speedup for p in left], [p.loss for p in left], s=60, marker="x",
                   color="tab:red", zorder=4,
                   label="left out: past --max-loss on the calibration batches")
    uniform_labels = _uniform_labels(ax, result, [*stated, *others])
    chosen = next((p for p in stated if p.trial.number == result.chosen_number), None)
    if chosen is not None:
        ax.scatter([chosen.speedup], [chosen.loss], s=160, marker="*", color="tab:red", zorder=5,
                   label=f"chosen (trial {chosen.trial.number})")
    ax.axvline(1.0, color="0.5", lw=0.8, ls=":")
    max_loss = result.facts.max_loss
    if max_loss is not None:
        ax.axhline(max_loss, color="tab:red", ls="--", lw=1, label=f"--max-loss {max_loss:g}")
    _loss_axis(ax, [p.loss for p in [*stated, *others]] + [max_loss] * (max_loss is not None))
    ax.margins(x=0.1)
    ax.set_xlabel("speed-up over all-FP32, × (higher is faster): all-FP32 timed beside each plan "
                  "in interleaved rounds")
    ax.set_ylabel(printable(f"loss: {loss_name(result.facts.metric)} (0: as FP32)"))
    ax.set_title(_wrapped(_subtitle(result), 8, 9), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.9)
    laid_out(fig)
    _stacked(fig, uniform_labels)
    return laid_out(fig)


def _uniform_labels(ax: Axes, result: ResultFiles, stated: Sequence[Point]) -> list:
    """The uniform plans among the drawn ones, circled and named."""
    labels = []
    for precision in ("fp32", "fp16", "int8"):
        uniform = result.uniform_trial(precision)
        number = uniform.number if uniform is not None else None
        point = next((p for p in stated if p.trial.number == number), None)
        if point is not None:
            labels.append(ax.annotate(f"all {precision}", (point.speedup, point.loss),
                                      textcoords="offset points", xytext=(6, 6), fontsize=9,
                                      color="0.3"))
            ax.scatter([point.speedup], [point.loss], s=30, facecolors="none", edgecolors="0.3",
                       zorder=4)
    return labels


def _loss_axis(ax: Axes, losses: list[float]) -> None:
    """Loss spans decades and FP32 sits at exactly 0: linear near 0, logarithmic above."""
    if losses and min(losses) >= 0 and max(losses) > 0:
        ax.set_yscale("symlog", linthresh=max(min(v for v in losses if v > 0), 1e-9))
        ax.set_ylim(0, max(losses) * 4)


def _stacked(fig: Figure, labels: list) -> None:
    """Labels of points close together (all-FP32 and all-FP16 0.7 ms apart on a 10 ms axis) moved
    up, each above the ones left of it that it would print over."""
    renderer = fig.canvas.get_renderer()
    placed = []
    for label in sorted(labels, key=lambda text: text.xy[0]):
        while any(_overprint(label.get_window_extent(renderer), box) for box in placed):
            x, y = label.get_position()  # offset points from the labelled point
            label.set_position((x, y + 11))
        placed.append(label.get_window_extent(renderer))


def _overprint(a, b) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1


def plot_pareto(result: ResultFiles, path: Path) -> Path:
    return _saved(pareto_figure(result), path)


def layers_figure(result: ResultFiles) -> Figure:
    """Units in graph order (columns) coloured by precision; one row per front member, the chosen
    one on top."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    plt = _pyplot()
    chosen = result.chosen_number
    front = sorted(result.shown_front(), key=lambda t: (t.number != chosen, t.latency_ms))
    weights4 = any("int4" in t.precisions.values() for t in front)
    order = ["int4"] * weights4 + ["int8", "fp16", "fp32"]  # INT4 shown where a plan holds it
    units = list(front[0].precisions) if front else []
    grid = [[order.index(t.precisions[u]) for u in units] for t in front]
    width = min(24.0, max(8.0, 0.09 * len(units) + 3.5))
    height = 1.6 + 0.32 * len(front)
    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    if grid:
        ax.imshow(grid, aspect="auto", interpolation="nearest", vmin=0, vmax=len(order) - 1,
                  cmap=ListedColormap([PRECISION_COLOURS[p] for p in order]))
    labels = []
    for t in front:
        loss_text = f"{t.loss:.1e}" if math.isfinite(t.loss) else "inf"
        mark = "chosen · " if t.number == chosen else ""
        labels.append(f"{mark}trial {t.number}: {t.latency_ms:.3g} ms, loss {loss_text}")
    ax.set_yticks(range(len(front)), labels, fontsize=8)
    if len(units) <= 40:
        ax.set_xticks(range(len(units)), [_name(u) for u in units], rotation=90, fontsize=7)
    else:  # too many names to read: number the units, every tenth
        ticks = list(range(0, len(units), 10))
        ax.set_xticks(ticks, [str(i) for i in ticks], fontsize=8)
        ax.set_xlabel(f"unit index in graph order ({len(units)} units; names in best/plan.json)",
                      fontsize=8)
    ax.set_xticks([x - 0.5 for x in range(1, len(units))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(front))], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6 if len(units) <= 60 else 0.2)
    ax.tick_params(which="minor", length=0)
    ax.set_title(_wrapped(f"Precision per unit on the Pareto front: {_subtitle(result)}", width, 9),
                 fontsize=9)
    handles = [Patch(color=PRECISION_COLOURS[p], label=p) for p in order]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    return laid_out(fig)


def plot_layers(result: ResultFiles, path: Path) -> Path:
    return _saved(layers_figure(result), path)


LOSS_FLOOR = 1e-9  # a loss of 0 (bit-identical outputs) drawn at the log axis' floor


def sensitivity_figure(sensitivity: Sensitivity, title: str) -> Figure:
    """Per unit in graph order: the loss when it alone is lowered (per precision, log scale) beside
    its share of the FP32 latency, so cheap-to-lower and costly units stand out together."""
    plt = _pyplot()
    units = sensitivity.units
    rows = list(range(len(units)))
    fig, (left, right) = plt.subplots(1, 2, sharey=True, figsize=(10, 1.6 + 0.16 * len(units)),
                                      dpi=120,
                                      gridspec_kw={"width_ratios": [3, 1.2]})
    floored = False
    for precision, marker in (("int4", "D"), ("int8", "s"), ("fp16", "o")):
        points = [(i, u.loss[precision]) for i, u in enumerate(units) if precision in u.loss]
        finite = [(i, max(v, LOSS_FLOOR)) for i, v in points if math.isfinite(v)]
        floored = floored or any(v < LOSS_FLOOR for _, v in points)
        if finite:
            left.scatter([v for _, v in finite], [i for i, _ in finite], marker=marker, s=18,
                         color=PRECISION_COLOURS[precision], label=f"{precision} alone", zorder=3)
        failed = [i for i, v in points if not math.isfinite(v)]
        if failed:
            left.scatter(
                [1.0] * len(failed), failed, marker="x", color="black", s=18, label=f"{precision}: "
                                                                                    "failed / inf"
            )
    left.set_xscale("log")
    judged = f" ({printable(sensitivity.judged)})" if sensitivity.judged else ""
    floor = f"; a loss of 0 is drawn at {number_text(LOSS_FLOOR)})" if floored else ")"
    width = 64  # characters: the label stays under the left panel, beside the right panel's own
    left.set_xlabel(textwrap.fill(f"accuracy loss{judged} with only this unit lowered "
                                  f"(log{floor}", width))
    left.grid(axis="x", color="0.9")
    # above: no point hid
    left.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=4, frameon=False)
    shares = [u.share if u.share is not None else 0.0 for u in units]
    right.barh(rows, [100 * s for s in shares], color="0.55")
    right.set_xlim(0, 1.05 * max(100 * max(shares, default=0.0), 1.0))  # a share is 0 % or more
    right.set_xlabel("share of FP32 latency, %" if any(u.share is not None for u in units) else "no "
                                                                                                "engine "
                                                                                                "profile")
    labels = [_name(u.unit) for u in units] if len(units) <= 60 else [str(i) for i in rows]
    left.set_yticks(rows, labels, fontsize=6 if len(units) > 30 else 8)
    left.invert_yaxis()
    fig.suptitle(_wrapped(printable(f"Sensitivity: {title}") + "\n" + printable(
        f"{sensitivity.engine} · {sensitivity.batches} evaluation batch(es)"), 10, 9), fontsize=9)
    return laid_out(fig)


def plot_sensitivity(sensitivity: Sensitivity, title: str, path: Path) -> Path:
    return _saved(sensitivity_figure(sensitivity, title), path)


# What a figure of the search's draws in a process of its own imports, where that process forks from a server
# that imported them already (autoprec.measure.isolation.start_worker_server).
DRAWING_MODULES = ("matplotlib.pyplot", __name__, "concurrent.futures.process")


def plot_result_dir(result: ResultFiles, side_by_side: bool = False) -> list[Path]:
    """Every figure a result directory supports, written next to its results; ``side_by_side``: each
    drawn in a process forked from the measuring workers' server (:data:`DRAWING_MODULES` imported
    there while the search ran), the figures at once on the cores the search leaves idle: 1.2 s of a
    search's writing on a 2-core VM, its longest figure's 0.6 s so."""
    names, context = figure_names(result), worker_context()
    if not side_by_side or context.get_start_method() != "forkserver":
        return [_plotted(result, name) for name in names]
    # (gc.freeze: what the server imported is not walked by each figure's collections)
    with ProcessPoolExecutor(min(len(names), os.cpu_count() or 1), mp_context=context,
                             initializer=gc.freeze) as pool:
        return list(pool.map(plot_figure, [str(result.out_dir)] * len(names), names))


def figure_names(result: ResultFiles) -> list[str]:
    """The figures ``result`` supports, the slowest to draw first."""
    return [*(["sensitivity.png"] if result.sensitivity is not None else []), "pareto.png", "layers.png"]


def plot_figure(out_dir: str, name: str) -> Path:
    """One of :func:`figure_names`' figures, from the result files in ``out_dir`` (what a process of its
    own is given)."""
    return _plotted(read_result_dir(out_dir), name)


def _plotted(result: ResultFiles, name: str) -> Path:
    path = result.out_dir / name
    if name == "sensitivity.png":
        assert result.sensitivity is not None
        return plot_sensitivity(result.sensitivity, result.model_name, path)
    return {"pareto.png": plot_pareto, "layers.png": plot_layers}[name](result, path)


def errors_figure(rows: Sequence[UnitError], title: str, loss_name: str = "model loss") -> Figure:
    """error_by_layer.png. Top: error accumulated at each unit's output (line) and the error the
    unit adds alone (bars). Bottom: the model's loss (``loss_name``: the judge's) with only that
    unit reduced; the worst five named."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()

    def positive(values):  # log axes: zero (an FP32 unit adds nothing) is left out, not floored
        return [v if v > 0 and math.isfinite(v) else np.nan for v in values]

    x = [r.index for r in rows]
    colours = [PRECISION_COLOURS[r.precision] if r.precision != "fp32" else "#BBBBBB" for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True,
                                      figsize=(min(24, max(9, 0.12 * len(rows) + 4)), 7), dpi=120)
    top.bar(
        x, positive([r.added_rel_l2 for r in rows]), color=colours, label="added by the unit alone "
                                                                          "(fed FP32 inputs)"
    )
    top.plot(
        x, positive([r.rel_l2 for r in rows]), color="black", marker=".", lw=1.2,
        label="accumulated "
                                                                                        "at its "
                                                                                        "output"
    )
    top.set_yscale("log")
    top.set_ylabel("rel. L2 error vs FP32")
    top.legend(fontsize=8, loc="lower right", framealpha=0.9)
    top.set_title(_wrapped(printable(title), fig.get_size_inches()[0], 9), fontsize=9)
    bottom.bar(x, positive([r.alone_loss for r in rows]), color=colours)
    bottom.set_yscale("log")
    # no taller than its axes
    bottom.set_ylabel(textwrap.fill(printable(f"{loss_name}, unit alone"), 34))
    for r in culprits(rows):
        if r.alone_loss > 0:
            bottom.annotate(_name(r.unit), (r.index, r.alone_loss), textcoords="offset points",
                            xytext=(0, 4),
                            ha="center", fontsize=7, rotation=60, color="tab:red",
                            annotation_clip=False)
    bottom.set_xlabel("unit index in graph order (bar colour: planned precision — orange int8, "
                      "blue fp16, grey fp32)")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(True, axis="y", alpha=0.3)
    bottom.margins(y=0.35)
    return laid_out(fig)


def plot_errors(rows: Sequence[UnitError], title: str, path: Path, loss_name: str = "model loss") -> Path:
    return _saved(errors_figure(rows, title, loss_name), path)

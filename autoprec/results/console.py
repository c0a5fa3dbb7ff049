"""Terminal output with rich: progress during a search, tables after it. Presentation only."""

from __future__ import annotations

import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from autoprec.backends.onnxruntime import session_said
from autoprec.core.escape import printable
from autoprec.core.plan import Precision
from autoprec.record.facts import SearchFacts
from autoprec.record.per_unit import Sensitivity
from autoprec.record.trial import MAX_TIMING_SPREAD, TrialRecord
from autoprec.record.verdict import Versus, ratio_text
from autoprec.results.files import ResultFiles
from autoprec.results.rows import (
    COLUMNS_SAID,
    decisions,
    loss_name,
    order_said,
    roles_said,
    trial_rows,
)

# shown here, read by the TensorRT backend (the --layers of export --build and inspect)
if TYPE_CHECKING:
    from autoprec.backends.tensorrt.layers import EngineLayers

class _Output(Console):
    """rich's Console, but a reader that ends first (``| head``) is the command line's to say: rich
    would exit 1 without a word."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


console = Console(stderr=True)
# Resolves sys.stdout when printing (so redirection and capture work). No markup: what it prints
# holds paths and names from the user, the model and result files; styles come as Text objects.
stdout = _Output(markup=False)
LOG_WIDTH = 160  # columns of tables written to a file or a pipe (rich's own default there is 80)


def widen_when_not_a_terminal() -> None:
    """Tables written to a CI log or a pipe get room (``$COLUMNS`` where set): rich would fit them
    to 80 columns and squeeze the marks and numbers out of them."""
    if not stdout.is_terminal:
        columns = os.environ.get("COLUMNS", "")
        stdout.width = int(columns) if columns.isdigit() and int(columns) > 0 else LOG_WIDTH


def plain(value: Any) -> Text:
    """Text from a model, a result file or a storage, shown as it is: one line, never read as
    markup."""
    return Text(printable(value))


def note(message: str) -> None:
    console.print(f"[dim]•[/dim] {escape(printable(message))}", highlight=False)


def warn(message: str) -> None:
    console.print(f"[bold yellow]WARNING[/bold yellow] {escape(printable(message))}",
                  highlight=False)


class NoteHandler(logging.Handler):
    """autoprec's log records as the command line shows them: a dim bullet, or WARNING in yellow."""

    def emit(self, record: logging.LogRecord) -> None:
        (warn if record.levelno >= logging.WARNING else note)(record.getMessage())


def show_log() -> None:
    """The command line shows what the pipeline logs (the Python API only logs:
    ``logging.getLogger("autoprec")``)."""
    log = logging.getLogger("autoprec")
    if not any(isinstance(h, NoteHandler) for h in log.handlers):
        log.addHandler(NoteHandler())
    log.setLevel(logging.INFO)


class SearchProgress:
    """trial k/N, best latency within the loss limit so far, elapsed and ETA."""

    def __init__(self, budget: int, done: int, max_loss: float | None, enabled: bool = True):
        self.max_loss = max_loss
        self.best: float | None = None
        self.progress = Progress(
            TextColumn("[bold]trial"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self.task = self.progress.add_task(self._describe(None), total=budget, completed=done)
        self.started = time.monotonic()

    def _describe(self, last: TrialRecord | None) -> str:
        limit = f"≤{self.max_loss:g}" if self.max_loss is not None else ""
        best = f"{ms_text(self.best)} ms" if self.best is not None else "—"
        latest = ""
        if last is not None:
            loss = f"{last.loss:.1e}" if math.isfinite(last.loss) else "inf"
            latest = f" · last {ms_text(last.latency_ms)} ms {loss}"
        return f"best{limit}: {best}{latest}"

    def update(self, done: int, last: TrialRecord | None) -> None:
        if last is not None and (self.max_loss is None or last.loss <= self.max_loss):
            self.best = last.latency_ms if self.best is None else min(self.best, last.latency_ms)
        self.progress.update(self.task, completed=done, description=self._describe(last))

    def __enter__(self) -> SearchProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


class StepProgress:
    """``label k/N`` with elapsed time and ETA: for phases before the trials (the sensitivity
    pass)."""

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.progress = Progress(
            TextColumn(f"[bold]{label}"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(), console=console, disable=not enabled,
        )
        self.task = self.progress.add_task(label, total=total)

    def update(self, done: int, total: int) -> None:
        self.progress.update(self.task, completed=done, total=total)

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def loss_text(value: float | str) -> str:
    value = float(value)  # result files write infinities as "inf"
    return f"{value:.2e}" if math.isfinite(value) else "inf"


def sensitivity_table(sensitivity: Sensitivity) -> Table:
    """Units least sensitive per time saved first (the order the warm start lowers them in)."""
    precisions = [p for p in ("int4", "int8", "fp16") if any(p in u.loss for u in sensitivity.units)]
    saving = [p for p in precisions if sensitivity.node_timed(Precision(p))]
    judged = f" ({sensitivity.judged})" if sensitivity.judged else ""
    table = Table(title=plain(f"sensitivity — {sensitivity.engine}; loss{judged} with only this "
                              f"unit lowered, {sensitivity.batches} "
                              "batch(es)"), title_justify="left")
    columns = ("#", "unit", "op", "fp32\nshare", *(f"{p}\nsaves" for p in saving),
               *(f"{p}\nloss" for p in precisions))
    for column in columns:
        table.add_column(column, justify="left" if column in ("unit", "op") else "right",
                         no_wrap=column != "unit",
                         min_width=8 if column == "unit" else None)
    order = {u.unit: i for i, u in enumerate(sensitivity.ranking(Precision(precisions[0])))} if precisions else {}
    for i, u in sorted(enumerate(sensitivity.units), key=lambda iu: order.get(iu[1].unit, iu[0])):
        share = f"{u.share:.1%}" if u.share is not None else "—"
        saves = [f"{u.gain[p]:+.1%}" if p in u.gain else "—" for p in saving]
        table.add_row(
            str(i),
            plain(u.unit),
            plain(u.op_type),
            share,
            *saves,
            *(loss_text(u.loss[p]) if p in u.loss else "—" for p in precisions),
        )
    notes = []
    if sensitivity.unattributed_share is not None:
        notes.append(
            f"{sensitivity.unattributed_share:.1%} of FP32 time is in nodes outside any unit "
            "(layout, reshapes, …)"
        )
    if saving:
        notes.append(
            "saves: share of FP32 time the unit gains in the profiled all-units plan (with its "
            "Q/DQ or Casts); where that plan is not faster than FP32, the warm start lowers only "
            "units that gain"
        )
    table.caption = "\n".join(notes) or None
    table.caption_justify = "left"
    return table


def front_table(result: ResultFiles) -> Table:
    """The Pareto front of a result, fastest first, the chosen plan marked; then the other trials
    its lines name (see :mod:`autoprec.results.rows` for what each column is)."""
    engine = result.engine
    rows = trial_rows(result)
    named = len(rows) > len(result.pareto.front)
    table = Table(
        title=plain(f"Pareto front{' and the plans named below' if named else ''} — "
                    f"{engine.engine} {engine.version} {engine.provider} on {engine.device}"),
        title_justify="left",
    )
    metric = plain(f"loss: {loss_name(result.facts.metric)}")
    # judged at several shapes: where each loss is
    shaped = any(row.trial.worst_shape for row in rows)
    for column in ("trial", "ms", "range", "×fp32", metric, *(["at"] if shaped else []),
                   "i8/f16/f32", ""):
        table.add_column(column, justify="left" if column in ("", "at") else "right",
                         overflow="fold")
    for row in rows:
        t = row.trial
        table.add_row(
            str(t.number),
            ms_within(row.ms, row.low, row.high) + (" ⚠" if t.measurement.unstable else ""),
            ms_range(row.low, row.high),
            ratio_text(row.over_fp32) if row.over_fp32 is not None else "—",
            loss_text(t.loss),
            *([plain(t.worst_shape or "—")] if shaped else []),
            t.mix,
            Text(", ".join(row.roles), style="bold red" if row.chosen else ""),
        )
    notes = [COLUMNS_SAID + ("; at: the judged shape where the plan's loss is its worst" if shaped else "")]
    notes += [said for said in (roles_said(rows), order_said(rows)) if said]
    if any(row.trial.measurement.unstable for row in rows):
        notes.append("⚠ the trial's own timing stayed spread (p10–p90 over "
                     f"{MAX_TIMING_SPREAD:.0%} of its median) after re-timing")
    table.caption = "\n".join(notes)
    table.caption_justify = "left"
    return table


def decisions_table(result: ResultFiles) -> Table | None:
    """What each front plan decides (task metrics against FP32 and the labels); None when no output
    has any."""
    rows = [(t.number, decisions(t.metrics)) for t in result.shown_front()]
    if not any(said for _, said in rows):
        return None
    table = Table(title="what the front's plans decide, against FP32 (and the data's labels)",
                  title_justify="left")
    table.add_column("trial", justify="right")
    table.add_column("decisions")
    for trial, said in rows:
        table.add_row(str(trial), plain(said or "—"))
    return table


def status_tables(status: dict[str, Any]) -> list[Table]:
    """A shared study: trials per worker, then its current front (trial latencies, not re-timed)."""
    budget = status["budget"]
    workers = Table(title=plain(f"study {status['study']} — {status['backend']}: "
                                f"{status['counted']}{f' of {budget}' if budget else ''} trials "
                                f"counted, {status['waiting']} queued"),
                    title_justify="left")
    for column in ("worker", "done", "running", "failed", "rejected", "died (re-run)"):
        workers.add_column(column, justify="left" if column == "worker" else "right")
    for who, tally in sorted(status["workers"].items()):
        workers.add_row(plain(who),
                        *(str(tally[k]) for k in ("done", "running", "failed", "rejected", "died")))
    front = Table(title="current Pareto front (each trial's own timing)", title_justify="left")
    for column in ("trial", "ms", "loss", "i8/f16/f32", "worker"):
        front.add_column(column, justify="left" if column == "worker" else "right")
    for t in status["front"]:
        counts = t["counts"]
        front.add_row(str(t["trial"]), ms_text(t['latency_ms']), loss_text(t["loss"]),
                      (f"int4 {counts['int4']} · " if counts.get("int4") else "")
                      + f"{counts['int8']}/{counts['fp16']}/{counts['fp32']}",
                      plain(t["worker"] or "—"))
    return [workers, front]


def chosen_summary(facts: SearchFacts, versus: Versus, chosen: TrialRecord | None) -> list[str]:
    """One line for the chosen plan, one for its speed against all-FP32 (and whether that beats the
    noise)."""
    if chosen is None and facts.max_loss is not None:
        return [f"no plan was chosen: no trial is within --max-loss {facts.max_loss:g}, not even "
                "all-FP32 (this engine's FP32 outputs differ from the reference's by more than "
                "that); raise --max-loss, or look at each trial's loss with `autoprec show`"]
    if chosen is None:
        return ["no plan was chosen (no trial finished with a finite loss)"]
    max_loss = facts.max_loss
    rule = f"fastest within --max-loss {max_loss:g}" if max_loss is not None else "knee of the front"
    if facts.held_out and facts.held_out.failed():
        rule += " on the evaluation and the calibration batches"
    if versus.rivals:
        rule += ", re-timed with its rivals"
    at = f" (its worst, at {chosen.worst_shape})" if chosen.worst_shape else ""
    lines = [f"chosen: trial {chosen.number} ({rule}): {ms_text(chosen.latency_ms)} ms, loss "
             f"{loss_text(chosen.loss)}{at}, int8/fp16/fp32 = {chosen.mix}"]
    if (fp32 := versus.fp32) and versus.fp32_trial != chosen.number:
        lines.append(f"        speed-up over all-FP32 {fp32.text()} ({fp32.verdict()}{fp32.how()})")
    if rivals := versus.rivals_said():
        lines.append("        in the same rounds, the plans the re-timing could not tell from it: "
                     f"{rivals}")
    if source := versus.source:
        line = f"        over the given model as it is: {source.text()} ({source.verdict(short=True)})"
        if versus.preparation:
            line += f"; of that, autoprec's all-FP32 graph alone: {versus.preparation.text()}"
        lines.append(line)
    lines += [f"        {line}" for line in facts.held_out_said(chosen.number)]
    if facts.limit_in_decisions:
        lines.append(f"        {facts.limit_in_decisions}")
    if unproven := versus.not_shipped:
        lines.append(f"        ⚠ trial {unproven.trial} was the fastest within the limit but is "
                     f"{unproven.why}")
    if drift := facts.drift_said:
        lines.append(f"        ⚠ {drift}")
    if versus.steadiness and (unsteady := versus.steadiness.said()):
        lines.append(f"        ⚠ {unsteady}")
    lines += [f"        ⚠ {session_said(build)}" for build in [chosen.measurement.build]
              if (build or {}).get("disabled_optimizers")]
    if said := decisions(chosen.metrics):
        lines.append(f"        decisions: {said}")
    for name, values in facts.fp32_on_labels.items():
        lines.append(f"        FP32 against the labels: {decisions({name: values})}")
    lines += [f"        ⚠ {line}" for line in facts.decision_changes]
    return lines


def _decimals(value: float, figures: int = 3) -> int:
    """Three decimals, or as many more as give a small latency ``figures`` significant figures
    (0.0103, not 0.010)."""
    if not (value > 0 and math.isfinite(value)):
        return 3
    return max(3, figures - 1 - math.floor(math.log10(value)))


def ms_text(value: float) -> str:
    """A latency in ms: ``13.300``, ``0.0103``."""
    return f"{value:.{_decimals(value)}f}"


def ms_range(low: float, high: float) -> str:
    """``low–high`` with as many decimals as tell them apart (never ``0.010–0.010`` for
    0.0101–0.0104)."""
    decimals = _range_decimals(low, high)
    return f"{low:.{decimals}f}–{high:.{decimals}f}"


def ms_within(value: float, low: float, high: float) -> str:
    """A latency beside its :func:`ms_range`, to as many decimals as the range: 0.022820 inside
    0.022818–0.022824, not 0.0228 below it."""
    return f"{value:.{max(_decimals(value), _range_decimals(low, high))}f}"


def _range_decimals(low: float, high: float) -> int:
    decimals = max(_decimals(low), _decimals(high))
    while low != high and f"{low:.{decimals}f}" == f"{high:.{decimals}f}" and decimals < 9:
        decimals += 1
    return decimals


def plan_table(result: ResultFiles) -> Table:
    """The chosen plan, unit by unit in graph order."""
    table = Table(title=f"chosen plan (trial {result.chosen_number}), units in graph order",
                  title_justify="left")
    for column in ("#", "unit", "op", "fused", "precision"):
        table.add_column(column, justify="right" if column == "#" else "left", overflow="fold")
    style = {"int4": "bold red", "int8": "bold yellow", "fp16": "bold cyan", "fp32": "dim"}
    for i, unit in enumerate(result.chosen_units):
        table.add_row(str(i), plain(unit.name), plain(unit.op_type),
                      plain(", ".join(unit.fused) or "—"),
                      Text(unit.precision, style=style[unit.precision]))
    return table


def engine_layers_table(layers: EngineLayers) -> Table:
    """Per-layer precision of a TensorRT engine; FP32 layers first in a reduced-precision engine."""
    summary = layers.summary()
    shares = ", ".join(
        f"{p} {n} ({summary['precision_shares'][p]:.0%})" for p, n in sorted(summary["precision_counts"].items())
    )
    table = Table(
        title=plain(
            f"{layers.source} — {summary['compute_layers']} compute layers ({summary['layers']} in "
            f"all, {layers.schema} JSON): {shares}"
        ),
        title_justify="left",
    )
    for column in ("layer", "type", "precision", "inputs", "outputs", "fused from"):
        table.add_column(column, overflow="fold")
    fp32_flag = bool(summary["fp32_in_reduced_precision_engine"])

    def tensors(group) -> str:
        return ", ".join(t.dtype for t in group)  # the full formats are in --json

    for layer in layers.ordered():
        mark = Text(layer.precision,
                    style="bold red" if fp32_flag and layer.precision == "fp32" else "")
        table.add_row(
            plain(layer.name),
            plain(layer.layer_type),
            mark,
            plain(tensors(layer.inputs)),
            plain(tensors(layer.outputs)),
            plain(", ".join(layer.fused_from) if len(layer.fused_from) > 1 else ""),
        )
    return table


def compare_table(a: ResultFiles, b: ResultFiles) -> Table:
    """Two runs side by side: where they ran, what they chose, and the uniform plans' latencies."""
    table = Table(title="autoprec compare", title_justify="left")
    table.add_column("")
    table.add_column(plain(a.out_dir))
    table.add_column(plain(b.out_dir))

    def engine(r: ResultFiles) -> str:
        return f"{r.engine.engine} {r.engine.version} {r.engine.provider}"

    def chosen(r: ResultFiles, field: str) -> str:
        c = r.shown_chosen()
        if c is None:
            return "—"
        if field == "latency":
            rounds = ", ".join(ms_text(v) for v in c.retimed_ms)
            return f"{ms_text(c.latency_ms)} ms" + (f" (rounds {rounds})" if rounds else "")
        if field == "decisions":
            return decisions(c.metrics) or "—"
        if field == "loss":
            return loss_text(c.loss) + (f" (worst at {c.worst_shape})" if c.worst_shape else "")
        if field == "shapes":
            return " · ".join(f"{p} {loss_text(v)}" for p, v in c.losses_by_shape().items()) or "—"
        return c.mix

    def speedup(r: ResultFiles) -> str:
        v = r.versus.fp32
        return f"{v.text()} ({v.verdict(short=True)})" if v else "—"

    def uniform(r: ResultFiles, precision: str) -> str:
        t = r.uniform_trial(precision)
        return f"{ms_text(t.latency_ms)} ms, loss {loss_text(t.loss)}" if t else "—"

    shaped = bool(a.facts.judged_shapes or b.facts.judged_shapes)  # either judged at several shapes
    rows = [
        ("model", lambda r: f"{r.model_name} ({r.model.sha256[:12]})"),
        ("engine", engine),
        ("device", lambda r: r.engine.device),
        ("loss / max loss", lambda r: f"{loss_name(r.facts.metric)} / "
                                      f"{'none (the knee)' if r.facts.max_loss is None else f'{r.facts.max_loss:g}'}"),
        ("trials / budget", lambda r: f"{r.facts.trials} / {r.facts.budget}"),
        ("wall time", lambda r: f"{r.facts.wall_seconds:.1f} s"),
        ("front size", lambda r: str(len(r.shown_front()))),
        ("chosen latency", lambda r: chosen(r, "latency")),
        *([("judged shapes",
            lambda r: ", ".join(p.name for p in r.facts.judged_shapes or ()) or "the data's one")]
          * shaped),
        ("chosen loss", lambda r: chosen(r, "loss")),
        *([("chosen loss per shape", lambda r: chosen(r, "shapes"))] * shaped),
        ("chosen int8/fp16/fp32", lambda r: chosen(r, "counts")),
        ("chosen decisions", lambda r: chosen(r, "decisions")),
        ("FP32 vs labels", lambda r: decisions(r.facts.fp32_on_labels) or "—"),
        ("chosen vs all-fp32", speedup),
        ("all fp32", lambda r: uniform(r, "fp32")),
        ("all fp16", lambda r: uniform(r, "fp16")),
        ("all int8", lambda r: uniform(r, "int8")),
    ]
    for label, value in rows:
        table.add_row(label, plain(value(a)), plain(value(b)))
    ca, cb = a.shown_chosen(), b.shown_chosen()
    if ca and cb and a.model.sha256 == b.model.sha256:
        pa, pb = ca.precisions, cb.precisions
        differ = [u for u in pa if pa[u] != pb.get(u)]
        shown = ", ".join(f"{u}: {pa[u]}→{pb.get(u)}" for u in differ[:6]) + (" …" if len(differ) > 6 else "")
        table.add_row("units chosen differently", f"{len(differ)} of {len(pa)}",
                      plain(shown or "—"))
    return table

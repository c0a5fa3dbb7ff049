"""Terminal output with rich: progress during a search, tables after it. Presentation only."""

from __future__ import annotations

import math
import sys
import time
from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from autoprec.search import TrialRecord

console = Console(stderr=True)
stdout = Console(file=sys.stdout)


def note(message: str) -> None:
    console.print(f"[dim]•[/dim] {message}", highlight=False)


def warn(message: str) -> None:
    console.print(f"[bold yellow]WARNING[/bold yellow] {message}", highlight=False)


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
        best = f"{self.best:.3f} ms" if self.best is not None else "—"
        latest = ""
        if last is not None:
            loss = f"{last.loss:.1e}" if math.isfinite(last.loss) else "inf"
            latest = f" · last {last.latency_ms:.3f} ms {loss}"
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


def front_table(front: Sequence[TrialRecord], chosen: TrialRecord | None, fp32_ms: float | None, metric: str, engine: str) -> Table:
    table = Table(title=f"Pareto front — {engine}", title_justify="left")
    for column in ("trial", "ms", "p10–p90", "×fp32", f"loss ({metric})", "i8/f16/f32", ""):
        table.add_column(column, justify="left" if not column else "right", no_wrap=True)
    for r in front:
        lat = r.measurement.latency
        counts = r.plan.counts()
        table.add_row(
            str(r.number),
            f"{lat.median_ms:.3f}",
            f"{lat.p10_ms:.3f}–{lat.p90_ms:.3f}",
            f"{fp32_ms / lat.median_ms:.2f}" if fp32_ms else "—",
            f"{r.loss:.2e}" if math.isfinite(r.loss) else "inf",
            f"{counts['int8']}/{counts['fp16']}/{counts['fp32']}",
            "[bold red]chosen[/bold red]" if chosen is not None and r.number == chosen.number else "",
        )
    return table

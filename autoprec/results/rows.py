"""The rows the tables of a result show (the terminal's front table, the report's): the Pareto
front, then every other trial a line of the result names (a rival, the plan not shipped, a plan left
out on the calibration batches), each column defined once here, from the record, so that a table
agrees with itself and with the lines beside it.

- ``ms``: the trial's final latency: the median of its re-timing rounds where it was re-timed, else of its own runs;
- ``low``–``high``: the spread of that same timing: those rounds' range, else its own runs' p10–p90 (so ``ms`` lies
  inside it);
- ``×fp32``: its speed-up over all-FP32 as the result states it: the final timing's where that timed it (the chosen
  plan, its rivals, the plan not shipped: the figures the lines say), else all-FP32's ``ms`` over its ``ms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoprec.core.escape import printable
from autoprec.record.trial import SHAPED, TrialRecord
from autoprec.record.verdict import Speedup
from autoprec.results.files import ResultFiles
from autoprec.tasks import TASKS, lower_is_closer, shown_keys

# What a row is, besides a front member or the chosen plan, as its table marks it and a caption
# explains it.
ROLES = {
    "rival": "timed with the chosen plan in its final rounds, which it did not win",
    "not shipped": "the fastest within the limit, not faster than all-FP32 beyond timing noise",
    "left out": "within --max-loss on the evaluation batches, past it on the calibration batches",
    "off the front": "not on the Pareto front: named by a line of the result",
}


COLUMNS_SAID = ("ms: median of the trial's re-timing rounds (else of its own runs); range: those "
                "rounds' min–max (else its runs' p10–p90); ×fp32: the final timing's speed-up "
                "where it timed the plan, else the re-timing's")


# The loss each --metric names, as every view (show, report, compare, the plots) says it: lower is
# better, 0 is FP32's own outputs; a similarity is said as its loss, never as itself beside it.
LOSS_NAMES = {"cosine": "cosine loss (1 − cosine)", "rel_l2": "rel. L2 error", "max_abs": "max abs "
                                                                                          "error",
              **{task.name: task.said for task in TASKS}}
# Each figure of a plan's outputs: its name with its direction (↓ lower is closer to FP32, ↑
# higher), and how the recorded value reads that way (a cosine similarity: its loss, 1 − cosine).
FIGURES = {"cosine": ("cosine loss (1 − cos) ↓", lambda v: 1.0 - v),
           "rel_l2": ("rel. L2 error ↓", None), "max_abs": ("max abs error ↓", None),
           "snr_db": ("SNR dB ↑", None)}


def loss_name(metric: str) -> str:
    """What ``--metric`` constrains, as a loss (``cosine`` → ``cosine loss (1 − cosine)``; a judge's
    note kept)."""
    name, _, note = metric.partition(" ")
    task, labelled, _ = name.partition("@")
    said = (f"{name}: drop from FP32's score on the labels" if labelled
            else LOSS_NAMES.get(name, f"{name} loss"))
    return f"{said} {note}".strip()


def figure(key: str, value: float, labels: dict[str, str]) -> tuple[str, float]:
    """A recorded figure as every table shows it: (its name with its direction, its value that way);
    ``labels``: the names of the decision figures (:data:`autoprec.results.files.DECISIONS`)."""
    if key in FIGURES:
        name, turn = FIGURES[key]
        return name, turn(value) if turn else value
    arrow = "↓" if lower_is_closer(key) else "↑"
    return f"{labels.get(key, key)} {arrow}", value


@dataclass(frozen=True)
class TrialRow:
    """One trial as the tables show it (see the module docstring for each column)."""

    trial: TrialRecord
    roles: tuple[str, ...]
    over_fp32: float | None  # None: no all-FP32 trial to compare with
    from_final_timing: bool  # over_fp32 is the final timing's (else the re-timing's medians')

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def ms(self) -> float:
        return self.trial.latency_ms

    @property
    def low(self) -> float:
        return self.trial.low_ms

    @property
    def high(self) -> float:
        return self.trial.high_ms

    @property
    def chosen(self) -> bool:
        return "chosen" in self.roles


def stated_speedups(result: ResultFiles) -> dict[int, Speedup]:
    """The speed-ups over all-FP32 the final timing measured, by trial: the figures the result's
    lines say."""
    versus, chosen = result.versus, result.chosen_number
    stated = {r.trial: r.claim for r in versus.rivals}
    if versus.not_shipped is not None:
        stated[versus.not_shipped.trial] = versus.not_shipped.claim
    if versus.fp32 is not None and chosen is not None:
        stated[chosen] = versus.fp32
    return stated


def _named(result: ResultFiles) -> dict[int, list[str]]:
    """The trials the result's lines name, with what each is."""
    versus, named = result.versus, {}
    if result.chosen_number is not None:
        named[result.chosen_number] = ["chosen"]
    for rival in versus.rivals:
        named.setdefault(rival.trial, []).append("rival")
    if versus.not_shipped is not None:
        named.setdefault(versus.not_shipped.trial, []).append("not shipped")
    held = result.facts.held_out
    for trial in held.failed() if held else ():
        named.setdefault(trial, []).append("left out")
    return named


def trial_rows(result: ResultFiles) -> list[TrialRow]:
    """The front, fastest first, then the other trials the result's lines name (fastest first)."""
    front = result.shown_front()
    named = _named(result)
    on_front = {t.number for t in front}
    others = sorted((t for n in named if n not in on_front and (t := result.shown_trial(n)) is not None),
                    key=lambda t: t.latency_ms)
    fp32 = result.uniform_trial("fp32")
    stated = {number: claim.speedup for number, claim in stated_speedups(result).items()}
    rows = []
    for t in [*front, *others]:
        roles = tuple(named.get(t.number, ())) + (() if t.number in on_front else ("off the "
                                                                                   "front",))
        if t.number in stated:
            rows.append(TrialRow(t, roles, stated[t.number], True))
        else:
            rows.append(TrialRow(t, roles, fp32.latency_ms / t.latency_ms if fp32 else None, False))
    return rows


def order_said(rows: list[TrialRow]) -> str | None:
    """Where a plan the final timing ran reads faster in ``ms`` than another it ran but slower in
    ``×fp32``: why (ms is its re-timing's median, beside all-FP32 in a few rounds of its own; ×fp32
    the final timing's, all of them in the same rounds, which decided); None where the columns
    agree."""
    timed = sorted((r for r in rows if r.from_final_timing and r.over_fp32 is not None),
                   key=lambda r: r.ms)
    pairs = [(a, b) for i, a in enumerate(timed) for b in timed[i + 1:]
             if a.ms < b.ms and a.over_fp32 < b.over_fp32]
    if not pairs:
        return None
    a, b = pairs[0]
    return (f"trial {a.number} reads faster than trial {b.number} in ms but slower in ×fp32: ms is "
            "each plan's re-timing median (a few rounds of its own beside all-FP32, at another "
            "moment than the other's), ×fp32 the final timing's, which ran them in the same rounds "
            "and decided")


def roles_said(rows: list[TrialRow]) -> str | None:
    """What the marks of these rows mean, in a line; None where no row has one."""
    found = dict.fromkeys(role for row in rows for role in row.roles if role != "chosen")
    return "; ".join(f"{role}: {ROLES[role]}" for role in found) or None


# What a trial decides, as the task metrics say (see autoprec.measure.accuracy): key, label, as a
# percentage; each figure of what an output decides, in words.
DECISIONS = (("equal", "values same"), *shown_keys())


def decisions(metrics: dict[str, dict[str, Any]]) -> str:
    """The task metrics of one trial in a few words (each output's, named when there are several);
    where it was judged at several shapes, each output's at the data's own shape and, where another
    is lower, the least."""
    parts = []
    own = {name: values for name, values in metrics.items() if SHAPED not in name}
    for name, values in own.items():
        found = []
        for key, label in DECISIONS:
            if key in values:
                found.append(f"{label} {float(values[key]):.1%}" + _least_elsewhere(metrics, name, key, values[key]))
        if found:
            parts.append((f"{printable(name)}: " if len(own) > 1 else "") + ", ".join(found))
    return "; ".join(parts)


def _least_elsewhere(metrics: dict[str, dict[str, Any]], name: str, key: str, here: float) -> str:
    """`` (worst 96.4% at prefill)`` where a judged shape's figure is worse than the data's own;
    else nothing."""
    # an error rate is worse higher, an agreement lower
    sign = -1.0 if lower_is_closer(key) else 1.0
    elsewhere = {other.split(SHAPED, 1)[1]: float(values[key]) for other, values in metrics.items()
                 if other.startswith(name + SHAPED) and key in values}
    if not elsewhere or min(sign * v for v in elsewhere.values()) >= sign * float(here):
        return ""
    where = min(elsewhere, key=lambda point: sign * elsewhere[point])
    return f" (worst {elsewhere[where]:.1%} at {printable(where)})"

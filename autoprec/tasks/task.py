"""What a task is: one kind of decision a model's output makes (its classes, its text, its boxes,
its neighbours), read from the raw output as every plan's and FP32's are, and the loss a plan's
decisions are judged by.

A task says once everything the rest of autoprec asks of it: its name (``--metric NAME``), the
metric its loss reads and which way is better, its figures in words, the label array it scores
against and the form that array takes, what output it needs; and reads an output: whether it
applies, what it scores.
"""

from __future__ import annotations

import abc
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np

from autoprec.tasks import regions


@dataclass(frozen=True)
class HeadOptions:
    """How to decode an output's decisions where its shape does not say (command-line options)."""

    blank: int = 0  # --ctc-blank
    # the recognizer's dictionary (--ctc-charset, or the model's metadata)
    charset: tuple[str, ...] | None = None
    layout: str | None = None  # --det-layout: yolov8 | yolov5 (inferred for channels-first heads)
    conf: float = 0.25  # --det-conf
    iou: float = 0.45  # --det-iou (NMS)
    output: str | None = None  # --task-output: the output the task metrics read
    db_thresh: float = regions.DB_THRESHOLD  # --db-thresh: text-regions' pixel threshold
    # --db-box-thresh: a region's mean probability to keep it
    db_box_thresh: float = regions.DB_BOX_THRESHOLD
    # the model's image input (H, W), from the data: where PicoDet's anchors lie
    image: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        charset = hashlib.sha256("\n".join(self.charset).encode()).hexdigest()[:12] if self.charset else None
        return {"blank": self.blank, "charset": charset, "layout": self.layout, "conf": self.conf,
                "iou": self.iou,
                "output": self.output, "db_thresh": self.db_thresh,
                "db_box_thresh": self.db_box_thresh,
                "image": list(self.image) if self.image else None}


@dataclass
class Reading:
    """What the tasks read outputs with: the head options, the tasks asked for (the constraint's,
    the labels', a zoo entry's), the outputs' shapes (as a batch has them), and FP32's decodes kept
    across plans (by task, output and batch count)."""

    options: HeadOptions
    asked: frozenset[str]
    # each output's, one evaluation batch's
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    kept: dict[tuple, Any] = field(default_factory=dict, repr=False)

    def reads(self, name: str) -> bool:
        """Whether the task metrics read output ``name`` (every output, or the one --task-output
        names)."""
        return self.options.output in (None, name)


@dataclass(frozen=True)
class Limit:
    """What a constraint's limit is said against: FP32's outputs over the evaluation batches
    (stacked, by output), the data's labels there (stacked), FP32's own metrics (which outputs a
    task scored)."""

    metric: str
    against_labels: bool
    max_loss: float
    references: Mapping[str, np.ndarray]
    labels: Mapping[str, np.ndarray]
    own: Mapping[str, Mapping[str, float]]


class Task(abc.ABC):
    """One task. A new one is a module of :mod:`autoprec.tasks` with a subclass and a line in its
    registry."""

    name: ClassVar[str]  # --metric NAME (and NAME@labels where it has ``labels``)
    key: ClassVar[str]  # the metric of an output its loss reads
    # the key agrees with FP32 (1: as FP32); else it is an error (0)
    higher_is_better: ClassVar[bool] = True
    said: ClassVar[str]  # its loss in words
    shown: ClassVar[tuple[tuple[str, str], ...]] = ()  # its metrics as every view names them
    labels: ClassVar[str | None] = None  # the data's array of ground truth it scores against
    label_form: ClassVar[str | None] = None  # that array's form, in words
    implied: ClassVar[bool] = False  # the data's ``labels`` array alone calls for this task
    needs: ClassVar[str] = "check --task-output"  # the output it reads, said where none fits
    # (key, what): decisions a similarity-chosen plan may change
    changes: ClassVar[tuple[str, str] | None] = None
    yields: ClassVar[tuple[str, ...]] = ()  # its keys, dropped where another task claims the output
    # FP32's score against the labels is doubted at chance (not at the worst)
    by_chance: ClassVar[bool] = False
    # its metrics read lower where closer to FP32 (errors, changes)
    lower_is_closer: ClassVar[tuple[str, ...]] = ()

    @property
    def label_key(self) -> str | None:
        return f"{self.key}_labels" if self.labels else None

    def loss(self, value: float) -> float:
        """The loss of a plan whose output scores ``value`` of the key (0: as FP32)."""
        return 1.0 - value if self.higher_is_better else value

    def label_drop(self, fp32: float, plan: float) -> float:
        """How much worse a plan scores against the labels than FP32 does."""
        return fp32 - plan if self.higher_is_better else plan - fp32

    def changed(self, values: Mapping[str, float]) -> float | None:
        """The share of its decisions a plan changed (``changes``), from an output's metrics; None:
        none counted."""
        if self.changes is None or self.changes[0] not in values:
            return None
        key, value = self.changes[0], values[self.changes[0]]
        # an error, or agreement
        return value if key == self.key and not self.higher_is_better else 1.0 - value

    def hopeless(self, value: float) -> bool:
        """Whether FP32's own score against the labels is the worst there is: labels not this
        model's."""
        return value <= 0.0 if self.higher_is_better else value >= 1.0

    @abc.abstractmethod
    def applies(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        """Whether output ``name`` (FP32's values over the evaluation batches) is one this task
        reads."""

    @abc.abstractmethod
    def scored(self, reading: Reading, name: str, ref: np.ndarray, cand: np.ndarray,
               labels: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The task's metrics of a plan's output ``cand`` against FP32's ``ref`` (and the stacked
        labels)."""

    def claims(self, reading: Reading, name: str, ref: np.ndarray) -> bool:
        """Whether the output is this task's own kind (boxes, vectors): other tasks' ``yields`` do
        not apply."""
        return False

    def when_nonfinite(self, name: str, ref: np.ndarray) -> dict[str, float]:
        """Its metrics of an output holding NaN or Inf (where it has a figure for that)."""
        return {}

    def transposed(self, reading: Reading, name: str, first: np.ndarray) -> tuple[int, ...] | None:
        """The axes to read a batch's output in where the head keeps them in another order (None: as
        it is)."""
        return None

    def scored_together(self, reading: Reading, refs: Mapping[str, np.ndarray],
                        cands: Mapping[str, np.ndarray],
                        labels: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
        """Metrics read from several outputs at once (a head spread over outputs), by the output
        they go on."""
        return {}

    def refused(self, reading: Reading, metric: str, against_labels: bool) -> str | None:
        """Why this task cannot constrain a search as asked (a dictionary its labels need), or
        None."""
        return None

    def limit_said(self, reading: Reading, limit: Limit) -> str | None:
        """What ``--max-loss`` allows in this task's decisions (None: it counts none)."""
        return None


def decisions_said(count: int, max_loss: float, metric: str, what: str) -> str:
    """``--max-loss`` over ``count`` decisions of equal weight: how many it allows, what one
    costs."""
    allowed, one = math.floor(max_loss * count + 1e-9), 1.0 / count
    said = (f"--max-loss {max_loss:g} with --metric {metric} over {count} evaluation decision(s) "
            f"allows {allowed} {what}: each is a loss of {one:.3g}")
    if allowed == 0:
        said += f"; give --max-loss {one:.3g} or more to allow one, or more evaluation data"
    return said

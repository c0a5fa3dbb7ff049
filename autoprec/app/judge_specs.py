"""The judge group: what decides a candidate's accuracy (the metric, the loss limit, the task heads'
options), and the --ctc-charset file it reads."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from autoprec.app.option_types import count_or_zero, fraction
from autoprec.app.specs import Group, suppressed
from autoprec.core import untrusted
from autoprec.core.errors import AutoprecError
from autoprec.measure.accuracy import AUTO
from autoprec.tasks import HeadOptions


@dataclass(frozen=True)
class JudgeSpec(Group):
    """What decides a candidate's accuracy: the metric, the loss limit, how task heads are
    decoded."""

    metric: str = AUTO
    max_loss: float | None = None
    head: HeadOptions = field(default_factory=HeadOptions)


    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, overriding: bool = False,
                      limit_help: str = "",
                      limit: bool = True) -> None:
        from autoprec.measure.accuracy import AUTO, BUILTIN_METRICS, TASK_METRICS
        from autoprec.tasks import DETECTION_LAYOUTS
        from autoprec.tasks.generation import NAME as GENERATION

        group = parser.add_argument_group("judge")
        recorded = " (default: the search's)" if overriding else ""
        if limit:
            group.add_argument("--max-loss", type=float, default=suppressed(overriding, None),
                               help=(limit_help or "accuracy-loss limit: the chosen plan is the "
                                                   "fastest within it")
                                    + recorded)
        group.add_argument(
            "--metric", default=suppressed(overriding, AUTO),
            help=f"the accuracy loss --max-loss constrains: {', '.join(BUILTIN_METRICS)} (default "
                 f"{AUTO}: {GENERATION} for a decoder with a KV cache, else cosine = 1 - mean "
                 f"cosine similarity; {GENERATION}: greedy generation's tokens and logits against "
                 f"FP32's, and the logits at every shape judged; {'/'.join(TASK_METRICS)}: the "
                 "decisions FP32 makes, changed; TASK@labels: the drop against the data's "
                 "labels), or module:function — that imports and RUNS your code. Every other "
                 "metric that applies is recorded beside it" + recorded)
        default = HeadOptions()
        group.add_argument("--ctc-blank", type=count_or_zero,
                           default=suppressed(overriding, default.blank),
                           metavar="INDEX", help="ctc-text: the blank class (default 0)")
        group.add_argument("--ctc-charset", metavar="FILE", default=suppressed(overriding, None),
                           help="ctc-text against labelled text: the recognizer's characters, one "
                                "per line: every class in order (an empty line for the blank), or "
                                "PaddleOCR's dictionary (default: the model's 'character' "
                                "metadata, as RapidOCR's models carry it)")
        group.add_argument("--det-layout", choices=DETECTION_LAYOUTS,
                           default=suppressed(overriding, None),
                           help="detection: yolov8 (4 box + classes, no objectness), yolov5 (box, "
                                "objectness, classes; YOLOX exported decoded too), yolox (YOLOX's "
                                "raw head: boxes per grid cell, strides 8/16/32) or picodet "
                                "(PicoDet/GFL: per stride scores and box distributions, read "
                                "together); inferred for channels-first heads")
        group.add_argument("--det-conf", type=fraction,
                           default=suppressed(overriding, default.conf),
                           metavar="SCORE", help="detection: score threshold (default 0.25)")
        group.add_argument("--det-iou", type=fraction, default=suppressed(overriding, default.iou),
                           metavar="IOU",
                           help="detection: NMS IoU (default 0.45)")
        group.add_argument("--db-thresh", type=fraction,
                           default=suppressed(overriding, default.db_thresh),
                           metavar="P", help="text-regions: a pixel's probability of text (default "
                                             "0.3, PaddleOCR's)")
        group.add_argument("--db-box-thresh", type=fraction,
                           default=suppressed(overriding, default.db_box_thresh),
                           metavar="P", help="text-regions: a region's mean probability to keep it "
                                             "(default 0.6)")
        group.add_argument("--task-output", metavar="NAME", default=suppressed(overriding, None),
                           help="the output task metrics read (default: every output that fits)")

    def __post_init__(self) -> None:
        # -0.0 (from "--max-loss -0") is said as 0
        if isinstance(self.max_loss, float) and self.max_loss == 0:
            object.__setattr__(self, "max_loss", 0.0)

    HEAD = {"ctc_blank": "blank", "ctc_charset": "charset", "det_layout": "layout",
            "det_conf": "conf",
            "det_iou": "iou", "task_output": "output", "db_thresh": "db_thresh",
            "db_box_thresh": "db_box_thresh"}

    @classmethod
    def given(cls, args: argparse.Namespace) -> dict[str, Any]:
        values = {k: getattr(args, k) for k in ("metric", "max_loss") if hasattr(args, k)}
        head = {option: getattr(args, dest) for dest, option in cls.HEAD.items() if hasattr(args, dest)}
        if "charset" in head and head["charset"] is not None:
            head["charset"] = read_charset(head["charset"])
        if head:
            values["head"] = head
        return values

    def replaced(self, args: argparse.Namespace) -> JudgeSpec:
        """The head options given replace those of this group one by one."""
        values = self.given(args)
        head = replace(self.head, **values.pop("head", {}))
        return replace(self, **values, head=head)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JudgeSpec:
        head = dict(data.get("head") or {})
        if head.get("charset") is not None:
            head["charset"] = tuple(head["charset"])
        if head.get("image") is not None:
            head["image"] = tuple(head["image"])
        return cls(data.get("metric", "cosine"), data.get("max_loss"), HeadOptions(**head))

    def checked(self) -> JudgeSpec:
        if self.max_loss is not None and (isinstance(self.max_loss, bool) or not isinstance(self.max_loss, (int, float))):
            raise AutoprecError(f"--max-loss {self.max_loss!r}: a number (the API was given a "
                                f"{type(self.max_loss).__name__})")
        if self.max_loss is not None and not (math.isfinite(self.max_loss) and self.max_loss >= 0):
            raise AutoprecError(f"--max-loss {self.max_loss}: must be a finite loss of 0 or more")
        return self


CHARSET_BYTES = 16 << 20  # the most a --ctc-charset may hold (PaddleOCR's largest: 70 KB)


def read_charset(path: str | os.PathLike) -> tuple[str, ...]:
    """--ctc-charset: one character per line."""
    try:
        text = untrusted.read_bytes(Path(path), "a charset", CHARSET_BYTES, given=True).decode()
        return tuple(text.splitlines())
    except (OSError, ValueError) as exc:
        raise AutoprecError(f"--ctc-charset {path}: cannot be read ({exc}); give a UTF-8 text "
                            "file, one character per line") from None

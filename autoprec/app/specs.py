"""What a verb is asked, in groups every verb shares (after Polygraphy's ``tools/args``): the inputs, the
engine, the judge, the space, the study, the isolation limits. Each group is one typed object with its
command-line options, its checks and its JSON; a search records them, and the verbs that start from a
result start from the recorded ones, any option given on the command line overriding them (and said).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from autoprec.analysis.calibrate import CALIBRATION_METHODS
from autoprec.analysis.images import ORDERS, RESIZES, SCALES, ImageOptions
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import AUTO_CALIBRATION, DEFAULT_CALIBRATION, calibration_method
from autoprec.core.profile import ShapeProfile
from autoprec.measure.accuracy import HeadOptions
from autoprec.study.coordination import DEFAULT_HEARTBEAT, GRACE_BEATS, redacted

log = logging.getLogger("autoprec")


# --- argparse types: a value of the wrong form is refused by the parser, naming the option ---

def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
        if not sep or not name or any(d <= 0 for d in shape):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=DIMS with positive dims, e.g. x=1x3x224x224"
        ) from None
    return name, shape


def _constant(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        number = float(value)
        if not sep or not name or not math.isfinite(number):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=NUMBER, e.g. sr=16000") from None
    return name, int(number) if number.is_integer() else number


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected one number or a comma list, e.g. 0.485,0.456,0.406"
        ) from None


def number(convert, acceptable, requirement: str):
    """An argparse type: a number of type ``convert`` that satisfies ``acceptable``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if convert is int else ''}number") from None
        if not acceptable(value):
            raise argparse.ArgumentTypeError(f"{text}: {requirement}")
        return value

    return parse


count = number(int, lambda v: v >= 1, "must be at least 1")
positive = number(float, lambda v: v > 0 and math.isfinite(v), "must be a finite number more than 0")
count_or_zero = number(int, lambda v: v >= 0, "must be 0 or more")
fraction = number(float, lambda v: 0 <= v <= 1, "must be between 0 and 1")
gpu_index = number(int, lambda v: v >= 0, "must be a GPU index: 0 or more (see nvidia-smi -L)")


# Ranges of numbers are checked by each group's ``checked`` (one check for the API and the command line alike);
# the parser only reads numbers.


class Group:
    """A spec group: its fields are options; ``add_arguments`` declares them (``overriding``: a verb that starts
    from a recorded search, so an option left out keeps the recorded value); ``given`` reads them back."""

    # field name -> argparse dest, where they differ or the option is negated (``not``-prefixed)
    DESTS: ClassVar[dict[str, str]] = {}

    @classmethod
    def given(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The fields the command line set (with ``overriding`` options, those it named)."""
        values = {}
        for f in fields(cls):
            dest = cls.DESTS.get(f.name, f.name)
            negated = dest.startswith("not ")
            dest = dest.removeprefix("not ")
            if hasattr(args, dest):
                value = getattr(args, dest)
                values[f.name] = (not value) if negated else value
        return values

    def replaced(self, args: argparse.Namespace):
        """This group with the fields the command line set."""
        return replace(self, **self.given(args))

    @classmethod
    def from_args(cls, args: argparse.Namespace):
        return cls().replaced(args)

    def checked(self):
        """This group, or one line naming the option that cannot be used and why."""
        return self

    def to_json(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def overridden(self, args: argparse.Namespace, verb: str):
        """This recorded group with what the command line gave instead, each change said once."""
        changed = self.replaced(args)
        for f in fields(self):
            old, new = getattr(self, f.name), getattr(changed, f.name)
            if new != old:
                log.info(f"{verb}: {f.name.replace('_', ' ')} {_shown(new)} instead of the search's {_shown(old)}")
        return changed


def _jsonable(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, HeadOptions):
        return {f.name: _jsonable(getattr(value, f.name)) for f in fields(value)}
    return value


def _shown(value: Any) -> str:
    """An option's value in a line (head options with their charset's digest, not its thousands of characters)."""
    if isinstance(value, HeadOptions):
        return str(value.to_json())
    return "none" if value is None else str(_jsonable(value))


def _suppressed(overriding: bool, default: Any) -> Any:
    return argparse.SUPPRESS if overriding else default


@dataclass(frozen=True)
class InputSpec(Group):
    """The model and what it is fed: data, shapes (``shapes``: the measured opt; ``min_shapes``/``max_shapes``:
    the deployment profile), constant inputs, image normalisation."""

    model: str | os.PathLike
    data: str | os.PathLike | None = None
    shapes: Mapping[str, Sequence[int]] | None = None
    min_shapes: Mapping[str, Sequence[int]] | None = None
    max_shapes: Mapping[str, Sequence[int]] | None = None
    constants: Mapping[str, float] | None = None
    image_mean: Sequence[float] = (0.0,)
    image_std: Sequence[float] = (1.0,)
    image_order: str = "RGB"
    image_scale: float = 1.0
    image_resize: str = "stretch"

    @property
    def image(self) -> ImageOptions:
        """How a folder of images becomes the input (see autoprec.analysis.images)."""
        return ImageOptions(tuple(self.image_mean), tuple(self.image_std), self.image_order, float(self.image_scale),
                            self.image_resize)

    DESTS = {"shapes": "shape", "min_shapes": "min_shape", "max_shapes": "max_shape", "constants": "const"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, profile: bool = False, overriding: bool = False) -> None:
        from autoprec.analysis.data import RANDOM_INTEGERS

        group = parser.add_argument_group("inputs")
        recorded = " (default: the search's)" if overriding else ""
        group.add_argument("--data", default=_suppressed(overriding, None),
                           help="folder of .npy/.npz files or images, or one .npz with arrays named like the inputs"
                                + recorded)
        group.add_argument("--shape", action="append", type=_shape, default=_suppressed(overriding, []),
                           metavar="NAME=DIMS", help="fix an input's shape, e.g. x=1x3x224x224 (repeatable)" + recorded)
        if profile:
            group.add_argument("--min-shape", action="append", type=_shape, default=[], metavar="NAME=DIMS",
                               help="the smallest shape input NAME takes in deployment, e.g. x=1x3x48x160 (repeatable; "
                                    "default: --shape, which is the opt shape the search measures at). With "
                                    "--max-shape it is the shape profile every export carries (TensorRT's "
                                    "min/opt/max, Triton's -1 dims)")
            group.add_argument("--max-shape", action="append", type=_shape, default=[], metavar="NAME=DIMS",
                               help="the largest shape input NAME takes in deployment, e.g. x=8x3x48x960 "
                                    "(see --min-shape)")
        if overriding:
            return
        group.add_argument("--const", action="append", type=_constant, default=[], metavar="NAME=VALUE",
                           help="feed input NAME this one value on every run, e.g. sr=16000 for a sample-rate scalar "
                                "(repeatable; the data need not hold it). Random data cannot choose a scalar integer "
                                f"input: it needs this or --data; other integer inputs are drawn from "
                                f"[{RANDOM_INTEGERS[0]}, {RANDOM_INTEGERS[1]})")
        group.add_argument("--image-mean", type=_floats, default=(0.0,),
                           help="images (a --data folder of them): per-channel mean, as in (pixel - mean) / std "
                                "with pixels in 0..1 (--image-scale 255: 0..255), e.g. 0.485,0.456,0.406. The layout "
                                "(N×C×H×W or N×H×W×C) is read off the input's shape")
        group.add_argument("--image-std", type=_floats, default=(1.0,), help="per-channel std (see --image-mean)")
        group.add_argument("--image-order", choices=ORDERS, type=str.upper, default="RGB",
                           help="channel order the model takes (BGR: Caffe-style models such as Keras' ResNet50)")
        group.add_argument("--image-scale", type=float, choices=SCALES, default=1.0,
                           help="a white pixel's value before mean and std: 1 (pixels 0..1, default) or 255")
        group.add_argument("--image-resize", choices=RESIZES, default="stretch",
                           help="stretch each image to the input's height and width (default), or crop: its shorter "
                                "side resized to them and the centre cut out (torchvision's Resize + CenterCrop)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> InputSpec:
        return cls(args.model, **cls.given(args))

    @classmethod
    def given(cls, args: argparse.Namespace) -> dict[str, Any]:
        values = super().given(args)
        values.pop("model", None)
        return {k: (_once_each(v, k) if k.endswith("shapes") or k == "constants" else v) for k, v in values.items()}


def _once_each(pairs: Sequence[tuple[str, Any]], field_name: str) -> dict[str, Any]:
    """A repeatable NAME=VALUE option as a mapping; a name given twice is refused (the last would win, silently)."""
    found: dict[str, Any] = {}
    option = "--" + {"shapes": "shape", "min_shapes": "min-shape", "max_shapes": "max-shape"}.get(field_name, "const")
    for name, value in pairs:
        if name in found and found[name] != value:
            def said(v: Any) -> str:
                return "x".join(map(str, v)) if isinstance(v, tuple) else f"{v:g}"

            raise AutoprecError(f"{option} {name} given twice ({said(found[name])} and {said(value)}); give each input "
                                "once")
        found[name] = value
    return found


MAX_THREADS_PER_CORE = 4


@dataclass(frozen=True)
class EngineSpec(Group):
    """The engine that builds, runs and times candidates, on which device, with how many threads."""

    backend: str = "ort-cpu"
    device: int = 0
    threads: int = 0


    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, overriding: bool = False) -> None:
        from autoprec.backends import BACKENDS

        group = parser.add_argument_group("engine")
        recorded = " (default: the search's engine)" if overriding else " (default ort-cpu"
        group.add_argument(
            "--backend", default=_suppressed(overriding, "ort-cpu"), choices=BACKENDS,
            help="inference engine" + recorded + ("" if overriding else
                 "; ort-cuda needs onnxruntime-gpu and an NVIDIA GPU; tensorrt needs TensorRT 10.12+ and cuda-python; "
                 "tensorrt-rtx needs TensorRT for RTX (PyPI) and a GPU of compute capability 8.0/8.6/8.9/12.x. Both "
                 "TensorRT backends' builds run in autoprec's CI; their engine runs and timing have never been "
                 "executed by its developers)"))
        group.add_argument("--device", type=gpu_index, default=_suppressed(overriding, 0), metavar="N",
                           help="GPU index for ort-cuda/tensorrt (default 0)")
        group.add_argument("--threads", type=int, default=_suppressed(overriding, 0), metavar="N",
                           help="ONNX Runtime's intra-op threads for every timed run (default 0: its own, one per "
                                "core); latencies hold for the thread count they were taken at")

    def checked(self) -> EngineSpec:
        from autoprec.backends import backend_class

        backend_class(self.backend)  # an engine autoprec has, or one line listing them
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise AutoprecError(f"--threads {self.threads}: a whole number of threads (0: ONNX Runtime's default)")
        cores = os.cpu_count() or 1
        if self.threads > MAX_THREADS_PER_CORE * cores:
            raise AutoprecError(f"--threads {self.threads}: more than {MAX_THREADS_PER_CORE}× this machine's {cores} "
                                "cores; timings with threads fighting over cores measure the contention")
        return self


@dataclass(frozen=True)
class JudgeSpec(Group):
    """What decides a candidate's accuracy: the metric, the loss limit, how task heads are decoded."""

    metric: str = "cosine"
    max_loss: float | None = None
    head: HeadOptions = field(default_factory=HeadOptions)


    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, overriding: bool = False, limit_help: str = "",
                      limit: bool = True) -> None:
        from autoprec.measure.accuracy import BUILTIN_METRICS
        from autoprec.measure.tasks import DETECTION_LAYOUTS

        group = parser.add_argument_group("judge")
        recorded = " (default: the search's)" if overriding else ""
        if limit:
            group.add_argument("--max-loss", type=float, default=_suppressed(overriding, None),
                               help=(limit_help or "accuracy-loss limit: the chosen plan is the fastest within it")
                                    + recorded)
        group.add_argument(
            "--metric", default=_suppressed(overriding, "cosine"),
            help=f"the accuracy loss --max-loss constrains: {', '.join(BUILTIN_METRICS)} (default cosine = 1 - mean "
                 "cosine similarity; top1/ctc-text/detection/embedding/text-regions/segmentation: the decisions FP32 "
                 "makes, changed; "
                 "TASK@labels: the drop against the data's labels), or module:function — that imports and RUNS "
                 "your code. Every other metric that applies is recorded beside it" + recorded)
        default = HeadOptions()
        group.add_argument("--ctc-blank", type=count_or_zero, default=_suppressed(overriding, default.blank),
                           metavar="INDEX", help="ctc-text: the blank class (default 0)")
        group.add_argument("--ctc-charset", metavar="FILE", default=_suppressed(overriding, None),
                           help="ctc-text against labelled text: the recognizer's characters, one per line: every "
                                "class in order (an empty line for the blank), or PaddleOCR's dictionary (default: "
                                "the model's 'character' metadata, as RapidOCR's models carry it)")
        group.add_argument("--det-layout", choices=DETECTION_LAYOUTS, default=_suppressed(overriding, None),
                           help="detection: yolov8 (4 box + classes, no objectness), yolov5 (box, objectness, "
                                "classes; YOLOX exported decoded too), yolox (YOLOX's raw head: boxes per grid "
                                "cell, strides 8/16/32) or picodet (PicoDet/GFL: per stride scores and box "
                                "distributions, read together); inferred for channels-first heads")
        group.add_argument("--det-conf", type=fraction, default=_suppressed(overriding, default.conf),
                           metavar="SCORE", help="detection: score threshold (default 0.25)")
        group.add_argument("--det-iou", type=fraction, default=_suppressed(overriding, default.iou), metavar="IOU",
                           help="detection: NMS IoU (default 0.45)")
        group.add_argument("--db-thresh", type=fraction, default=_suppressed(overriding, default.db_thresh),
                           metavar="P", help="text-regions: a pixel's probability of text (default 0.3, PaddleOCR's)")
        group.add_argument("--db-box-thresh", type=fraction, default=_suppressed(overriding, default.db_box_thresh),
                           metavar="P", help="text-regions: a region's mean probability to keep it (default 0.6)")
        group.add_argument("--task-output", metavar="NAME", default=_suppressed(overriding, None),
                           help="the output task metrics read (default: every output that fits)")

    def __post_init__(self) -> None:
        if isinstance(self.max_loss, float) and self.max_loss == 0:  # -0.0 (from "--max-loss -0") is said as 0
            object.__setattr__(self, "max_loss", 0.0)

    HEAD = {"ctc_blank": "blank", "ctc_charset": "charset", "det_layout": "layout", "det_conf": "conf",
            "det_iou": "iou", "task_output": "output", "db_thresh": "db_thresh", "db_box_thresh": "db_box_thresh"}

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
        if self.max_loss is not None and not (math.isfinite(self.max_loss) and self.max_loss >= 0):
            raise AutoprecError(f"--max-loss {self.max_loss}: must be a finite loss of 0 or more")
        return self


def read_charset(path: str | os.PathLike) -> tuple[str, ...]:
    """--ctc-charset: one character per line."""
    try:
        return tuple(Path(path).read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError) as exc:
        raise AutoprecError(f"--ctc-charset {path}: cannot be read ({exc}); give a UTF-8 text file, one character "
                            "per line") from None


@dataclass(frozen=True)
class SpaceSpec(Group):
    """What a unit may take: the search-space file and overrides, the precisions searched, the INT8
    calibration method, and whether repeated blocks are decided together."""

    search_space: str | os.PathLike | None = None
    overrides: Sequence[str] = ()
    precisions: Sequence[str] | None = None
    calibration: str = DEFAULT_CALIBRATION
    tie_repeats: bool = True

    DESTS = {"overrides": "override", "tie_repeats": "not separate_repeats"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
        group = parser.add_argument_group("search space")
        group.add_argument("--precisions", type=lambda text: text.split(","), metavar="LIST",
                           help=f"precisions the {verb} may use, e.g. fp16,fp32 (default: those the engine runs faster "
                                "than FP32 — all on ort-cpu; fp16,fp32 on ort-cuda, whose Q/DQ INT8 runs as float ops)")
        group.add_argument("--separate-repeats", action="store_true",
                           help="decide every unit on its own (default: the units of a repeated block at the same "
                                "position — a transformer's 12 query projections — are decided together, one "
                                "dimension for all)")
        group.add_argument("--calibration", default=DEFAULT_CALIBRATION, choices=(*CALIBRATION_METHODS, AUTO_CALIBRATION),
                           help=f"INT8 activation range method (default {DEFAULT_CALIBRATION}); auto: the study "
                                "chooses per trial (entropy costs ~0.7 s per tensor once)")
        group.add_argument("--search-space", help="search-space YAML (default: the bundled search_spaces/default.yaml)")
        group.add_argument("--override", action="append", default=[], metavar="PATTERN=PRECISIONS",
                           help="restrict layers whose name matches PATTERN (fnmatch), e.g. '/head/*=fp32' "
                                "(repeatable)")

    def checked(self) -> SpaceSpec:
        if self.calibration not in (*CALIBRATION_METHODS, AUTO_CALIBRATION):
            raise AutoprecError(f"--calibration {self.calibration!r}: choose auto or one of "
                                f"{', '.join(CALIBRATION_METHODS)}")
        return self

    @property
    def method(self) -> str:
        """The INT8 range method a plan starts with (``auto``: the study chooses per trial)."""
        return calibration_method(self.calibration)


@dataclass(frozen=True)
class StudySpec(Group):
    """The Optuna study: its budget, seed and sampler, where it is stored and shared, and how it starts
    (the sensitivity warm start, cheap rejection, plans judged before each build)."""

    budget: int = 50
    seed: int = 0
    sampler: str = "tpe"
    storage: str | None = None
    study_name: str | None = None
    artifacts: str | os.PathLike | None = None
    heartbeat: int = DEFAULT_HEARTBEAT
    warm_start: bool = True
    early_reject: bool = True
    proposals: int | None = None

    DESTS = {"warm_start": "not no_warm_start", "early_reject": "not no_early_reject"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from autoprec.study.optimize import SAMPLERS

        group = parser.add_argument_group("study")
        group.add_argument("--budget", type=int, default=50, help="number of trials (default 50)")
        group.add_argument("--seed", type=int, default=0, help="sampler and data-split seed (default 0)")
        group.add_argument("--sampler", default="tpe", choices=SAMPLERS,
                           help="Optuna sampler after the warm start (default tpe: multi-objective TPE; gp needs "
                                "torch)")
        group.add_argument("--no-warm-start", action="store_true",
                           help="skip the sensitivity pass and its warm-start plans (the study starts from the "
                                "uniform plans)")
        group.add_argument("--no-early-reject", action="store_true",
                           help="evaluate and time every candidate fully, even one far past --max-loss on the first "
                                "batches")
        group.add_argument("--storage", help="Optuna storage URL (default sqlite:///<out>/study.db); workers given the "
                                             "same postgresql://… URL and --study-name share one study and its --budget")
        group.add_argument("--study-name", help="Optuna study name (default autoprec-<model stem>-<backend>)")
        group.add_argument("--artifacts", metavar="DIR",
                           help="Optuna artifact store where the first worker leaves calibration, reference and "
                                "sensitivity for the others (default: beside a SQLite storage, else "
                                "~/.cache/autoprec/artifacts; across hosts: a shared directory)")
        group.add_argument("--heartbeat", type=int, default=DEFAULT_HEARTBEAT, metavar="SECONDS",
                           help=f"a running trial's heartbeat; one silent for {GRACE_BEATS} beats (dead worker) is "
                                f"re-run once by another worker (default {DEFAULT_HEARTBEAT})")
        group.add_argument("--proposals", type=int, metavar="N",
                           help="plans judged before each build: ONNX Runtime on the CPU computes each one's loss on "
                                "the graph the engine would build, a latency model fitted to the engine's profiles "
                                "predicts its latency, and only the plan that decides most is built and timed (0: "
                                "every trial is built; default 8 on tensorrt, where builds are slow, 0 on ONNX "
                                "Runtime)")

    def to_json(self) -> dict[str, Any]:
        """As recorded: a password in the storage URL never is."""
        recorded = super().to_json()
        if self.storage is not None:
            recorded["storage"] = redacted(self.storage)
        return recorded

    def checked(self) -> StudySpec:
        for option, value in (("--study-name", self.study_name), ("--artifacts", self.artifacts),
                              ("--storage", self.storage)):
            if value is not None and not str(value).strip():
                raise AutoprecError(f"{option} '': empty; give a value or leave the option out for the default")
        for option, value, what in (("--budget", self.budget, " (the number of trials to run)"),
                                    ("--heartbeat", self.heartbeat, "")):
            if _bad_whole(value) or value < 1:
                raise AutoprecError(f"{option} {value}: must be {'a whole number, ' if _bad_whole(value) else ''}"
                                    f"at least 1{what}")
        if self.proposals is not None and (_bad_whole(self.proposals) or self.proposals < 0):
            raise AutoprecError(f"--proposals {self.proposals}: must be 0 (every trial built) or more")
        if _bad_whole(self.seed) or not 0 <= self.seed < 2**32:
            raise AutoprecError(f"--seed {self.seed}: must be a whole number from 0 to {2**32 - 1} (NumPy's and "
                                "Optuna's samplers take 32-bit seeds)")
        return self


def _bad_whole(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


MIN_TRIAL_SECONDS = 1.0  # below this no candidate could be measured within its limit


@dataclass(frozen=True)
class IsolationSpec(Group):
    """Where candidates run: worker processes limited in time and memory (a crash fails one trial), how many."""

    isolate: bool = True
    trial_timeout: float = 600.0
    trial_memory_gb: float | None = None
    build_workers: int | None = None

    DESTS = {"isolate": "not no_isolation", "trial_memory_gb": "trial_memory"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("isolation")
        group.add_argument("--trial-timeout", type=float, default=600.0, metavar="SECONDS",
                           help="time limit to build and measure one candidate (default 600)")
        group.add_argument("--trial-memory", type=float, metavar="GB",
                           help="memory limit of the worker measuring candidates (default 75%% of RAM)")
        group.add_argument("--build-workers", type=int, metavar="N",
                           help="worker processes measuring candidates side by side: builds overlap, evaluation and "
                                "timing take the device one at a time (default 2 on tensorrt, 1 on ONNX Runtime)")
        group.add_argument("--no-isolation", action="store_true",
                           help="measure candidates in this process (debugging; an engine crash then ends the search)")

    def checked(self) -> IsolationSpec:
        if self.build_workers is not None and (_bad_whole(self.build_workers) or self.build_workers < 1):
            raise AutoprecError(f"--build-workers {self.build_workers}: must be at least 1")
        if self.build_workers and self.build_workers > 1 and not self.isolate:
            raise AutoprecError(f"--build-workers {self.build_workers} needs worker processes; drop --no-isolation")
        for option, value in (("--trial-timeout", self.trial_timeout), ("--trial-memory", self.trial_memory_gb)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise AutoprecError(f"{option} {value}: must be a finite number more than 0")
        if self.trial_timeout < MIN_TRIAL_SECONDS:
            raise AutoprecError(f"--trial-timeout {self.trial_timeout:g}: a candidate is built, then timed for at least "
                                f"0.2 s of runs; give {MIN_TRIAL_SECONDS:g} second(s) or more")
        return self


def _batch_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        found = (int(low), int(high))
        if not sep or not 0 < found[0] <= found[1]:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LOW:HIGH batch sizes, 0 < LOW <= HIGH, e.g. 1:8") from None
    return found


@dataclass(frozen=True)
class ProfileSpec(Group):
    """The deployment profile an export is written for: the search's, widened where asked (``min_shapes`` /
    ``max_shapes`` by input, ``batch``: the dynamic first dim of every input that has one, LOW to HIGH). Widening
    needs no new search: the plan is lowered onto the source's dims and checked at the new min and max."""

    min_shapes: Mapping[str, Sequence[int]] | None = None
    max_shapes: Mapping[str, Sequence[int]] | None = None
    batch: tuple[int, int] | None = None

    DESTS = {"min_shapes": "min_shape", "max_shapes": "max_shape"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("deployment profile (default: the search's; widened without a new search, "
                                          "the plan checked against the given model at the new min and max)")
        group.add_argument("--batch", type=_batch_range, metavar="LOW:HIGH",
                           help="every input's dynamic first dim from LOW to HIGH, e.g. 1:8 (the measured batch "
                                "within them)")
        group.add_argument("--min-shape", action="append", type=_shape, default=[], metavar="NAME=DIMS",
                           help="the smallest shape input NAME takes, e.g. x=1x3x48x160 (repeatable)")
        group.add_argument("--max-shape", action="append", type=_shape, default=[], metavar="NAME=DIMS",
                           help="the largest shape input NAME takes, e.g. x=8x3x48x960 (repeatable)")

    @classmethod
    def given(cls, args: argparse.Namespace) -> dict[str, Any]:
        return {k: (dict(v) or None if k.endswith("shapes") else v) for k, v in super().given(args).items()}

    @property
    def widens(self) -> bool:
        return bool(self.min_shapes or self.max_shapes or self.batch)

    def applied(self, profile: ShapeProfile) -> ShapeProfile:
        """``profile`` widened as asked (itself where nothing is), or one line naming the option that cannot be."""
        if not self.widens:
            return profile
        as_dims = lambda shapes: {k: tuple(v) for k, v in (shapes or {}).items()}  # noqa: E731
        return profile.widened(as_dims(self.min_shapes), as_dims(self.max_shapes), self.batch)

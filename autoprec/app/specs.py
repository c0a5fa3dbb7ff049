"""What a verb is asked, in groups every verb shares (after Polygraphy's ``tools/args``): the
inputs, the engine, the judge, the space, the study, the isolation limits. Each group is one typed
object with its command-line options, its checks and its JSON; a search records them, and the verbs
that start from a result start from the recorded ones, any option given on the command line
overriding them (and said).

Here: a group's shape (:class:`Group`), the parsers of option values, the inputs, the engine and the
export's deployment profile; the judge is in :mod:`autoprec.app.judge_specs`, the groups only a
search is asked (space, study, isolation) in :mod:`autoprec.app.search_specs`.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Mapping, Sequence

from autoprec.analysis.images import ORDERS, RESIZES, SCALES, ImageOptions
from autoprec.app.option_types import (
    batch_range_arg,
    constant_arg,
    dim_range_arg,
    floats_arg,
    gpu_index,
    runs_arg,
    shape_arg,
)
from autoprec.core import engines
from autoprec.core.errors import AutoprecError
from autoprec.core.profile import ShapeProfile
from autoprec.study.coordination import redacted
from autoprec.tasks import HeadOptions

log = logging.getLogger("autoprec")


# Ranges of numbers are checked by each group's ``checked`` (one check for the API and the command
# line alike); the parser only reads numbers.


class Group:
    """A spec group: its fields are options; ``add_arguments`` declares them (``overriding``: a verb
    that starts from a recorded search, so an option left out keeps the recorded value); ``given``
    reads them back."""

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

    # fields whose value is recorded with its password hidden (a storage URL's)
    REDACTED: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        """As a result records it (``search.spec``): every field, a password in a URL hidden."""
        return {f.name: redacted(value) if f.name in self.REDACTED and value is not None else _jsonable(value)
                for f in fields(self) for value in [getattr(self, f.name)]}

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
                log.info(f"{verb}: {f.name.replace('_', ' ')} {_shown(new)} instead of the "
                         f"search's {_shown(old)}")
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
    """An option's value in a line (head options with their charset's digest, not its thousands of
    characters)."""
    if isinstance(value, HeadOptions):
        return str(value.to_json())
    return "none" if value is None else str(_jsonable(value))


def suppressed(overriding: bool, default: Any) -> Any:
    return argparse.SUPPRESS if overriding else default


@dataclass(frozen=True)
class InputSpec(Group):
    """The model and what it is fed: data, shapes (``shapes``: the measured opt;
    ``min_shapes``/``max_shapes``: the deployment profile), constant inputs, image normalisation."""

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
    # --dim: a named dim's range at every input
    dims: Mapping[str, tuple[int, int | None, int]] | None = None
    # --shape-weights: runs per request of each judged shape
    shape_weights: Mapping[str, int] | None = None

    def checked(self) -> InputSpec:
        """One line where a judged shape's runs are not a whole number of 0 or more (the API took a
        negative one, and the search failed writing its result)."""
        for name, runs in (self.shape_weights or {}).items():
            if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
                raise AutoprecError(f"--shape-weights {name}={runs!r}: runs per request are a whole number of 0 "
                                    "or more")
        return self

    @property
    def image(self) -> ImageOptions:
        """How a folder of images becomes the input (see autoprec.analysis.images)."""
        return ImageOptions(tuple(self.image_mean), tuple(self.image_std), self.image_order,
                            float(self.image_scale),
                            self.image_resize)

    DESTS = {"shapes": "shape", "min_shapes": "min_shape", "max_shapes": "max_shape",
             "constants": "const",
             "dims": "dim"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, profile: bool = False,
                      overriding: bool = False) -> None:
        from autoprec.analysis.data import RANDOM_INTEGERS

        group = parser.add_argument_group("inputs")
        recorded = " (default: the search's)" if overriding else ""
        group.add_argument("--data", default=suppressed(overriding, None),
                           help="folder of .npy/.npz files or images, or one .npz with arrays "
                                "named like the inputs"
                                + recorded)
        group.add_argument("--shape", action="append", type=shape_arg,
                           default=suppressed(overriding, []),
                           metavar="NAME=DIMS", help="fix an input's shape, e.g. x=1x3x224x224 "
                                                     "(repeatable)" + recorded)
        if profile:
            group.add_argument("--min-shape", action="append", type=shape_arg, default=[],
                               metavar="NAME=DIMS",
                               help="the smallest shape input NAME takes in deployment, e.g. "
                                    "x=1x3x48x160 (repeatable; 0: an empty past). With --max-shape "
                                    "it is the shape profile every export carries (TensorRT's "
                                    "min/opt/max, Triton's -1 dims); every plan is judged at both. "
                                    "Default: derived where the model runs there (batch 1, a "
                                    "sequence of 1, a past of 0); a decoder with a KV cache is "
                                    "judged at prefill and decode")
            group.add_argument("--max-shape", action="append", type=shape_arg, default=[],
                               metavar="NAME=DIMS",
                               help="the largest shape input NAME takes in deployment, e.g. "
                                    "x=8x3x48x960 (see --min-shape)")
            group.add_argument("--dim", action="append", type=dim_range_arg, default=[],
                               metavar="NAME=MIN:OPT:MAX",
                               help="a named dynamic dim's range at every input declaring it, e.g. "
                                    "past_sequence_length=0:12:512 (repeatable; OPT, where given, "
                                    "is the measured size): instead of one --min-shape/--max-shape "
                                    "per input; a decoder is judged at decode after a past of MAX")
            group.add_argument("--shape-weights", type=runs_arg, default=None,
                               metavar="NAME=RUNS,...",
                               help="runs of each judged shape in one deployment request, the "
                                    "latency the search minimises, e.g. prefill=1,decode=256 (a "
                                    "phase weighs all its shapes; default: a decoder's prompt once "
                                    "and 16 decode steps, one run of any other shape)")
        if overriding:
            return
        group.add_argument("--const", action="append", type=constant_arg, default=[],
                           metavar="NAME=VALUE",
                           help="feed input NAME this one value on every run, e.g. sr=16000 for a "
                                "sample-rate scalar (repeatable; the data need not hold it). "
                                "Random data cannot choose a scalar integer input: it needs this "
                                "or --data; other integer inputs are drawn from "
                                f"[{RANDOM_INTEGERS[0]}, {RANDOM_INTEGERS[1]})")
        group.add_argument("--image-mean", type=floats_arg, default=(0.0,),
                           help="images (a --data folder of them): per-channel mean, as in (pixel "
                                "- mean) / std with pixels in 0..1 (--image-scale 255: 0..255), "
                                "e.g. 0.485,0.456,0.406. The layout (N×C×H×W or N×H×W×C) is read "
                                "off the input's shape")
        group.add_argument("--image-std", type=floats_arg, default=(1.0,), help="per-channel std "
                                                                                "(see "
                                                                                "--image-mean)")
        group.add_argument("--image-order", choices=ORDERS, type=str.upper, default="RGB",
                           help="channel order the model takes (BGR: Caffe-style models such as "
                                "Keras' ResNet50)")
        group.add_argument("--image-scale", type=float, choices=SCALES, default=1.0,
                           help="a white pixel's value before mean and std: 1 (pixels 0..1, "
                                "default) or 255")
        group.add_argument("--image-resize", choices=RESIZES, default="stretch",
                           help="stretch each image to the input's height and width (default); "
                                "crop: its shorter side resized to them and the centre cut out "
                                "(torchvision's Resize + CenterCrop); letterbox: its longer side "
                                "resized to them, the rest padded grey 114 (YOLO models)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> InputSpec:
        return cls(args.model, **cls.given(args))

    @classmethod
    def given(cls, args: argparse.Namespace) -> dict[str, Any]:
        values = super().given(args)
        values.pop("model", None)
        return {k: (_once_each(v, k) if k.endswith("shapes") or k in ("constants", "dims") else v)
                for k, v in values.items()}


def _once_each(pairs: Sequence[tuple[str, Any]], field_name: str) -> dict[str, Any]:
    """A repeatable NAME=VALUE option as a mapping; a name given twice is refused (the last would
    win, silently)."""
    found: dict[str, Any] = {}
    option = "--" + {"shapes": "shape", "min_shapes": "min-shape", "max_shapes": "max-shape",
                     "dims": "dim"}.get(field_name, "const")
    for name, value in pairs:
        if name in found and found[name] != value:
            def said(v: Any) -> str:
                if isinstance(v, tuple):
                    return ("x" if field_name != "dims" else ":").join(str(d) for d in v if d is not None)
                return f"{v:g}"

            raise AutoprecError(f"{option} {name} given twice ({said(found[name])} and "
                                f"{said(value)}); give each input once")
        found[name] = value
    return found


@dataclass(frozen=True)
class EngineSpec(Group):
    """The engine that builds, runs and times candidates, on which device, with how many threads."""

    backend: str = engines.DEFAULT
    device: int = 0
    threads: int = 0


    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, overriding: bool = False) -> None:
        from autoprec.backends import BACKENDS

        group = parser.add_argument_group("engine")
        recorded = " (default: the search's engine)" if overriding else f" (default {engines.DEFAULT}"
        group.add_argument(
            "--backend", default=suppressed(overriding, engines.DEFAULT), choices=BACKENDS,
            help="inference engine" + recorded + ("" if overriding else
                 "; ort-cuda needs onnxruntime-gpu and an NVIDIA GPU; tensorrt needs TensorRT "
                 "10.12+ and cuda-python; tensorrt-rtx needs TensorRT for RTX (PyPI) and a GPU of "
                 "compute capability 8.0/8.6/8.9/12.x. Both TensorRT backends' builds run in "
                 "autoprec's CI; their engine runs and timing have never been executed by its "
                 "developers)"))
        group.add_argument("--device", type=gpu_index, default=suppressed(overriding, 0),
                           metavar="N",
                           help="GPU index for ort-cuda/tensorrt (default 0)")
        group.add_argument("--threads", type=int, default=suppressed(overriding, 0), metavar="N",
                           help="ONNX Runtime's intra-op threads for every timed run (default: "
                                "AUTOPREC_THREADS where it is set, else 0: its own, one per core); "
                                "latencies hold for the thread count they were taken at")

    def checked(self) -> EngineSpec:
        from autoprec.backends import backend_class

        backend_class(self.backend)  # an engine autoprec has, or one line listing them
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0:
            raise AutoprecError(f"--threads {self.threads}: a whole number of threads (0: ONNX "
                                "Runtime's default)")
        if why := engines.too_many_threads(self.threads):
            raise AutoprecError(f"--threads {self.threads}: {why}")
        return self


@dataclass(frozen=True)
class ProfileSpec(Group):
    """The deployment profile an export is written for: the search's, widened where asked
    (``min_shapes`` / ``max_shapes`` by input, ``batch``: the dynamic first dim of every input that
    has one, LOW to HIGH). Widening needs no new search: the plan is lowered onto the source's dims
    and checked at the new min and max."""

    min_shapes: Mapping[str, Sequence[int]] | None = None
    max_shapes: Mapping[str, Sequence[int]] | None = None
    batch: tuple[int, int] | None = None
    dims: Mapping[str, tuple[int, int | None, int]] | None = None

    DESTS = {"min_shapes": "min_shape", "max_shapes": "max_shape", "dims": "dim"}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("deployment profile (default: the search's; widened "
                                          "without a new search, the plan checked against the "
                                          "given model at the new min and max)")
        group.add_argument("--batch", type=batch_range_arg, metavar="LOW:HIGH",
                           help="every input's dynamic first dim from LOW to HIGH, e.g. 1:8 (the "
                                "measured batch within them)")
        group.add_argument("--min-shape", action="append", type=shape_arg, default=[],
                           metavar="NAME=DIMS",
                           help="the smallest shape input NAME takes, e.g. x=1x3x48x160 "
                                "(repeatable)")
        group.add_argument("--max-shape", action="append", type=shape_arg, default=[],
                           metavar="NAME=DIMS",
                           help="the largest shape input NAME takes, e.g. x=8x3x48x960 "
                                "(repeatable)")
        group.add_argument("--dim", action="append", type=dim_range_arg, default=[],
                           metavar="NAME=MIN:MAX",
                           help="a named dynamic dim's range at every input declaring it, e.g. "
                                "past_sequence_length=0:512 (repeatable)")

    @classmethod
    def given(cls, args: argparse.Namespace) -> dict[str, Any]:
        return {k: (dict(v) or None if k.endswith("shapes") or k == "dims" else v)
                for k, v in super().given(args).items()}

    @property
    def widens(self) -> bool:
        return bool(self.min_shapes or self.max_shapes or self.batch or self.dims)

    def applied(self, profile: ShapeProfile) -> ShapeProfile:
        """``profile`` widened as asked (itself where nothing is), or one line naming the option
        that cannot be."""
        if not self.widens:
            return profile
        as_dims = lambda shapes: {k: tuple(v) for k, v in (shapes or {}).items()}  # noqa: E731
        widened = profile.widened(as_dims(self.min_shapes), as_dims(self.max_shapes), self.batch)
        return widened.with_dims({k: tuple(v) for k, v in self.dims.items()}) if self.dims else widened


def recorded(groups: Mapping[str, Group]) -> dict[str, Any]:
    """Spec groups by name as a result records them (a search's configuration: ``search.spec``)."""
    return {name: group.to_json() for name, group in groups.items()}

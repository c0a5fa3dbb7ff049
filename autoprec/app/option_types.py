"""The command line's value types: a value of the wrong form is refused by the parser, naming the
option. Ranges of numbers are checked by each spec group's ``checked`` (one check for the API and
the command line alike); the parser only reads numbers."""

from __future__ import annotations

import argparse
import math


def shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=DIMS; a dim of 0 is an empty past (the model's spec says where one may be: see
    autoprec.analysis.shapes.resolve_input_shapes)."""
    name, sep, dims = text.rpartition("=")
    try:
        found = tuple(int(d) for d in dims.lower().split("x"))
        if not sep or not name or any(d < 0 for d in found):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIMS with dims of 0 or more "
                                         "(0: an empty past), e.g. x=1x3x224x224") from None
    return name, found


def dim_range_arg(text: str) -> tuple[str, tuple[int, int | None, int]]:
    """--dim NAME=MIN:MAX or NAME=MIN:OPT:MAX."""
    name, sep, sizes = text.partition("=")
    try:
        values = [int(v) for v in sizes.split(":")]
        if not sep or not name or len(values) not in (2, 3) or min(values) < 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=MIN:MAX or NAME=MIN:OPT:MAX, "
                                         "sizes of 0 or more, e.g. "
                                         "past_sequence_length=0:12:512") from None
    return name, (values[0], values[1] if len(values) == 3 else None, values[-1])


def runs_arg(text: str) -> dict[str, int]:
    """--shape-weights NAME=RUNS,...: a judged shape's (or a phase's) runs per deployment
    request."""
    found = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            count_ = int(value)
            if not sep or not name.strip() or count_ < 0:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=RUNS pairs, e.g. "
                                             "prefill=1,decode=64") from None
        found[name.strip()] = count_
    return found


def constant_arg(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        number = float(value)
        if not sep or not name or not math.isfinite(number):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=NUMBER, e.g. sr=16000") from None
    return name, int(number) if number.is_integer() else number


def floats_arg(text: str) -> tuple[float, ...]:
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
            raise argparse.ArgumentTypeError(f"{text!r} is not a "
                                             f"{'whole ' if convert is int else ''}number") from None
        if not acceptable(value):
            raise argparse.ArgumentTypeError(f"{text}: {requirement}")
        return value

    return parse


count = number(int, lambda v: v >= 1, "must be at least 1")
positive = number(float, lambda v: v > 0 and math.isfinite(v), "must be a finite number more than "
                                                               "0")
count_or_zero = number(int, lambda v: v >= 0, "must be 0 or more")
fraction = number(float, lambda v: 0 <= v <= 1, "must be between 0 and 1")
gpu_index = number(int, lambda v: v >= 0, "must be a GPU index: 0 or more (see nvidia-smi -L)")




def batch_range_arg(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        found = (int(low), int(high))
        if not sep or not 0 < found[0] <= found[1]:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LOW:HIGH batch sizes, 0 < LOW <= "
                                         "HIGH, e.g. 1:8") from None
    return found

"""The input shapes a plan is deployed across: per input, the dims as declared and min, opt, max.

The search measures at opt (``--shape``); min and max (``--min-shape``, ``--max-shape``) are where a
dynamic dim may go in deployment. It is what TensorRT's optimisation profile holds (trtexec
``--minShapes/--optShapes/--maxShapes``, ``IOptimizationProfile.set_shape``) and what Triton's
``-1`` dims and ``max_batch_size`` say, so every export writes it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from autoprec.core.errors import ModelError

POINTS = ("min", "opt", "max")
Dims = tuple[int, ...]


@dataclass(frozen=True)
class InputRange:
    """One input: its dims as the source declares them (an int, or a name / None where dynamic), and
    the three shapes of its profile."""

    name: str
    declared: tuple[int | str | None, ...]
    min: Dims
    opt: Dims
    max: Dims

    @property
    def dynamic_axes(self) -> tuple[int, ...]:
        return tuple(a for a, d in enumerate(self.declared) if not isinstance(d, int))

    def at(self, point: str) -> Dims:
        return getattr(self, point)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "declared": list(self.declared), "min": list(self.min),
                "opt": list(self.opt),
                "max": list(self.max)}


@dataclass(frozen=True)
class ShapeProfile:
    """Every input's range, in the model's input order."""

    inputs: tuple[InputRange, ...]

    @property
    def dynamic(self) -> bool:
        """Whether any input declares a dynamic dim (the deployed model keeps it)."""
        return any(i.dynamic_axes for i in self.inputs)

    def at(self, point: str) -> dict[str, Dims]:
        """Each input's shape at ``point`` (min, opt or max)."""
        return {i.name: i.at(point) for i in self.inputs}

    def points(self) -> list[str]:
        """The profile's distinct points, opt first (min and max where they differ from it)."""
        return ["opt", *(p for p in ("min", "max") if self.at(p) != self.at("opt"))]

    def batch_range(self) -> tuple[int, int] | None:
        """(min, max) of a batch dim every input shares as its dynamic first dim; None where there
        is none (Triton's ``max_batch_size`` and dynamic batching need one)."""
        if not self.inputs or not all(i.declared and not isinstance(i.declared[0], int) for i in self.inputs):
            return None
        lows, highs = {i.min[0] for i in self.inputs}, {i.max[0] for i in self.inputs}
        return (lows.pop(), highs.pop()) if len(lows) == len(highs) == 1 else None

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [i.to_json() for i in self.inputs]}

    def said(self) -> str:
        """``x [N, 3, 16, 16] min 1x3x16x16 · opt 4x3x16x16 · max 8x3x16x16`` per input with a
        dynamic dim, inputs alike in all four said once (a decoder's dozen cache inputs: one line,
        not 1,500 characters); the fixed shapes where none has one."""
        if not self.dynamic:
            return "fixed shapes " + "; ".join(f"{i.name} {dims_text(i.opt) or 'scalar'}" for i in self.inputs)
        alike: dict[str, list[str]] = {}
        for i in (i for i in self.inputs if i.dynamic_axes):
            ranges = (f"{declared_text(i.declared)} min {dims_text(i.min)} "
                      f"· opt {dims_text(i.opt)} · max {dims_text(i.max)}")
            alike.setdefault(ranges, []).append(i.name)
        return "; ".join(f"{names_text(names)} {ranges}" for ranges, names in alike.items())

    def widened(self, low: Mapping[str, Dims] | None = None, high: Mapping[str, Dims] | None = None,
                batch: tuple[int, int] | None = None) -> ShapeProfile:
        """This profile with the min and max shapes given (``low``/``high``, by input) and the
        dynamic first dim of every input that has one from ``batch``'s first to its last; opt, the
        measured shapes, stays. Checked as a search checks --min-shape/--max-shape (one line naming
        the option and input)."""
        if not self.dynamic and (low or high or batch):
            raise ModelError("the model declares no dynamic dim (" + self.said() + "): its exports "
                                                                                   "take the "
                                                                                   "measured "
                             "shapes only; search a model with dynamic dims for a profile")
        low, high = dict(low or {}), dict(high or {})
        if batch is not None:
            batched = [i for i in self.inputs if i.declared and not isinstance(i.declared[0], int)]
            if not batched:
                raise ModelError(f"--batch: no input has a dynamic first dim ({self.said()}); give "
                                 "--min-shape and --max-shape instead")
            for i in batched:
                low[i.name] = (batch[0], *low.get(i.name, i.min)[1:])
                high[i.name] = (batch[1], *high.get(i.name, i.max)[1:])
        declared, opt = [(i.name, i.declared) for i in self.inputs], self.at("opt")
        # an input not given keeps its recorded bound, unless it shares a dim name with one given
        low = {**self.at("min"), **_shared_dims(declared, opt, low, "--min-shape")}
        high = {**self.at("max"), **_shared_dims(declared, opt, high, "--max-shape")}
        return shape_profile(declared, opt, low, high)

    def with_dims(self, dims: Mapping[str, tuple[int, int | None, int]]) -> ShapeProfile:
        """This profile with each named dim from its min to its max at every input declaring it
        (``--dim past=0:12:512``: every cache input's past, the attention mask's ``past + sequence``
        with it), and a dim summed of named dims (``past_sequence_length + sequence_length``) at the
        sum at each end. A dim's opt, where given, must be the measured one; a name no input
        declares is refused, naming those they do."""
        declared = {d for i in self.inputs for d in i.declared if isinstance(d, str)}
        named = {term.strip() for d in declared for term in d.split("+")}
        for name, (low, opt, high) in dims.items():
            if name not in named:
                raise ModelError(f"--dim {name}: no input declares a dim of that name; the named "
                                 f"dims are {', '.join(sorted(named)) or 'none'}")
            if not 0 <= low <= high:
                raise ModelError(f"--dim {name}={low}:{high}: needs 0 <= MIN <= MAX")
        sizes = {point: self._dim_sizes(point) for point in POINTS}
        for name, (low, opt, high) in dims.items():
            measured = sizes["opt"].get(name)
            if measured is not None and not low <= measured <= high:
                raise ModelError(f"--dim {name}={low}:{high}: the search measures {name} at "
                                 f"{measured} (its data, or --shape), outside the range; give a "
                                 "range holding it, e.g. "
                                 f"{min(low, measured)}:{max(high, measured)}")
            if opt is not None and measured is not None and opt != measured:
                raise ModelError(f"--dim {name}={low}:{opt}:{high}: the search measures {name} at "
                                 f"{measured} (its data, or --shape); give "
                                 f"{low}:{measured}:{high}, or {low}:{high}")
            sizes["min"][name], sizes["max"][name] = low, high
        ranges = []
        for i in self.inputs:
            at = {point: tuple(_sized(d, size, sizes[point]) for d, size in zip(i.declared, i.at(point)))
                  for point in ("min", "max")}
            if not all(lo <= mid <= hi for lo, mid, hi in zip(at["min"], i.opt, at["max"])):
                raise ModelError(f"--dim: input {i.name} would take {dims_text(at['min'])} to "
                                 f"{dims_text(at['max'])}, which does not hold the measured "
                                 f"{dims_text(i.opt)}; widen the range to hold it")
            ranges.append(InputRange(i.name, i.declared, at["min"], i.opt, at["max"]))
        return ShapeProfile(tuple(ranges))

    def _dim_sizes(self, point: str) -> dict[str, int]:
        """Each named dim's size at ``point``, read off an input declaring it alone on an axis."""
        return {d: size for i in self.inputs for d, size in zip(i.declared, i.at(point))
                if isinstance(d, str) and "+" not in d}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShapeProfile:
        return cls(tuple(InputRange(i["name"], tuple(i["declared"]), tuple(i["min"]),
                                    tuple(i["opt"]), tuple(i["max"]))
                         for i in data["inputs"]))

    @classmethod
    def fixed(cls, shapes: Mapping[str, Sequence[int]]) -> ShapeProfile:
        """A profile of one point: a model (or an older result) with no dynamic dim."""
        return cls(tuple(InputRange(k, tuple(v), tuple(v), tuple(v), tuple(v)) for k, v in shapes.items()))


def _sized(dim: int | str | None, size: int, sizes: Mapping[str, int]) -> int:
    """A declared dim's size from named sizes: a name's own, a sum's of its terms' (each known),
    else ``size``."""
    if not isinstance(dim, str):
        return size
    terms = [term.strip() for term in dim.split("+")]
    return sum(sizes[t] for t in terms) if all(t in sizes for t in terms) else size


NAMED = 3  # a line naming more inputs than this names the first ones and counts the rest


def names_text(names: Sequence[str]) -> str:
    """``a``, ``a, b``, or ``a, b, c and 9 more``: inputs said alike, in one line of any length of
    model."""
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


def dims_text(dims: Sequence) -> str:
    """``1x3x48x320``; a dynamic dim by its name, or ``?``."""
    return "x".join(str(d) if isinstance(d, int) else (d or "?") for d in dims)


def declared_text(dims: Sequence) -> str:
    """``[N, 3, 48, W]``: dims as a model declares them."""
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in dims) + "]"


def shared_dim_sizes(declared: Sequence[tuple[str, Sequence]], given: Mapping[str, Sequence[int]],
                     option: str) -> dict[str, tuple[int, str]]:
    """One dim name is one size: the size each named dim takes where ``option`` (``--shape``,
    ``--min-shape``, ``--max-shape``) gives a shape to an input declaring it (``input_ids`` and
    ``attention_mask``, both ``[batch, seq]``), with the input that gave it; two inputs given it at
    different sizes are refused in one line naming both. An unnamed dim ('' or '?') is no name, and
    one input's own axes may share a name (Paddle's)."""
    sizes: dict[str, tuple[int, str]] = {}
    for name, dims in declared:
        for dim, size in zip(dims, given.get(name, ())):
            if not isinstance(dim, str) or dim in ("", "?"):
                continue
            first, owner = sizes.setdefault(dim, (size, name))
            if first != size and owner != name:
                raise ModelError(f"{option}: inputs {owner} and {name} share the dim '{dim}' but "
                                 f"are given {first} and {size} there; give them the same size")
    return sizes


def _shared_dims(declared: Sequence[tuple[str, tuple]], opt: Mapping[str, Dims],
                 given: dict[str, Dims],
                 option: str) -> dict[str, Dims]:
    """``given`` with the inputs it leaves out filled in where they share a dim name with one it
    names (:func:`shared_dim_sizes`), at every point."""
    sizes = shared_dim_sizes(declared, given, option)
    filled = dict(given)
    for name, dims in declared:
        if name not in given and any(isinstance(d, str) and d in sizes for d in dims):
            filled[name] = tuple(
                sizes[d][0] if isinstance(d, str) and d in sizes else s for d, s in zip(dims, opt[name])
            )
    return filled


def shape_profile(
    declared: Sequence[tuple[str, tuple[int | str | None, ...]]],
    opt: Mapping[str, Dims],
    low: Mapping[str, Dims] | None = None,
    high: Mapping[str, Dims] | None = None,
) -> ShapeProfile:
    """The profile of inputs ``declared`` (name, dims) at ``opt`` (every dim fixed), with ``low`` /
    ``high`` (``--min-shape`` / ``--max-shape``) where given; an input not given one is at opt
    there. Refused in one line naming the option and input: an unknown input, another rank, a fixed
    dim changed, or not min <= opt <= max."""
    low, high = dict(low or {}), dict(high or {})
    names = [name for name, _ in declared]
    for option, given in (("--min-shape", low), ("--max-shape", high)):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ModelError(f"{option} names {', '.join(unknown)}, which the model does not have "
                             f"as input(s); its inputs are: {', '.join(names)}")
    low, high = _shared_dims(declared, opt, low, "--min-shape"), _shared_dims(declared, opt, high, "--max-shape")
    ranges = []
    for name, dims in declared:
        best = tuple(opt[name])
        lo, hi = tuple(low.get(name, best)), tuple(high.get(name, best))
        for option, shape in (("--min-shape", lo), ("--max-shape", hi)):
            if len(shape) != len(dims) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape)):
                raise ModelError(f"{option} {name}={dims_text(shape)} does not fit the model's "
                                 f"declared shape {declared_text(dims)}; give {len(dims)} dims "
                                 "that keep the fixed ones")
        if not all(a <= b <= c for a, b, c in zip(lo, best, hi)):
            raise ModelError(
                f"input {name}: the profile needs min <= opt <= max in every dim; got min "
                f"{dims_text(lo)}, opt {dims_text(best)} (--shape), max {dims_text(hi)}: change "
                "--min-shape / --max-shape (or --shape, the shape the search measures at)"
            )
        ranges.append(InputRange(name, tuple(dims), lo, best, hi))
    return ShapeProfile(tuple(ranges))

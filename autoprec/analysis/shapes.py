"""A model's declared inputs and outputs, and the fixed shapes it is prepared and measured at."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from autoprec.analysis.model_info import TensorSpec
from autoprec.core.errors import ModelError
from autoprec.core.profile import declared_text, names_text, shared_dim_sizes


def dtype_name(elem_type: int) -> str:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name


def _dims(value_info: onnx.ValueInfoProto) -> tuple[int | str | None, ...]:
    return tuple(
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
        for d in value_info.type.tensor_type.shape.dim
    )


def declared_inputs(model: onnx.ModelProto) -> tuple[TensorSpec, ...]:
    """The graph's real inputs (initializers excluded), dynamic dims as declared."""
    initializers = {i.name for i in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in initializers]
    axes = batch_axes([_dims(v) for v in values])
    return tuple(
        TensorSpec(v.name, _dims(v), dtype_name(v.type.tensor_type.elem_type), axis) for v, axis in zip(values, axes)
    )


def batch_axes(shapes: Sequence[tuple[int | str | None, ...]]) -> list[int | None]:
    """Each input's batch axis, read off the declared shapes: the axis carrying the first input's
    batch dim by name (``batch``), or by size where all are fixed (an input with no dim of that
    size, such as weights given as an input, is not batched). Beside a dynamic batch, an input with
    one dynamic axis after a fixed first one batches along it (a state [2, ?, 128]), and one with no
    dynamic axis is one tensor per run, not batched (None, as a scalar); else axis 0."""
    first = next((dims for dims in shapes if dims), None)
    batch = first[0] if first else None
    axes: list[int | None] = []
    for dims in shapes:
        dynamic = [axis for axis, d in enumerate(dims) if not isinstance(d, int)]
        if not dims:
            axes.append(None)
        elif isinstance(batch, str) and batch in dims:
            axes.append(dims.index(batch))
        # all fixed: an input without the batch's size is one tensor per run (weights)
        elif isinstance(batch, int):
            axes.append(0 if dims[0] == batch else dims.index(batch) if batch in dims else None)
        elif not dynamic:
            axes.append(None)
        elif isinstance(dims[0], int) and len(dynamic) == 1:
            axes.append(dynamic[0])
        else:
            axes.append(0)
    return axes


def _empty_past(spec: TensorSpec, axis: int, size: object) -> bool:
    """Whether ``size`` is 0 on a dim of ``spec`` named for a past (``past_sequence_length``): a KV
    cache's empty past (prefill), as data with no past gives it and a search of such data records
    it."""
    dim = spec.shape[axis] if axis < len(spec.shape) else None
    return size == 0 and isinstance(dim, str) and "past" in dim.lower()


def resolve_input_shapes(
    inputs: Sequence[TensorSpec],
    given: Mapping[str, tuple[int, ...]],
    data_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Fix every input dim: --shape first, then the data's per-item shape; a dynamic batch dim
    becomes 1.

    Returns the shapes and notes that say what was assumed.
    """
    unknown = sorted(set(given) - {i.name for i in inputs})
    if unknown:
        raise ModelError(
            f"--shape names {', '.join(unknown)}, which the model does not have as input(s); "
            f"its inputs are: {', '.join(i.name for i in inputs)}"
        )
    for spec in (s for s in inputs if s.name in given):
        shape = tuple(given[spec.name])
        if not all(isinstance(d, int) and not isinstance(d, bool) and (d > 0 or _empty_past(spec, axis, d))
                   for axis, d in enumerate(shape)):
            raise ModelError(f"--shape {spec.name}={'x'.join(map(str, shape))}: dims must be whole "
                             "numbers above 0 (0 only on a dim named for a past: an empty past)")
        if len(shape) != len(spec.shape) or any(
            isinstance(d, int) and d > 0 and d != s for d, s in zip(spec.shape, shape)
        ):
            raise ModelError(
                f"--shape {spec.name}={'x'.join(map(str, shape))} does not fit the model's "
                f"declared shape {declared_text(spec.shape)}; give {len(spec.shape)} dims that "
                "keep the fixed ones"
            )
    # dim name: (size, its input)
    named = shared_dim_sizes([(s.name, s.shape) for s in inputs], given, "--shape")
    shapes, notes, batched, empty = {}, [], {}, {}
    for spec in inputs:
        if spec.name in given:
            shapes[spec.name] = tuple(given[spec.name])
            continue
        item = (data_shapes or {}).get(spec.name)
        if item is not None and len(item) != len(spec.item_shape):
            item = None
        shape = []
        for axis, dim in enumerate(spec.shape):
            item_axis = axis if spec.batch_axis is None or axis < spec.batch_axis else axis - 1
            if isinstance(dim, int) and dim > 0:
                shape.append(dim)
            elif axis == spec.batch_axis:
                shape.append(1)
                batched.setdefault(dim or "?", []).append(spec.name)
            elif item is not None:
                shape.append(item[item_axis])
            # --shape of another input gives it (see _shared_dims)
            elif isinstance(dim, str) and dim in named:
                shape.append(named[dim][0])
            elif isinstance(dim, str) and (size := _sized(dim, named)) is not None:
                shape.append(size)
                empty.setdefault(dim, []).append(spec.name)
            else:
                raise ModelError(_unfixed(spec, axis, dim, data_shapes))
        shapes[spec.name] = tuple(shape)
    _data_dims_agree(inputs, shapes, given)
    shapes = _shared_dims(inputs, shapes, given, named, notes, batched)
    notes += [f"input{'s' if len(names) > 1 else ''} {names_text(names)}: dim {dim} set to "
              f"{_sized(dim, named)} (a past of 0: a generation's first run; --shape or --dim for others)"
              for dim, names in empty.items()]
    return shapes, [_batch_note(dim, names) for dim, names in batched.items() if names] + notes


def _sized(dim: str, named: Mapping[str, tuple[int, str]]) -> int | None:
    """A dim nothing else sizes, sized where its name says how: a past is 0 (a KV cache's first
    run), a sum with a past (an attention mask's ``past_sequence_length + sequence_length``, or
    ``+ 1``) its parts'."""
    parts = [part.strip() for part in dim.split("+")]
    sizes = [named[part][0] if part in named else int(part) if part.isdigit() else 0 if "past" in part.lower()
             else None for part in parts]
    return None if None in sizes or not any("past" in part.lower() for part in parts) else sum(sizes)


def _batch_note(dim: str, names: Sequence[str]) -> str:
    """One line for every input whose dynamic batch dim ``dim`` was set to 1 (a decoder has a
    dozen)."""
    inputs = f"input{'s' if len(names) > 1 else ''} {names_text(names)}"
    return f"{inputs}: dynamic batch dim {dim} set to 1 (use --shape to change)"


def _unfixed(spec: TensorSpec, axis: int, dim, data_shapes: Mapping[str, tuple[int, ...]] | None) -> str:
    """What to say of a dynamic dim nothing fixes: the --shape to give, and why the data (if any)
    did not."""
    free = [f"D{a}" for a, d in enumerate(spec.shape) if a != spec.batch_axis and not (isinstance(d, int) and d > 0)]
    example = "x".join(str(d) if isinstance(d, int) and d > 0 else ("1" if a == spec.batch_axis else f"D{a}")
                       for a, d in enumerate(spec.shape))
    found = (data_shapes or {}).get(spec.name)
    data = ("or --data with arrays of that shape" if data_shapes is None else
            f"or --data items of that shape (its items for {spec.name} are {list(found)}, which do "
            "not fit the input's rank)" if found is not None else
            f"as --data holds no arrays for {spec.name} to read it from (images are resized to the "
            "input)")
    return (f"input {spec.name} has dynamic dim {axis} ({dim or '?'}) in shape "
            f"{declared_text(spec.shape)} and nothing fixes it; pass --shape {spec.name}={example} "
            f"with {', '.join(free)} filled in, {data}")


def _data_dims_agree(inputs: Sequence[TensorSpec], shapes: Mapping[str, tuple[int, ...]],
                     given: Mapping[str, tuple[int, ...]]) -> None:
    """A dim name inputs share, fixed from the data's items (no --shape names either input), must be
    one size: else one line naming both inputs and their sizes, the data's to fix."""
    sizes: dict[str, tuple[int, str]] = {}
    for spec in (s for s in inputs if s.name not in given):
        for axis, dim in enumerate(spec.shape):
            if not isinstance(dim, str) or dim in ("", "?") or axis == spec.batch_axis:
                continue
            size, owner = sizes.setdefault(dim, (shapes[spec.name][axis], spec.name))
            if size != shapes[spec.name][axis] and owner != spec.name:
                raise ModelError(f"--data: inputs {owner} and {spec.name} share the dim {dim!r}, "
                                 f"but the data's items give it {size} and "
                                 f"{shapes[spec.name][axis]}; give both items of one size there "
                                 "(the model takes one size for both)")


def _shared_dims(inputs: Sequence[TensorSpec], shapes: dict[str, tuple[int, ...]],
                 given: Mapping[str, tuple[int, ...]],
                 sizes: Mapping[str, tuple[int, str]], notes: list[str],
                 batched: dict[str, list[str]]) -> dict[str, tuple[int, ...]]:
    """A dim name inputs share is one size (:func:`autoprec.core.profile.shared_dim_sizes`): the one
    --shape gives (``sizes``: dim name -> size, the input whose --shape gave it), carried to the
    inputs it does not name, over what their data's items say (and over a batch dim of 1: the input
    leaves ``batched``)."""
    for spec in (s for s in inputs if s.name not in given):
        shape = list(shapes[spec.name])
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, str) and dim not in ("", "?") and dim in sizes and shape[axis] != sizes[dim][0]:
                shape[axis] = sizes[dim][0]
                if spec.name in batched.get(dim, ()):
                    batched[dim].remove(spec.name)
                notes.append(f"input {spec.name}: dim {dim} set to {sizes[dim][0]}, as --shape "
                             f"{sizes[dim][1]} gives it")
        shapes[spec.name] = tuple(shape)
    return shapes


def check_feeds(
    inputs: Sequence[TensorSpec], constants: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """What preparation runs the model on: zeros at the given shapes, or the given constant at them
    (a scalar given for an input of shape [1] fills it)."""
    constants = constants or {}
    return {i.name: np.full(i.shape, constants[i.name], i.dtype) if i.name in constants else np.zeros(i.shape, i.dtype)
            for i in inputs}


def output_specs(model: onnx.ModelProto) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(o.name, _dims(o), dtype_name(o.type.tensor_type.elem_type)) for o in model.graph.output)

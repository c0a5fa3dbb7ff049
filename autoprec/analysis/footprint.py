"""What running the model at each point of its shape profile asks of memory, estimated before any
work: the tensors alive at once as the graph runs at the measured shapes (opt), grown as the inputs
grow at each point, in the two ONNX Runtime sessions the shipped model's check holds side by side
(each arena grown past its need, each with the weights), and the check's batches of inputs and of
outputs. A point this machine cannot hold is refused before the search starts, naming the option
that asked for it (the search measures at opt, ``--shape``; the check runs min and max too)."""

from __future__ import annotations

import math
import os
from typing import Mapping

import numpy as np
import onnx

from autoprec.core.errors import ModelError
from autoprec.core.profile import ShapeProfile, dims_text

OPTION = {"opt": "--shape", "max": "--max-shape", "min": "--min-shape"}
SESSIONS = 2  # the given model and the shipped one, side by side in the check (measure.deployment)
ARENA = 2  # ONNX Runtime's CPU arena grows in doubling chunks: what it holds, over what is alive
# batches of inputs fitted to a point, all held at once by the check (deployment.CHECKED_BATCHES)
BATCHES = 4
# each batch's outputs as the check holds them: both models', stacked, compared in float64
OUTPUT_COPIES = 8


def available_bytes() -> int | None:
    """The memory this machine can give now (MemAvailable), else its physical memory; None where
    unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _elements(shape) -> int:
    return math.prod(int(d) for d in shape)


def _sizes(graph: onnx.GraphProto) -> dict[str, int]:
    """Bytes of each tensor whose shape the graph records fixed (value_info, outputs)."""
    sizes = {}
    for value in [*graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        dims = [d.dim_value for d in tensor.shape.dim]
        if tensor.HasField("shape") and all(d > 0 for d in dims):
            try:
                item = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
            except (KeyError, TypeError, ValueError):
                item = 4
            sizes[value.name] = _elements(dims) * item
    return sizes


def live_peak_bytes(model: onnx.ModelProto) -> int:
    """The most bytes of computed tensors alive at once as the top graph runs in its order (each
    freed after its last reader; outputs kept), where value_info records their shapes; 0 where it
    records none."""
    graph, sizes = model.graph, _sizes(model.graph)
    last = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            last[name] = index
    kept = {o.name for o in graph.output}
    alive, peak = 0, 0
    for index, node in enumerate(graph.node):
        alive += sum(sizes.get(name, 0) for name in node.output)
        peak = max(peak, alive)
        alive -= sum(sizes.get(name, 0) for name in {*node.input, *node.output}
                     if last.get(name, -1) <= index and name not in kept and name in sizes)
    return peak


def asked(profile: ShapeProfile, itemsizes: Mapping[str, int], peak_at_opt: int,
          outputs_at_opt: int = 0,
          weights: int = 0) -> dict[str, int]:
    """Per point of the profile, the bytes running the model there asks (see the module
    docstring)."""
    found = {}
    for point in ("opt", "min", "max"):
        inputs = sum(_elements(i.at(point)) * itemsizes.get(i.name, 4) for i in profile.inputs)
        growth = max(1.0,
                     max((_elements(i.at(point)) / max(1, _elements(i.opt)) for i in profile.inputs), default=1))
        found[point] = (BATCHES * (inputs + int(OUTPUT_COPIES * outputs_at_opt * growth))
                        + SESSIONS * (ARENA * int(peak_at_opt * growth) + weights))
    return found


def check_fits(profile: ShapeProfile, itemsizes: Mapping[str, int], model: onnx.ModelProto,
               weights: int = 0,
               memory: int | None = None) -> None:
    """Refuse, in one line naming the option, a profile point this machine cannot run the model at
    (``memory``: the bytes it has, default :func:`available_bytes`)."""
    memory = available_bytes() if memory is None else memory
    if not memory:
        return
    outputs = sum(_sizes(model.graph).get(o.name, 0) for o in model.graph.output)
    for point, need in asked(profile, itemsizes, live_peak_bytes(model), outputs, weights).items():
        if need > memory:
            shapes = ", ".join(f"{i.name}={dims_text(i.at(point))}" for i in profile.inputs)
            raise ModelError(f"{OPTION[point]} {shapes}: running the model there needs about "
                             f"{need / 2**30:.3g} GiB (its tensors alive at once, in the two "
                             f"sessions that check the shipped model, and {BATCHES} batches of "
                             f"inputs), and this machine has {memory / 2**30:.3g} GiB free; give a "
                             f"smaller {OPTION[point]}")

"""TensorRT's optimisation profile for a network's dynamic inputs, from a search's shape profile."""

from __future__ import annotations

from autoprec.core.errors import BackendError
from autoprec.core.profile import ShapeProfile


def optimization_profile(builder, inputs: list, profile: ShapeProfile | None):
    """TensorRT's optimisation profile for the network's dynamic ``inputs``, from ``profile``."""
    ranges = {i.name: i for i in (profile.inputs if profile is not None else ())}
    missing = [tensor.name for tensor in inputs if tensor.name not in ranges]
    if missing:
        raise BackendError(f"input {missing[0]} has dynamic dims and no shape profile to build it "
                           "for; export a result (it records --shape, --min-shape, --max-shape) "
                           "rather than a bare model")
    made = builder.create_optimization_profile()
    for tensor in inputs:
        found = ranges[tensor.name]
        made.set_shape(tensor.name, found.min, found.opt, found.max)
    return made

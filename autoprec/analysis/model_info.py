"""A model analysed: its inputs and outputs, and the units a precision is chosen for."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import onnx

from autoprec.core.plan import DEFAULT_CALIBRATION, Plan, Precision
from autoprec.core.profile import ShapeProfile
from autoprec.core.search_space import INT4_BLOCK_SIZE
from autoprec.core.stored import StoredModel


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output. ``shape`` holds ints, or None/str for dynamic dims.

    ``batch_axis`` is where items stack into a batch: 0 mostly, 1 for a recurrent state shaped
    [layers, batch, size], None for an input fed one tensor per run (a scalar; a fixed shape beside
    a dynamic batch). See :func:`batch_axes`.
    """

    name: str
    shape: tuple[int | str | None, ...]
    dtype: str
    batch_axis: int | None = 0

    @property
    def item_shape(self) -> tuple:
        """One item's shape: the shape without the batch axis."""
        return tuple(d for axis, d in enumerate(self.shape) if axis != self.batch_axis)

    @property
    def batch(self) -> int | None:
        return None if self.batch_axis is None else self.shape[self.batch_axis]


# Ops ONNX Runtime folds into the Q that follows a quantized layer (zero point at the range minimum).
ORT_ABSORBED = frozenset({"Relu", "Clip"})


@dataclass(frozen=True)
class Unit:
    """One compute layer a precision is chosen for, with the neighbours fused into it.

    ``nodes`` is the compute node followed by its fused neighbours (bias, activation) in
    graph order; ``output`` is the tensor that leaves the fused group.
    """

    name: str
    op_type: str
    nodes: tuple[str, ...]
    activations: tuple[str, ...]
    weight: str | None
    output: str
    allowed: tuple[Precision, ...]
    # the subgraph it lives in (see autoprec.analysis.subgraphs); () for the top graph
    scope: tuple[str, ...] = ()
    # a numerically sensitive op (softmax, normalisation): FP32 unless a search finds otherwise
    sensitive: bool = False
    tied_to: str | None = (
        # the unit of the same repeated pattern whose precision it takes
        # (autoprec.analysis.patterns)
        None
    )
    # values of its weight's column sharing one scale where it takes INT4 (the search space's knob)
    int4_block: int = INT4_BLOCK_SIZE

    @property
    def searchable(self) -> bool:
        return len(self.allowed) > 1

    def quantized_output(self, node_of: Callable[[str], onnx.NodeProto]) -> str:
        """The tensor after the unit's compute node and the activations ONNX Runtime folds into the Q
        that follows (ORT_ABSORBED): where a whole-node unit's output Q/DQ goes (``node_of``: the
        unit's graph's node of a name)."""
        tensor = node_of(self.nodes[0]).output[0]
        for name in self.nodes[1:]:
            node = node_of(name)
            if node.op_type not in ORT_ABSORBED or node.input[0] != tensor:
                break
            tensor = node.output[0]
        return tensor


@dataclass(frozen=True)
class ModelInfo:
    """The prepared FP32 model (static shapes, folded constants, opset >= 13) and its units."""

    path: Path
    sha256: str
    # the graph; weights over INLINE_BYTES in ``folder``
    model: onnx.ModelProto = field(repr=False, compare=False)
    # where the prepared model and its weights live (see autoprec.core.stored)
    folder: Path = field(compare=False)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    units: tuple[Unit, ...]
    notes: tuple[str, ...] = ()
    # the source model's metadata_props
    metadata: dict[str, str] = field(default_factory=dict, compare=False)
    # neutral nodes made units of their own for their range on the data
    out_of_range: tuple[str, ...] = ()
    external_data: bool = False  # the given model kept its weights in external data files
    # The prepared model before its input shapes were fixed (the source's dynamic dims kept), same
    # nodes by the same names, weights in ``folder``: what best/ and the exports lower a plan onto
    # (None: ``model``).
    deployable: onnx.ModelProto | None = field(default=None, repr=False, compare=False)
    # the shapes it is deployed across
    profile: ShapeProfile | None = field(default=None, compare=False)
    # The given graph unchanged but for its inputs' dims (the measured shapes), weights in
    # ``folder``: what the chosen plan's speed-up is also stated against (the user's own model,
    # before any preparation).
    source: onnx.ModelProto | None = field(default=None, repr=False, compare=False)
    # prepared by an earlier run and read from the cache: its outputs are checked against the given file's
    prepared_kept: bool = field(default=False, compare=False)

    @property
    def shape_profile(self) -> ShapeProfile:
        """The deployment profile: as given, else the one shape measured."""
        return self.profile or ShapeProfile.fixed({i.name: i.shape for i in self.inputs})

    def for_deployment(self) -> ModelInfo:
        """The same units on the deployable graph (the source's dims): a plan lowered onto it is the
        shipped model."""
        return self if self.deployable is None else replace(self, model=self.deployable,
                                                            deployable=None)

    def as_shipped(self) -> ModelInfo:
        """:meth:`for_deployment`, the given graph at its own declared dims too: what a speed-up of
        best/ over the given model is timed on (ONNX Runtime ran magika's INT8 plan 6 % faster with
        its batch dim fixed, the FP32 file 1 %: fixed graphs overstated the shipped file's gain)."""
        if self.deployable is None:
            return self
        return replace(self.for_deployment(), source=_declared_dims(self.source, self.deployable))

    @property
    def stored(self) -> StoredModel:
        """The prepared FP32 model, its weights on disk: what engines load and lowering starts
        from."""
        return StoredModel(self.model, self.folder)

    @property
    def searchable_units(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.searchable)

    @property
    def dimensions(self) -> tuple[Unit, ...]:
        """The searchable units a search decides: each stands for the units tied to it (a repeated
        pattern)."""
        return tuple(u for u in self.searchable_units if u.tied_to is None)

    def members(self, name: str) -> list[str]:
        """A unit and the units tied to it."""
        return [u.name for u in self.units if u.name == name or u.tied_to == name]

    def untied(self) -> ModelInfo:
        """Every unit decided on its own (``--separate-repeats``)."""
        return replace(self, units=tuple(replace(u, tied_to=None) for u in self.units))

    def unit(self, name: str) -> Unit:
        for u in self.units:
            if u.name == name:
                return u
        raise KeyError(name)

    def without(self, precisions: Iterable[Precision], names: Iterable[str], note: str) -> ModelInfo:
        """The same model with ``precisions`` taken from the units ``names``, saying why in
        ``note``."""
        names, dropped = set(names), set(precisions)
        names |= {u.name for u in self.units if u.tied_to in names}  # a pattern's units go together
        units = tuple(replace(u, allowed=tuple(p for p in u.allowed if p not in dropped)) if u.name in names else u
                      for u in self.units)
        return replace(self, units=_retied(units), notes=(*self.notes, note))

    def plan_at(
        self, precision: Precision, units: Iterable[str] | None = None,
        calibration: str = DEFAULT_CALIBRATION
    ) -> Plan:
        """``units`` (default: every unit that allows it) at ``precision``, every other unit at its
        widest: the plan that shows what lowering just those units costs and saves."""
        lowered = set(units) if units is not None else {u.name for u in self.units if precision in u.allowed}
        # a pattern's units go together
        lowered |= {u.name for u in self.units if u.tied_to in lowered}
        return Plan.from_mapping(
            {u.name: precision if u.name in lowered else u.allowed[-1] for u in self.units},
            calibration
        )


def _retied(units: Sequence[Unit]) -> tuple[Unit, ...]:
    """Ties kept where the units of a pattern still take the same precisions; where narrowing split
    them, each part follows its own first unit (a unit that may take one precision follows none)."""
    leaders: dict[tuple, str] = {}
    tied = []
    for unit in units:
        leader = (
            leaders.setdefault((unit.tied_to or unit.name, unit.allowed), unit.name) if unit.searchable else unit.name
        )
        tied.append(replace(unit, tied_to=leader if leader != unit.name else None))
    return tuple(tied)


def _declared_dims(source: onnx.ModelProto | None, deployable: onnx.ModelProto) -> onnx.ModelProto | None:
    """The given graph with its inputs' dims as declared (the deployable's), not fixed at the
    data's."""
    if source is None:
        return None
    dynamic = onnx.ModelProto()
    dynamic.CopyFrom(source)
    declared = {v.name: v.type.tensor_type.shape for v in deployable.graph.input}
    for value in dynamic.graph.input:
        if value.name in declared:
            value.type.tensor_type.shape.CopyFrom(declared[value.name])
    return dynamic

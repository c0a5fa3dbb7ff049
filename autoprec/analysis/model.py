"""Load an ONNX model, fix its shapes, and find its precision units."""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Collection, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from autoprec.analysis import subgraphs
from autoprec.analysis.footprint import check_fits
from autoprec.analysis.patterns import tie_repeats
from autoprec.analysis.preparation import prepared_model
from autoprec.core.errors import ModelError, first_line
from autoprec.core.groups import connected
from autoprec.core.plan import DEFAULT_CALIBRATION, Plan, Precision
from autoprec.core.profile import ShapeProfile, declared_text, shape_profile, shared_dim_sizes
from autoprec.core.search_space import NEUTRAL_OPS, SearchSpace
from autoprec.core.stored import StoredModel, check_external_data, is_external, tensors

KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}
# Integer compute ops of a model quantized already (by ONNX Runtime's quantizer, say).
RECURRENT_OPS = {"LSTM", "GRU", "RNN"}  # TensorRT makes a loop of layers of one: no precision check reads it
QUANTIZED_OPS = {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "DynamicQuantizeLinear", "MatMulNBits"}


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
    scope: tuple[str, ...] = ()  # the subgraph it lives in (see autoprec.analysis.subgraphs); () for the top graph
    sensitive: bool = False  # a numerically sensitive op (softmax, normalisation): FP32 unless a search finds otherwise
    tied_to: str | None = (
        None  # the unit of the same repeated pattern whose precision it takes (autoprec.analysis.patterns)
    )

    @property
    def searchable(self) -> bool:
        return len(self.allowed) > 1


@dataclass(frozen=True)
class ModelInfo:
    """The prepared FP32 model (static shapes, folded constants, opset >= 13) and its units."""

    path: Path
    sha256: str
    model: onnx.ModelProto = field(repr=False, compare=False)  # the graph; weights over INLINE_BYTES in ``folder``
    folder: Path = field(compare=False)  # where the prepared model and its weights live (see autoprec.core.stored)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    units: tuple[Unit, ...]
    notes: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict, compare=False)  # the source model's metadata_props
    out_of_range: tuple[str, ...] = ()  # neutral nodes made units of their own for their range on the data
    external_data: bool = False  # the given model kept its weights in external data files
    # The prepared model before its input shapes were fixed (the source's dynamic dims kept), same nodes by
    # the same names, weights in ``folder``: what best/ and the exports lower a plan onto (None: ``model``).
    deployable: onnx.ModelProto | None = field(default=None, repr=False, compare=False)
    profile: ShapeProfile | None = field(default=None, compare=False)  # the shapes it is deployed across
    # The given graph unchanged but for its inputs' dims (the measured shapes), weights in ``folder``: what the
    # chosen plan's speed-up is also stated against (the user's own model, before any preparation).
    source: onnx.ModelProto | None = field(default=None, repr=False, compare=False)

    @property
    def shape_profile(self) -> ShapeProfile:
        """The deployment profile: as given, else the one shape measured."""
        return self.profile or ShapeProfile.fixed({i.name: i.shape for i in self.inputs})

    def for_deployment(self) -> ModelInfo:
        """The same units on the deployable graph (the source's dims): a plan lowered onto it is the shipped model."""
        return self if self.deployable is None else replace(self, model=self.deployable, deployable=None)

    @property
    def stored(self) -> StoredModel:
        """The prepared FP32 model, its weights on disk: what engines load and lowering starts from."""
        return StoredModel(self.model, self.folder)

    @property
    def searchable_units(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.searchable)

    @property
    def dimensions(self) -> tuple[Unit, ...]:
        """The searchable units a search decides: each stands for the units tied to it (a repeated pattern)."""
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
        """The same model with ``precisions`` taken from the units ``names``, saying why in ``note``."""
        names, dropped = set(names), set(precisions)
        names |= {u.name for u in self.units if u.tied_to in names}  # a pattern's units go together
        units = tuple(replace(u, allowed=tuple(p for p in u.allowed if p not in dropped)) if u.name in names else u
                      for u in self.units)
        return replace(self, units=_retied(units), notes=(*self.notes, note))

    def with_out_of_range(self, space: SearchSpace, nodes: Collection[str], note: str) -> ModelInfo:
        """The units again, the precision-neutral ``nodes`` (labels) among the sensitive ones."""
        units = find_units(self.model, space, nodes)
        if any(u.tied_to for u in self.units):
            units = tie_repeats(self.model, units)
        return replace(self, units=units, out_of_range=tuple(sorted(nodes)), notes=(*self.notes, note))

    def plan_at(
        self, precision: Precision, units: Iterable[str] | None = None, calibration: str = DEFAULT_CALIBRATION
    ) -> Plan:
        """``units`` (default: every unit that allows it) at ``precision``, every other unit at its widest:
        the plan that shows what lowering just those units costs and saves."""
        lowered = set(units) if units is not None else {u.name for u in self.units if precision in u.allowed}
        lowered |= {u.name for u in self.units if u.tied_to in lowered}  # a pattern's units go together
        return Plan.from_mapping(
            {u.name: precision if u.name in lowered else u.allowed[-1] for u in self.units}, calibration
        )


def _retied(units: Sequence[Unit]) -> tuple[Unit, ...]:
    """Ties kept where the units of a pattern still take the same precisions; where narrowing split them,
    each part follows its own first unit (a unit that may take one precision follows none)."""
    leaders: dict[tuple, str] = {}
    tied = []
    for unit in units:
        leader = (
            leaders.setdefault((unit.tied_to or unit.name, unit.allowed), unit.name) if unit.searchable else unit.name
        )
        tied.append(replace(unit, tied_to=leader if leader != unit.name else None))
    return tuple(tied)


def file_sha256(path: Path) -> str:
    stat = os.stat(path)
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, modified_ns: int) -> str:
    """Hashed once per process while the file's size and modification time stay (a 2 GB data file takes seconds)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_sha256(path: Path) -> str:
    """What a model *is*: the sha256 of its ONNX file or, when its weights live in external data files,
    of the file and every data file it references (a changed weight file is a changed model)."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    path = Path(path)
    own = file_sha256(path)
    skeleton = onnx.load(str(path), load_external_data=False)
    locations = sorted({ExternalDataInfo(t).location for t in tensors(skeleton.graph) if uses_external_data(t)})
    if not locations:
        return own
    digest = hashlib.sha256(own.encode())
    for location in locations:
        digest.update(f"\0{location}\0{file_sha256(path.parent / location)}".encode())
    return digest.hexdigest()


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Read and check an ONNX file, raising ModelError that names the file and the fix. Its external
    weights are checked to be there, not loaded: the graph comes back with references to them."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such file; check the model path")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several types for a damaged file
        raise ModelError(
            f"{path}: not a readable ONNX file ({type(exc).__name__}: {exc}); re-export or re-download it"
        ) from None
    if not model.graph.node:
        raise ModelError(f"{path}: the ONNX graph is empty (truncated or not a model); re-export it")
    try:
        check_external_data(model, path.parent, str(path))
    except ValueError as exc:  # says which tensor and file, and the fix
        raise ModelError(str(exc)) from None
    except OSError as exc:
        raise ModelError(f"{path}: its external weight data cannot be read ({exc}); check the data files' "
                         "permissions beside the model") from None
    unknown = sorted({n.domain for n in model.graph.node} - KNOWN_DOMAINS)
    if unknown:
        nodes = [n.name or n.op_type for n in model.graph.node if n.domain in unknown][:3]
        raise ModelError(
            f"{path}: uses op domain(s) {', '.join(unknown)} (e.g. node {', '.join(nodes)}) that no "
            "supported engine implements; export the model with standard ONNX ops"
        )
    try:
        onnx.checker.check_model(str(path))  # from the file: never the whole model in one protobuf (2 GB at most)
    except Exception as exc:  # ValidationError, and e.g. UnicodeDecodeError for a damaged string field
        raise ModelError(f"{path}: fails onnx.checker ({first_line(exc)}); fix or re-export the model") from None
    initializers = {i.name for i in model.graph.initializer}
    for value in [*(v for v in model.graph.input if v.name not in initializers), *model.graph.output]:
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            role = "output" if value in model.graph.output else "input"
            raise ModelError(
                f"{path}: {role} {value.name} is a {(kind or 'untyped value').removesuffix('_type')}, not a "
                f"tensor; autoprec feeds and compares tensors only: export the model with tensor {role}s"
            )
    return model


def _dtype(elem_type: int) -> str:
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
        TensorSpec(v.name, _dims(v), _dtype(v.type.tensor_type.elem_type), axis) for v, axis in zip(values, axes)
    )


def batch_axes(shapes: Sequence[tuple[int | str | None, ...]]) -> list[int | None]:
    """Each input's batch axis, read off the declared shapes: the axis carrying the first input's
    batch dim by name (``batch``), or by size where all are fixed (an input with no dim of that size, such as
    weights given as an input, is not batched). Beside a dynamic batch, an input
    with one dynamic axis after a fixed first one batches along it (a state [2, ?, 128]), and one
    with no dynamic axis is one tensor per run, not batched (None, as a scalar); else axis 0."""
    first = next((dims for dims in shapes if dims), None)
    batch = first[0] if first else None
    axes: list[int | None] = []
    for dims in shapes:
        dynamic = [axis for axis, d in enumerate(dims) if not isinstance(d, int)]
        if not dims:
            axes.append(None)
        elif isinstance(batch, str) and batch in dims:
            axes.append(dims.index(batch))
        elif isinstance(batch, int):  # all fixed: an input without the batch's size is one tensor per run (weights)
            axes.append(0 if dims[0] == batch else dims.index(batch) if batch in dims else None)
        elif not dynamic:
            axes.append(None)
        elif isinstance(dims[0], int) and len(dynamic) == 1:
            axes.append(dynamic[0])
        else:
            axes.append(0)
    return axes


def resolve_input_shapes(
    inputs: Sequence[TensorSpec],
    given: Mapping[str, tuple[int, ...]],
    data_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Fix every input dim: --shape first, then the data's per-item shape; a dynamic batch dim becomes 1.

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
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise ModelError(f"--shape {spec.name}={'x'.join(map(str, shape))}: dims must be whole numbers above 0")
        if len(shape) != len(spec.shape) or any(
            isinstance(d, int) and d > 0 and d != s for d, s in zip(spec.shape, shape)
        ):
            raise ModelError(
                f"--shape {spec.name}={'x'.join(map(str, shape))} does not fit the model's declared "
                f"shape {declared_text(spec.shape)}; give {len(spec.shape)} dims that keep the fixed ones"
            )
    named = shared_dim_sizes([(s.name, s.shape) for s in inputs], given, "--shape")  # dim name: (size, its input)
    shapes, notes = {}, []
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
                notes.append(f"input {spec.name}: dynamic batch dim {dim or '?'} set to 1 (use --shape to change)")
            elif item is not None:
                shape.append(item[item_axis])
            elif isinstance(dim, str) and dim in named:  # --shape of another input gives it (see _shared_dims)
                shape.append(named[dim][0])
            else:
                raise ModelError(_unfixed(spec, axis, dim, data_shapes))
        shapes[spec.name] = tuple(shape)
    _data_dims_agree(inputs, shapes, given)
    return _shared_dims(inputs, shapes, given, named, notes)


def _unfixed(spec: TensorSpec, axis: int, dim, data_shapes: Mapping[str, tuple[int, ...]] | None) -> str:
    """What to say of a dynamic dim nothing fixes: the --shape to give, and why the data (if any) did not."""
    free = [f"D{a}" for a, d in enumerate(spec.shape) if a != spec.batch_axis and not (isinstance(d, int) and d > 0)]
    example = "x".join(str(d) if isinstance(d, int) and d > 0 else ("1" if a == spec.batch_axis else f"D{a}")
                       for a, d in enumerate(spec.shape))
    found = (data_shapes or {}).get(spec.name)
    data = ("or --data with arrays of that shape" if data_shapes is None else
            f"or --data items of that shape (its items for {spec.name} are {list(found)}, which do not fit the "
            "input's rank)" if found is not None else
            f"as --data holds no arrays for {spec.name} to read it from (images are resized to the input)")
    return (f"input {spec.name} has dynamic dim {axis} ({dim or '?'}) in shape {declared_text(spec.shape)} and nothing fixes "
            f"it; pass --shape {spec.name}={example} with {', '.join(free)} filled in, {data}")


def _data_dims_agree(inputs: Sequence[TensorSpec], shapes: Mapping[str, tuple[int, ...]],
                     given: Mapping[str, tuple[int, ...]]) -> None:
    """A dim name inputs share, fixed from the data's items (no --shape names either input), must be one size:
    else one line naming both inputs and their sizes, the data's to fix."""
    sizes: dict[str, tuple[int, str]] = {}
    for spec in (s for s in inputs if s.name not in given):
        for axis, dim in enumerate(spec.shape):
            if not isinstance(dim, str) or dim in ("", "?") or axis == spec.batch_axis:
                continue
            size, owner = sizes.setdefault(dim, (shapes[spec.name][axis], spec.name))
            if size != shapes[spec.name][axis] and owner != spec.name:
                raise ModelError(f"--data: inputs {owner} and {spec.name} share the dim {dim!r}, but the data's items "
                                 f"give it {size} and {shapes[spec.name][axis]}; give both items of one size there "
                                 "(the model takes one size for both)")


def _shared_dims(inputs: Sequence[TensorSpec], shapes: dict[str, tuple[int, ...]], given: Mapping[str, tuple[int, ...]],
                 sizes: Mapping[str, tuple[int, str]], notes: list[str]) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """A dim name inputs share is one size (:func:`autoprec.core.profile.shared_dim_sizes`): the one --shape gives
    (``sizes``: dim name -> size, the input whose --shape gave it), carried to the inputs it does not name, over
    what their data's items say."""
    for spec in (s for s in inputs if s.name not in given):
        shape = list(shapes[spec.name])
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, str) and dim not in ("", "?") and dim in sizes and shape[axis] != sizes[dim][0]:
                shape[axis] = sizes[dim][0]
                notes[:] = [n for n in notes if not n.startswith(f"input {spec.name}: dynamic batch dim {dim} ")]
                notes.append(f"input {spec.name}: dim {dim} set to {sizes[dim][0]}, as --shape {sizes[dim][1]} gives it")
        shapes[spec.name] = tuple(shape)
    return shapes, notes


def _compute_types(model: onnx.ModelProto, nodes: Collection[str]) -> list[str]:
    """The element types of the first inputs of ``nodes`` (top-graph node names), as NumPy names."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    found = {types.get(n.input[0]) for n in graph.node if n.name in nodes and n.input}
    return sorted(_dtype(t) for t in found if t) or ["a float type other than float32"]


def check_feeds(
    inputs: Sequence[TensorSpec], constants: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """What preparation runs the model on: zeros at the given shapes, or the given constant."""
    constants = constants or {}
    return {i.name: np.asarray(constants[i.name], i.dtype) if i.name in constants else np.zeros(i.shape, i.dtype)
            for i in inputs}


def _fusable_block(
    tensor: gs.Variable, graph: gs.Graph, space: SearchSpace, made: Collection[str] = ()
) -> list[gs.Node]:
    """Neighbours TensorRT would fuse into the unit that produces ``tensor``.

    Two shapes are recognised, repeatedly: a single-consumer chain of fusable ops whose other
    inputs are constants or tensors the unit itself ``made`` (bias Add, BN, Relu, Clip, ...; a
    decomposed LayerNorm's Div of its centred value by its deviation, then scale and shift: ONNX
    Runtime fuses all of it and names it after the scale), and a gated activation ``x * f(x)``
    (SiLU, HardSwish) where f is a short fusable chain.
    """
    fused: list[gs.Node] = []

    def fusable(node: gs.Node, allowed_inputs: set) -> bool:
        return (
            node.op in space.fusable
            and node.op not in space.pinned_fp32
            and len(node.outputs) == 1
            and all(isinstance(i, gs.Constant) or i.name in allowed_inputs for i in node.inputs if i.name)
        )

    while tensor not in graph.outputs:
        consumers = list(tensor.outputs)
        if len(consumers) == 1 and fusable(consumers[0], {tensor.name, *made}):
            fused.append(consumers[0])
            tensor = consumers[0].outputs[0]
            continue
        gate = _gated_activation(tensor, consumers, graph, fusable)
        if gate is None:
            break
        fused.extend(gate)
        tensor = gate[-1].outputs[0]
    return fused


def _gated_activation(tensor, consumers, graph, fusable) -> list[gs.Node] | None:
    """Match ``Mul(x, chain(x))`` with a chain of up to three fusable single-consumer ops."""
    if len(consumers) != 2:
        return None
    for start, mul in (consumers, consumers[::-1]):
        if mul.op != "Mul" or not fusable(start, {tensor.name}):
            continue
        chain = [start]
        while len(chain) <= 3:
            out = chain[-1].outputs[0]
            if out in graph.outputs or len(out.outputs) != 1:
                break
            nxt = out.outputs[0]
            if nxt is mul:
                if fusable(mul, {tensor.name, out.name}):
                    return chain + [mul]
                break
            if not fusable(nxt, {out.name}):
                break
            chain.append(nxt)
    return None


def find_units(model: onnx.ModelProto, space: SearchSpace, out_of_range: Collection[str] = ()) -> tuple[Unit, ...]:
    """Every node whose op type the search space lists, in graph order, with its fused neighbours;
    inside If branches and Loop/Scan bodies too, named by their path (``If_1/then/Conv_3``).
    ``out_of_range``: labels of precision-neutral nodes that count as sensitive (their range on the data)."""
    return tuple(_units_in(gs.import_onnx(model), space, (), frozenset(out_of_range)))


def _sensitive_groups(graph: gs.Graph, space: SearchSpace, out_of_range: Collection[str]) -> dict[str, list[gs.Node]]:
    """Sensitive nodes joined directly or through one precision-neutral node (the ops of a decomposed
    LayerNorm: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt), keyed by the name of its first sensitive op;
    the joining neutral nodes are members too. One such group is one unit. ``out_of_range``: names of
    neutral nodes here that count as sensitive."""
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    sensitive = [n for n in graph.nodes
                 if (n.op in space.sensitive or n.name in out_of_range) and n.op not in space.units
                 and n.op not in space.pinned_fp32]
    inside = {id(n) for n in sensitive}
    links: list[tuple[gs.Node, gs.Node]] = []
    bridges: dict[int, list[gs.Node]] = {}
    for node in sensitive:
        for consumer in (c for out in node.outputs for c in out.outputs):
            if id(consumer) in inside:
                links.append((node, consumer))
            elif consumer.op in NEUTRAL_OPS and consumer.op not in space.units:
                reached = [c for out in consumer.outputs for c in out.outputs if id(c) in inside]
                links += [(node, other) for other in reached]
                if reached:
                    bridges.setdefault(id(node), []).append(consumer)
    groups = {}
    for members in connected(sensitive, links):
        nodes = {id(n): n for member in members for n in (member, *bridges.get(id(member), []))}
        ordered = sorted(nodes.values(), key=lambda n: order[id(n)])
        # named after its first sensitive op, so that a unit keeps its name whether or not neutral ops out
        # of FP16's range joined it (a plan searched without FP16 fits an analysis with it)
        groups[next((n for n in ordered if n.op in space.sensitive), ordered[0]).name] = ordered
    return groups


def _units_in(graph: gs.Graph, space: SearchSpace, scope: tuple[str, ...], out_of_range: frozenset[str]) -> list[Unit]:
    units = []
    groups = _sensitive_groups(
        graph, space, {n.name for n in graph.nodes if subgraphs.label(scope, n.name) in out_of_range}
    )
    for node in graph.nodes:
        for attribute, value in node.attrs.items():
            if isinstance(value, gs.Graph):
                units += _units_in(value, space, (*scope, node.name, attribute), out_of_range)
        if node.op not in space.units and node.name not in groups:
            continue
        members = groups.get(node.name, [node])
        inside = {id(n) for n in members}
        float_inputs = [
            i
            for n in members
            for i in n.inputs
            if i.name
            and (i.dtype is None or np.dtype(i.dtype).kind == "f")
            and not (i.inputs and id(i.inputs[0]) in inside)
        ]
        weight = (
            None if node.name in groups else next((i for i in float_inputs[1:2] if isinstance(i, gs.Constant)), None)
        )
        activations = tuple(dict.fromkeys(i.name for i in float_inputs if not isinstance(i, gs.Constant)))
        if not activations:
            continue  # a constant-only node is folded away by engines; nothing to choose
        # Lowering writes FP16 Casts and INT8 Q/DQ for float32 tensors only: a unit computing in
        # another float type (float64) would be reported lowered while running unchanged.
        float32 = all(i.dtype is None or np.dtype(i.dtype) == np.float32 for i in float_inputs)
        made = {out.name for n in members for out in n.outputs}
        fused = [] if node.op in space.pinned_fp32 else _fusable_block(members[-1].outputs[0], graph, space, made)
        name = subgraphs.label(scope, node.name)
        units.append(
            Unit(
                name=name,
                op_type=node.op,
                nodes=tuple(dict.fromkeys(n.name for n in (*members, *fused))),
                activations=activations,
                weight=weight.name if weight is not None else None,
                output=(fused[-1] if fused else members[-1]).outputs[0].name,
                allowed=space.allowed(name, node.op) if float32 else (Precision.FP32,),
                scope=scope,
                sensitive=node.op not in space.units,
            )
        )
    return units


def _output_specs(model: onnx.ModelProto) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(o.name, _dims(o), _dtype(o.type.tensor_type.elem_type)) for o in model.graph.output)


# Ops whose output is drawn at random on every run: a model with one has no exact FP32 reference.
RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")


def refuse_random_ops(model, path: Path) -> None:
    """A graph drawing random values (any subgraph) has no FP32 reference to judge plans against, and
    preparation would fold a seeded draw into a constant: refused before either, naming the op."""
    used = {name for _, graph in subgraphs.graphs(model.graph) for node in graph.node for name in node.input} | {
        o.name for o in model.graph.output}
    found = [f"{node.op_type} {node.name!r}" for _, graph in subgraphs.graphs(model.graph) for node in graph.node
             if node.op_type in RANDOM_OPS and any(out in used for out in node.output)]
    if found:
        raise ModelError(f"{path.name}: it draws random values ({', '.join(found[:3])}): its FP32 outputs change from "
                         "run to run, so a plan's loss against FP32 would be that noise. Give a deterministic model "
                         "(random ops removed, or exported for inference)")


def analyse(
    path: str | Path,
    space: SearchSpace,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    data_shapes: Mapping[str, tuple[int, ...]] | None = None,
    model: onnx.ModelProto | None = None,
    constants: Mapping[str, float] | None = None,
    cache: Path | None = None,
    min_shapes: Mapping[str, tuple[int, ...]] | None = None,
    max_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> ModelInfo:
    """Load (unless given: :func:`load_onnx`'s graph), prepare and analyse a model: the first step of every
    search. ``constants`` are the values of inputs fed one fixed value (``--const``); ``cache``: where the
    prepared model is kept for the next search of it (else a temporary folder, for this process);
    ``min_shapes`` / ``max_shapes``: the bounds of the shapes it is deployed across (opt: the fixed shapes)."""
    path = Path(path)
    raw = model if model is not None else load_onnx(path)
    refuse_random_ops(raw, path)
    declared = declared_inputs(raw)
    fixed, notes = resolve_input_shapes(declared, shapes or {}, data_shapes)
    inputs = tuple(replace(s, shape=fixed[s.name]) for s in declared)
    profile = shape_profile([(s.name, s.shape) for s in declared], fixed, min_shapes, max_shapes)
    check_fits(profile, {s.name: np.dtype(s.dtype).itemsize for s in inputs}, raw)  # before preparation runs it
    sha256 = model_sha256(path)
    external_data = any(is_external(t) for t in tensors(raw.graph))
    made = prepared_model(path, raw, sha256, fixed, check_feeds(inputs, constants), cache)
    stored, prep_notes, prepared = made.model, made.notes, made.model.proto
    try:
        units = tie_repeats(prepared, find_units(prepared, space))
    except Exception as exc:  # the model runs (prepare_graph checked): a failure here is autoprec's
        raise ModelError(
            f"{path}: runs in ONNX Runtime, but autoprec cannot find its layers ({type(exc).__name__}: "
            f"{first_line(exc)}); please report it with the model"
        ) from None
    other_floats = [u.name for u in units if not u.searchable and len(space.allowed(u.name, u.op_type)) > 1]
    if other_floats:
        notes.append(
            f"{len(other_floats)} unit(s) compute in a float type other than float32 (e.g. {other_floats[0]}): "
            "kept FP32, since lowering converts float32 tensors only"
        )
    quantized = sorted({n.op_type for n in prepared.graph.node} & QUANTIZED_OPS)
    if not units and quantized:
        raise ModelError(
            f"{path}: already quantized ({', '.join(quantized)}), with no FP32 compute layer left to choose a "
            "precision for; give autoprec the FP32 model it was quantized from"
        )
    if not any(u.searchable for u in units):
        if other_floats:
            kinds = _compute_types(prepared, {u.nodes[0] for u in units if u.name in other_floats})
            raise ModelError(
                f"{path}: no searchable layers: its layers compute in {' and '.join(kinds)}, not float32, and autoprec "
                "lowers float32 layers only; give it the float32 model"
                + (" (a float16 model is already reduced: its FP32 original is what the search starts from)"
                   if "float16" in kinds else "")
            )
        raise ModelError(
            f"{path}: no searchable layers: the search space ({space.source}) lists "
            f"{', '.join(sorted(space.units))}, and the model has "
            + ("none of them" if not units else "only pinned ones")
            + "; add its compute op types under 'units:' in a --search-space file"
        )
    return ModelInfo(
        path=path,
        sha256=sha256,
        model=prepared,
        folder=stored.folder,
        inputs=inputs,
        outputs=_output_specs(prepared),
        units=units,
        notes=tuple(notes + prep_notes),
        metadata={p.key: p.value for p in raw.metadata_props},
        external_data=external_data,
        deployable=made.deployable if made.deployable is not prepared else None,
        profile=profile,
        source=made.source,
    )

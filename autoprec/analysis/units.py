"""The units of a model: its compute layers, each with the neighbours an engine fuses into it."""

from __future__ import annotations

from dataclasses import replace
from typing import Collection

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from autoprec.analysis import subgraphs
from autoprec.analysis.model_info import ModelInfo, Unit
from autoprec.analysis.patterns import tie_repeats
from autoprec.core.groups import connected
from autoprec.core.plan import Precision
from autoprec.core.search_space import NEUTRAL_OPS, SearchSpace

# TensorRT makes a loop of layers of one: no precision check reads it
RECURRENT_OPS = {"LSTM", "GRU", "RNN"}


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
    ``out_of_range``: labels of precision-neutral nodes that count as sensitive (their range on the
    data)."""
    return tuple(_units_in(gs.import_onnx(model), space, (), frozenset(out_of_range)))


def _sensitive_groups(graph: gs.Graph, space: SearchSpace, out_of_range: Collection[str]) -> dict[str, list[gs.Node]]:
    """Sensitive nodes joined directly or through one precision-neutral node (the ops of a
    decomposed LayerNorm: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt), keyed by the name of its
    first sensitive op; the joining neutral nodes are members too. One such group is one unit.
    ``out_of_range``: names of neutral nodes here that count as sensitive."""
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
        # named after its first sensitive op, so that a unit keeps its name whether or not neutral
        # ops out of FP16's range joined it (a plan searched without FP16 fits an analysis with it)
        groups[next((n for n in ordered if n.op in space.sensitive), ordered[0]).name] = ordered
    return groups


def _units_in(graph: gs.Graph, space: SearchSpace, scope: tuple[str, ...],
              out_of_range: frozenset[str]) -> list[Unit]:
    units = []
    groups = _sensitive_groups(
        graph, space,
        {n.name for n in graph.nodes if subgraphs.label(scope, n.name) in out_of_range}
    )
    for node in graph.nodes:
        for attribute, value in node.attrs.items():
            if isinstance(value, gs.Graph):
                units += _units_in(value, space, (*scope, node.name, attribute), out_of_range)
        embedding = _embedding_allowed(node, space, subgraphs.label(scope, node.name))
        if embedding:
            units.append(_embedding_unit(node, embedding, scope, space))
            continue
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
                allowed=_allowed(space.allowed(name, node.op), node, weight) if float32 else (Precision.FP32,),
                scope=scope,
                sensitive=node.op not in space.units,
                int4_block=space.int4_block_size,
            )
        )
    return units


def _embedding_allowed(node: gs.Node, space: SearchSpace, name: str) -> tuple[Precision, ...]:
    """What a Gather of a constant float32 table's rows along axis 0 may take (its row a whole number of
    INT4 blocks; see :meth:`SearchSpace.embedding_allowed`); () for any other node."""
    table = node.inputs[0] if node.op == "Gather" and len(node.inputs) == 2 else None
    if (not isinstance(table, gs.Constant) or isinstance(node.inputs[1], gs.Constant)
            or node.attrs.get("axis", 0) not in (0, -2) or len(table.shape) != 2 or table.dtype != np.float32
            or table.shape[1] % space.int4_block_size):
        return ()
    return space.embedding_allowed(name)


def _embedding_unit(node: gs.Node, allowed: tuple[Precision, ...], scope: tuple[str, ...],
                    space: SearchSpace) -> Unit:
    """An embedding as a unit: its table the weight, no float activations (the indices are integers), decided
    as a sensitive unit is (a gather reads a row a token: INT4 saves memory, time only where measured)."""
    return Unit(name=subgraphs.label(scope, node.name), op_type=node.op, nodes=(node.name,), activations=(),
                weight=node.inputs[0].name, output=node.outputs[0].name, allowed=allowed, scope=scope,
                sensitive=True, int4_block=space.int4_block_size)


def _allowed(allowed: tuple[Precision, ...], node: gs.Node, weight: gs.Constant | None) -> tuple[Precision, ...]:
    """INT4 (weight-only 4-bit blocks) where the node has a weight to hold so (see
    :func:`takes_int4`)."""
    shape = tuple(weight.shape) if weight is not None else None
    return allowed if takes_int4(node.op, node.attrs, shape) else tuple(p for p in allowed if p is not Precision.INT4)


def takes_int4(op_type: str, attributes: dict, weight_shape: tuple | None) -> bool:
    """Whether a compute node can hold its weight in 4-bit blocks: a MatMul reading a constant 2-D
    weight second, or a plain Gemm (no transposed input A, no scaling). A K that is not a whole
    number of blocks is padded (autoprec.lower.int4)."""
    if weight_shape is None or len(weight_shape) != 2:
        return False
    if op_type == "MatMul":
        return True
    plain = not attributes.get("transA", 0) and attributes.get("alpha", 1.0) == attributes.get("beta", 1.0) == 1.0
    return op_type == "Gemm" and plain


def with_out_of_range(info: ModelInfo, space: SearchSpace, nodes: Collection[str], note: str) -> ModelInfo:
    """The units again, the precision-neutral ``nodes`` (labels) among the sensitive ones."""
    units = find_units(info.model, space, nodes)
    if any(u.tied_to for u in info.units):
        units = tie_repeats(info.model, units)
    return replace(info, units=units, out_of_range=tuple(sorted(nodes)), notes=(*info.notes, note))

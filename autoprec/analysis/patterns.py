"""Repeated structures: units with the same ops, shapes and attributes at the same position of
repeated blocks (the 12 or 24 layers of a transformer), so that the search decides them together.

Each node is labelled by its own structure (op, attributes, output types, the constants it reads),
then, for a few rounds, by its neighbours' labels as well (Weisfeiler-Lehman hashing): two nodes
keep equal labels only where their surroundings look alike that far out. A unit's signature is its
nodes' labels; units of one signature are one pattern at one position, and each follows the first of
them in graph order. Layers whose surroundings differ within those rounds (the first and last,
usually) stay apart.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import replace
from typing import Sequence

import onnx
from onnx import helper

from autoprec.analysis import subgraphs

# How far a node's neighbourhood decides its label: far enough that a layer's query and value
# projections (alike but for where their outputs go) differ, near enough that every middle layer
# looks alike.
ROUNDS = 3


def _digest(*parts) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


def _attribute(attribute: onnx.AttributeProto):
    if attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return attribute.name, "graph"
    if attribute.type == onnx.AttributeProto.TENSOR:
        return attribute.name, attribute.t.data_type, tuple(attribute.t.dims)
    return attribute.name, repr(helper.get_attribute_value(attribute))


def _types(graph: onnx.GraphProto) -> dict[str, tuple]:
    """Each tensor's element type and shape, where the graph says."""
    found = {}
    for value in (*graph.value_info, *graph.input, *graph.output):
        tensor = value.type.tensor_type
        found[value.name] = (tensor.elem_type,
                             tuple(d.dim_value or d.dim_param for d in tensor.shape.dim))
    found.update({t.name: ("const", t.data_type, tuple(t.dims)) for t in graph.initializer})
    return found


def node_labels(graph: onnx.GraphProto, rounds: int = ROUNDS) -> dict[str, str]:
    """Node name -> structural label after ``rounds`` rounds of neighbourhood hashing."""
    types = _types(graph)
    producer = {out: n.name for n in graph.node for out in n.output if out}
    readers: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for node in graph.node:
        for slot, name in enumerate(node.input):
            readers[name].append((slot, node.name))
    labels = {n.name: _digest(n.op_type, n.domain, sorted(_attribute(a) for a in n.attribute),
                              [types.get(o) for o in n.output],
                              [(slot, types[i]) for slot, i in enumerate(n.input) if types.get(i, ("",))[0] == "const"])
              for n in graph.node}
    for _ in range(rounds):
        labels = {
            n.name: _digest(
                labels[n.name],
                [(slot, labels.get(producer.get(i, ""), "outside")) for slot, i in enumerate(n.input)],
                sorted((slot, labels[reader]) for o in n.output for slot, reader in readers.get(o, ())),
            )
            for n in graph.node
        }
    return labels


def tie_repeats(model: onnx.ModelProto, units: Sequence) -> tuple:
    """``units`` with each unit of a repeated pattern tied to the first of its pattern
    (``tied_to``): units of one scope whose nodes carry the same labels and that may take the same
    precisions."""
    labels = {scope: node_labels(graph) for scope, graph in subgraphs.graphs(model.graph)}
    leaders: dict[tuple, str] = {}
    tied = []
    for unit in units:
        signature = (unit.scope, unit.op_type, unit.sensitive, unit.allowed,
                     tuple(labels[unit.scope].get(n) for n in unit.nodes))
        leader = leaders.setdefault(signature, unit.name) if unit.searchable else unit.name
        tied.append(replace(unit, tied_to=leader if leader != unit.name else None))
    return tuple(tied)

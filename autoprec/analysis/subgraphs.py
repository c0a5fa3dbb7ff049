"""Control flow: the graphs inside If, Loop and Scan nodes, and reading their tensors off a run.

A subgraph is addressed by its *scope*: the (node name, attribute name) pairs from the top graph
down, e.g. ``("If_1", "then_branch")``. ONNX Runtime returns only top-graph outputs, so a tensor
inside a subgraph is read by passing it out as an extra output of every enclosing subgraph: an If's
other branch passes an empty tensor; a Loop or Scan body passes it as a scan output (its values at
every iteration, stacked).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import onnx
from onnx import helper

Scope = tuple[str, ...]
BRANCH_LABELS = {"then_branch": "then", "else_branch": "else", "body": "body"}


def graphs(graph: onnx.GraphProto, scope: Scope = ()) -> Iterator[tuple[Scope, onnx.GraphProto]]:
    """The graph and every subgraph in it, depth first, each with its scope."""
    yield scope, graph
    for node in graph.node:
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                yield from graphs(sub, (*scope, node.name, attribute.name))


def all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of the model, inside subgraphs too: what a profile of a run names."""
    return [node for _, graph in graphs(model.graph) for node in graph.node]


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from outside itself (its nodes' inputs it does not make or hold), at
    any depth."""
    own = (
        {i.name for i in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    )
    return set().union(*(node_reads(node) for node in graph.node)) - own


def subgraphs_of(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds (an If's branches, a Loop's or Scan's body)."""
    return [sub for attribute in node.attribute
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs)]


def node_reads(node: onnx.NodeProto) -> set[str]:
    """Every name a node reads: its inputs, and what its subgraphs read from around it."""
    return {i for i in node.input if i} | {name for sub in subgraphs_of(node) for name in outer_reads(sub)}


def label(scope: Scope, node_name: str) -> str:
    """A node's name as the user sees it: ``If_1/then/Conv_3`` inside subgraphs, its own name on
    top."""
    parts = [f"{scope[i]}/{BRANCH_LABELS.get(scope[i + 1], scope[i + 1])}" for i in range(0, len(scope), 2)]
    return "/".join([*parts, node_name])


def graph_at(model: onnx.ModelProto, scope: Scope) -> onnx.GraphProto:
    graph = model.graph
    for node_name, attribute_name in zip(scope[::2], scope[1::2]):
        node = next(n for n in graph.node if n.name == node_name)
        graph = next(a.g for a in node.attribute if a.name == attribute_name)
    return graph


def defining_scopes(model: onnx.ModelProto) -> dict[str, Scope]:
    """Where each tensor is made (a node output or a subgraph input): the scope it can be read
    from."""
    found: dict[str, Scope] = {}
    for scope, graph in graphs(model.graph):
        names = [t for n in graph.node for t in n.output if t]
        if scope:
            names += [i.name for i in graph.input]
        for name in names:
            found.setdefault(name, scope)
    return found


def _elem_type(graph: onnx.GraphProto, name: str) -> int:
    for value in [*graph.value_info, *graph.output, *graph.input]:
        if value.name == name and value.type.tensor_type.elem_type:
            return value.type.tensor_type.elem_type
    return onnx.TensorProto.FLOAT


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` that also outputs the tensors ``names``, wherever they are made, and the
    output name each is read under (its own name for a top-graph tensor).

    A tensor from inside an If reads as an empty array on runs that took the other branch; one
    from a Loop or Scan body reads as its values at every iteration, stacked.
    """
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    scopes = defining_scopes(exposed)
    present = {o.name for o in exposed.graph.output}
    read_as = []
    for index, name in enumerate(names):
        scope = scopes.get(name, ())
        outer = _pass_out(exposed, scope, name, index) if scope else name
        if outer not in present:
            exposed.graph.output.append(onnx.ValueInfoProto(name=outer))
            present.add(outer)
        read_as.append(outer)
    return exposed, read_as


def _pass_out(model: onnx.ModelProto, scope: Scope, name: str, index: int) -> str:
    """Pass ``name`` out of each subgraph enclosing it, innermost first; the outer name it gets."""
    current = name
    while scope:
        parent, (node_name, attribute_name) = scope[:-2], scope[-2:]
        node = next(n for n in graph_at(model, parent).node if n.name == node_name)
        sub = next(a.g for a in node.attribute if a.name == attribute_name)
        elem_type = _elem_type(sub, current)
        local = f"autoprec_read/{index}/{len(scope)}/{name}"
        sub.node.append(helper.make_node("Identity", [current], [local], name=f"{local}/identity"))
        sub.output.append(helper.make_tensor_value_info(local, elem_type, None))
        if node.op_type == "If":
            other = next(
                a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH and a.name != attribute_name
            )
            empty = f"{local}/empty"
            other.node.append(helper.make_node("Constant", [], [empty], name=f"{empty}/constant",
                                               value=helper.make_tensor(empty, elem_type, [0], [])))
            other.output.append(helper.make_tensor_value_info(empty, elem_type, None))
        elif node.op_type == "Scan":
            for attribute in node.attribute:
                if attribute.name in ("scan_output_axes", "scan_output_directions"):
                    attribute.ints.append(0)
        current = f"{local}/out"
        node.output.append(current)
        scope = parent
    return current

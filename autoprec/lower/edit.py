"""Local edits of the prepared model's graphs: a lowering costs what it changes, not the graph's
size.

Lowering a plan adds Q/DQ pairs and Casts, rewires the inputs of the units it lowers and replaces
their weights. :class:`ModelIndex` (built once per prepared model and process) knows where each node
is and who reads each tensor; a :class:`GraphEdit` collects one graph's changes and writes them in
one pass: each added node just before the first node that reads what it makes, the graph otherwise
as it was, an initializer no node reads any more dropped. No import, export, topological sort or
cleanup of the whole graph.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import NodeProto, TensorProto, helper

from autoprec.analysis.subgraphs import Scope, graphs, outer_reads, subgraphs_of
from autoprec.core.stored import external_info, is_external, read_tensor

# "position" of a tensor made outside the graph (an input, an initializer, an outer scope's)
_OUTER = -1


@dataclass
class ScopeIndex:
    """One graph of the prepared model (never edited), as lowering reads it."""

    graph: onnx.GraphProto
    outer_initializers: dict[str, TensorProto]  # those of the graphs around it, which it may read
    position: dict[str, int] = field(init=False)  # node name -> position
    producer: dict[str, int] = field(init=False)  # tensor -> position of the node making it
    # tensor -> positions of nodes with it as a direct input
    readers: dict[str, list[int]] = field(init=False)
    # tensor -> positions of nodes whose subgraphs read it
    implicit: dict[str, list[int]] = field(init=False)
    dtypes: dict[str, int] = field(init=False)  # tensor -> ONNX element type, where known
    outputs: frozenset[str] = field(init=False)

    def __post_init__(self):
        self._where: dict[str, tuple | None] = {}
        graph = self.graph
        self.position = {n.name: p for p, n in enumerate(graph.node)}
        self.producer = {o: p for p, n in enumerate(graph.node) for o in n.output if o}
        self.readers, self.implicit = defaultdict(list), defaultdict(list)
        for p, node in enumerate(graph.node):
            for name in dict.fromkeys(i for i in node.input if i):
                self.readers[name].append(p)
            for sub in subgraphs_of(node):
                for name in outer_reads(sub):
                    self.implicit[name].append(p)
        values = [*graph.value_info, *graph.input, *graph.output]
        self.dtypes = {v.name: v.type.tensor_type.elem_type for v in values if v.type.HasField("tensor_type")}
        self.dtypes.update({t.name: t.data_type for t in self.initializers.values()})
        self.outputs = frozenset(o.name for o in graph.output)

    @cached_property
    def initializers(self) -> dict[str, TensorProto]:
        """The initializers this graph can read: its own and its outer graphs' (as graphsurgeon sees
        them)."""
        return {**self.outer_initializers, **{t.name: t for t in self.graph.initializer}}

    @cached_property
    def surgeon(self) -> gs.Graph:
        """The graph for graphsurgeon's readers (region growth), the outer initializers it reads
        among its constants; imported once, never edited or exported."""
        graph = onnx.GraphProto()
        graph.CopyFrom(self.graph)
        read = {i for n in graph.node for i in n.input}
        own = {t.name for t in graph.initializer}
        graph.initializer.extend(t for name, t in self.outer_initializers.items() if name in read and name not in own)
        return gs.import_onnx(helper.make_model(graph))

    def is_float32(self, name: str) -> bool:
        return self.dtypes.get(name) == TensorProto.FLOAT

    def values(self, name: str, folder: Path) -> np.ndarray:
        """An initializer's values (read, or memory-mapped where large: see
        autoprec.core.stored.read_tensor), its data file's place looked up once: reading it off the
        protobuf costs more than a small read."""
        if name not in self._where:
            self._where[name] = external_info(self.initializers[name]) if is_external(self.initializers[name]) else None
        return read_tensor(self.initializers[name], folder, self._where[name])


@dataclass
class ModelIndex:
    """Every graph of a prepared model indexed, and how often each name is read (to drop unread
    initializers)."""

    scopes: dict[Scope, ScopeIndex]
    uses: Counter  # name -> node inputs (at any depth) and graph outputs naming it
    owner: dict[str, Scope]  # initializer -> the graph holding it


def build_index(model: onnx.ModelProto) -> ModelIndex:
    scopes: dict[Scope, ScopeIndex] = {}
    owner: dict[str, Scope] = {}
    uses: Counter = Counter()
    for scope, graph in graphs(model.graph):
        outer = {}
        for depth in range(0, len(scope), 2):
            outer.update({t.name: t for t in scopes[scope[:depth]].graph.initializer})
        scopes[scope] = ScopeIndex(graph, outer)
        owner.update({t.name: scope for t in graph.initializer})
        uses.update(i for n in graph.node for i in n.input if i)
        uses.update(o.name for o in graph.output)
    return ModelIndex(scopes, uses, owner)


_indexes: dict[int, tuple[onnx.ModelProto, ModelIndex]] = {}
_lock = threading.Lock()


def index_of(model: onnx.ModelProto) -> ModelIndex:
    """The index of a prepared model's graph, built once (per process; the last two models kept)."""
    with _lock:
        found = _indexes.get(id(model))
        if found is not None and found[0] is model:
            return found[1]
    index = build_index(model)
    with _lock:
        if len(_indexes) >= 2:
            _indexes.pop(next(iter(_indexes)))
        _indexes[id(model)] = (model, index)
    return index


class GraphEdit:
    """The changes lowering makes to one graph, written by :meth:`apply`. Each node it changes or
    adds is mirrored by plain lists of its inputs and outputs (``ins``/``outs``, by ``id``): placing
    and pruning read those, not the protobuf fields, which cost far more to read a thousand
    times."""

    def __init__(self, index: ScopeIndex, released: Counter):
        self.index = index
        self.released = released  # name -> references dropped (shared by the edits of one lowering)
        self.edited: dict[int, NodeProto] = {}
        self.added: list[NodeProto] = []
        self.initializers: dict[str, TensorProto] = {}
        self.unread: set[str] = set()  # tensors of this graph a rewired input no longer reads
        self.ins: dict[int, list[str]] = {}
        self.outs: dict[int, list[str]] = {}
        self.reads: dict[str, list[NodeProto]] = defaultdict(
            list
        )  # name -> changed or added nodes that read (or once read) it

    def _mirror(self, node: NodeProto, inputs: list[str], outputs: list[str]) -> None:
        self.ins[id(node)], self.outs[id(node)] = list(inputs), list(outputs)
        for name in inputs:
            self.reads[name].append(node)

    def node(self, position: int) -> NodeProto:
        """The node at ``position``, as this lowering changes it (a copy, made on first use)."""
        if position not in self.edited:
            copy = NodeProto()
            copy.CopyFrom(self.index.graph.node[position])
            self.edited[position] = copy
            self._mirror(copy, copy.input, copy.output)
        return self.edited[position]

    def set_input(self, node: NodeProto, slot: int, name: str) -> None:
        old = self.ins[id(node)][slot]
        if old in self.index.initializers:
            self.released[old] += 1
        else:
            self.unread.add(old)
        node.input[slot] = self.ins[id(node)][slot] = name
        self.reads[name].append(node)

    def set_output(self, node: NodeProto, slot: int, name: str) -> None:
        node.output[slot] = self.outs[id(node)][slot] = name

    def retype(self, node: NodeProto, op: str, domain: str, inputs: list[str], attrs: dict) -> None:
        """``node`` made another op on ``inputs`` (its outputs kept), with ``attrs`` for its
        attributes."""
        for old in self.ins[id(node)]:
            # no longer read: an initializer released, a tensor maybe dead
            if old and old not in inputs:
                if old in self.index.initializers:
                    self.released[old] += 1
                else:
                    self.unread.add(old)
        node.op_type, node.domain = op, domain
        del node.input[:], node.attribute[:]
        node.input.extend(inputs)
        node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
        self.ins[id(node)] = list(inputs)
        for name in inputs:
            self.reads[name].append(node)

    def add(self, op: str, name: str, inputs: list[str], outputs: list[str], **attrs) -> NodeProto:
        node = NodeProto(op_type=op, name=name, input=inputs, output=outputs)
        if attrs:
            node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
        self.added.append(node)
        self._mirror(node, inputs, outputs)
        return node

    def add_initializer(self, tensor: TensorProto) -> str:
        self.initializers.setdefault(tensor.name, tensor)
        return tensor.name

    def readers(self, name: str) -> list[NodeProto]:
        """Nodes of this graph (as changed so far) with ``name`` as a direct input."""
        for position in self.index.readers.get(name, ()):
            self.node(position)
        return [n for n in {id(n): n for n in self.reads.get(name, ())}.values() if name in self.ins[id(n)]]

    def apply(self, graph: onnx.GraphProto) -> None:
        """Write the changes into ``graph`` (a copy of the indexed one)."""
        buckets = self._placed()
        dead = self._dead()
        original = self.index.graph.node
        sequence: list[NodeProto] = []
        for position, node in enumerate(original):
            sequence += buckets.get(position, [])
            if position not in dead:
                sequence.append(self.edited.get(position, node))
        sequence += buckets.get(len(original), [])
        graph.ClearField("node")
        graph.node.extend(sequence)
        graph.initializer.extend(self.initializers.values())

    def _dead(self) -> set[int]:
        """Original nodes whose outputs nothing reads any more (every reader was rewired to another
        tensor, as a one-hot's Cast to FP32 is when its FP16 region casts the integers directly),
        and those only they fed."""
        dead: set[int] = set()
        gone: set[int] = set()  # ids of the changed copies of dead nodes
        todo = set(self.unread)
        while todo:
            name = todo.pop()
            producer = self.index.producer.get(name)
            if producer is None or producer in dead:
                continue
            node = self.edited.get(producer, self.index.graph.node[producer])
            outputs = self.outs[id(node)] if producer in self.edited else list(node.output)
            if any(self._read(out, dead, gone) for out in outputs if out):
                continue
            dead.add(producer)
            gone.add(id(node))
            for name in (self.ins[id(node)] if producer in self.edited else node.input):
                if name in self.index.initializers:
                    self.released[name] += 1
                elif name:
                    todo.add(name)
        return dead

    def _read(self, name: str, dead: set[int], gone: set[int]) -> bool:
        """Whether anything still reads ``name`` (a graph output, a node kept, a node added)."""
        if name in self.index.outputs or any(p not in dead for p in self.index.implicit.get(name, ())):
            return True
        if any(p not in dead and p not in self.edited for p in self.index.readers.get(name, ())):
            return True
        return any(id(n) not in gone and name in self.ins[id(n)] for n in self.reads.get(name, ()))

    def _placed(self) -> dict[int, list[NodeProto]]:
        """Each added node under the position it goes before: that of the first node reading what it
        makes (its output read by none: just after what it reads), dependencies first within one
        position."""
        added = {id(node): i for i, node in enumerate(self.added)}
        made = {o: i for i, node in enumerate(self.added) for o in self.outs[id(node)]}
        # an FP16 node's new output
        renamed = {o: p for p, node in self.edited.items() for o in self.outs[id(node)]}
        position = {id(node): p for p, node in self.edited.items()}
        anchors: dict[int, int] = {}

        def anchor(i: int) -> int:
            if i not in anchors:
                before = []
                for out in self.outs[id(self.added[i])]:
                    before += [p for p in self.index.readers.get(out, ()) if p not in self.edited]
                    before += self.index.implicit.get(out, [])
                    before += [position[id(n)] if id(n) in position else anchor(added[id(n)])
                               for n in {id(n): n for n in self.reads.get(out, ())}.values() if out in self.ins[id(n)]]
                if before:
                    anchors[i] = min(before)
                else:
                    after = [anchor(made[n]) if n in made else renamed.get(n, self.index.producer.get(n, _OUTER)) + 1
                             for n in self.ins[id(self.added[i])] if n]
                    anchors[i] = max(after, default=0)
            return anchors[i]

        buckets: dict[int, list[int]] = defaultdict(list)
        for i in range(len(self.added)):
            buckets[anchor(i)].append(i)
        ins = [self.ins[id(node)] for node in self.added]
        return {at: [self.added[i] for i in _in_order(members, ins, made)] for at, members in buckets.items()}


def _in_order(members: list[int], ins: list[list[str]], made: dict[str, int]) -> list[int]:
    """``members`` (added nodes at one position) with each after the members whose outputs it
    reads."""
    if len(members) == 1:
        return members
    left, done, ordered = list(members), set(), []
    inside = set(members)
    while left:
        ready = next(i for i in left if all(made[n] in done or made[n] not in inside for n in ins[i] if n in made))
        left.remove(ready)
        done.add(ready)
        ordered.append(ready)
    return ordered

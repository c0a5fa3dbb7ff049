"""The sensitivity pass's one-unit plans run from their first changed node on.

A one-unit plan changes one unit: every node before the first one its lowering changes is the
all-FP32 graph's and computes what all-FP32 computes. So all-FP32 runs once on the pass's batches,
its tensors kept where they cross a few cuts of its graph, and each plan's session holds only the
nodes from the last cut before its first changed node, fed the kept tensors: about half the graph
to build and run (on a 2-core CPU the pass's evaluations of five zoo models 1.3-2.0x faster, the
losses' ranks alike, each loss above 1e-6 within 2 % of the whole plan's; on an H200, whose
sessions cost more than their nodes, 1.1-1.2x; ``benchmarks/results/sensitivity_pass_4348f78.json``,
``sensitivity_pass_gpu_h200_4348f78.json``).

Top-graph nodes only (a unit inside an If changes the If node: the cut falls before it); a graph
output made before the cut is all-FP32's own. Where no cut falls before the first change, the plan
runs whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from autoprec.analysis.data import Batch
from autoprec.analysis.subgraphs import node_reads, with_outputs
from autoprec.backends.base import Backend
from autoprec.core.errors import first_line
from autoprec.core.stored import StoredModel

log = logging.getLogger("autoprec")

CUTS = 16  # places all-FP32's tensors are kept at, evenly spread over its top graph's nodes
CAPTURE_BYTES = 256 << 20  # the tensors kept for every batch together, at most


def crossing(graph: onnx.GraphProto, cut: int) -> set[str]:
    """The tensors nodes before ``cut`` make and nodes from ``cut`` on read (through their
    subgraphs too)."""
    made = {o for node in graph.node[:cut] for o in node.output if o}
    return {name for node in graph.node[cut:] for name in node_reads(node) if name in made}


@dataclass(frozen=True)
class Downstream:
    """All-FP32 (``reference``, as the pass's plans are lowered) run on ``batches``: at each cut
    (a node position), the tensors crossing it, and its graph outputs; per batch."""

    reference: onnx.ModelProto
    cuts: tuple[int, ...]
    batches: tuple[Batch, ...]
    kept: tuple[dict[str, np.ndarray], ...]

    @classmethod
    def captured(cls, backend: Backend, reference: StoredModel, batches: Sequence[Batch],
                 budget: int = CAPTURE_BYTES) -> Downstream | None:
        """All-FP32's tensors at up to CUTS cuts, as many as ``budget`` holds over the batches (the
        later cuts kept first: they save the most); None where it holds none, or the engine cannot
        run all-FP32 with them as outputs, or runs a cut graph otherwise than the whole
        (:attr:`~autoprec.backends.base.Backend.runs_from_a_cut`): the plans then run whole."""
        if not backend.runs_from_a_cut:
            return None
        graph = reference.proto.graph
        cuts = sorted({len(graph.node) * k // (CUTS + 1) for k in range(1, CUTS + 1)} - {0})
        across = {cut: crossing(graph, cut) for cut in cuts}
        outputs = [o.name for o in graph.output]
        names = sorted(set().union(*across.values()) - set(outputs))
        try:
            exposed, _ = with_outputs(reference.proto, names)
            with backend.judging_runner(reference.with_proto(exposed)) as runner:
                first = runner.run(batches[0])
                while cuts and _bytes(first, across, cuts) * len(batches) > budget:
                    cuts = cuts[1::2] if len(cuts) > 1 else []
                if not cuts:
                    return None
                wanted = set(outputs).union(*(across[cut] for cut in cuts))
                kept = [{k: v for k, v in found.items() if k in wanted}
                        for found in [first, *(runner.run(batch) for batch in batches[1:])]]
        except Exception as exc:  # noqa: BLE001 - any engine error: the plans run whole, as before
            log.debug(f"sensitivity: all-FP32's tensors not kept ({first_line(exc, 200)}); each plan runs whole")
            return None
        return cls(reference.proto, tuple(cuts), tuple(batches), tuple(kept))

    def outputs(self, backend: Backend, model: StoredModel) -> list[dict[str, np.ndarray]] | None:
        """``model``'s outputs on the batches, its nodes from the last cut before its first changed
        one run on the tensors kept there; None where no cut falls before that node."""
        nodes, before = model.proto.graph.node, self.reference.graph.node
        first = next((i for i, (a, b) in enumerate(zip(before, nodes)) if a != b), min(len(before), len(nodes)))
        cut = max((c for c in self.cuts if c <= first), default=0)
        fed = crossing(model.proto.graph, cut) if cut else set()
        if not cut or not fed <= self.kept[0].keys():
            return None
        part = _from_cut(model.proto, cut, {name: self.kept[0][name] for name in fed})
        if part is None:
            return None
        names = [o.name for o in self.reference.graph.output]
        inputs = {i.name for i in part.graph.input}
        found = []
        with backend.judging_runner(model.with_proto(part)) as runner:
            for batch, kept in zip(self.batches, self.kept):
                ran = runner.run({**{k: v for k, v in batch.items() if k in inputs},
                                  **{name: kept[name] for name in fed}})
                found.append({name: ran[name] if name in ran else kept[name] for name in names})
        return found


def _bytes(found: Mapping[str, np.ndarray], across: Mapping[int, set[str]], cuts: Sequence[int]) -> int:
    return sum(found[name].nbytes for name in set().union(*(across[cut] for cut in cuts)))


def _from_cut(model: onnx.ModelProto, cut: int, fed: Mapping[str, np.ndarray]) -> onnx.ModelProto | None:
    """``model`` from node ``cut`` on: the tensors crossing the cut (``fed``, examples of their
    values) made inputs, its initializers and inputs those the remaining nodes read, its outputs
    those they make; None where they make none."""
    part = onnx.ModelProto()
    part.CopyFrom(model)
    graph = part.graph
    del graph.node[:cut]
    reads = set().union(*(node_reads(node) for node in graph.node))
    made = {o for node in graph.node for o in node.output}
    outputs = [o for o in graph.output if o.name in made]
    if not outputs:
        return None
    kept = [t for t in graph.initializer if t.name in reads]
    inputs = [i for i in graph.input if i.name in reads]
    values = [v for v in graph.value_info if v.name not in fed]
    for field, items in (("initializer", kept), ("input", inputs), ("output", outputs), ("value_info", values)):
        graph.ClearField(field)
        getattr(graph, field).extend(items)
    graph.input.extend(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                     [None] * value.ndim)
                       for name, value in sorted(fed.items()))
    return part


class Captures:
    """A measurer's :class:`Downstream` by batch count: captured when the first one-unit plan asks,
    dropped once anything else is asked (their memory given back)."""

    def __init__(self):
        self.by_count: dict[int, Downstream | None] = {}

    def of(self, backend: Backend, reference: Callable[[], StoredModel], batches: Sequence[Batch]) -> Downstream | None:
        """The capture on ``batches``, made now of all-FP32 as ``reference`` lowers it where not yet."""
        if len(batches) not in self.by_count:
            self.by_count[len(batches)] = Downstream.captured(backend, reference(), batches)
        return self.by_count[len(batches)]

    def clear(self) -> None:
        self.by_count.clear()

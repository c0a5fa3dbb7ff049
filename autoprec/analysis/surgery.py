"""onnx-graphsurgeon over a stored model: its weights stay on disk unless a step reads them.

``gs.import_onnx`` keeps an external tensor as ``LazyValues`` (exported again as the same reference)
but cannot read its values (it would look for the data file in the working directory). Here such a
tensor reads as a memory map of the model's folder; one a step left as it was goes back to its
reference when the graph is exported, and a tensor a step made (a folded constant, a
BatchNorm-folded weight) is written to a data file of the folder, not into the graph.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto
from onnx_graphsurgeon.ir.tensor import LazyValues

from autoprec.core.stored import StoredModel, externalize, is_external, read_tensor

_steps = itertools.count()


def _constants(graph: gs.Graph) -> list[gs.Constant]:
    """Every constant of a graph and its subgraphs: tensors and node attributes (a Constant node's
    value)."""
    found = []
    for g in (graph, *graph.subgraphs(recursive=True)):
        found += [t for t in g.tensors().values() if isinstance(t, gs.Constant)]
        found += [v for node in g.nodes for v in node.attrs.values() if isinstance(v, gs.Constant)]
    return found


class Surgery:
    """A stored model opened as a graphsurgeon graph (``graph``); :meth:`close` makes it a stored
    model again.

    Every external tensor's values are a read-only memory map of its data file: reading one costs
    nothing until its bytes are used, so a step (graphsurgeon's constant folding runs the nodes
    whose inputs are all constant on ONNX Runtime, from a serialized copy of just those) sees every
    value without the model's weights being loaded."""

    def __init__(self, model: StoredModel):
        self.source = model
        graph = onnx.ModelProto()
        # graphsurgeon's folding of If branches writes into the protos it imported
        graph.CopyFrom(model.proto)
        self.graph = gs.import_onnx(graph)
        # id of a memory map -> it, its reference
        self.external: dict[int, tuple[np.ndarray, TensorProto]] = {}
        for constant in _constants(self.graph):
            values = constant._values
            if isinstance(values, LazyValues) and is_external(values.tensor):
                mapped = read_tensor(values.tensor, model.folder)
                self.external[id(mapped)] = (mapped, values.tensor)
                constant._values = mapped

    def close(self, new_data: bool = True) -> StoredModel:
        """The graph as a stored model in the same folder: a tensor whose values are still its
        memory map is a reference again (under its own name: an If branch inlined by folding copies
        its constants), a tensor a step made over the inline size goes to a new data file there
        (unless not ``new_data``: the caller places it)."""
        for constant in _constants(self.graph):
            found = self.external.get(id(constant._values))
            if found is not None and constant._values is found[0]:
                reference = TensorProto()
                reference.CopyFrom(found[1])
                constant._values = LazyValues(reference)
        proto = gs.export_onnx(self.graph)
        _keep_model_fields(self.source.proto, proto)
        if new_data:
            externalize(proto, self.source.folder, f"step-{os.getpid()}-{next(_steps)}.data")
        return StoredModel(proto, self.source.folder)


def _keep_model_fields(source: onnx.ModelProto, made: onnx.ModelProto) -> None:
    """What graphsurgeon's export leaves out of the model around the graph, as ``source`` has it: its
    metadata (a recognizer's character set, a classifier's labels: what deployment code reads), doc
    string, version and domain."""
    made.metadata_props.extend(p for p in source.metadata_props if p.key not in {q.key for q in made.metadata_props})
    for field in ("doc_string", "model_version", "domain"):
        if not getattr(made, field):
            setattr(made, field, getattr(source, field))

"""Plan -> explicit-precision ONNX: precision lives in the graph (Q/DQ for INT8, Cast for FP16,
4-bit weight blocks for INT4).

TensorRT 11 builds such a graph strongly typed; ONNX Runtime runs it as is. The plan is
engine-independent; the Q/DQ *form* is the engine's choice (see :mod:`autoprec.lower.qdq`).
"""

from __future__ import annotations

from collections import Counter

import onnx

from autoprec.analysis import subgraphs
from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.model_info import ModelInfo
from autoprec.core.plan import Plan, Precision
from autoprec.core.stored import StoredModel
from autoprec.lower.cast import apply_fp16, grow_region
from autoprec.lower.edit import GraphEdit, index_of
from autoprec.lower.int4 import Int4Form, apply_int4, opset_needed
from autoprec.lower.layernorm import sums_before_layer_norms
from autoprec.lower.qdq import QDQForm, apply_int8

__all__ = ["Int4Form", "QDQForm", "lower_plan"]


def lower_plan(
    info: ModelInfo, plan: Plan, ranges: ActivationRanges | None, form: QDQForm = QDQForm.TENSORRT,
    int4: Int4Form = Int4Form.DEQUANTIZE,
) -> StoredModel:
    """The prepared FP32 model rewritten so each unit runs in the plan's precision.

    Units the plan does not name stay FP32. Model inputs and outputs keep their types. In the
    TensorRT form, precision-neutral ops between FP16 units (and between them and the model's inputs
    and outputs) run in FP16 with them (one region, Casts at its borders: see autoprec.lower.cast);
    the ort-cpu form keeps Casts at every unit's borders, and writes an Add that a
    LayerNormalization reads as a Sum (see autoprec.lower.layernorm). INT4 units take ``int4``'s
    form (see autoprec.lower.int4).
    """
    precisions = _checked(info, plan)
    model = info.stored
    index = index_of(info.model)
    released: Counter = Counter()  # references to initializers the edits dropped
    edits: dict[tuple[str, ...], GraphEdit] = {}
    # the top graph, then each subgraph holding units
    for scope in dict.fromkeys(u.scope for u in info.units):
        units = [u for u in info.units if u.scope == scope]
        edit = GraphEdit(index.scopes[scope], released)
        # "If_1/then/": names unique across branches
        prefix = subgraphs.label(scope, "") if scope else ""
        fp16_nodes = {n for u in units if precisions.get(u.name) is Precision.FP16 for n in u.nodes}
        unit_nodes = {n for u in units for n in u.nodes}
        if fp16_nodes:
            region = grow_region(edit.index.surgeon, fp16_nodes, unit_nodes) if form.fp16_regions else fp16_nodes
            apply_fp16(edit, model, region, prefix)
        int8_units = [u for u in units if precisions.get(u.name) is Precision.INT8]
        if int8_units:
            if ranges is None:
                raise ValueError("INT8 units need calibrated activation ranges")
            apply_int8(edit, model, int8_units, ranges, plan.calibration, form, prefix,
                       frozenset(unit_nodes))
        apply_int4(edit, model, [u for u in units if precisions.get(u.name) is Precision.INT4],
                   int4, ranges, prefix)
        if edit.edited or edit.added:
            edits[scope] = edit
    if form.sums_before_layer_norms:
        top = edits.get(()) or GraphEdit(index.scopes[()], released)
        sums_before_layer_norms(top)
        if top.edited:
            edits[()] = top
    lowered = onnx.ModelProto()
    lowered.CopyFrom(info.model)
    # a graph before the subgraphs inside it: they are found in its new copy
    for scope in sorted(edits, key=len):
        edits[scope].apply(subgraphs.graph_at(lowered, scope))
    # a weight no node reads any more (its INT8 copy does), by graph
    unread: dict[tuple[str, ...], set[str]] = {}
    for name, dropped in released.items():
        if dropped >= index.uses[name]:
            unread.setdefault(index.owner[name], set()).add(name)
    for scope, names in unread.items():
        initializers = subgraphs.graph_at(lowered, scope).initializer
        for position in sorted((i for i, t in enumerate(initializers) if t.name in names),
                               reverse=True):
            del initializers[position]
    if Precision.INT4 in precisions.values():
        _import_opset(lowered, *opset_needed(int4))
    return model.with_proto(lowered)


def _checked(info: ModelInfo, plan: Plan) -> dict[str, Precision]:
    """The plan's precisions, each of a unit the model has and a precision that unit may take."""
    precisions = plan.as_dict()
    unknown = sorted(set(precisions) - {u.name for u in info.units})
    if unknown:
        raise KeyError(f"plan names unit(s) the model does not have: {', '.join(unknown[:5])}")
    # FP32 is always possible (what a unit the plan leaves out runs in, and what pinning leaves)
    refused = [f"{u.name} ({precisions[u.name]}; it allows {', '.join(map(str, u.allowed))})" for u in info.units
               if precisions.get(u.name, Precision.FP32) not in (*u.allowed, Precision.FP32)]
    if refused:
        raise ValueError("plan gives unit(s) a precision they may not take: "
                         f"{', '.join(refused[:3])}")
    return precisions


def _import_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    """The opset an INT4 form needs imported: com.microsoft's added; the standard one raised to it
    (the graph converted where a standard op changed between the two)."""
    found = next((o for o in model.opset_import if o.domain in (domain, "ai.onnx" if not domain else domain)), None)
    if found is None:
        model.opset_import.append(onnx.helper.make_opsetid(domain, version))
    elif found.version < version:
        if domain:
            found.version = version
        else:
            converted = onnx.version_converter.convert_version(model, version)
            model.CopyFrom(converted)

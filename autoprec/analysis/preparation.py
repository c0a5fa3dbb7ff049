"""The FP32 model every candidate starts from: static shapes, opset >= 13, constants and BatchNorm
folded.

Preparation makes it in two stages: first what holds at any input shape (opset, constant and
BatchNorm folding, node names), which gives the *deployable* graph, keeping the source's dynamic
dims; then the input shapes fixed and what they let fold. Both have the same nodes by the same
names, so a plan lowers onto either: the fixed one is measured, the deployable one is what best/ and
the exports ship.

It is a stored model (see :mod:`autoprec.core.stored`) in a folder of its own: the given model's
weights copied there once (its data files, or its inline tensors), and what preparation makes beside
them. Each step is checked by running the model in ONNX Runtime from a file of that folder, never
from a serialized copy of the weights. In a cache folder the preparation is kept under the model's
content and shapes: a resumed search, a worker and a re-created result read it.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime
from onnx import version_converter

from autoprec.analysis import subgraphs
from autoprec.analysis.artifacts import drop_idle_casts, pools_from_means
from autoprec.analysis.conv_folding import fold_batchnorm, fold_channel_steps
from autoprec.analysis.session_probe import build_crashes
from autoprec.analysis.surgery import Surgery
from autoprec.core import atomic, untrusted
from autoprec.core.atomic import pid_alive
from autoprec.core.errors import ModelError, first_line
from autoprec.core.stored import (
    DataWriter,
    StoredModel,
    copy_external_data,
    external_info,
    externalize,
    is_external,
    tensors,
)

# Q/DQ with a per-channel axis needs opset 13; older models are converted once at load.
MIN_OPSET = 13
# onnxruntime accepts IR versions up to 13 (onnx 1.23 writes 14 by default).
MAX_IR_VERSION = 10
PREPARATION_VERSION = "7"  # part of a kept preparation's key: change it with what preparation does
PREPARED_FILE = "model.onnx"
# the given graph, inputs at the shapes: timed beside the plans (weights shared)
SOURCE_FILE = "source.onnx"
DEPLOYABLE_FILE = "deployable.onnx"  # only where it differs from the prepared model (a dynamic dim)
NOTES_FILE = "prepared.json"  # written last: a folder holds a preparation only once it is there


# ONNX Runtime's CPU provider copies each weight a kernel reads into that kernel's own layout as a session is built
# ("prepacking"): a second copy beside the first, made at about a second per GB. A session that is never timed, of a
# model with more weights than this, is built without it (session.disable_prepacking): the same outputs bit for bit on
# INT8 plans; an FP32 MatMul's sums in another order, 3e-7 apart by relative L2 on a 256-wide MLP (far below any FP16
# or INT8 unit's error; the reference itself stays packed: cpu_session's ``packed``). A 2.3 GB model's session: built
# in 0.0 s instead of 2.5 s, its process peaking at 1.0x the weights instead of 1.49x, each run as fast (memory-bound);
# a 113 MB encoder's: 0.01 s instead of 0.11, each run 15 % slower, so that below this a judging session's few runs
# gain nothing from it.
UNPACKED_FROM_BYTES = 64 << 20


# ONNX Runtime's log of autoprec's sessions: errors (the API's default); fatal ones alone on the command
# line without --verbose (:func:`errors_said_once`).
_session_log_level = 3


def errors_said_once() -> None:
    """Sessions made from now on in this process leave their errors to autoprec: each comes back as
    the exception autoprec says in one line (a red engine line before it said it twice)."""
    global _session_log_level
    _session_log_level = 4


def quiet_session_options():
    """ONNX Runtime session options whose threads stop spinning when a run returns
    (``session.force_spinning_stop``; within a run they spin as a plain session's do). By default a
    session's threads spin about 40 ms after each run: the session timed next (the re-timing's and
    the final timing's interleaved turns), or a worker's timing right after a run in the main
    process, shared the cores with them: on 2 cores an INT8 plan's speed-up over all-FP32 in 0.1 s
    turns read x2.5-4.0 apart from round to round with them spinning, x1.4-2.0 stopped; a run now
    wakes them, 2 % of a 4 ms model's run, on both sides of every speed-up
    (benchmarks/results/spinning_stop_retime_turns.json). ONNX Runtime's optimizer notes are not
    autoprec's to print: errors only, or none (:func:`errors_said_once`)."""
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = _session_log_level
    return options


def never_timed(options, weight_bytes: int):
    """``options`` for a session whose runs are judged, never timed: without prepacking where the
    model's weights reach UNPACKED_FROM_BYTES (what a timed session keeps: a deployment's does)."""
    if weight_bytes >= UNPACKED_FROM_BYTES:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def cpu_session(model: StoredModel, quick: bool = False, packed: bool = False):
    """An ONNX Runtime CPU session for autoprec's own runs of a model (shapes, calibration,
    reference, the checks of a lowered plan), loaded from a file beside its weights (never timed:
    see :func:`never_timed`). ``quick``: basic graph optimisations only, for a single check run,
    where building the session costs more than running it. ``packed``: prepacked whatever its size,
    as a timed session is, so that one of the same graph gives its outputs bit for bit (an FP32
    MatMul's sums differ in their last bits unpacked): the reference every trial is judged against,
    which the all-FP32 plan meets at a loss of exactly 0."""
    options = quiet_session_options() if packed else never_timed(quiet_session_options(), model.weight_bytes())
    if quick:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with model.file() as path:  # (basic optimisations never run the layout transformer: no probe)
        left_off = cpu_optimizers_left_off(model.proto, None if quick else path)
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                            disabled_optimizers=left_off)


def cpu_runs(model: StoredModel) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """``model`` run by ONNX Runtime on the CPU as a function: feeds (those it does not take left
    out) to every output by name."""
    session = cpu_session(model)
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return lambda feeds: dict(zip(names,
                                  session.run(names,
                                              {k: v for k, v in feeds.items() if k in wanted})))


# The nodes ONNX Runtime's NCHWc transformer converts from the plain layout (nchwc_transformer.cc):
# every other node it touches reads one of theirs. (A decoder or a MatMul chain has none: its FP16
# plans need no probe, which built each of a 300-unit chain's FP16 plans twice.)
NCHWC_STARTS = {"Conv", "FusedConv", "MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"}


def cpu_optimizers_left_off(model: onnx.ModelProto, path: Path | None = None,
                            crashes: Callable[[Path], bool] | None = None) -> list[str]:
    """The ONNX Runtime CPU optimizers to leave off for this graph (1.32), each only where it would
    change what autoprec measures, so that every other session is the plain ``InferenceSession`` a
    user builds:

    - ``QDQSelectorActionTransformer`` on signed INT8 activations (the TensorRT Q/DQ form, judged on
      the CPU as the reference for what TensorRT computes): it turns DQ→MatMul into ONNX Runtime's
      integer kernels, which on an x86 CPU without VNNI saturate int8 products (the s8 activations
      shifted to u8), 0.09 off in a classifier's probabilities where the Q/DQ arithmetic is exact;
      left off, the Q/DQ runs as float ops, exactly. (The ort-cpu form, what best/ ships for
      ort-cpu, has unsigned activations: never left off there.)
    - ``NchwcTransformer`` only on a graph whose session build crashes the process with every
      optimizer on: its layout transformer ended the process (a segmentation fault) building a
      session of a ViT-S/16 export's all-FP16 model. Graphs holding FP16 (the only kind it was seen
      on) and a node it starts from (NCHWC_STARTS: it changes nothing else) loaded from ``path`` are
      built once in a child process first (``crashes``: :func:`build_crashes`); every other graph
      keeps it, as a user's session does (left off for every FP16 graph, a mixed plan of a detector
      timed at 0.94× all-FP32 ran 1.14–1.18× in a plain session).
"""
    graph = model.graph
    signed = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    signed_activations = any(n.op_type == "QuantizeLinear" and len(n.input) > 2
                             and n.input[2] in signed for n in graph.node)
    crashing = (path is not None and holds_fp16(model)
                and any(n.op_type in NCHWC_STARTS for n in subgraphs.all_nodes(model))
                and (crashes or build_crashes)(path))
    return ["NchwcTransformer"] * crashing + ["QDQSelectorActionTransformer"] * signed_activations


def given_session(path: Path, weight_bytes: int):
    """An ONNX Runtime CPU session of the given file as the user has it (from its path, its
    external data beside it): what a prepared or shipped model is checked against (never timed:
    see :func:`never_timed`)."""
    options = never_timed(quiet_session_options(), weight_bytes)
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def holds_fp16(model: onnx.ModelProto) -> bool:
    graph = model.graph
    return any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer) or any(
        n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)
        for n in graph.node)


class RunCheck:
    """Runs a model in ONNX Runtime on the check feeds and compares its outputs with the model as
    given: how preparation knows a step left the model intact."""

    def __init__(self, model: StoredModel, feeds: Mapping[str, np.ndarray], path: Path):
        self.feeds = dict(feeds)
        try:
            self.expected = self._run(model)
        except Exception as exc:  # ORT raises several types; the model is untrusted input
            said = " ".join(str(exc).split())
            loading = re.match(r".*?Load model from \S+ failed:\s*(.*)", said)
            if loading:  # (the file ONNX Runtime names is autoprec's staged copy, not the user's)
                raise ModelError(f"{path}: ONNX Runtime cannot load it ({loading.group(1)[:300]}); "
                                 "fix or re-export the model: it must load in onnxruntime as it "
                                 "is") from None
            raise ModelError(
                f"{path}: does not run in ONNX Runtime at input shapes "
                f"{', '.join(f'{k} {list(v.shape)}' for k, v in self.feeds.items())} "
                f"({said[:300]}); check --shape (and --const), or that the model runs in "
                "onnxruntime as it is"
            ) from None

    def _run(self, model: StoredModel) -> dict[str, np.ndarray]:
        session = cpu_session(model, quick=True)
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, self.feeds)))

    def __call__(self, model: StoredModel) -> str | None:
        """None when the model runs and gives the same outputs, else what went wrong."""
        try:
            got = self._run(model)
        except Exception as exc:
            return first_line(exc)
        for name, want in self.expected.items():
            have = got.get(name)
            if have is None or have.shape != want.shape:
                return f"output {name} is {None if have is None else list(have.shape)}, not {list(want.shape)}"
            if want.dtype.kind == "f" and want.size:
                scale = float(np.nanmax(np.abs(want))) if np.isfinite(want).any() else 0.0
                if not np.allclose(have, want, rtol=1e-3, atol=1e-4 * scale + 1e-6, equal_nan=True):
                    return f"output {name} changed (largest difference {float(np.nanmax(np.abs(have - want))):.3g})"
        return None


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX's strict shape inference; where it fails on a model that runs, the lenient one. (It
    reads the graph only: external weights need not be loaded.)"""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError:
        inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in inferred.graph.value_info}
    for out in inferred.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in known:
            out.type.CopyFrom(known[out.name].type)
    return inferred


def _inferred(model: StoredModel) -> StoredModel:
    return model.with_proto(infer(model.proto))


def _fix_input_shapes(model: StoredModel, shapes: Mapping[str, tuple[int, ...]]) -> StoredModel:
    surgery = Surgery(model)
    for tensor in surgery.graph.tensors().values():
        if isinstance(tensor, gs.Variable):
            tensor.shape = shapes[tensor.name] if tensor.name in shapes else None
    return _inferred(surgery.close())


def _sliced_shapes(graph: gs.Graph) -> None:
    """Each ``Shape(x, start, end)`` (opset 15) written as ``Slice(Shape(x))``, the same at any
    shape: graphsurgeon folds a Shape to the whole shape whatever its start and end (0.6.1), which
    the dynamo exporter's ``Shape(mask, start=1, end=2)`` turned into a sequence length of two
    values."""
    for g in (graph, *graph.subgraphs(recursive=True)):
        for node in [n for n in g.nodes if n.op == "Shape" and ("start" in n.attrs or "end" in n.attrs)]:
            start, end = node.attrs.pop("start", 0), node.attrs.pop("end", None)
            whole = gs.Variable(f"{node.outputs[0].name}_whole", np.int64)
            bounds = [gs.Constant(f"{node.outputs[0].name}_{name}", np.array([value], np.int64))
                      for name, value in (("start", start),
                                          ("end", np.iinfo(np.int64).max if end is None else end))]
            g.nodes.append(gs.Node("Slice", f"{node.name}_slice", inputs=[whole, *bounds],
                                   outputs=[node.outputs[0]]))
            node.outputs = [whole]
        g.toposort()


def _fold_constants(model: StoredModel, flatten_subgraphs: bool) -> StoredModel:
    node_count = None
    for _ in range(8):  # folding exposes shapes, shapes expose more folding
        surgery = Surgery(model)
        graph = surgery.graph
        # folded as models of their own: give them the model's IR
        for subgraph in graph.subgraphs(recursive=True):
            # version, not onnx's newest, which older ONNX Runtimes refuse
            subgraph.ir_version = graph.ir_version
        _sliced_shapes(graph)
        graph.fold_constants(error_ok=True, flatten_subgraphs=flatten_subgraphs).cleanup().toposort()
        model = _inferred(surgery.close())
        if len(model.proto.graph.node) == node_count:
            break
        node_count = len(model.proto.graph.node)
    return model


def fold_batchnorms(model: StoredModel) -> tuple[StoredModel, str | None]:
    """A preparation step: BatchNormalization, and per-channel scale Muls and bias Adds after a
    Conv, folded into the Conv's weights and bias (one unit, as engines fuse them); with what it
    did, None where nothing."""
    surgery = Surgery(model)
    folded = fold_batchnorm(surgery.graph)
    scales, biases = fold_channel_steps(surgery.graph)
    if not folded and not scales and not biases:
        return model, None
    surgery.graph.cleanup().toposort()
    said = [f"{folded} BatchNormalization node(s)" if folded else "",
            f"{scales} scale Mul(s)" if scales else "",
            f"{biases} bias Add(s)" if biases else ""]
    return _inferred(surgery.close()), f"folded {' and '.join(filter(None, said))} into the Conv before them"


def _one_way(model: StoredModel) -> tuple[StoredModel, str | None]:
    """The exporter's artifacts written one way (see autoprec.analysis.artifacts)."""
    surgery = Surgery(model)
    dropped, pools = drop_idle_casts(surgery.graph), pools_from_means(surgery.graph)
    if not dropped and not pools:
        return model, None
    said = [f"took out {dropped} Cast(s) that change no value (to the type a tensor has)" if dropped else "",
            f"wrote {pools} ReduceMean(s) over every spatial axis as the GlobalAveragePool they "
            f"are" if pools else ""]
    return _inferred(surgery.close()), "; ".join(filter(None, said))


def _fill_shapes_by_running(model: StoredModel, feeds: Mapping[str, np.ndarray]) -> StoredModel:
    """Shapes static inference could not find are read off one ORT run."""
    graph = model.proto.graph
    known = {v.name for v in graph.value_info} | {i.name for i in graph.input}
    known |= {o.name for o in graph.output if o.type.tensor_type.HasField("shape")}
    missing = [t for n in graph.node for t in n.output if t and t not in known]
    if not missing:
        return model
    exposed, _ = subgraphs.with_outputs(model.proto, missing)
    values = cpu_session(model.with_proto(exposed)).run(missing, dict(feeds))
    filled = onnx.ModelProto()
    # a step returns a new model: the one before it stays, should this one be left out
    filled.CopyFrom(model.proto)
    by_name = {o.name: o for o in filled.graph.output}
    for name, value in zip(missing, values):
        info = onnx.helper.make_tensor_value_info(name,
                                                  onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
                                                  value.shape)
        if name in by_name:
            by_name[name].type.CopyFrom(info.type)
        else:
            filled.graph.value_info.append(info)
    return model.with_proto(filled)


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique name within its graph: units are identified by node name in
    plans."""
    for _, graph in subgraphs.graphs(model.graph):
        seen: set[str] = set()
        for i, node in enumerate(graph.node):
            if not node.name or node.name in seen:
                node.name = f"{node.op_type}_{i}" if f"{node.op_type}_{i}" not in seen else f"{node.op_type}_{i}_n"
            seen.add(node.name)


Step = Callable[[StoredModel], tuple[StoredModel, "str | None"]]


@dataclass(frozen=True)
class Preparation:
    """The prepared model (shapes fixed) and its deployable twin (the source's dims kept), sharing
    weights."""

    model: StoredModel
    deployable: onnx.ModelProto
    notes: list[str]
    source: onnx.ModelProto | None = (
        None  # the given graph as it is, its inputs at the shapes: what it is timed against
    )
    kept: bool = False  # read from the cache, not prepared by this run (checked against the given model)


def prepare_graph(
    model: StoredModel, shapes: Mapping[str, tuple[int, ...]], path: Path,
    feeds: Mapping[str, np.ndarray]
) -> Preparation:
    """Opset >= 13, constants and BatchNorm folded, then static shapes: the FP32 model every
    candidate starts from, and before its shapes were fixed, the deployable one.

    The model as given must run in ONNX Runtime on ``feeds``; each stage is checked to run and give
    the same outputs. Where it does not, its steps are taken again one at a time, each checked, and
    a step that breaks the model is left out with a note naming it.
    """
    runs = RunCheck(model, feeds, path)
    check = lambda m: runs(m) or _invalid(m)  # noqa: E731 - ONNX Runtime runs some graphs onnx.checker refuses
    notes = []
    opset = next((o.version for o in model.proto.opset_import if o.domain in ("", "ai.onnx")),
                 MIN_OPSET)
    if opset < MIN_OPSET:
        try:
            model = model.with_proto(version_converter.convert_version(model.proto, MIN_OPSET))
            broken = check(model)
        except Exception as exc:
            broken = first_line(exc)
        if broken:
            raise ModelError(
                f"{path}: opset {opset} cannot be converted to {MIN_OPSET}, which per-channel Q/DQ "
                f"needs ({broken}); re-export the model with opset >= {MIN_OPSET}"
            )
        notes.append(f"converted opset {opset} -> {MIN_OPSET} (per-channel Q/DQ needs {MIN_OPSET})")
    # what ONNX Runtime loads
    model.proto.ir_version = min(max(model.proto.ir_version, 7), MAX_IR_VERSION)
    any_shape: list[tuple[str, Step]] = [
        ("constant folding", lambda m: (_fold_constants(m, flatten_subgraphs=True), None)),
        ("constant folding (If nodes kept)",
         lambda m: (_fold_constants(m, flatten_subgraphs=False), None)),
        ("export artifacts", _one_way),
        ("BatchNorm and bias folding", fold_batchnorms),
    ]
    deployable, step_notes, taken = _checked_steps(model, any_shape, check)
    notes += step_notes + _distinct_dim_names(deployable.proto, shapes)
    _name_nodes(deployable.proto)
    at_shapes: list[tuple[str, Step]] = [("shape filling",
                                          lambda m: (_fill_shapes_by_running(m, feeds), None))]
    # what fixed shapes let fold (Shape, Reshape targets), on a copy
    if _dynamic(deployable.proto, shapes):
        # flattening the If nodes, where it broke the model at any shape, is not tried again at these
        flattening = [] if "constant folding (If nodes kept)" in taken else [
            ("constant folding at these shapes", lambda m: (_fold_constants(m, flatten_subgraphs=True), None))]
        at_shapes[:0] = [
            ("input shape fixing", lambda m: (_fix_input_shapes(m, shapes), None)),
            *flattening,
            (
                "constant folding at these shapes (If nodes kept)",
                lambda m: (_fold_constants(m, flatten_subgraphs=False), None),
            ),
        ]
    dynamic = _dynamic(deployable.proto, shapes)
    prepared, step_notes, _ = _checked_steps(deployable, at_shapes, check)
    notes += step_notes
    proto = prepared.proto
    _name_nodes(proto)
    with prepared.file() as written:
        # from its file: never the whole model in one protobuf
        onnx.checker.check_model(str(written))
    return Preparation(prepared, _typed_like(deployable.proto, proto) if dynamic else proto, notes)


def _invalid(model: StoredModel) -> str | None:
    """What onnx.checker finds wrong with the model (read from its file), or None."""
    try:
        with model.file() as written:
            onnx.checker.check_model(str(written))
    except Exception as exc:  # noqa: BLE001 - ValidationError and friends
        return f"onnx.checker: {first_line(exc)}"
    return None


def _checked_steps(model: StoredModel, steps: list[tuple[str, Step]],
                   check: Callable[[StoredModel], str | None]) -> tuple[StoredModel, list[str], list[str]]:
    """The steps at once; where the result fails ``check``, again one at a time, each checked (a step
    on the model the first pass gave it is not made again: silero-vad's folding, 0.4 s). The model,
    its notes and the names of the steps taken."""
    made: dict[tuple[str, int], tuple[StoredModel, str | None]] = {}
    found = _take_steps(model, steps, None, made)
    if check(found[0]) is not None:
        found = _take_steps(model, steps, check, made)
    return found


def _at_shapes(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``model``'s graph, nothing changed but its inputs' dims, set to ``shapes`` (an
    engine builds for the shapes it is timed at) and an IR version ONNX Runtime reads."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    fixed.ir_version = min(max(fixed.ir_version, 7), MAX_IR_VERSION)
    for value in fixed.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[value.name]:
                dims.add().dim_value = size
    return fixed


def _distinct_dim_names(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Input dims that share a name but were given different sizes, or that one input has on several
    axes (Paddle's '?' for both height and width), renamed apart, ``<input>_dim<axis>``: TensorRT
    takes one name for one size, and the deployable model keeps its dims dynamic. Returns the notes
    that say so."""
    named: dict[str, list[tuple[onnx.TensorShapeProto.Dimension, str, int]]] = {}
    for value in model.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and value.name in shapes:
                named.setdefault(dim.dim_param, []).append((dim, value.name, axis))
    notes = []
    for name, dims in named.items():
        # H and W both '?': sizes that may differ
        one_input_twice = len({value for _, value, _ in dims}) < len(dims)
        if one_input_twice or len({shapes[value][axis] for _, value, axis in dims}) > 1:
            for dim, value, axis in dims:
                dim.dim_param = f"{value}_dim{axis}"
            notes.append(
                f"input dims named '{name}' on several axes of one input or at different sizes: "
                f"named {', '.join(d.dim_param for d, _, _ in dims)} in the shipped model "
                "(TensorRT takes one name for one size)"
            )
    return notes


def _dynamic(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether any input is declared otherwise than at ``shapes`` (a dynamic dim)."""
    declared = {v.name: tuple(d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim)
                for v in model.graph.input}
    return any(declared.get(name) != tuple(dims) for name, dims in shapes.items())


def _typed_like(deployable: onnx.ModelProto, prepared: onnx.ModelProto) -> onnx.ModelProto:
    """The deployable graph told every element type the prepared one knows (where inference at
    dynamic dims found none), without shapes: lowering converts float32 tensors only, so both must
    know the same."""
    known = {v.name for v in [*deployable.graph.value_info, *deployable.graph.input,
                              *deployable.graph.output]
             if v.type.tensor_type.elem_type}
    produced = {t for n in deployable.graph.node for t in n.output}
    for value in prepared.graph.value_info:
        if value.name in produced and value.name not in known and value.type.tensor_type.elem_type:
            deployable.graph.value_info.append(
                onnx.helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type,
                                                   None)
            )
    return deployable


def _take_steps(model: StoredModel, steps: list[tuple[str, Step]],
                check: Callable[[StoredModel], str | None] | None,
                made: dict[tuple[str, int], tuple[StoredModel, str | None]]) -> tuple[StoredModel, list[str], list[str]]:
    """Each step in turn; with a ``check``, one whose result fails it is left out with a note.
    A step named "X (...)" is the fallback of step "X": taken only where "X" was left out. ``made``:
    each step's result by the step and the model it was given (kept alive there, so no other model
    takes its ``id``)."""
    notes, taken, names = [], set(), []
    for name, step in steps:
        base = name.split(" (")[0]
        if base != name and base in taken:
            continue
        try:
            if (name, id(model)) not in made:
                made[name, id(model)] = step(model)
            candidate, note = made[name, id(model)]
            # as it will be saved
            candidate.proto.ir_version = min(max(candidate.proto.ir_version, 7), MAX_IR_VERSION)
            broken = check(candidate) if check is not None else None
        except Exception as exc:  # a library failing on the model: the step is left out
            broken = first_line(exc)
        if broken:
            notes.append(f"preparation step '{name}' left out: it breaks this model ({broken})")
            continue
        model = candidate
        taken.add(base)
        names.append(name)
        if base != name:
            notes.append(f"took '{name}' instead")
        if note:
            notes.append(note)
    return model, notes, names


def _gathered(models: list[StoredModel]) -> None:
    """The tensors the steps wrote (one data file per step) moved into one ``prepared.data``, the
    step files removed: the folder keeps the given weights and what the prepared models use, each
    once."""
    folder = models[0].folder
    writer = DataWriter(folder, "prepared.data")
    # a step's tensor, shared by both models: copied once
    moved: dict[tuple[str, int], onnx.TensorProto] = {}
    try:
        for model in models:
            for tensor in tensors(model.proto.graph):
                if not (is_external(tensor) and external_info(tensor)[0].startswith("step-")):
                    continue
                where = external_info(tensor)[:2]
                if where not in moved:
                    writer.copy(tensor, folder)
                    moved[where] = tensor
                else:
                    del tensor.external_data[:]
                    tensor.external_data.extend(moved[where].external_data)
    finally:
        writer.close()
    for leftover in folder.glob("step-*.data"):
        leftover.unlink()


def _key(sha256: str, shapes: Mapping[str, tuple[int, ...]], feeds: Mapping[str, np.ndarray]) -> str:
    """What a preparation depends on: the model's content, its input shapes and check feeds, and the
    code."""
    parts = [sha256, sorted((k, list(v)) for k, v in shapes.items()),
             sorted((k, v.dtype.str, list(v.shape), hashlib.sha256(v.tobytes()).hexdigest()) for k, v in feeds.items()),
             PREPARATION_VERSION, onnx.__version__, onnxruntime.__version__, gs.__version__]
    return atomic.digest(parts, default=str)


def _read(folder: Path) -> Preparation | None:
    try:
        notes = untrusted.parse_json((folder / NOTES_FILE).read_bytes())["notes"]
        proto = onnx.load(str(folder / PREPARED_FILE), load_external_data=False)
        deployable = (onnx.load(str(folder / DEPLOYABLE_FILE), load_external_data=False)
                      if (folder / DEPLOYABLE_FILE).is_file() else proto)
        source = onnx.load(str(folder / SOURCE_FILE), load_external_data=False)
    except Exception:  # noqa: BLE001 - missing, partial or damaged: prepared again
        return None
    return Preparation(StoredModel(proto, folder), deployable, list(notes), source, kept=True)


def prepared_model(path: Path, raw: onnx.ModelProto, sha256: str,
                   shapes: Mapping[str, tuple[int, ...]],
                   feeds: Mapping[str, np.ndarray], cache: Path | None = None) -> Preparation:
    """``path`` (read as ``raw``, its external weights not loaded; its inline ones are moved out of
    it, to the folder) prepared at ``shapes`` (see :func:`prepare_graph`). Under ``cache`` it is
    kept, and read again by the next caller with the same model and shapes; without one it lives in
    a temporary folder until the process ends."""
    if cache is None:
        folder = Path(tempfile.mkdtemp(prefix="autoprec-model-"))
        atexit.register(shutil.rmtree, folder, True)
        return _prepare_in(folder, path, raw, shapes, feeds)
    key = _key(sha256, shapes, feeds)
    folder = Path(cache) / f"prepared-{key}"
    found = _read(folder)
    if found is not None:
        return found
    for stale in Path(cache).glob(f".prepared-{key}.*.staging"):  # a killed preparation's
        if not pid_alive(int(stale.name.split(".")[2])):
            shutil.rmtree(stale, ignore_errors=True)
    # (not *.tmp: those are files, removed when stale)
    staging = Path(cache) / f".prepared-{key}.{os.getpid()}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        made = _prepare_in(staging, path, raw, shapes, feeds)
        shutil.rmtree(folder, ignore_errors=True)  # an unreadable earlier one
        os.rename(staging, folder)
    except OSError:
        found = _read(folder)  # another worker finished the same preparation first
        shutil.rmtree(staging, ignore_errors=True)
        if found is None:
            raise
        return found
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return replace(made, model=StoredModel(made.model.proto, folder))


def _prepare_in(folder: Path, path: Path, raw: onnx.ModelProto,
                shapes: Mapping[str, tuple[int, ...]],
                feeds: Mapping[str, np.ndarray]) -> Preparation:
    copied = copy_external_data(raw, path.parent, folder)
    externalize(raw, folder, "source.data")  # in place: no second copy of inline weights in memory
    source = _at_shapes(raw, shapes)
    made = replace(prepare_graph(StoredModel(raw, folder), shapes, path, feeds), source=source)
    _gathered([made.model, made.model.with_proto(made.deployable)])
    if copied:
        made.notes.insert(0, f"its external data ({copied / 2**30:.2f} GiB): one copy in "
                             f"{folder.parent}, made by the first run at these shapes and read by "
                             "every later one")
    if made.deployable is not made.model.proto:
        (folder / DEPLOYABLE_FILE).write_bytes(made.deployable.SerializeToString())
    (folder / SOURCE_FILE).write_bytes(source.SerializeToString())
    (folder / PREPARED_FILE).write_bytes(made.model.proto.SerializeToString())
    atomic.write_json(folder / NOTES_FILE, {"notes": made.notes, "model": str(path)})
    return made

"""Load and check an ONNX model, hash it, and analyse it: prepared, its shapes fixed, its units
found."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Collection, Mapping, Sequence

import numpy as np
import onnx

from autoprec.analysis import subgraphs
from autoprec.analysis.footprint import check_fits
from autoprec.analysis.model_info import ModelInfo, Unit
from autoprec.analysis.patterns import tie_repeats
from autoprec.analysis.preparation import prepared_model
from autoprec.analysis.shapes import (
    check_feeds,
    declared_inputs,
    dtype_name,
    output_specs,
    resolve_input_shapes,
)
from autoprec.analysis.units import find_units
from autoprec.core.errors import ModelError, first_line
from autoprec.core.escape import printable
from autoprec.core.profile import shape_profile
from autoprec.core.search_space import SearchSpace
from autoprec.core.stored import check_external_data, is_external, tensors

KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}
# Integer compute ops of a model quantized already (by ONNX Runtime's quantizer, say).
QUANTIZED_OPS = {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul",
                 "DynamicQuantizeLinear", "MatMulNBits"}


def file_sha256(path: Path) -> str:
    stat = os.stat(path)
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, modified_ns: int) -> str:
    """Hashed once per process while the file's size and modification time stay (a 2 GB data file
    takes seconds)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_sha256(path: Path) -> str:
    """What a model *is*: the sha256 of its ONNX file or, when its weights live in external data
    files, of the file and every data file it references (a changed weight file is a changed
    model)."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    path = Path(path)
    own = file_sha256(path)
    skeleton = onnx.load(str(path), load_external_data=False)
    try:  # where its data lives, first: a location such as /dev/zero is never read
        check_external_data(skeleton, path.parent, str(path))
    except ValueError as exc:
        raise ModelError(str(exc)) from None
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
        str(path.resolve()).encode("utf-8")
    except UnicodeEncodeError:  # bytes of another encoding, which Python keeps as lone surrogates
        if sys.getfilesystemencoding().lower() not in ("utf-8", "utf8"):  # a C/POSIX locale reads UTF-8 so too
            raise ModelError(f"{printable(path)}: this Python reads file names as "
                             f"{sys.getfilesystemencoding()} (the locale is C or POSIX), and the "
                             "path has other characters; run with a UTF-8 locale (LANG=C.UTF-8) "
                             "or PYTHONUTF8=1") from None
        raise ModelError(f"{printable(path)}: its path is not UTF-8, which ONNX's checker and ONNX "
                         "Runtime need; rename the file (or its folder) with UTF-8 characters"
                         ) from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several types for a damaged file
        raise ModelError(
            f"{path}: not a readable ONNX file ({type(exc).__name__}: {exc}); re-export or "
            "re-download it"
        ) from None
    if not model.graph.node:
        raise ModelError(f"{path}: the ONNX graph is empty (truncated or not a model); re-export "
                         f"it")
    try:
        check_external_data(model, path.parent, str(path))
    except ValueError as exc:  # says which tensor and file, and the fix
        raise ModelError(str(exc)) from None
    except OSError as exc:
        raise ModelError(f"{path}: its external weight data cannot be read ({exc}); check the data "
                         "files' permissions beside the model") from None
    if model.functions:  # its own functions (ONNX Runtime runs them): their nodes are searched too
        model = _inlined(model, path)
    unknown = sorted({n.domain for n in model.graph.node} - KNOWN_DOMAINS)
    if unknown:
        nodes = [n.name or n.op_type for n in model.graph.node if n.domain in unknown][:3]
        raise ModelError(
            f"{path}: uses op domain(s) {', '.join(unknown)} (e.g. node {', '.join(nodes)}) that "
            "no supported engine implements; export the model with standard ONNX ops"
        )
    try:
        # from the file: never the whole model in one protobuf (2 GB at most)
        onnx.checker.check_model(str(path))
    # ValidationError, and e.g. UnicodeDecodeError for a damaged string field
    except Exception as exc:
        raise ModelError(f"{path}: fails onnx.checker ({first_line(exc)}); fix or re-export the "
                         "model") from None
    initializers = {i.name for i in model.graph.initializer}
    for value in [*(v for v in model.graph.input if v.name not in initializers),
                  *model.graph.output]:
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            role = "output" if value in model.graph.output else "input"
            raise ModelError(
                f"{path}: {role} {value.name} is a "
                f"{(kind or 'untyped value').removesuffix('_type')}, not a tensor; autoprec feeds "
                "and compares tensors only: "
                + _tensor_fix(model, value.name, role)
            )
    return model


def _tensor_fix(model: onnx.ModelProto, name: str, role: str) -> str:
    """How to get a tensor where ``name`` is not one: a ZipMap (the probabilities as a list of
    dicts, which skl2onnx puts after every classifier by default) is left out at conversion."""
    if any(n.op_type == "ZipMap" and name in n.output for n in model.graph.node):
        return ("it is the ZipMap skl2onnx adds after a classifier; convert without it "
                "(skl2onnx: to_onnx(model, X, options={'zipmap': False}), or "
                "convert_sklearn(..., options={id(model): {'zipmap': False}})) for a tensor of "
                "probabilities")
    return f"export the model with tensor {role}s"


def _inlined(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """``model`` with its local functions inlined (their external weights stay references)."""
    import onnx.inliner

    try:
        return onnx.inliner.inline_local_functions(model)
    except Exception as exc:  # noqa: BLE001 - onnx's C++ inliner raises its own types
        raise ModelError(f"{path}: its local functions cannot be inlined ({first_line(exc)}); "
                         "export the model with them inlined") from None


def _compute_types(model: onnx.ModelProto, nodes: Collection[str]) -> list[str]:
    """The element types of the first inputs of ``nodes`` (top-graph node names), as NumPy names."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input,
                                                            *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    found = {types.get(n.input[0]) for n in graph.node if n.name in nodes and n.input}
    return sorted(dtype_name(t) for t in found if t) or ["a float type other than float32"]


# Ops whose output is drawn at random on every run: a model with one has no exact FP32 reference.
RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Multinomial", "Bernoulli")


def refuse_random_ops(model, path: Path) -> None:
    """A graph drawing random values (any subgraph) has no FP32 reference to judge plans against,
    and preparation would fold a seeded draw into a constant: refused before either, naming the
    op."""
    used = {name for _, graph in subgraphs.graphs(model.graph) for node in graph.node for name in node.input} | {
        o.name for o in model.graph.output}
    found = [f"{node.op_type} {node.name!r}" for _, graph in subgraphs.graphs(model.graph) for node in graph.node
             if node.op_type in RANDOM_OPS and any(out in used for out in node.output)]
    if found:
        raise ModelError(f"{path.name}: it draws random values ({', '.join(found[:3])}): its FP32 "
                         "outputs change from run to run, so a plan's loss against FP32 would be "
                         "that noise. Give a deterministic model (random ops removed, or exported "
                         "for inference)")


QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def refuse_quantized(model: onnx.ModelProto, path: Path) -> None:
    """A model in Q/DQ form (ONNX Runtime's quantize_static, a QAT export) is quantized already: its
    layers would be taken for FP32 ones and quantized again, and its INT8 for the FP32 reference.
    Refused, naming its Q/DQ ops."""
    nodes = (node for _, graph in subgraphs.graphs(model.graph) for node in graph.node)
    found = sorted({n.op_type for n in nodes if n.op_type in QDQ_OPS})
    if found:
        raise ModelError(f"{path.name}: already quantized ({', '.join(found)}); autoprec starts "
                         "from the FP32 model and chooses each layer's precision itself: give it "
                         "the FP32 model this was quantized from")


def _refuse_unsearchable(path: Path, space: SearchSpace, prepared: onnx.ModelProto,
                         units: Sequence[Unit],
                         other_floats: Sequence[str]) -> None:
    """One line where no unit can be searched: quantized already, layers in another float type, or
    none the search space lists (or only pinned ones)."""
    quantized = sorted({n.op_type for n in prepared.graph.node} & QUANTIZED_OPS)
    if not units and quantized:
        raise ModelError(
            f"{path}: already quantized ({', '.join(quantized)}), with no FP32 compute layer left "
            "to choose a precision for; give autoprec the FP32 model it was quantized from"
        )
    if any(u.searchable for u in units):
        return
    if other_floats:
        kinds = _compute_types(prepared, {u.nodes[0] for u in units if u.name in other_floats})
        raise ModelError(
            f"{path}: no searchable layers: its layers compute in {' and '.join(kinds)}, not "
            "float32, and autoprec lowers float32 layers only; give it the float32 model"
            + (" (a float16 model is already reduced: its FP32 original is what the search starts "
               "from)"
               if "float16" in kinds else "")
        )
    if units and space.overrides and all(len(u.allowed) == 1 for u in units):
        given = ", ".join(f"{pattern}={'/'.join(p.value for p in precisions)}"
                          for pattern, precisions in space.overrides)
        raise ModelError(f"{path}: no searchable layers: the overrides ({given}) leave each unit "
                         "one precision (or none it can take); narrow the --override patterns")
    single = sorted({u.op_type for u in units if len(space.units.get(u.op_type, ())) == 1})
    if single:
        raise ModelError(
            f"{path}: no searchable layers: the search space ({space.source}) gives its "
            f"{', '.join(single)} units one precision each, which leaves nothing to choose; list two "
            "or more for them, e.g. Conv: [int8, fp16, fp32]")
    raise ModelError(
        f"{path}: no searchable layers: the search space ({space.source}) lists "
        f"{', '.join(sorted(space.units))}, and the model has "
        + ("none of them" if not units else "only pinned ones")
        + "; add its compute op types under 'units:' in a --search-space file"
    )


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
    dims: Mapping[str, tuple[int, int | None, int]] | None = None,
) -> ModelInfo:
    """Load (unless given: :func:`load_onnx`'s graph), prepare and analyse a model: the first step
    of every search. ``constants`` are the values of inputs fed one fixed value (``--const``);
    ``cache``: where the prepared model is kept for the next search of it (else a temporary folder,
    for this process); ``min_shapes`` / ``max_shapes``: the bounds of the shapes it is deployed
    across (opt: the fixed shapes); ``dims``: a named dim's bounds at every input declaring it
    (``--dim``)."""
    path = Path(path)
    raw = model if model is not None else load_onnx(path)
    refuse_random_ops(raw, path)
    refuse_quantized(raw, path)
    declared = declared_inputs(raw)
    fixed, notes = resolve_input_shapes(declared, shapes or {}, data_shapes)
    overridable = sorted({i.name for i in raw.graph.initializer} & {v.name for v in raw.graph.input})
    if overridable:
        notes.append(f"{len(overridable)} weight(s) are graph inputs too "
                     f"({', '.join(overridable[:4])}{', ...' if len(overridable) > 4 else ''}: an "
                     "IR 3 export, or weights a caller may replace): searched as the constants "
                     "they hold; best/ and the exports take "
                     f"{', '.join(s.name for s in declared) or 'no other input'} only")
    inputs = tuple(replace(s, shape=fixed[s.name]) for s in declared)
    profile = shape_profile([(s.name, s.shape) for s in declared], fixed, min_shapes, max_shapes)
    if dims:
        profile = profile.with_dims(dims)
    # before preparation runs it
    check_fits(profile, {s.name: np.dtype(s.dtype).itemsize for s in inputs}, raw)
    sha256 = model_sha256(path)
    external_data = any(is_external(t) for t in tensors(raw.graph))
    made = prepared_model(path, raw, sha256, fixed, check_feeds(inputs, constants), cache)
    stored, prep_notes, prepared = made.model, made.notes, made.model.proto
    try:
        units = tie_repeats(prepared, find_units(prepared, space))
    except Exception as exc:  # the model runs (prepare_graph checked): a failure here is autoprec's
        raise ModelError(
            f"{path}: runs in ONNX Runtime, but autoprec cannot find its layers "
            f"({type(exc).__name__}: {first_line(exc)}); please report it with the model"
        ) from None
    other_floats = [u.name for u in units if not u.searchable and len(space.allowed(u.name, u.op_type)) > 1]
    if other_floats:
        notes.append(
            f"{len(other_floats)} unit(s) compute in a float type other than float32 (e.g. "
            f"{other_floats[0]}): kept FP32, since lowering converts float32 tensors only"
        )
    _refuse_unsearchable(path, space, prepared, units, other_floats)
    return ModelInfo(
        path=path,
        sha256=sha256,
        model=prepared,
        folder=stored.folder,
        inputs=inputs,
        outputs=output_specs(prepared),
        units=units,
        notes=tuple(notes + prep_notes),
        metadata={p.key: p.value for p in raw.metadata_props},
        external_data=external_data,
        deployable=made.deployable if made.deployable is not prepared else None,
        profile=profile,
        source=made.source,
        prepared_kept=made.kept,
    )

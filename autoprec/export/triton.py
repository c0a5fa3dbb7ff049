"""A Triton Inference Server model-repository entry for a result's chosen (or any) plan.

Writes ``NAME/config.pbtxt`` and ``NAME/1/model.onnx`` (platform ``onnxruntime_onnx``). Dims are the
model's: ``-1`` where it keeps the source's dynamic ones. Where every input and output has a dynamic
first dim (a batch) and the shape profile's batch goes beyond one, Triton batches:
``max_batch_size`` is the profile's largest batch, the dims leave it out, and ``dynamic_batching``
gathers requests; otherwise ``max_batch_size: 0``, the full dims. A decoder with a KV cache is never
batched by Triton (its requests carry pasts of their own lengths): the config says so, and how to
keep the cache on the server. For TensorRT, the same entry would use ``platform: "tensorrt_plan"``
and ``1/model.plan``, an engine built from the trtexec export's model.onnx (see the config's
comment) — not generated here, because no TensorRT can run here.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from autoprec.analysis.decoder import find_decoder
from autoprec.analysis.shapes import declared_inputs, output_specs
from autoprec.backends.onnxruntime import replanned_at_new_shapes
from autoprec.core import atomic
from autoprec.core.escape import path_component, pbtxt_string, shell_comment
from autoprec.core.profile import ShapeProfile
from autoprec.core.stored import StoredModel, save_models

_TRITON_TYPES = {
    onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.INT8: "TYPE_INT8", onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.INT16: "TYPE_INT16",
    onnx.TensorProto.INT32: "TYPE_INT32", onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
}


def _dims(value: onnx.ValueInfoProto) -> list[int]:
    return [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in value.type.tensor_type.shape.dim
    ]


def _tensor_block(value: onnx.ValueInfoProto, batched: bool) -> str:
    dims = _dims(value)[1 if batched else 0:]
    return (
        f"  {{\n    name: {pbtxt_string(value.name)}\n"
        f"    data_type: {_TRITON_TYPES.get(value.type.tensor_type.elem_type, 'TYPE_FP32')}\n"
        f"    dims: [ {', '.join(map(str, dims))} ]\n  }}"
    )


def max_batch(model: onnx.ModelProto, profile: ShapeProfile) -> int:
    """Triton's ``max_batch_size``: the profile's largest batch where every input and output of
    ``model`` has a dynamic first dim, the profile one batch range, and a batch of more than one; 0
    (no batching by Triton, every dim as the model has it) otherwise."""
    initializers = {i.name for i in model.graph.initializer}
    values = [*(v for v in model.graph.input if v.name not in initializers), *model.graph.output]
    batch = profile.batch_range()
    if batch is None or batch[1] < 2 or not values or not all(_dims(v)[:1] == [-1] for v in values):
        return 0
    return batch[1]


STATEFUL = ("# a decoder with a KV cache: each request carries its own past ({past} ...) and gets "
            "its present back,",
            "# of its own length: Triton cannot batch such requests (no dynamic_batching, "
            "max_batch_size 0); to keep",
            "# the cache on the server, use sequence_batching with implicit state (Triton's "
            "stateful models)")


# What replanned_at_new_shapes costs a Triton server that batches (measured: docs/engines.md).
REPLANNED = ("# on a GPU (ONNX Runtime's CUDA provider) each convolution is planned again at every change of batch",
             "# size (0.9-1.0 s a change between batch 1 and 32 on yolov8n on an H200, with cuDNN's exhaustive search,",
             "# the default); the dynamic batcher forms batches of varying size: batches of one size do not pay it")


def config_pbtxt(model: onnx.ModelProto, name: str, note: str, profile: ShapeProfile, trial: int) -> str:
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    decoder = find_decoder(declared_inputs(model), output_specs(model))
    batch = 0 if decoder is not None else max_batch(model, profile)
    stateful = [line.format(past=decoder.cache[0].past) for line in STATEFUL] if decoder is not None else []
    replanned = REPLANNED if batch and replanned_at_new_shapes(model) else ()
    return "\n".join([
        # protobuf text format comments are '#' to the end of the line, like the shell's
        shell_comment(note),
        *(shell_comment(line.removeprefix("# ")) for line in (*stateful, *replanned)),
        "# TensorRT alternative: platform: \"tensorrt_plan\" with 1/model.plan built (strongly "
        "typed) from the",
        f"# model.onnx that autoprec export RESULT --format trtexec --trial {trial} writes "
        "(TensorRT's Q/DQ form),",
        "# with its build.sh (--saveEngine=model.plan and the --minShapes/--optShapes/--maxShapes)",
        f"name: {pbtxt_string(name)}",
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {batch}",
        "input [", ",\n".join(_tensor_block(v, batch > 0) for v in inputs), "]",
        "output [", ",\n".join(_tensor_block(v, batch > 0) for v in model.graph.output), "]",
        *(["dynamic_batching { }"] if batch else []),
        "instance_group [ { kind: KIND_AUTO } ]",
        "",
    ])


def write_triton_entry(model: StoredModel, repository: Path, name: str, note: str,
                       profile: ShapeProfile,
                       trial: int, external: bool | None = None) -> list[Path]:
    """``repository/name/`` (Triton reads the model's name from its folder: ``name`` must be one
    plain folder name); a large model's weights beside ``1/model.onnx`` (``external``: see
    :func:`autoprec.core.stored.save_models`). Returns the files written."""
    entry = Path(repository) / path_component(name, "model name")
    written = save_models({entry / "1" / "model.onnx": model}, external=external)
    config = config_pbtxt(model.proto, name, note, profile, trial).encode()
    return [*written, atomic.write_bytes(entry / "config.pbtxt", config)]

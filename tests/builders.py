"""Tiny ONNX models built with onnx.helper, with fixed random weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 9  # onnx 1.23 writes 14 by default; onnxruntime accepts up to 13


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32) if array.dtype.kind == "f" else array, name)


def _model(nodes, inputs, outputs, initializers, opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def conv_net(batch: int | str = 1, size: int = 16, opset: int = 13, seed: int = 0) -> onnx.ModelProto:
    """Conv+BN+Relu -> Conv+SiLU -> residual Add -> Conv+Relu -> GlobalAveragePool -> Gemm -> Softmax."""
    rng = np.random.default_rng(seed)
    c = 8
    w = lambda *shape: rng.normal(0, 0.3, shape)  # noqa: E731
    inits = [
        _init("w0", w(c, 3, 3, 3)), _init("b0", w(c)),
        _init("bn_scale", 1 + 0.1 * rng.random(c)), _init("bn_bias", w(c)),
        _init("bn_mean", w(c)), _init("bn_var", 1 + rng.random(c)),
        _init("w1", w(c, c, 3, 3)), _init("b1", w(c)),
        _init("w2", w(c, c, 1, 1)), _init("b2", w(c)),
        _init("fc_w", w(5, c)), _init("fc_b", w(5)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], "conv0", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn0"], "bn0"),
        helper.make_node("Relu", ["bn0"], ["r0"], "relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"], "sig1"),
        helper.make_node("Mul", ["c1", "s1"], ["silu1"], "silu1"),
        helper.make_node("Add", ["silu1", "r0"], ["res"], "residual"),
        helper.make_node("Conv", ["res", "w2", "b2"], ["c2"], "conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], "relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], "gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], "flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], "fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], "softmax", axis=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 5])
    return _model(nodes, [x], [y], inits, opset)


def residual_net(channels: int = 8, size: int = 16, bias_as_add: bool = False, seed: int = 7) -> onnx.ModelProto:
    """A ResNet block: Conv "stem" → Relu → Conv "inner" → Relu → Conv "outer", whose output the Add "residual"
    sums with the block's input (the skip), then Conv "last". ``bias_as_add``: every Conv adds its bias after
    itself, as PaddlePaddle exports convolutions."""
    rng = np.random.default_rng(seed)
    nodes, inits, made = [], [], "x"
    for i, name in enumerate(("stem", "inner", "outer", "last")):
        inits.append(_init(f"w{i}", rng.normal(0, np.sqrt(2 / (9 * channels)), (channels, channels, 3, 3))))
        inits.append(_init(f"b{i}", rng.normal(0, 0.1, (1, channels, 1, 1) if bias_as_add else (channels,))))
        source = {"stem": "x", "inner": "r0", "outer": "r1", "last": "sum"}[name]
        nodes.append(helper.make_node("Conv", [source, f"w{i}"] + ([] if bias_as_add else [f"b{i}"]), [f"c{i}"],
                                      name=name, pads=[1, 1, 1, 1]))
        made = f"c{i}"
        if bias_as_add:
            nodes.append(helper.make_node("Add", [made, f"b{i}"], [f"a{i}"], name=f"bias{i}"))
            made = f"a{i}"
        if name in ("stem", "inner"):
            nodes.append(helper.make_node("Relu", [made], [f"r{i}"], name=f"relu{i}"))
        elif name == "outer":
            nodes.append(helper.make_node("Add", ["r0", made], ["sum"], name="residual"))
    shape = [1, channels, size, size]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                  [helper.make_tensor_value_info(made, TensorProto.FLOAT, shape)], inits)


def mlp(batch: int = 4, features: int = 16, hidden: int = 32, seed: int = 1) -> onnx.ModelProto:
    """MatMul+Add+Relu twice, then MatMul: two hidden layers and a linear head."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w0", rng.normal(0, 0.3, (features, hidden))), _init("b0", rng.normal(0, 0.1, hidden)),
        _init("w1", rng.normal(0, 0.3, (hidden, hidden))), _init("b1", rng.normal(0, 0.1, hidden)),
        _init("w2", rng.normal(0, 0.3, (hidden, 3))),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["m0"], "fc0"),
        helper.make_node("Add", ["m0", "b0"], ["a0"], "bias0"),
        helper.make_node("Relu", ["a0"], ["h0"], "relu0"),
        helper.make_node("MatMul", ["h0", "w1"], ["m1"], "fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], "bias1"),
        helper.make_node("Relu", ["a1"], ["h1"], "relu1"),
        helper.make_node("MatMul", ["h1", "w2"], ["y"], "head"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    return _model(nodes, [x], [y], inits)


def classifier(classes: int = 12, batch: int | str = 4, seed: int = 0) -> onnx.ModelProto:
    """x[batch, 16] → MatMul → Relu → MatMul → y[batch, classes]: class scores, for labels to score."""
    rng = np.random.default_rng(seed)
    inits = [_init("w0", rng.normal(0, 0.3, (16, 32))), _init("w1", rng.normal(0, 0.3, (32, classes)))]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], "fc0"), helper.make_node("Relu", ["h"], ["r"], "relu"),
             helper.make_node("MatMul", ["r", "w1"], ["y"], "fc1")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])], inits)


def attention(tokens: int = 8, dim: int = 16, seed: int = 2) -> onnx.ModelProto:
    """Single-head self-attention: Q/K/V projections, QK^T (two activations), Softmax, ·V, output projection."""
    rng = np.random.default_rng(seed)
    inits = [_init(n, rng.normal(0, 0.25, (dim, dim))) for n in ("wq", "wk", "wv", "wo")]
    inits.append(_init("scale", np.array(1 / np.sqrt(dim))))
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], "q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], "k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], "v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], "k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"], "scores"),
        helper.make_node("Mul", ["qk", "scale"], ["qk_scaled"], "scale_scores"),
        helper.make_node("Softmax", ["qk_scaled"], ["attn"], "softmax", axis=-1),
        helper.make_node("MatMul", ["attn", "v"], ["ctx"], "context"),
        helper.make_node("MatMul", ["ctx", "wo"], ["out"], "out_proj"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, tokens, dim])
    return _model(nodes, [x], [y], inits)


def transformer_block(tokens: int = 8, dim: int = 16, seed: int = 4) -> onnx.ModelProto:
    """Projection -> LayerNorm as exporters decompose it (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div,
    scale, shift) -> self-attention with Softmax -> residual Add -> output projection."""
    rng = np.random.default_rng(seed)
    inits = [_init(n, rng.normal(0, 0.25, (dim, dim))) for n in ("w_in", "wq", "wk", "w_out")]
    inits += [_init("two", np.array(2.0)), _init("eps", np.array(1e-5)), _init("gamma", 1 + 0.1 * rng.normal(size=dim)),
              _init("beta", 0.1 * rng.normal(size=dim)), _init("scale", np.array(1 / np.sqrt(dim)))]
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"], "proj_in"),
        helper.make_node("ReduceMean", ["h"], ["mean"], "ln_mean", axes=[-1]),
        helper.make_node("Sub", ["h", "mean"], ["centred"], "ln_sub"),
        helper.make_node("Pow", ["centred", "two"], ["squared"], "ln_pow"),
        helper.make_node("ReduceMean", ["squared"], ["var"], "ln_var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], "ln_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], "ln_sqrt"),
        helper.make_node("Div", ["centred", "std"], ["normed"], "ln_div"),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"], "ln_scale"),
        helper.make_node("Add", ["scaled", "beta"], ["ln"], "ln_shift"),
        helper.make_node("MatMul", ["ln", "wq"], ["q"], "q_proj"),
        helper.make_node("MatMul", ["ln", "wk"], ["k"], "k_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], "k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"], "scores"),
        helper.make_node("Mul", ["qk", "scale"], ["qk_scaled"], "scale_scores"),
        helper.make_node("Softmax", ["qk_scaled"], ["attn"], "softmax", axis=-1),
        helper.make_node("MatMul", ["attn", "ln"], ["ctx"], "context"),
        helper.make_node("Add", ["ctx", "h"], ["res"], "residual"),
        helper.make_node("MatMul", ["res", "w_out"], ["out"], "proj_out"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, tokens, dim])
    return _model(nodes, [x], [y], inits)


def line_reader(seed: int = 6) -> onnx.ModelProto:
    """A CTC-recognizer-like model with a dynamic batch and width, x [N, 3, 8, W] -> [N, W, 6]: Conv+Relu,
    Conv+Relu, the height averaged away, per column MatMul+Softmax; a Reshape whose target is read off the
    tensor's Shape, which preparation folds to constants only where the shapes are fixed."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.normal(0, 0.3, shape)  # noqa: E731
    inits = [_init("w0", w(8, 3, 3, 3)), _init("b0", w(8)), _init("w1", w(8, 8, 3, 3)), _init("b1", w(8)),
             _init("fc", w(8, 6)), _init("fc_b", w(6)), _init("first", np.array([0], np.int64)),
             _init("minus_one", np.array([-1], np.int64)), _init("two", np.array([2], np.int64))]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], "conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], "relu0"),
        helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("ReduceMean", ["r1"], ["m"], "height_mean", axes=[2], keepdims=0),  # [N, 8, W]
        helper.make_node("Transpose", ["m"], ["cols"], "to_columns", perm=[0, 2, 1]),  # [N, W, 8]
        helper.make_node("Shape", ["cols"], ["shape"], "shape"),
        helper.make_node("Gather", ["shape", "first"], ["n"], "batch_of", axis=0),
        helper.make_node("Concat", ["n", "minus_one", "two"], ["target"], "target", axis=0),
        helper.make_node("Reshape", ["cols", "target"], ["pairs"], "pairs"),  # [N, 4W, 2]
        helper.make_node("Reshape", ["pairs", "shape"], ["back"], "back"),  # [N, W, 8] again
        helper.make_node("MatMul", ["back", "fc"], ["logits0"], "classifier"),
        helper.make_node("Add", ["logits0", "fc_b"], ["logits"], "classifier_bias"),
        helper.make_node("Softmax", ["logits"], ["probs"], "softmax", axis=-1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, "W"])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", "W", 6])
    return _model(nodes, [x], [y], inits)


def exported_classifier(seed: int = 8) -> onnx.ModelProto:
    """A classifier as PyTorch's TorchScript exporter writes code made for mixed precision, NHWC x [N, 16, 16, 3]:
    a Transpose to NCHW; Casts to float of float tensors before each layer (``x.float()``) and one feeding the
    output; a float64 round trip (``.double().float()``); a Conv followed by a per-channel scale Mul (tf2onnx's
    BatchNorm after a depthwise Conv); the global average pooling as the dynamo exporter writes it (ReduceMean
    over H and W); a Gemm."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.normal(0, 0.3, shape)  # noqa: E731
    inits = [_init("w0", w(8, 3, 3, 3)), _init("b0", w(8)), _init("scale0", 1 + 0.2 * rng.random((1, 8, 1, 1))),
             _init("w1", w(8, 8, 3, 3)), _init("b1", w(8)), _init("fc_w", w(4, 8)), _init("fc_b", w(4))]
    to = {"float": TensorProto.FLOAT, "double": TensorProto.DOUBLE}
    nodes = [
        helper.make_node("Transpose", ["x"], ["nchw"], "to_nchw", perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["nchw"], ["nchw_f"], "cast_in", to=to["float"]),
        helper.make_node("Conv", ["nchw_f", "w0", "b0"], ["c0"], "conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c0", "scale0"], ["s0"], "scale0"),
        helper.make_node("Relu", ["s0"], ["r0"], "relu0"),
        helper.make_node("Cast", ["r0"], ["r0_wide"], "cast_wide", to=to["double"]),
        helper.make_node("Cast", ["r0_wide"], ["r0_back"], "cast_back", to=to["float"]),
        helper.make_node("Cast", ["r0_back"], ["r0_f"], "cast_1", to=to["float"]),
        helper.make_node("Conv", ["r0_f", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("ReduceMean", ["r1"], ["pooled"], "mean_hw", axes=[2, 3], keepdims=1),
        helper.make_node("Flatten", ["pooled"], ["flat"], "flatten"),
        helper.make_node("Cast", ["flat"], ["flat_f"], "cast_2", to=to["float"]),
        helper.make_node("Gemm", ["flat_f", "fc_w", "fc_b"], ["logits_f"], "fc", transB=1),
        helper.make_node("Cast", ["logits_f"], ["logits"], "cast_out", to=to["float"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 16, 3])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])
    return _model(nodes, [x], [y], inits)


def masked_encoder(tokens: int = 8, dim: int = 16, vocab: int = 32, seed: int = 9) -> onnx.ModelProto:
    """Token ids and an attention mask, as Hugging Face exports write them (opset 15): an embedding Gather, the
    sequence length read as ``Shape(mask, start=1, end=2)``, scores masked by ``Where`` with float32's lowest
    (``finfo(float32).min``), Softmax, a projection. Dynamic batch and sequence."""
    rng = np.random.default_rng(seed)
    inits = [_init("table", rng.normal(0, 0.5, (vocab, dim))), _init("wq", rng.normal(0, 0.25, (dim, dim))),
             _init("wk", rng.normal(0, 0.25, (dim, dim))), _init("wo", rng.normal(0, 0.25, (dim, dim))),
             _init("lowest", np.array(np.finfo(np.float32).min)), _init("zero", np.array([0], np.int64)),
             _init("one", np.array([1], np.int64)), _init("dims", np.array([dim], np.int64))]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], "embed", axis=0),
        helper.make_node("Shape", ["mask"], ["length"], "length", start=1, end=2),
        helper.make_node("Concat", ["zero", "length", "dims"], ["target"], "target", axis=0),
        helper.make_node("Reshape", ["emb", "target"], ["h"], "h"),
        helper.make_node("MatMul", ["h", "wq"], ["q"], "q_proj"),
        helper.make_node("MatMul", ["h", "wk"], ["k"], "k_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], "k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], "scores"),
        helper.make_node("Unsqueeze", ["mask", "one"], ["mask_rows"], "mask_rows"),
        helper.make_node("Cast", ["mask_rows"], ["keep"], "keep", to=TensorProto.BOOL),
        helper.make_node("Not", ["keep"], ["hidden"], "hidden"),
        helper.make_node("Where", ["hidden", "lowest", "scores"], ["masked"], "masked"),
        helper.make_node("Softmax", ["masked"], ["attn"], "softmax", axis=-1),
        helper.make_node("MatMul", ["attn", "h"], ["ctx"], "context"),
        helper.make_node("MatMul", ["ctx", "wo"], ["out"], "out_proj"),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T"])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", "T"])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "T", dim])
    return _model(nodes, [ids, mask], [y], inits, opset=15)


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def conv_with_data(folder: Path, items: int, batch: int | str = 1, name: str = "conv.onnx") -> tuple[Path, Path]:
    """:func:`conv_net` saved in ``folder`` with ``items`` image-like inputs beside it in ``data.npz``."""
    model = save(conv_net(batch=batch), folder / name)
    data = folder / "data.npz"
    np.savez(data, x=image_like(items))
    return model, data


def image_like(count: int, size: int = 16, seed: int = 3) -> np.ndarray:
    """Smooth, image-like inputs (not white noise), so quantization error looks like it does on real data."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = []
    for _ in range(count):
        f = rng.uniform(1, 4, (3, 2))
        phase = rng.uniform(0, 6.3, (3, 1, 1))
        img = np.sin(2 * np.pi * (f[:, :1, None] * xx + f[:, 1:, None] * yy) + phase)
        out.append(img + 0.05 * rng.normal(size=img.shape))
    return np.stack(out).astype(np.float32)


def session(model, options=None):
    """An ONNX Runtime CPU session of a stored model (loaded from a file beside its weights, as engines load
    it), of a path, or of an in-memory model."""
    import onnxruntime as ort

    from autoprec.core.stored import StoredModel

    options = options or ort.SessionOptions()
    if isinstance(model, StoredModel):
        with model.file() as path:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    source = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def check(model) -> None:
    """onnx.checker (from its file, where its weights are) and strict shape inference of a stored model."""
    with model.file() as path:
        onnx.checker.check_model(str(path))
    onnx.shape_inference.infer_shapes(model.proto, strict_mode=True)


def with_external_data(model: onnx.ModelProto, path: Path) -> Path:
    """``model`` saved with every initializer over 1 KiB in ``<name>.data`` beside it, as large models come."""
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
    return path


def embedding_over_2gb(path: Path, rows: int = 8_400_000, dim: int = 64, used: int = 256, seed: int = 5) -> Path:
    """ids [1, 8] -> Gather from a float32 table of ``rows`` × ``dim`` (2.15 GB: more than one protobuf can
    hold) -> MatMul+Relu -> MatMul. Only the first ``used`` rows hold values; the rest of the table is a hole
    in its data file (no disk, reads as zeros), so the model costs seconds, not gigabytes, to make."""
    rng = np.random.default_rng(seed)
    data = path.with_name(path.name + ".data")
    table = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[rows, dim])
    table.data_location = TensorProto.EXTERNAL
    table.external_data.add(key="location", value=data.name)
    table.external_data.add(key="length", value=str(rows * dim * 4))
    with open(data, "wb") as f:
        f.write(rng.normal(0, 1, (used, dim)).astype(np.float32).tobytes())
        f.truncate(rows * dim * 4)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], "embed"),
             helper.make_node("MatMul", ["e", "w0"], ["h"], "fc0"),
             helper.make_node("Relu", ["h"], ["r"], "relu0"),
             helper.make_node("MatMul", ["r", "w1"], ["y"], "fc1")]
    inits = [table, _init("w0", rng.normal(0, 0.2, (dim, 32))), _init("w1", rng.normal(0, 0.2, (32, 4)))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = IR_VERSION
    path.write_bytes(model.SerializeToString())
    return path


def mlp_with_data(folder: Path, items: int = 768) -> tuple[Path, Path]:
    """An MLP large enough that an INT8 plan runs faster than FP32 on a CPU (batch 64, 64 → 256 → 256 → 3), saved
    in ``folder`` with ``items`` normal inputs in ``data.npz`` (the same bytes on every call: seeded)."""
    model = save(mlp(batch=64, features=64, hidden=256), folder / "mlp.onnx")
    data = folder / "data.npz"
    np.savez(data, x=np.random.default_rng(0).normal(size=(items, 64)).astype(np.float32))
    return model, data


def kv_decoder(hidden: int = 16, vocab: int = 24, positions: int = 96, seed: int = 10,
               cache_names: tuple[str, str] = ("past_key_values.0", "present.0")) -> onnx.ModelProto:
    """A one-layer decoder with a KV cache, its inputs and outputs named and dimensioned as optimum exports a GPT-2
    (``text-generation-with-past``): input_ids, attention_mask [batch, past + sequence], position_ids and
    past_key_values.0.key/value [batch, 1, past, hidden] in; logits [batch, sequence, vocab] and present.0.key/value
    out. ``cache_names``: the cache's input and output prefixes (another exporter's, or none the names pair)."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.normal(0, 0.5, shape)  # noqa: E731
    past, present = cache_names
    inits = [_init("wte", w(vocab, hidden)), _init("wpe", w(positions, hidden)), _init("wq", w(hidden, hidden)),
             _init("wk", w(hidden, hidden)), _init("wv", w(hidden, hidden)), _init("wo", w(hidden, hidden)),
             _init("w_lm", w(hidden, vocab)), _init("axis1", np.array([1], np.int64)),
             _init("axes12", np.array([1, 2], np.int64)), _init("scale", np.array(hidden ** -0.5, np.float32)),
             _init("one", np.array(1.0, np.float32)), _init("big", np.array(-1e4, np.float32))]
    nodes = [
        helper.make_node("Gather", ["wte", "input_ids"], ["tok"], "wte"),
        helper.make_node("Gather", ["wpe", "position_ids"], ["pos"], "wpe"),
        helper.make_node("Add", ["tok", "pos"], ["x"], "embed"),
        *(helper.make_node("MatMul", ["x", f"w{n}"], [n], f"{n}_proj") for n in "qkv"),
        *(helper.make_node("Unsqueeze", [n, "axis1"], [f"{n}4"], f"{n}_heads") for n in "qkv"),
        helper.make_node("Concat", [f"{past}.key", "k4"], [f"{present}.key"], "cache_k", axis=2),
        helper.make_node("Concat", [f"{past}.value", "v4"], [f"{present}.value"], "cache_v", axis=2),
        helper.make_node("Transpose", [f"{present}.key"], ["kt"], "kt", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q4", "kt"], ["scores"], "scores"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], "scaled"),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], "maskf", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axes12"], ["mask4"], "mask4"),
        helper.make_node("Sub", ["one", "mask4"], ["masked"], "masked"),
        helper.make_node("Mul", ["masked", "big"], ["bias"], "bias"),
        helper.make_node("Add", ["scaled", "bias"], ["biased"], "biased"),
        helper.make_node("Softmax", ["biased"], ["probs"], "softmax", axis=-1),
        helper.make_node("MatMul", ["probs", f"{present}.value"], ["ctx4"], "context"),
        helper.make_node("Squeeze", ["ctx4", "axis1"], ["ctx"], "ctx"),
        helper.make_node("MatMul", ["ctx", "wo"], ["attn"], "o_proj"),
        helper.make_node("Add", ["x", "attn"], ["h"], "residual"),
        helper.make_node("MatMul", ["h", "w_lm"], ["logits"], "lm_head"),
    ]
    cache = ["batch_size", 1, "past_sequence_length", hidden]
    grown = ["batch_size", 1, "past_sequence_length + sequence_length", hidden]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              *(helper.make_tensor_value_info(f"{past}.{kv}", TensorProto.FLOAT, cache) for kv in ("key", "value")),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch_size", "past_sequence_length + sequence_length"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab]),
               *(helper.make_tensor_value_info(f"{present}.{kv}", TensorProto.FLOAT, grown) for kv in ("key", "value"))]
    return _model(nodes, inputs, outputs, inits)


def decoder_data(model: Path, path: Path, items: int = 12, tokens: int = 5, past: int = 6, seed: int = 3) -> Path:
    """One shape of data for a :func:`kv_decoder` as a user saves it: ``tokens`` tokens after a past of ``past``,
    the past made by the model itself from ``past`` earlier tokens (prefill), items stacked with a batch of 1."""
    runs = session(model)
    names = {i.name for i in runs.get_inputs()}
    caches = [i for i in runs.get_inputs() if i.type == "tensor(float)"]
    vocab = runs.get_outputs()[0].shape[-1]
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {n: [] for n in names}
    for _ in range(items):
        first = {"input_ids": rng.integers(0, vocab, (1, past)), "attention_mask": np.ones((1, past), np.int64),
                 "position_ids": np.arange(past)[None],
                 **{c.name: np.zeros((1, c.shape[1], 0, c.shape[3]), np.float32) for c in caches}}
        made = dict(zip([o.name for o in runs.get_outputs()], runs.run(None, first)))
        presents = [o.name for o in runs.get_outputs()][1:]
        item = {"input_ids": rng.integers(0, vocab, (1, tokens)), "attention_mask": np.ones((1, past + tokens),
                np.int64), "position_ids": np.arange(past, past + tokens)[None],
                **{c.name: made[p] for c, p in zip(caches, presents)}}
        for name in names:
            rows[name].append(item[name][0])
    np.savez(path, **{name: np.stack(values) for name, values in rows.items()})
    return path


def weight_only_mlp(batch: int = 4, features: int = 128, hidden: int = 256, out: int = 64) -> onnx.ModelProto:
    """x → MatMul(w1) → Relu → Gemm(w2 stored transposed, bias): the two layouts of a weight INT4 blocks take."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], "mm"), helper.make_node("Relu", ["h"], ["r"], "relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], "gemm", transB=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out])],
                  [_init("w1", rng.normal(0, 0.1, (features, hidden))), _init("w2", rng.normal(0, 0.1, (out, hidden))),
                   _init("b2", rng.normal(0, 0.1, out))])


def graph_model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    """A model of ``nodes`` at opset 17, unchecked (a test's model may be one autoprec must refuse)."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def mlp_then(extra_nodes, extra_inputs=(), outputs=None, name="m.onnx", folder=None) -> Path:
    """x[1,16] → MatMul → a[1,32], then ``extra_nodes`` (their last output is y unless ``outputs`` says)."""
    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"), *extra_nodes]
    outs = outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])]
    model = graph_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]), *extra_inputs], outs,
                        [weight])
    return save(model, folder / name)


def classifier_file(folder: Path, classes: int = 12, batch: int | str = 4, name: str = "cls.onnx") -> Path:
    return save(classifier(classes, batch), folder / name)


def sharing_t(folder: Path) -> Path:
    """x[N, T, 16] and m[N, T, 1], multiplied: two inputs that share the dim T."""
    weight = numpy_helper.from_array(np.ones((16, 8), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], "fc"), helper.make_node("Mul", ["h", "m"], ["y"], "mask")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 16]),
                           helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", "T", 1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 8])], [weight])
    return save(model, folder / "two.onnx")


def embedding_lookup(table: np.ndarray, dim: int = 32) -> onnx.ModelProto:
    """ids [2, 5] -> an embedding Gather from ``table``, then a MatMul; and a Gather of an activation's rows."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], "embed", axis=0),
             helper.make_node("MatMul", ["e", "w"], ["h"], "proj"),
             helper.make_node("Gather", ["h", "first"], ["y"], "first_row", axis=1)]
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, dim])],
                  [_init("table", table), _init("w", np.eye(table.shape[1], dim)),
                   numpy_helper.from_array(np.array(0, np.int64), "first")])

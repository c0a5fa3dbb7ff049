"""Synthetic ONNX models of any size, written straight to disk (random weights: cost and scale, not accuracy).

Weights over 1 KiB go to one external data file beside the model, written tensor by tensor, so a
model of several GB is generated without ever holding it in one protobuf (which cannot exceed 2 GB).

    python benchmarks/synthetic.py encoder out/bert.onnx --layers 12 --hidden 768 --tokens 128
    python benchmarks/synthetic.py chain out/chain.onnx --units 600 --hidden 64
    python benchmarks/synthetic.py wide out/wide.onnx --width 17000
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 9
INLINE_BYTES = 1024  # smaller tensors stay in the .onnx file (shape constants, scalars)
ALIGN = 4096  # each external tensor starts on a page: ONNX Runtime memory-maps aligned external data


class _Writer:
    """Initializers of one model: small ones inline, the others appended to ``<model>.data``."""

    def __init__(self, path: Path, seed: int, zeros: bool = False):
        self.path, self.data = path, path.with_name(path.name + ".data")
        self.file = open(self.data, "wb")
        self.rng, self.zeros = np.random.default_rng(seed), zeros
        self.initializers: list[TensorProto] = []

    def random(self, name: str, shape: tuple[int, ...], std: float) -> str:
        """A float32 weight of ``shape``; all zeros where the model is generated with ``zeros`` (fast, sparse on disk)."""
        if self.zeros or math.prod(shape) * 4 <= INLINE_BYTES:
            values = np.zeros(shape, np.float32) if self.zeros else self.rng.normal(0, std, shape).astype(np.float32)
            return self.add(name, values)
        return self.add(name, (self.rng.standard_normal(shape, np.float32) * np.float32(std)))

    def add(self, name: str, values: np.ndarray) -> str:
        values = np.ascontiguousarray(values)
        if values.nbytes <= INLINE_BYTES:
            self.initializers.append(numpy_helper.from_array(values, name))
            return name
        offset = -(-self.file.tell() // ALIGN) * ALIGN
        if self.zeros and not values.any():
            self.file.truncate(offset + values.nbytes)  # a hole: no disk, reads as zeros
        else:
            self.file.seek(offset)
            self.file.write(values.tobytes())
        self.file.seek(offset + values.nbytes)
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(values.dtype), dims=values.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data.name), ("offset", str(offset)), ("length", str(values.nbytes))):
            tensor.external_data.add(key=key, value=value)
        self.initializers.append(tensor)
        return name

    def save(self, nodes, inputs, outputs) -> Path:
        self.file.close()
        graph = helper.make_graph(nodes, self.path.stem, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = IR_VERSION
        self.path.write_bytes(model.SerializeToString())
        onnx.checker.check_model(str(self.path))  # by path: never the whole model in one protobuf
        return self.path


def encoder(path: Path, layers: int = 12, hidden: int = 768, tokens: int = 128, vocab: int = 30522, seed: int = 0,
            zeros: bool = False) -> Path:
    """A BERT-like encoder as exporters write it: token embedding (Gather), then per layer Q/K/V projections,
    multi-head attention with Softmax, output projection, residual, decomposed LayerNorm, GELU (Erf) FFN."""
    w = _Writer(path, seed, zeros)
    nodes = []
    head_dim = 64 if hidden % 64 == 0 else hidden
    heads = hidden // head_dim
    w.add("shape_heads", np.array([1, tokens, heads, head_dim], np.int64))
    w.add("shape_merged", np.array([1, tokens, hidden], np.int64))
    for name, value in (("two", 2.0), ("eps", 1e-12), ("half", 0.5), ("one", 1.0), ("sqrt2", math.sqrt(2.0)),
                        ("scale", 1 / math.sqrt(head_dim))):
        w.add(name, np.array(value, np.float32))
    w.random("embedding", (vocab, hidden), 0.02)
    nodes.append(helper.make_node("Gather", ["embedding", "input_ids"], ["x0"], "embed"))
    x = _layer_norm(w, nodes, "x0", "embed_ln", hidden)
    for i in range(layers):
        x = _encoder_layer(w, nodes, x, f"l{i}", hidden, heads, head_dim)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, tokens])]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, tokens, hidden])]
    return w.save(nodes, inputs, outputs)


def _linear(w: _Writer, nodes: list, x: str, name: str, rows: int, cols: int) -> str:
    nodes.append(
        helper.make_node(
            "MatMul", [x, w.random(f"{name}.weight", (rows, cols), 0.02)], [f"{name}.mm"], f"{name}/MatMul"
        )
    )
    nodes.append(
        helper.make_node("Add", [f"{name}.mm", w.random(f"{name}.bias", (cols,), 0.02)], [f"{name}.out"], f"{name}/Add")
    )
    return f"{name}.out"


def _layer_norm(w: _Writer, nodes: list, x: str, name: str, hidden: int) -> str:
    gamma, beta = (
        w.add(f"{name}.gamma", np.ones(hidden, np.float32)),
        w.add(f"{name}.beta", np.zeros(hidden, np.float32)),
    )
    n = lambda op, ins, out, **kw: nodes.append(helper.make_node(op, ins, [f"{name}.{out}"], f"{name}/{out}", **kw))  # noqa: E731
    n("ReduceMean", [x], "mean", axes=[-1])
    n("Sub", [x, f"{name}.mean"], "centred")
    n("Pow", [f"{name}.centred", "two"], "squared")
    n("ReduceMean", [f"{name}.squared"], "var", axes=[-1])
    n("Add", [f"{name}.var", "eps"], "var_eps")
    n("Sqrt", [f"{name}.var_eps"], "std")
    n("Div", [f"{name}.centred", f"{name}.std"], "normed")
    n("Mul", [f"{name}.normed", gamma], "scaled")
    n("Add", [f"{name}.scaled", beta], "out")
    return f"{name}.out"


def _encoder_layer(w: _Writer, nodes: list, x: str, p: str, hidden: int, heads: int, head_dim: int) -> str:
    n = lambda op, ins, out, **kw: nodes.append(helper.make_node(op, ins, [f"{p}.{out}"], f"{p}/{out}", **kw))  # noqa: E731
    for proj in ("q", "k", "v"):
        n("Reshape", [_linear(w, nodes, x, f"{p}.{proj}", hidden, hidden), "shape_heads"], f"{proj}_heads")
    n("Transpose", [f"{p}.q_heads"], "q_t", perm=[0, 2, 1, 3])
    n("Transpose", [f"{p}.k_heads"], "k_t", perm=[0, 2, 3, 1])
    n("Transpose", [f"{p}.v_heads"], "v_t", perm=[0, 2, 1, 3])
    n("MatMul", [f"{p}.q_t", f"{p}.k_t"], "scores")
    n("Mul", [f"{p}.scores", "scale"], "scaled")
    n("Softmax", [f"{p}.scaled"], "attn", axis=-1)
    n("MatMul", [f"{p}.attn", f"{p}.v_t"], "context")
    n("Transpose", [f"{p}.context"], "context_t", perm=[0, 2, 1, 3])
    n("Reshape", [f"{p}.context_t", "shape_merged"], "merged")
    n("Add", [_linear(w, nodes, f"{p}.merged", f"{p}.o", hidden, hidden), x], "attn_res")
    h = _layer_norm(w, nodes, f"{p}.attn_res", f"{p}.ln1", hidden)
    up = _linear(w, nodes, h, f"{p}.ffn_up", hidden, 4 * hidden)
    n("Div", [up, "sqrt2"], "gelu_div")
    n("Erf", [f"{p}.gelu_div"], "gelu_erf")
    n("Add", [f"{p}.gelu_erf", "one"], "gelu_add")
    n("Mul", [up, f"{p}.gelu_add"], "gelu_mul")
    n("Mul", [f"{p}.gelu_mul", "half"], "gelu")
    n("Add", [_linear(w, nodes, f"{p}.gelu", f"{p}.ffn_down", 4 * hidden, hidden), h], "ffn_res")
    return _layer_norm(w, nodes, f"{p}.ffn_res", f"{p}.ln2", hidden)


def chain(path: Path, units: int = 600, hidden: int = 64, batch: int = 8, seed: int = 0, zeros: bool = False) -> Path:
    """``units`` MatMul+Add+Relu layers in a row: many units, small weights."""
    w = _Writer(path, seed, zeros)
    nodes, x = [], "x"
    for i in range(units):
        x = _linear(w, nodes, x, f"fc{i}", hidden, hidden)
        nodes.append(helper.make_node("Relu", [x], [f"fc{i}.relu"], f"fc{i}/Relu"))
        x = f"fc{i}.relu"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, hidden])]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, hidden])]
    return w.save(nodes, inputs, outputs)


def wide(path: Path, width: int = 17000, batch: int = 1, seed: int = 0, zeros: bool = False) -> Path:
    """Two square MatMuls of ``width`` (17000: 2 × 1.16 GB = 2.3 GB of weights): few units, huge weights."""
    w = _Writer(path, seed, zeros)
    std = 1 / math.sqrt(width)
    nodes = [helper.make_node("MatMul", ["x", w.random("w0", (width, width), std)], ["h"], "mm0"),
             helper.make_node("Relu", ["h"], ["r"], "relu0"),
             helper.make_node("MatMul", ["r", w.random("w1", (width, width), std)], ["y"], "mm1")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])]
    return w.save(nodes, inputs, outputs)


def weight_bytes(path: Path) -> int:
    """Bytes of the model's initializers, inline and external (what "the weights" means in scale figures)."""
    model = onnx.load(str(path), load_external_data=False)
    return sum(math.prod(t.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
               for t in model.graph.initializer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("encoder", "chain", "wide"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--units", type=int, default=600)
    parser.add_argument("--width", type=int, default=17000)
    parser.add_argument("--zeros", action="store_true", help="all-zero weights (sparse files: fast, for tests)")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.kind == "encoder":
        path = encoder(args.out, args.layers, args.hidden or 768, args.tokens, zeros=args.zeros)
    elif args.kind == "chain":
        path = chain(args.out, args.units, args.hidden or 64, zeros=args.zeros)
    else:
        path = wide(args.out, args.width, zeros=args.zeros)
    print(f"{path}: {weight_bytes(path) / 1e6:.1f} MB of weights")


if __name__ == "__main__":
    main()

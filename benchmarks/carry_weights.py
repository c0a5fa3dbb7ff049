"""Carry ONNX models that share weights once: a model, its re-exports at other shapes and its mixed-precision
copies hold many byte-identical tensors (MiniLM at 128 and 256 tokens: 86 MB of the same weights; AutoCast's
FP16 copies of it: 65 MB each, 21 MB of it new). Each call carries 64 MiB, so that is calls saved.

    python benchmarks/carry_weights.py pack TREE      # here: every .onnx under TREE keeps only its small tensors,
                                                      # the rest go once into TREE/weights.bin (+ weights.json)
    python benchmarks/carry_weights.py unpack TREE    # there: each model whole again, checked by its sha256

A packed tensor is marked as ONNX external data (location weights.bin, offset, length) so that nothing reads a
packed model by mistake as whole; unpacking writes the original bytes back, byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import onnx

BLOB, MANIFEST = "weights.bin", "weights.json"
SMALL = 64 * 1024  # tensors below this stay in their model


def tensors(graph: onnx.GraphProto):
    """Every tensor a graph holds: initializers and tensor attributes, subgraphs included. (Not through
    autoprec.analysis.subgraphs.graphs: unpacking runs on the GPU machine before autoprec is installed.)"""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                yield from tensors(sub)


def pack(tree: Path) -> None:
    offsets: dict[str, int] = {}
    manifest = {}
    with open(tree / BLOB, "wb") as blob:
        for path in sorted(tree.rglob("*.onnx")):
            data = path.read_bytes()
            model = onnx.load_from_string(data)
            for tensor in tensors(model.graph):
                if len(tensor.raw_data) < SMALL or tensor.HasField("data_location"):
                    continue
                key = hashlib.sha256(tensor.raw_data).hexdigest()
                if key not in offsets:
                    offsets[key] = blob.tell()
                    blob.write(tensor.raw_data)
                entries = {"location": BLOB, "offset": str(offsets[key]), "length": str(len(tensor.raw_data))}
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                tensor.external_data.extend(onnx.StringStringEntryProto(key=k, value=v) for k, v in entries.items())
            path.write_bytes(model.SerializeToString())
            manifest[str(path.relative_to(tree))] = hashlib.sha256(data).hexdigest()
    (tree / MANIFEST).write_text(json.dumps(manifest, indent=1))
    print(f"carry_weights: {len(manifest)} models, {len(offsets)} shared tensors, "
          f"{(tree / BLOB).stat().st_size / 2**20:.1f} MiB in {BLOB}")


def unpack(tree: Path) -> None:
    manifest = json.loads((tree / MANIFEST).read_text())
    with open(tree / BLOB, "rb") as blob:
        for name, digest in manifest.items():
            path = tree / name
            model = onnx.load_from_string(path.read_bytes())
            for tensor in tensors(model.graph):
                entries = {e.key: e.value for e in tensor.external_data}
                if tensor.data_location != onnx.TensorProto.EXTERNAL or entries.get("location") != BLOB:
                    continue  # a model's own external data (autoprec writes large models so) stays as it came
                blob.seek(int(entries["offset"]))
                tensor.raw_data = blob.read(int(entries["length"]))
                tensor.ClearField("external_data")
                tensor.ClearField("data_location")
            data = model.SerializeToString()
            if hashlib.sha256(data).hexdigest() != digest:
                raise SystemExit(f"carry_weights: {name} differs from the packed original after unpacking")
            path.write_bytes(data)
    (tree / BLOB).unlink()
    (tree / MANIFEST).unlink()
    print(f"carry_weights: {len(manifest)} models whole again, each matching its sha256")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("tree", type=Path)
    args = parser.parse_args()
    (pack if args.action == "pack" else unpack)(args.tree)


if __name__ == "__main__":
    main()

"""Search-space files (which ops are units, in which precisions): a malformed one is one line naming what is wrong."""

import pytest
from cli import clean, run

SPACES = {
    "units not a mapping": "units: 5\n",
    "precisions not a list": "units: {Conv: 5}\n",
    "fusable not a list": "units: {Conv: [int8, fp32]}\nfusable: 5\n",
    "pinned a mapping": "units: {Conv: [int8, fp32]}\npinned_fp32: {a: 1}\n",
    "overrides a list": "units: {Conv: [int8, fp32]}\noverrides: [a, b]\n",
    "override precisions a number": "units: {Conv: [int8, fp32]}\noverrides: {'conv*': 5}\n",
    "not utf-8": b"\xff\xfe\x00units",
    "a list": "- Conv\n",
    "op name not text": "units: {1: [int8]}\n",
    "int4 block size not a power of two": "units: {MatMul: [int4, fp32]}\nint4_block_size: 24\n",
    "int4 block size text": "units: {MatMul: [int4, fp32]}\nint4_block_size: big\n",
    "int4 block size past what INT4 weights take": "units: {MatMul: [int4, fp32]}\nint4_block_size: 512\n",
    "embeddings in int8": "units: {MatMul: [int4, fp32]}\nembeddings: [int8, fp32]\n",
}


@pytest.mark.parametrize("kind", sorted(SPACES))
def test_bad_search_spaces_are_one_line(workdir, capsys, kind):
    space = workdir / "space.yaml"
    text = SPACES[kind]
    space.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, err = run(["search", workdir / "conv.onnx", "--search-space", space, "--budget", 1, "--no-progress",
                     "--out", workdir / "out"], capsys)
    clean(code, err, allowed=(2,))
    assert "int4 block size" not in kind or "int4_block_size" in err.strip().splitlines()[-1]


def test_a_unit_type_given_one_precision_is_said_as_that_not_as_pinned(workdir, capsys):
    """``Conv: int8`` (text where a list was meant) leaves every Conv one precision: the line says so and how to list
    more, where it said the model had "only pinned" units."""
    space = workdir / "space.yaml"
    space.write_text("units:\n  Conv: int8\n  Gemm: int8\n")
    code, err = run(["search", workdir / "conv.onnx", "--search-space", space, "--budget", 1, "--no-progress",
                     "--out", workdir / "out"], capsys)
    clean(code, err, allowed=(2,))
    assert "gives its Conv, Gemm units one precision each" in err and "pinned" not in err

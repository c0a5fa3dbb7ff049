import builders
import numpy as np
import onnx
import pytest

from autoprec.analysis.calibrate import (
    TensorRange,
    _abs_percentile,
    calibrate,
    collected_tensors,
)
from autoprec.analysis.data import build_dataset
from autoprec.analysis.model import analyse
from autoprec.analysis.reference import reference_outputs
from autoprec.core.search_space import load_search_space


@pytest.fixture
def conv_analysed(conv_model, conv_data):
    info = analyse(conv_model, load_search_space())
    return info, build_dataset(conv_data, info.inputs)


def _activations(info, batches, names):
    model = onnx.ModelProto()
    model.CopyFrom(info.model)
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    session = builders.session(info.stored.with_proto(model))
    runs = [session.run(names, b) for b in batches]
    return {n: np.concatenate([r[i].ravel() for r in runs]) for i, n in enumerate(names)}


def test_ranges_match_the_activations_seen(conv_analysed):
    info, data = conv_analysed
    ranges = calibrate(info, data.calibration, data.fingerprint())
    names = collected_tensors(info)
    assert {"x", "r0", "res", "flat", "c1"} <= set(names)
    seen = _activations(info, data.calibration, names)
    for name in names:
        r = ranges[name]
        assert r.min == pytest.approx(seen[name].min(), rel=1e-6)
        assert r.max == pytest.approx(seen[name].max(), rel=1e-6)
        absolute = np.abs(seen[name])
        bin_width = (r.edges[-1] - r.edges[0]) / (len(r.edges) - 1)
        assert r.amax("minmax") == pytest.approx(absolute.max(), rel=1e-6)
        for p in (99.9, 99.99):
            # The threshold is a histogram bin edge: it covers p % of the values, one bin less does not.
            amax = r.amax(f"percentile-{p}")
            assert (absolute <= amax + 1e-6).mean() >= p / 100
            assert (absolute <= amax - 2 * bin_width).mean() < p / 100
        lo, hi = r.bounds("minmax")
        assert lo <= 0 <= hi


def test_percentile_of_a_known_histogram():
    values = np.concatenate([np.linspace(-1, 1, 9_995), np.full(5, 50.0)])  # 0.05 % outliers at 50
    hist, edges = np.histogram(values, bins=2048, range=(-50, 50))
    r = TensorRange(float(values.min()), float(values.max()), hist, edges)
    assert r.amax("minmax") == 50.0
    assert r.amax("percentile-99.9") == pytest.approx(1.0, abs=0.1)
    assert r.amax("percentile-99.99") == pytest.approx(50.0, abs=0.1)
    assert _abs_percentile(hist, edges, 50) == pytest.approx(0.5, abs=0.1)
    with pytest.raises(ValueError, match="unknown calibration method"):
        r.amax("entropy-ish")


def test_calibration_and_reference_are_cached_and_reused(conv_analysed, tmp_path, monkeypatch):
    info, data = conv_analysed
    first = calibrate(info, data.calibration, data.fingerprint(), tmp_path)
    ref = reference_outputs(info, data.evaluation, data.fingerprint(), tmp_path)
    assert len(list(tmp_path.glob("calibration-*.npz"))) == 1 and len(list(tmp_path.glob("reference-*.npz"))) == 1

    def no_run(*args, **kwargs):
        raise AssertionError("the FP32 model was run again")

    monkeypatch.setattr("autoprec.analysis.calibrate.cpu_session", no_run)
    again = calibrate(info, data.calibration, data.fingerprint(), tmp_path)
    ref_again = reference_outputs(info, data.evaluation, data.fingerprint(), tmp_path)
    assert again.tensors.keys() == first.tensors.keys()
    for name in first.tensors:
        assert again[name].min == first[name].min and again[name].amax("percentile-99.9") == first[name].amax(
            "percentile-99.9"
        )
    np.testing.assert_array_equal(ref_again[0]["probs"], ref[0]["probs"])


def test_a_tensor_holding_infinities_and_float_extremes_is_ranged_by_its_finite_values(tmp_path):
    """An attention mask's -inf or float32's lowest (a causal mask as exporters write it) reaches a MatMul's input:
    calibration ranges what it can bin and the search goes on (it raised on both before)."""
    from onnx import TensorProto, helper

    mask = np.array([0.0, -np.inf, np.finfo(np.float32).min, 0.0], np.float32)
    model = builders._model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], "first"), helper.make_node("Add", ["h", "mask"], ["m"], "mask"),
         helper.make_node("MatMul", ["m", "w2"], ["y"], "second")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [builders._init("w1", np.eye(4)), builders._init("mask", mask), builders._init("w2", np.ones((4, 2)))])
    path = builders.save(model, tmp_path / "masked.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))
    info = analyse(path, load_search_space())
    data = build_dataset(tmp_path / "x.npz", info.inputs)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    masked = ranges["m"]
    assert np.isfinite([masked.min, masked.max]).all() and masked.min <= -1e29 and masked.max < 10
    assert np.isfinite(masked.amax("percentile-99.99"))


def test_a_range_that_grows_many_times_from_batch_to_batch_is_binned_within_bounds(conv_analysed):
    """A batch far wider than the ones before (an outlier ×1e4, a padded mask's extreme after an unpadded one) made
    ONNX Runtime's collector ask for millions of bins at the first batch's width, or petabytes: the bins so far are
    coarsened onto the wider range instead, and the range and its percentiles come out of every batch."""
    from autoprec.analysis.calibrate import MAX_BINS

    info, dataset = conv_analysed
    batches = [{name: value * (1e7 if i % 2 else 1.0) for name, value in batch.items()}
               for i, batch in enumerate(dataset.calibration[:4])]
    ranges = calibrate(info, batches, "outliers")
    seen = _activations(info, batches, list(ranges.tensors))
    for name, found in ranges.tensors.items():
        assert len(found.hist) <= MAX_BINS and found.hist.sum() == seen[name].size
        assert found.min == pytest.approx(float(seen[name].min()), rel=1e-5)
        assert found.max == pytest.approx(float(seen[name].max()), rel=1e-5)
        assert 0 <= found.amax("percentile-99.99") <= max(abs(found.min), abs(found.max)) * (1 + 1e-6)


def test_fp16_counts_and_ranges_are_those_of_the_values_seen(tmp_path):
    """Each tensor's counts (values, below FP16's smallest subnormal, subnormal, beyond its largest) and range are
    what the calibration batches held, NaNs and infinities counted and left out of the range."""
    from onnx import TensorProto, helper

    from autoprec.analysis.calibrate import FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL

    # a column for each kind of value; the last two -inf, and NaN or -inf
    scale = np.array([1e-9, 1e-6, 1e5, 1.0, 1.0, np.inf], np.float32)
    mask = np.array([0, 0, 0, 0, -np.inf, -np.inf], np.float32)
    model = builders._model(
        [helper.make_node("Mul", ["x", "scale"], ["scaled"], "scale"), helper.make_node("Add", ["scaled", "mask"], ["s"], "mask"),
         helper.make_node("MatMul", ["s", "w"], ["y"], "mm")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [builders._init("scale", scale), builders._init("mask", mask), builders._init("w", np.ones((6, 2)))])
    path = builders.save(model, tmp_path / "scaled.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(size=(16, 6)).astype(np.float32))
    info = analyse(path, load_search_space())
    data = build_dataset(tmp_path / "x.npz", info.inputs)
    ranges = calibrate(info, data.calibration, data.fingerprint())
    with np.errstate(invalid="ignore"):
        seen = np.concatenate([(b["x"] * scale + mask).ravel() for b in data.calibration])
    magnitude = np.abs(seen)
    with np.errstate(invalid="ignore"):
        assert ranges["s"].counts == (
            seen.size, np.count_nonzero((magnitude > 0) & (magnitude < FP16_MIN_SUBNORMAL)),
            np.count_nonzero((magnitude >= FP16_MIN_SUBNORMAL) & (magnitude < FP16_MIN_NORMAL)),
            np.count_nonzero(magnitude > FP16_MAX))
    assert all(ranges["s"].counts[1:]) and np.isnan(seen).any()  # (each kind is there to count)
    finite = seen[np.isfinite(seen)]
    assert (ranges["s"].min, ranges["s"].max) == pytest.approx((finite.min(), finite.max()))
    assert int(ranges["s"].hist.sum()) == finite.size


@pytest.mark.parametrize("make", [builders.conv_net, builders.residual_net, lambda: builders.residual_net(bias_as_add=True),
                                  builders.attention, builders.transformer_block, builders.classifier, builders.mlp],
                         ids=["conv", "residual", "residual-bias-add", "attention", "transformer", "classifier", "mlp"])
def test_the_search_calibrates_every_tensor_a_lowering_quantizes_and_trt10_every_node(make, tmp_path):
    """The search histograms fewer tensors than every node output in a unit (TensorRT 10's cache wants those), and
    lowering any plan in either Q/DQ form with its ranges makes the very graph that every node's ranges make."""
    from autoprec.analysis.calibrate import ActivationRanges, every_node_tensors
    from autoprec.core.plan import Precision
    from autoprec.lower import QDQForm, lower_plan

    info = analyse(builders.save(make(), tmp_path / "m.onnx"), load_search_space())
    data = build_dataset(None, info.inputs, random_count=4)
    every = calibrate(info, data.calibration, data.fingerprint(), tensors=every_node_tensors(info))
    searched = ActivationRanges({t: every[t] for t in collected_tensors(info)})
    assert set(searched.tensors) <= set(every.tensors)
    int8 = [u.name for u in info.units if Precision.INT8 in u.allowed]
    for plan in (info.plan_at(Precision.INT8), info.plan_at(Precision.INT8, int8[::2])):
        for form in QDQForm:
            assert lower_plan(info, plan, searched, form).proto == lower_plan(info, plan, every, form).proto

"""Models of any size: the weights stay on disk, once; what a candidate costs is its own graph, not the model.

The model over 2 GB here is a table of mostly zeros (a hole in its data file), so the test costs seconds:
protobuf's limit is the same for zeros as for weights (benchmarks/scale.py searches real-sized ones).
"""

import json
import os
import re
import stat
from pathlib import Path

import builders
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import searching
from searching import main

import autoprec
from autoprec.analysis.model import analyse
from autoprec.core import stored
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan

PROTOBUF_LIMIT = 2**31


def _ids(path, items=8, used=256):
    np.savez(path, ids=np.random.default_rng(0).integers(0, used, (items, 8)).astype(np.int64))
    return path


@pytest.fixture(scope="module")
def over_2gb(tmp_path_factory):
    folder = tmp_path_factory.mktemp("huge")
    model = builders.embedding_over_2gb(folder / "huge.onnx")
    return model, _ids(folder / "ids.npz")


# The shipped plan's weights: the re-timing picks it (all-FP32 or, where it times faster, FP16: half the 2.1 GB).
SHIPPED_LEAST = PROTOBUF_LIMIT // 2


def test_a_model_over_2gb_is_searched_its_best_model_runs_and_exports_with_its_weights_beside_it(over_2gb, tmp_path):
    """One search of the 2 GB model (each costs a minute of the suite's two cores) serves the search's own
    result and the exports for TensorRT and Triton."""
    model, data = over_2gb
    assert stored.weight_bytes(onnx.load(str(model), load_external_data=False)) > PROTOBUF_LIMIT
    out = tmp_path / "out"
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=3, warm_start=False), out=out
        )
    )
    assert result.chosen is not None and result.model.external_data and result.model.weight_bytes > PROTOBUF_LIMIT
    best = out / "best"
    assert (best / "model.onnx").stat().st_size < 1 << 20  # the graph; the weights beside it
    assert (best / "model.data").stat().st_size > SHIPPED_LEAST
    ids = np.load(data)["ids"][:1]
    got = ort.InferenceSession(str(best / "model.onnx")).run(None, {"ids": ids})[0]
    want = ort.InferenceSession(str(model)).run(None, {"ids": ids})[0]
    assert got.shape == want.shape and np.allclose(got, want, rtol=0.1, atol=0.1)
    prepared = [p for p in (out / "cache").iterdir() if p.name.startswith("prepared-")]
    assert (
        len(prepared) == 1
        and (prepared[0] / "given" / "huge.onnx.data").stat().st_size
        == (model.parent / "huge.onnx.data").stat().st_size
    )
    for fmt, name in (("trtexec", "model.onnx"), ("trt10", "model_fp32.onnx")):
        folder = tmp_path / fmt
        assert main(["export", str(out), "--format", fmt, "--out", str(folder)]) == 0
        assert (folder / f"{name}.data").stat().st_size > (PROTOBUF_LIMIT if fmt == "trt10" else SHIPPED_LEAST)
        onnx.checker.check_model(str(folder / name))  # a valid model with its external data beside it
    assert main(["export", str(out), "--format", "triton", "--out", str(tmp_path / "triton")]) == 0
    assert (tmp_path / "triton" / "huge" / "1" / "model.onnx.data").stat().st_size > SHIPPED_LEAST


def test_weights_given_as_external_data_stay_external_and_are_copied_once(tmp_path):
    model = builders.with_external_data(builders.conv_net(), tmp_path / "conv.onnx")
    data = tmp_path / "data.npz"
    np.savez(data, x=builders.image_like(8))
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=4), out=out)
    )
    assert (out / "best" / "model.data").is_file()  # as the model came: weights beside it
    # readable as the graph is (a server running as another user reads both)
    assert _mode(out / "best" / "model.data") == _mode(out / "best" / "model.onnx") == 0o666 & ~_umask()
    assert not any(i.HasField("raw_data") and len(i.raw_data) > stored.INLINE_BYTES
                   for i in onnx.load(str(out / "best" / "model.onnx"), load_external_data=False).graph.initializer)
    assert ort.InferenceSession(str(out / "best" / "model.onnx")).run(None, {"x": np.load(data)["x"][:1]})[0].shape == (
        1,
        5,
    )
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=5), out=out)
    )  # resumed: the preparation is read again
    assert len([p for p in (out / "cache").iterdir() if p.name.startswith("prepared-")]) == 1
    assert onnx.load(str(model)).graph.initializer  # the given model loads as before (no link of ours on its files)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_small_model_exports_in_one_file_and_a_large_one_beside_its_data(tmp_path, monkeypatch):
    model, data = builders.conv_with_data(tmp_path, 8)
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=3), out=out)
    )
    assert not (out / "best" / "model.data").exists()
    monkeypatch.setattr(stored, "EXTERNAL_EXPORT_BYTES", 1024)  # as if the weights were a gigabyte
    assert main(["export", str(out), "--format", "trtexec", "--out", str(tmp_path / "trt")]) == 0
    assert (tmp_path / "trt" / "model.onnx.data").is_file()
    assert _mode(tmp_path / "trt" / "model.onnx.data") == _mode(tmp_path / "trt" / "model.onnx")
    assert ort.InferenceSession(str(tmp_path / "trt" / "model.onnx")).run(None, {"x": np.load(data)["x"][:1]})[
        0
    ].shape == (1, 5)


def test_lowering_one_unit_leaves_the_rest_of_the_graph_as_it_was(tmp_path):
    """A candidate is the prepared graph with its lowered units edited: every other node unchanged, in order,
    the Q/DQ pairs just before the unit, no weight copied."""
    path = builders.save(builders.mlp(), tmp_path / "mlp.onnx")
    info = analyse(path, load_search_space())
    from autoprec.analysis.calibrate import calibrate
    from autoprec.analysis.data import build_dataset

    dataset = build_dataset(None, info.inputs)
    ranges = calibrate(info, dataset.calibration, dataset.fingerprint())
    for form in QDQForm:
        lowered = lower_plan(info, info.plan_at(Precision.INT8, ["fc1"]), ranges, form)
        changed = {
            "fc1",
            *(["bias1"] if form is QDQForm.ORT_CPU else []),
        }  # ONNX Runtime's form: its reader reads the DQ
        original = [n.SerializeToString() for n in info.model.graph.node if n.name not in changed]
        kept = [n.SerializeToString() for n in lowered.graph.node if n.name in {m.name for m in info.model.graph.node}
                and n.name not in changed]
        assert kept == original
        names = [n.name for n in lowered.graph.node]
        assert names.index("h0_quantize") < names.index("h0_dequantize") < names.index("fc1")
        builders.check(lowered)
        assert "w1" not in {t.name for t in lowered.graph.initializer}  # its INT8 copy replaced it
    assert json.loads((info.folder / "prepared.json").read_text())["notes"] == list(info.notes)


def test_a_preparation_killed_half_way_is_cleaned_up_and_done_again(tmp_path):
    model, data = builders.conv_with_data(tmp_path, 8)
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=2, warm_start=False), out=out
        )
    )
    prepared = next(p for p in (out / "cache").iterdir() if p.name.startswith("prepared-"))
    key = prepared.name.removeprefix("prepared-")
    stale = out / "cache" / f".prepared-{key}.999999999.staging"  # a process that is gone
    stale.mkdir()
    (stale / "model.onnx.data").write_bytes(b"half")
    import shutil

    shutil.rmtree(prepared)  # as if it was killed before its rename
    searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=3, warm_start=False), out=out
        )
    )
    assert not stale.exists() and (out / "cache" / f"prepared-{key}" / "prepared.json").is_file()


def _external_mlp(folder, location="mlp.onnx.data"):
    """The MLP saved with its weights in ``location`` beside it; returns the path and the loaded skeleton."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mlp.onnx"
    onnx.save_model(builders.mlp(), str(path), save_as_external_data=True, location=location, size_threshold=1024)
    return path, onnx.load(str(path), load_external_data=False)


def _set_field(path, model, key, value):
    tensor = next(t for t in model.graph.initializer if t.external_data)
    next(e for e in tensor.external_data if e.key == key).value = value
    onnx.save(model, str(path))
    return tensor.name


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "offset",
            "-4096",
            r"says offset -4096, length \d+ in 'mlp.onnx.data', but its type and dims take \d+ bytes; re-save",
        ),
        (
            "length",
            "16",
            r"says offset \d+, length 16 in 'mlp.onnx.data', but its type and dims take \d+ bytes; re-save",
        ),
        ("offset", "abc", r"has unreadable external-data fields .*'offset': 'abc'.*; re-save"),
    ],
)
def test_external_data_fields_that_cannot_be_right_get_one_line_naming_the_tensor(
    tmp_path, capsys, key, value, message
):
    path, model = _external_mlp(tmp_path / "m")
    name = _set_field(path, model, key, value)
    assert main(["search", str(path), "--budget", "2", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "a bug in autoprec" not in err
    assert re.search(f"tensor '{re.escape(name)}' " + message, err), err
    assert not (tmp_path / "out" / "cache").exists() or not any((tmp_path / "out" / "cache").iterdir())


def test_a_data_file_reached_through_a_symbolic_link_is_named_as_one(tmp_path, capsys):
    path, _ = _external_mlp(tmp_path / "m")
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (tmp_path / "m" / "mlp.onnx.data").rename(blobs / "abc123")
    (tmp_path / "m" / "mlp.onnx.data").symlink_to(blobs / "abc123")  # as a Hugging Face cache keeps files
    assert main(["search", str(path), "--budget", "2", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert "'mlp.onnx.data', a symbolic link" in capsys.readouterr().err


@pytest.mark.parametrize("location", ["prepared.json", "model.onnx", "source.data"])
def test_data_files_named_like_the_caches_own_files_are_kept_apart_from_them(tmp_path, location):
    path, _ = _external_mlp(tmp_path / "m", location)
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(path), study=autoprec.StudySpec(budget=2), out=out)
    )
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(path), study=autoprec.StudySpec(budget=3), out=out)
    )  # resumed: the kept preparation is whole
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    assert ort.InferenceSession(str(out / "best" / "model.onnx")).run(None, {"x": x})[0].shape == (4, 3)


def test_an_export_into_the_searched_models_folder_is_refused_and_the_model_kept(tmp_path, capsys):
    path, _ = _external_mlp(tmp_path / "m")
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(path), study=autoprec.StudySpec(budget=2), out=out)
    )
    assert main(["export", str(out), "--format", "trtexec", "--trial", "0", "--out", str(path.parent)]) == 2
    assert "the export's model.onnx and weights would overwrite files there" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before


def test_a_changed_model_is_refused_before_its_weights_are_copied_again(tmp_path, capsys):
    path, _ = _external_mlp(tmp_path / "m")
    out = tmp_path / "out"
    searching.search(
        autoprec.SearchConfig(autoprec.InputSpec(path), study=autoprec.StudySpec(budget=2), out=out)
    )
    data = path.parent / "mlp.onnx.data"
    changed = bytearray(data.read_bytes())
    changed[-4:] = b"\x00\x00\x80\x3f"
    data.write_bytes(bytes(changed))
    assert main(["export", str(out), "--format", "trtexec", "--trial", "0", "--out", str(tmp_path / "trt")]) == 2
    assert "its weights or external data changed" in capsys.readouterr().err
    assert len([p for p in (out / "cache").iterdir() if p.name.startswith("prepared-")]) == 1


def test_judging_the_chosen_plan_and_checking_it_against_the_given_file_hold_one_session_at_a_time(tmp_path,
                                                                                                  monkeypatch):
    """The held-out judging of a plan and the deployment checks against the given file (both in the search's own
    process) have one model's session alive at a time: a 2 GB model's weights are never held twice there (the
    judge kept an FP32 session for the rest of the search, and the check ran the given file beside the plan)."""
    import weakref

    from autoprec.analysis.baseline import load_baseline
    from autoprec.measure.accuracy import Metric
    from autoprec.measure.confirmation import held_out_judge
    from autoprec.measure.deployment import deploy

    alive, most = weakref.WeakSet(), []

    class Counted(ort.InferenceSession):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            alive.add(self)
            most.append(len(alive))

    model, data = builders.conv_with_data(tmp_path, 12)
    baseline = load_baseline(model, load_search_space(), data)
    info, ranges = baseline.info, baseline.ranges
    lower = lambda graph: lower_plan(graph, info.plan_at(Precision.INT8), ranges, QDQForm.ORT_CPU)  # noqa: E731
    judge = held_out_judge(info.stored, baseline.dataset, Metric("cosine"))
    monkeypatch.setattr(ort, "InferenceSession", Counted)
    assert 0 < judge.loss(lower(info)) < 0.1 and max(most) == 1, most
    checks = deploy(info, lower, None, baseline.dataset.evaluation[:2]).checks
    assert checks and all(c.loss is not None for c in checks) and max(most) == 1 and len(most) > 2, most


def _prepacks(session) -> bool:
    try:
        return session.get_session_options().get_session_config_entry("session.disable_prepacking") != "1"
    except RuntimeError:  # not set: ONNX Runtime's default, prepacking on
        return True


def test_a_heavy_models_judged_sessions_copy_no_weights_and_give_the_timed_sessions_outputs(tmp_path, monkeypatch):
    """A session autoprec only judges (its own runs, the sensitivity pass's plans) of a model at UNPACKED_FROM_BYTES
    is built without ONNX Runtime's prepacking, the second copy of the weights a timed session keeps as a deployment's
    does; its outputs are the timed session's, bit for bit on an INT8 plan. A lighter model's keep it; the given file,
    checked against the shipped plan, goes by its own weights (made to fail by never setting the option, by setting it
    on the timed runner too, and by sizing the given file's session by the plan's weights)."""
    from autoprec.analysis import preparation
    from autoprec.analysis.baseline import load_baseline
    from autoprec.backends import get_backend

    model, data = builders.conv_with_data(tmp_path, 4)
    baseline = load_baseline(model, load_search_space(), data)
    info, engine, batch = baseline.info, get_backend("ort-cpu"), baseline.dataset.evaluation[0]
    plan = engine.lower(info, info.plan_at(Precision.INT8), baseline.ranges)
    with engine.judging_runner(plan) as light:
        assert _prepacks(light.session) and _prepacks(preparation.cpu_session(info.stored))
    monkeypatch.setattr(preparation, "UNPACKED_FROM_BYTES", plan.weight_bytes())
    with engine.runner(plan) as timed, engine.judging_runner(plan) as judged:
        assert _prepacks(timed.session) and not _prepacks(judged.session)
        assert all(np.array_equal(timed.run(batch)[k], v) for k, v in judged.run(batch).items())
    assert not _prepacks(preparation.cpu_session(info.stored))

    # the shipped plan checked against the given file: that file's session goes by the given weights, not the plan's
    from autoprec.measure.deployment import deploy

    given = []

    class Seen(ort.InferenceSession):
        def __init__(self, path, *args, **kwargs):
            super().__init__(path, *args, **kwargs)
            if Path(path) == info.path:
                given.append(_prepacks(self))

    monkeypatch.setattr(preparation, "UNPACKED_FROM_BYTES", info.stored.weight_bytes())
    assert plan.weight_bytes() < preparation.UNPACKED_FROM_BYTES  # the INT8 plan alone is light
    monkeypatch.setattr(preparation.onnxruntime, "InferenceSession", Seen)
    lower = lambda graph: engine.lower(graph, info.plan_at(Precision.INT8), baseline.ranges)  # noqa: E731
    assert deploy(info, lower, None, baseline.dataset.evaluation[:1]).checks and given == [False], given


@pytest.mark.parametrize("in_kernel", [True, False])
def test_a_tensor_whose_bytes_begin_in_a_hole_of_its_file_is_copied_where_it_belongs(tmp_path, monkeypatch, in_kernel):
    """A sparse data file's tensor — unwritten (a hole) first, then values, then a hole again — copied into a data file
    that already holds bytes keeps its values at their place, and its holes (made to fail by opening the target to
    append, which wrote the values where the first hole was; ``in_kernel``: os.copy_file_range, else chunks)."""
    if not in_kernel:
        monkeypatch.delattr(stored.os, "copy_file_range", raising=False)
    values = np.zeros((3 << 20,), np.float32)
    values[2 << 20: (2 << 20) + 1000] = np.arange(1000, dtype=np.float32) + 1
    with open(tmp_path / "sparse.data", "wb") as f:
        f.seek(8 << 20)
        f.write(values[2 << 20: (2 << 20) + 1000].tobytes())
        f.truncate(values.nbytes)
    tensor = onnx.TensorProto(name="table", data_type=onnx.TensorProto.FLOAT, dims=[3 << 20])
    stored._set_external(tensor, "sparse.data", 0, values.nbytes)
    (tmp_path / "out").mkdir()
    writer = stored.DataWriter(tmp_path / "out", "copied.data")
    writer.add(onnx.numpy_helper.from_array(np.ones(10, np.float32), "before"))
    writer.copy(tensor, tmp_path)
    writer.close()
    assert np.array_equal(stored.read_tensor(tensor, tmp_path / "out"), values)
    assert os.stat(tmp_path / "out" / "copied.data").st_blocks * 512 < values.nbytes // 2  # the holes stay holes


def test_a_heavy_models_all_fp32_plan_meets_its_reference_at_a_loss_of_exactly_0(tmp_path, monkeypatch):
    """The FP32 reference of a model whose autoprec-only sessions go unpacked is still computed as a timed session
    computes it (prepacked: an FP32 MatMul of 256 sums differs in its last bits unpacked), so the all-FP32 plan, timed
    and judged on its prepacked session, scores a loss of exactly 0 (made to fail by computing the reference
    unpacked: a loss of 4.3e-7, FP32's own rounding in another order)."""
    from autoprec.analysis import preparation
    from autoprec.analysis.baseline import load_baseline
    from autoprec.backends import get_backend
    from autoprec.measure.accuracy import Judge, Metric
    from autoprec.measure.measurement import measure

    monkeypatch.setattr(preparation, "UNPACKED_FROM_BYTES", 1)  # every model heavy
    path = builders.save(builders.mlp(features=256, hidden=256), tmp_path / "mlp.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(size=(16, 256)).astype(np.float32))
    baseline = load_baseline(path, load_search_space(), tmp_path / "x.npz")
    engine, info, batches = get_backend("ort-cpu"), baseline.info, baseline.dataset.evaluation
    fp32 = engine.lower(info, info.plan_at(Precision.FP32), baseline.ranges)
    assert measure(engine, fp32, batches, Judge(Metric(), baseline.reference)).loss == 0.0


def test_a_tensor_past_the_end_of_its_data_file_is_refused_not_copied_as_zeros(tmp_path):
    """A data file shorter than a tensor's range (cut off after the model was checked) is said, naming the file, not
    copied as zeros (the end read as a hole; made to fail by dropping the size check)."""
    (tmp_path / "short.data").write_bytes(b"\1" * 4096)
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.UINT8, dims=[8192])
    stored._set_external(tensor, "short.data", 0, 8192)
    writer = stored.DataWriter(tmp_path, "copied.data")
    with pytest.raises(OSError, match="short.data: ends 4096 bytes short"):
        writer.copy(tensor, tmp_path)
    writer.close()

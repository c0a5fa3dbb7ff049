"""What every engine promises the measurer (autoprec/backends/base.py), one suite run over every engine the registry
names, as Optuna's storage tests run one suite over every storage: each way an engine can be made here is a
parameter of the ``backend`` fixture (``WAYS``).

ONNX Runtime's CPU provider runs for real; its CUDA and TensorRT providers where onnxruntime-gpu and a GPU are here
(skipped otherwise). TensorRT and TensorRT for RTX run through the recording fake (tests/fake_tensorrt.py: the real
backend code, a fake module that builds nothing and runs the graph with ONNX Runtime). TensorRT for RTX's real
builder, where it is installed, runs what needs no GPU (describing itself, lowering, building, refusing); loading an
engine is refused here, as the contract says a failure must be: a BackendError. A new engine is one more ``Way``."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import builders
import fake_tensorrt as fake
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autoprec.backends import BACKENDS, Backend, backend_class, get_backend
from autoprec.backends.tensorrt import TENSORRT_RTX
from autoprec.core.errors import BackendError
from autoprec.core.plan import Precision
from autoprec.core.timing import Timing
from autoprec.lower import QDQForm
from autoprec.record.trial import EngineInfo

RTX_4090 = [{"name": "NVIDIA GeForce RTX 4090", "driver": "580", "compute_capability": "8.9"}]
NO_SUCH_OP = "NoSuchOp"  # an op no engine has: every engine must refuse a model holding it


@dataclass(frozen=True)
class Way:
    """One way to make an engine here: ``make(monkeypatch, tmp_path)`` returns it (or skips, saying why)."""

    backend: str  # its name in the registry
    how: str  # the test id
    make: Callable[[pytest.MonkeyPatch, object], Backend]
    cannot_run: str = ""  # why its engines cannot run here ("": they run)


def _ort_cpu(monkeypatch, tmp_path) -> Backend:
    return get_backend("ort-cpu")


def _ort_cuda(monkeypatch, tmp_path) -> Backend:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("ONNX Runtime here has no CUDA provider (onnxruntime-gpu and an NVIDIA GPU): run on the GPU machine")
    return get_backend("ort-cuda")


def _ort_tensorrt(monkeypatch, tmp_path) -> Backend:
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        pytest.skip("ONNX Runtime here has no TensorRT provider (onnxruntime-gpu with TensorRT's libraries and an "
                    "NVIDIA GPU): never run by autoprec's developers")
    try:
        return get_backend("ort-tensorrt", cache_dir=tmp_path / "cache")
    except BackendError as exc:  # onnxruntime-gpu lists it, TensorRT's libraries are missing (the GPU machine)
        pytest.skip(str(exc))


def _the_fake_as(monkeypatch, module_name: str, version: str, gpus: list[dict]) -> None:
    """The recording fake imported as ``module_name``, its CUDA for cuda-python's, ``gpus`` for nvidia-smi's; its
    parser refusing NO_SUCH_OP, as TensorRT's has no importer for an op it does not know."""
    module = fake.reset(version)
    module.__name__ = module_name
    fake.PARSER_REJECTS.add(NO_SUCH_OP)
    monkeypatch.setitem(sys.modules, module_name, module)
    monkeypatch.setattr("autoprec.backends.tensorrt.cuda_api", lambda device, flavour: fake.FakeCuda())
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: gpus)


def _tensorrt_fake(monkeypatch, tmp_path) -> Backend:
    _the_fake_as(monkeypatch, "tensorrt", "11.4.0.106", fake.GPUS)
    return get_backend("tensorrt", cache_dir=tmp_path / "cache")


def _tensorrt_rtx_fake(monkeypatch, tmp_path) -> Backend:
    _the_fake_as(monkeypatch, "tensorrt_rtx", "1.7.1.116", RTX_4090)
    return get_backend("tensorrt-rtx", cache_dir=tmp_path / "cache")


def _tensorrt_rtx_real(monkeypatch, tmp_path) -> Backend:
    if not any(importlib.util.find_spec(m) for m in TENSORRT_RTX.modules):
        pytest.skip("TensorRT for RTX is not installed (pip install '.[tensorrt-rtx]')")
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: RTX_4090)  # builds need no GPU
    return get_backend("tensorrt-rtx", cache_dir=tmp_path / "cache")


WAYS = [
    Way("ort-cpu", "ort-cpu", _ort_cpu),
    Way("ort-cuda", "ort-cuda", _ort_cuda),
    Way("ort-tensorrt", "ort-tensorrt", _ort_tensorrt),
    Way("tensorrt", "tensorrt-recording-fake", _tensorrt_fake),
    Way("tensorrt-rtx", "tensorrt-rtx-recording-fake", _tensorrt_rtx_fake),
    Way("tensorrt-rtx", "tensorrt-rtx-real-builder", _tensorrt_rtx_real,
        cannot_run="TensorRT for RTX's engines load on a GPU it runs on, and this machine has none"),
]


@pytest.fixture(params=WAYS, ids=[w.how for w in WAYS])
def way(request) -> Way:
    return request.param


@pytest.fixture
def backend(way, monkeypatch, tmp_path) -> Backend:
    return way.make(monkeypatch, tmp_path)


def runs_here(way: Way) -> None:
    if way.cannot_run:
        pytest.skip(way.cannot_run)


def plans(info):
    """The all-FP32, all-FP16 and all-INT8 plans of the model (every unit that allows the precision at it)."""
    return {p: info.plan_at(p) for p in Precision}


def ops(model) -> set[str]:
    return {n.op_type for n in model.proto.graph.node}


def test_every_registered_engine_is_made_one_way_or_more():
    assert {w.backend for w in WAYS} == set(BACKENDS)


def test_it_is_the_registered_class_and_says_what_it_can(backend):
    assert backend.name in BACKENDS and type(backend) is backend_class(backend.name)
    assert isinstance(backend.has_threads, bool) and isinstance(backend.uses_device, bool)
    assert isinstance(backend.one_shape_only, str) and backend.is_reference == (backend.name == "ort-cpu")
    assert set(backend.slow_precisions) <= set(Precision) and all(backend.slow_precisions.values())
    for said in (backend.float32_ops, backend.float_int8_ops):  # op type -> why, in words
        assert all(isinstance(op, str) and why for op, why in said.items())
    assert backend.default_build_workers >= 1 and backend.default_proposals >= 0
    assert isinstance(backend.qdq_form, QDQForm)


def test_its_info_names_the_engine_the_device_and_the_form(backend):
    info = backend.info()
    assert info.backend == backend.name and info.qdq_form == backend.qdq_form.value
    assert info.engine and info.version and info.device and info.timing  # what its latencies are, in words
    assert EngineInfo.from_json(json.loads(json.dumps(info.to_json()))) == info  # stored with every measurement
    assert info.device in info.label() and info.version in info.label()


def test_threads_are_set_where_it_has_them_and_refused_where_it_has_none(backend):
    if backend.has_threads:
        assert re.search(r"\b2 (CPU )?threads", get_backend(backend.name, threads=2).info().device)
    else:
        with pytest.raises(BackendError, match=f"--threads 2: .*--backend {backend.name} has no such setting"):
            get_backend(backend.name, threads=2)


def test_without_threads_given_onnx_runtime_takes_autoprec_threads(monkeypatch):
    """AUTOPREC_THREADS is --threads' default (several searches, or a test suite's processes, sharing the cores);
    --threads given wins; a value that is no count is one line naming it."""
    monkeypatch.setenv("AUTOPREC_THREADS", "3")
    engine = get_backend("ort-cpu")
    assert engine.info().device.endswith("(3 threads)") and engine.session_options().intra_op_num_threads == 3
    assert get_backend("ort-cpu", threads=2).session_options().intra_op_num_threads == 2
    monkeypatch.delenv("AUTOPREC_THREADS")
    engine = get_backend("ort-cpu")
    assert engine.info().device.endswith("default threads)") and engine.session_options().intra_op_num_threads == 0
    monkeypatch.setenv("AUTOPREC_THREADS", "two")
    with pytest.raises(BackendError, match="AUTOPREC_THREADS='two': a whole number of ONNX Runtime threads"):
        get_backend("ort-cpu")
    monkeypatch.setenv("AUTOPREC_THREADS", "100000")  # as --threads 100000 is
    with pytest.raises(BackendError, match="AUTOPREC_THREADS=100000: more than 4× this machine's"):
        get_backend("ort-cpu")


def _spin_cpu_seconds(run) -> float:
    """The process's CPU seconds in the 0.1 s after one run, its own thread asleep: the thread pool spinning."""
    run()
    cpu = time.process_time()
    time.sleep(0.1)
    return time.process_time() - cpu


def test_onnx_runtime_sessions_leave_the_cores_idle_between_runs(tmp_path):
    """A session autoprec times or runs itself stops its threads when a run returns, so that the session timed next
    in an interleaved round has the cores; a plain session's threads spin on for about 40 ms (made to fail by
    building autoprec's sessions without session.force_spinning_stop)."""
    from autoprec.analysis.preparation import cpu_session
    from autoprec.core.stored import StoredModel

    model = StoredModel(builders.mlp(batch=64, features=512, hidden=512), tmp_path)
    feeds = {"x": np.ones((64, 512), np.float32)}
    with model.file() as path:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        plain = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        spun = statistics.median(_spin_cpu_seconds(lambda: plain.run(None, feeds)) for _ in range(3))
    with get_backend("ort-cpu", threads=2).runner(model) as runner:
        timed = statistics.median(_spin_cpu_seconds(lambda: runner.run(feeds)) for _ in range(3))
    own = cpu_session(model)
    judged = statistics.median(_spin_cpu_seconds(lambda: own.run(None, feeds)) for _ in range(3))
    idle = statistics.median(_spin_cpu_seconds(lambda: None) for _ in range(3))  # the process's other threads
    assert max(timed, judged) - idle <= 0.25 * (spun - idle) + 0.002, (timed, judged, spun, idle)


def test_each_plan_is_lowered_in_the_engines_form(backend, conv):
    info, _, ranges = conv
    lowered = {p: backend.lower(info, plan, ranges) for p, plan in plans(info).items()}
    for model in lowered.values():
        builders.check(model)
        assert [o.name for o in model.proto.graph.output] == [o.name for o in info.outputs]
    assert not ops(lowered[Precision.FP32]) & {"QuantizeLinear", "DequantizeLinear", "Cast"}
    assert "Cast" in ops(lowered[Precision.FP16])
    int8 = lowered[Precision.INT8]
    zero_points = [int8.tensor(n.input[2]) for n in int8.proto.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points
    if backend.qdq_form is QDQForm.ORT_CPU:  # unsigned activations: what ONNX Runtime's integer kernels take
        assert {z.dtype for z in zero_points} == {np.dtype(np.uint8)}
    else:  # signed and symmetric: what TensorRT fuses into INT8 kernels
        assert {z.dtype for z in zero_points} == {np.dtype(np.int8)} and not any(z.any() for z in zero_points)


def test_an_all_fp32_plan_runs_as_the_model_does_and_is_timed(way, backend, conv):
    runs_here(way)
    info, data, ranges = conv
    batch = data.evaluation[0]
    expected = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"]).run(None, batch)
    with backend.runner(backend.lower(info, plans(info)[Precision.FP32], ranges)) as runner:
        outputs = runner.run(batch)
        timing = runner.time(batch)
        report = runner.build_report()
    assert list(outputs) == [o.name for o in info.outputs]
    for found, want in zip(outputs.values(), expected):
        assert isinstance(found, np.ndarray)  # on the host
        np.testing.assert_allclose(found, want, rtol=1e-4, atol=1e-5)
    assert isinstance(timing, Timing) and timing.runs >= 1 and timing.warmup >= 1
    assert 0 < timing.p10_ms <= timing.median_ms <= timing.p90_ms
    assert report is None or json.loads(json.dumps(report)) == report  # stored with the trial


def test_every_precision_runs_with_the_models_outputs(way, backend, conv):
    runs_here(way)
    info, data, ranges = conv
    batch = data.evaluation[0]
    session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
    expected = {o.name: (v.shape, v.dtype) for o, v in zip(session.get_outputs(), session.run(None, batch))}
    for precision, plan in plans(info).items():
        with backend.runner(backend.lower(info, plan, ranges)) as runner:
            outputs = runner.run(batch)
        assert {name: (v.shape, v.dtype) for name, v in outputs.items()} == expected, precision
        assert all(np.isfinite(v).all() for v in outputs.values()), precision


def test_node_times_are_keyed_by_the_lowered_models_nodes(way, backend, conv):
    runs_here(way)
    info, data, ranges = conv
    lowered = backend.lower(info, plans(info)[Precision.FP16], ranges)
    times = backend.node_times(lowered, data.evaluation[0], runs=2)
    if times is not None:  # None: the engine has no profiler
        nodes = {n.name for n in lowered.proto.graph.node}
        assert times and set(times) - {""} <= nodes and all(t >= 0 for t in times.values())
        assert sum(times.values()) > 0
    backend.drop_kept_builds()
    backend.drop_kept_builds()  # forgetting twice is harmless


def test_what_it_cannot_run_is_refused_with_a_backend_error(way, backend, conv):
    """A model holding an op no engine has, and (where engines cannot run here) any model: refused as the one
    error type the measurer turns into a failed trial, never another exception."""
    info, _, ranges = conv
    lowered = backend.lower(info, plans(info)[Precision.FP32], ranges)
    unknown = onnx.ModelProto()
    unknown.CopyFrom(lowered.proto)
    next(n for n in unknown.graph.node if n.op_type == "Relu").op_type = NO_SUCH_OP
    with pytest.raises(BackendError, match=NO_SUCH_OP):
        backend.runner(lowered.with_proto(unknown))
    if way.cannot_run:
        with pytest.raises(BackendError):
            backend.runner(lowered)

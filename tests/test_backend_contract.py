"""What every engine promises the measurer, run by each: ONNX Runtime on the CPU, ONNX Runtime's CUDA provider
(where it can run here), and TensorRT through the recording fake (tests/fake_tensorrt.py: the real backend code,
a fake ``tensorrt`` module that builds nothing and runs the graph with ONNX Runtime). After Optuna's
``StorageTestCase``: a new engine subclasses ``BackendContract`` with a fixture that makes it."""

from __future__ import annotations

import sys

import fake_tensorrt as fake
import numpy as np
import onnxruntime as ort
import pytest

from autoprec.analysis.data import build_dataset
from autoprec.analysis.model import analyse
from autoprec.backends import BACKENDS, Backend, backend_class, get_backend
from autoprec.core.errors import BackendError
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space


@pytest.fixture
def model(conv_model, conv_data):
    info = analyse(conv_model, load_search_space())
    return info, build_dataset(conv_data, info.inputs).evaluation[0]


class BackendContract:
    @pytest.fixture
    def backend(self) -> Backend:
        raise NotImplementedError

    def test_it_is_the_registered_class_and_says_what_it_can(self, backend):
        assert backend.name in BACKENDS and type(backend) is backend_class(backend.name)
        assert isinstance(backend.has_threads, bool) and isinstance(backend.uses_device, bool)
        assert isinstance(backend.one_shape_only, str) and isinstance(backend.is_reference, bool)
        assert set(backend.slow_precisions) <= set(Precision)

    def test_its_info_names_the_engine_the_device_and_the_form(self, backend):
        info = backend.info()
        assert info.backend == backend.name and info.qdq_form == backend.qdq_form.value
        assert info.engine and info.version and info.device and backend.name in info.to_json()["backend"]

    def test_an_all_fp32_plan_runs_as_the_model_does_and_is_timed(self, backend, model):
        info, batch = model
        expected = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"]).run(None, batch)
        with backend.runner(backend.lower(info, info.plan_at(Precision.FP32, [], "minmax"), None)) as runner:
            outputs = runner.run(batch)
            timing = runner.time(batch)
        assert list(outputs) == [o.name for o in info.outputs]
        for found, want in zip(outputs.values(), expected):
            np.testing.assert_allclose(found, want, rtol=1e-4, atol=1e-5)
        assert timing.runs >= 1 and 0 < timing.p10_ms <= timing.median_ms <= timing.p90_ms

    def test_node_times_are_keyed_by_the_lowered_models_nodes(self, backend, model):
        info, batch = model
        lowered = backend.lower(info, info.plan_at(Precision.FP16, [u.name for u in info.searchable_units], "minmax"),
                                None)
        times = backend.node_times(lowered, batch, runs=2)
        if times is not None:  # None: the engine has no profiler
            nodes = {n.name for n in lowered.proto.graph.node}
            assert times and set(times) - {""} <= nodes and all(t >= 0 for t in times.values())
        backend.drop_kept_builds()
        backend.drop_kept_builds()  # forgetting twice is harmless


class TestOrtCpu(BackendContract):
    @pytest.fixture
    def backend(self):
        return get_backend("ort-cpu")


class TestOrtCuda(BackendContract):
    @pytest.fixture
    def backend(self):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            pytest.skip("ONNX Runtime here has no CUDA provider (onnxruntime-gpu and an NVIDIA GPU): run on the "
                        "GPU machine")
        return get_backend("ort-cuda")


class TestOrtTensorRT(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path):
        if "TensorrtExecutionProvider" not in ort.get_available_providers():
            pytest.skip("ONNX Runtime here has no TensorRT provider (onnxruntime-gpu with TensorRT's libraries and an "
                        "NVIDIA GPU): never run by autoprec's developers")
        try:
            return get_backend("ort-tensorrt", cache_dir=tmp_path / "cache")
        except BackendError as exc:  # onnxruntime-gpu lists it, TensorRT's libraries are missing (the GPU machine)
            pytest.skip(str(exc))


class TestTensorRTThroughTheRecordingFake(BackendContract):
    @pytest.fixture
    def backend(self, monkeypatch, tmp_path):
        monkeypatch.setitem(sys.modules, "tensorrt", fake.reset())
        monkeypatch.setattr("autoprec.backends.tensorrt.cuda_api", lambda device, flavour: fake.FakeCuda())
        monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: fake.GPUS)
        return get_backend("tensorrt", cache_dir=tmp_path / "cache")

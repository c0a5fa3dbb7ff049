"""autoprec doctor: each engine call a search makes, as a table; exit 0 only where a search can run."""

import sys

import fake_tensorrt as fake
import pytest
from cli import exit_code

from autoprec.app.doctor import examine


def test_onnx_runtime_cpu_passes_every_step_and_says_a_search_can_run(capsys):
    assert exit_code(["doctor"]) == 0
    out = capsys.readouterr().out
    for step in ("engine", "lower the plan", "load", "execute", "compare with ONNX Runtime CPU", "time", "profile"):
        assert step in out
    assert "FAIL" not in out and out.strip().endswith("a search can run on ort-cpu here")


def test_tensorrt_through_the_recording_fake_runs_every_step(monkeypatch):
    """The fake builds nothing real and runs the graph with ONNX Runtime: what this checks is that the doctor
    makes every call a search makes, in order, and reads what comes back."""
    monkeypatch.setitem(sys.modules, "tensorrt", fake.reset())
    monkeypatch.setattr("autoprec.backends.tensorrt.cuda_api", lambda device, flavour: fake.FakeCuda())
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: fake.GPUS)
    outcomes = {o.step: o for o in examine("tensorrt")}
    assert [name for name, o in outcomes.items() if o.result != "pass"] == []
    assert "3 units at their planned precision" in outcomes["build strongly typed"].said
    assert "min [1, 16] opt [2, 16] max [4, 16]" in outcomes["build with a profile (export)"].said
    assert "timing-cache" in outcomes["timing cache"].said
    assert ("IExecutionContext", "execute_async_v3") in {c[:2] for c in fake.CALLS}


def test_a_missing_engine_fails_its_first_step_with_the_install_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    assert exit_code(["doctor", "--backend", "tensorrt"]) == 2
    out = capsys.readouterr().out
    assert "skipped" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("a search cannot run on tensorrt here: import FAIL: ") and "pip install" in last


def test_a_gpu_the_engine_does_not_run_on_is_not_here_not_a_failure(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", fake.reset())
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: [])
    outcomes = {o.step: o for o in examine("tensorrt")}
    assert outcomes["build strongly typed"].result == "pass"
    assert outcomes["GPU"].result == "not here" and "no NVIDIA GPU" in outcomes["GPU"].said
    assert outcomes["execute"].result == "skipped" and outcomes["execute"].blocks_a_search


@pytest.mark.parametrize("backend", ["ort-cpu"])
def test_every_step_of_a_passing_engine_is_needed_or_said_optional(backend):
    outcomes = examine(backend)
    assert all(o.result == "pass" for o in outcomes) and not any(o.blocks_a_search for o in outcomes)


def test_the_doctor_says_whether_onnx_runtimes_tensorrt_provider_loads():
    """Here: no provider, said at the first step. Where onnxruntime-gpu lists it but TensorRT's libraries do not load,
    ONNX Runtime falls back to CUDA quietly: the load step says so rather than timing CUDA as TensorRT."""
    outcomes = {o.step: o for o in examine("ort-tensorrt")}
    failed = [o for o in outcomes.values() if o.result == "FAIL"]
    assert all("TensorRT" in o.said and o.step == "engine" for o in failed)
    assert failed or all(o.result == "pass" for o in outcomes.values())


def test_a_search_on_tensorrt_stops_at_the_doctors_fast_steps_in_one_line(monkeypatch, capsys, conv_model, tmp_path):
    """TensorRT imports, but this machine has no GPU: refused before the model is analysed or a study made."""
    monkeypatch.setitem(sys.modules, "tensorrt", fake.reset())
    monkeypatch.setattr("autoprec.backends.tensorrt.gpu_facts", lambda: [])
    out = tmp_path / "out"
    assert exit_code(["search", str(conv_model), "--backend", "tensorrt", "--out", str(out)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("autoprec: error: --backend tensorrt: no NVIDIA GPU on this machine")
    assert not (out / "study.db").exists()

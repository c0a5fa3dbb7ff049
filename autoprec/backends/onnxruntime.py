"""ONNX Runtime: the CPU execution provider (the embedded default engine) and the CUDA one."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from autoprec.analysis.data import Batch
from autoprec.analysis.preparation import (
    cpu_optimizers_left_off,
    never_timed,
    quiet_session_options,
)
from autoprec.analysis.subgraphs import all_nodes
from autoprec.backends.base import Backend, Runner
from autoprec.backends.gpus import cores_per_gpu, gpu_facts
from autoprec.backends.int8_sums import int8_sums
from autoprec.core import engines
from autoprec.core.errors import BackendError, first_line
from autoprec.core.plan import Precision
from autoprec.core.stored import StoredModel
from autoprec.core.timing import TIME_CALLS, TRIAL, Runs, Timing, time_calls
from autoprec.lower import Int4Form, QDQForm
from autoprec.record.trial import EngineInfo


@lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class OrtRunner(Runner):
    def __init__(self, session, left_off: tuple[str, ...] = ()):
        self.session, self.left_off = session, left_off
        self.output_names = [o.name for o in session.get_outputs()]

    def build_report(self) -> dict | None:
        return left_off_report(self.left_off)

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(self.output_names, batch)))

    def time(self, batch: Batch, runs: Runs = TRIAL) -> Timing:
        return time_calls(lambda: self.session.run(self.output_names, batch), runs)

    def close(self) -> None:
        # the engine's memory goes now, not when the last name bound to the runner does
        self.session = None


def left_off_report(left_off: tuple[str, ...]) -> dict | None:
    """A runner's build report: the optimizers its session was built without (see
    :func:`new_session`), what a claim on the plan holds with, recorded with the trial, in
    best/plan.json and on the build card; None where there are none (a user's plain session)."""
    return {"disabled_optimizers": list(left_off)} if left_off else None


def session_said(build: dict | None) -> str:
    """How ONNX Runtime sessions of a plan were built, for the lines and the card beside its
    figures: what a user's session needs for the figures to hold."""
    left_off = (build or {}).get("disabled_optimizers")
    if left_off:
        return (f"timed in ONNX Runtime sessions built with disabled_optimizers={left_off} (its "
                "build crashed with them on): build yours so")
    return ("timed in plain ONNX Runtime sessions (every graph optimizer on, as "
            "InferenceSession(model.onnx) builds)")


# How autoprec's ONNX Runtime sessions differ from a plain one (analysis.preparation.quiet_session_options).
QUIET_THREADS = ("each session's threads stop spinning when its run returns (session.force_spinning_stop), so "
                 "the session timed next has the cores")


class OrtNodeTimes:
    """Per-node times from ONNX Runtime's profiler, mapped back to the model's own node names."""

    def node_times(self, model: StoredModel, batch: Batch, runs: int = 10) -> dict[str, float]:
        options = self.session_options()
        with tempfile.TemporaryDirectory(prefix="autoprec-profile-") as folder:
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(folder, "ort")
            session, _ = new_session(self._ort, model, options, self.session_providers())
            names = [o.name for o in session.get_outputs()]
            for _ in range(runs + 1):
                session.run(names, batch)
            with open(session.end_profiling()) as f:
                events = [
                    e for e in json.load(f) if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
                ]
        seen: set[str] = set()
        # each node's first run: warm-up
        timed = [e for e in events if e["name"] in seen or seen.add(e["name"])]
        return attribute_node_times(model.proto, timed, runs)

    threads = 0  # ONNX Runtime's intra-op threads (0: its default, one per core)

    def session_options(self):
        options = quiet_session_options()
        if self.threads:
            options.intra_op_num_threads = self.threads
        return options

    def session_providers(self) -> list:
        return [self.provider]


def attribute_node_times(model: onnx.ModelProto, events: list[dict], runs: int) -> dict[str, float]:
    """Seconds per run for each original node. ORT renames what it rewrites: a layout-converted node
    after its output tensor (``<output>_nchwc``, ``InsertedPrecisionFreeCast_<output>_nchwc`` when
    an FP16 node without an FP16 kernel runs in FP32 between inserted Casts), a fused node after the
    first node it fused (``<node>/<Fusion>`` or ``<node>_<suffix>``, ``fused <that>`` where an
    activation joined it: MatMul+Add+Relu as FusedGemm); layout reorders and other inserted nodes go
    to ``""``."""
    every = all_nodes(model)
    nodes = {n.name for n in every}
    producer = {out: n.name for n in every for out in n.output}
    by_prefix = sorted(nodes, key=len, reverse=True)

    def original(name: str) -> str:
        if name in nodes:
            return name
        name = name.removeprefix("fused ")
        if name in nodes:
            return name
        tensor = name.removeprefix("InsertedPrecisionFreeCast_").removesuffix("_nchwc")
        if name.endswith("_nchwc") and tensor in producer:
            return producer[tensor]
        return next((n for n in by_prefix if name.startswith((n + "/", n + "_"))), "")

    # each name once: every run repeats them (a 300-unit chain's 10 runs took 2.3 s of prefix scans)
    named = {name: original(name) for name in {event["name"][: -len("_kernel_time")] for event in events}}
    times: dict[str, float] = defaultdict(float)
    for event in events:
        times[named[event["name"][: -len("_kernel_time")]]] += event["dur"] * 1e-6 / runs
    return dict(times)


class OrtCpuBackend(OrtNodeTimes, Backend):
    """CPU execution provider, all graph optimisations on.

    Lowers INT8 in the ``ort-cpu`` Q/DQ form (whole node units, uint8 activations): the only
    form ORT's CPU kernels run as integer QLinearConv/QLinearMatMul (see autoprec.lower.qdq).
    """

    name = engines.ORT_CPU
    qdq_form = QDQForm.ORT_CPU
    int4_form = Int4Form.MATMUL_NBITS
    provider = "CPUExecutionProvider"
    uses_device = False
    has_threads = True
    runs_from_a_cut = True
    float32_ops = dict.fromkeys(("LSTM", "GRU", "RNN"), "ONNX Runtime's CPU kernels for recurrent "
                                                        "ops are float32 only "
                                "(in FP16 they would run in FP32 between inserted Casts)")
    float_int8_ops = {"ConvTranspose": "ONNX Runtime's CPU provider has no integer ConvTranspose: "
                                       "it runs its Q/DQ as float ops around a float kernel, "
                                       "slower than FP32"}
    sensitive_ops_fp32 = ("no FP16 kernels on ONNX Runtime's CPU provider, so no FP16 region to "
                          "join: they would run in FP32 between inserted Casts")
    timing = ("per-request latency of one batch: wall time of one synchronous session.run, inputs "
              f"and outputs in host memory; {TIME_CALLS}; {QUIET_THREADS}")

    @classmethod
    def create(cls, device: int, cache_dir: Path | None, threads: int) -> OrtCpuBackend:
        return cls(threads)

    def __init__(self, threads: int = 0):
        import onnxruntime as ort

        self._ort = ort
        self.threads = threads or threads_from_environment()

    def info(self) -> EngineInfo:
        return engine_info(self, f"{cpu_name()} ({self._thread_label()})", {"int8_sums": int8_sums()})

    def _thread_label(self) -> str:
        return f"{self.threads} threads" if self.threads else f"{os.cpu_count()} cores, default threads"

    def runner(self, model: StoredModel) -> OrtRunner:
        return OrtRunner(*new_session(self._ort, model, self.session_options(), [self.provider]))

    def judging_runner(self, model: StoredModel) -> OrtRunner:
        """:meth:`runner`'s session, without prepacking where the model is heavy (see
        :func:`~autoprec.analysis.preparation.never_timed`)."""
        options = never_timed(self.session_options(), model.weight_bytes())
        return OrtRunner(*new_session(self._ort, model, options, [self.provider]))


THREADS_VARIABLE = "AUTOPREC_THREADS"


def threads_from_environment() -> int:
    """``--threads``' default for ONNX Runtime, from AUTOPREC_THREADS where it is set (0 where not: ONNX
    Runtime's own, a thread per core): several searches, or a test suite's processes, sharing a
    machine, each session's threads spinning on every core would slow them all."""
    said = os.environ.get(THREADS_VARIABLE, "").strip()
    if not said:
        return 0
    if not said.isdigit():
        raise BackendError(f"{THREADS_VARIABLE}={said!r}: a whole number of ONNX Runtime threads "
                           f"(0: its default, one per core); set it so or unset it")
    if why := engines.too_many_threads(int(said)):
        raise BackendError(f"{THREADS_VARIABLE}={said}: {why}; set fewer or unset it")
    return int(said)


def engine_info(backend, device: str, versions: dict[str, str] | None = None) -> EngineInfo:
    import onnxruntime as ort

    return EngineInfo(backend.name, "onnxruntime", ort.__version__, backend.provider, device,
                      backend.qdq_form.value, versions=versions or {}, timing=backend.timing,
                      caveat=getattr(backend, "caveat", ""))


def new_session(ort, model: StoredModel, options, providers: list):
    """A session loaded from a file beside the model's weights (memory-mapped, never copied through
    protobuf), with every optimizer but those :func:`cpu_optimizers_left_off` names; and those. (Its
    crash probe, a CPU session's build in a child, only where the CPU provider runs the graph: the
    layout transformer it guards against is that provider's.)"""
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    on_cpu = providers[0] == "CPUExecutionProvider"
    try:
        with model.file() as path:
            left_off = cpu_optimizers_left_off(model.proto, path if on_cpu else None)
            session = ort.InferenceSession(str(path), options, providers=providers,
                                           disabled_optimizers=left_off)
    except Exception as exc:  # ORT raises its own exception types
        raise BackendError(f"onnxruntime cannot load the candidate: {exc}") from None
    return session, tuple(left_off)


class OrtCudaRunner(Runner):
    """Inputs copied to the GPU once and outputs kept there (IO binding), so timing sees GPU work
    only. Where ``per_shape``, one session for each input shape, built when first met: ONNX
    Runtime's CUDA convolutions plan their cuDNN kernels again at every change of input shape (no
    cache of earlier shapes), so one session timed at two shapes in turn planned at every turn
    (about a second on yolov8n at batch 32, exhaustively); each session's latency is its shape's
    either way."""

    def __init__(self, build: Callable[[], tuple[object, tuple[str, ...]]], device: int, per_shape: bool = False):
        self.session, self.left_off = build()
        self.build, self.device, self.per_shape = build, device, per_shape
        self.by_shape: dict[tuple, object] = {}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def build_report(self) -> dict | None:
        return left_off_report(self.left_off)

    def _session(self, batch: Batch):
        """The session that runs ``batch``: the one session, or where ``per_shape``, its shape's."""
        if not self.per_shape:
            return self.session
        shape = tuple((name, np.shape(value)) for name, value in batch.items())
        if shape not in self.by_shape:
            self.by_shape[shape] = self.build()[0] if self.by_shape else self.session
        return self.by_shape[shape]

    def _bound(self, session, batch: Batch):
        """An IO binding of ``session`` with ``batch`` resident on the device; the device arrays are
        returned to keep them alive."""
        from onnxruntime import OrtValue

        binding = session.io_binding()
        resident = [OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), "cuda", self.device) for v in batch.values()]
        for name, value in zip(batch, resident):
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, "cuda", self.device)
        return binding, resident

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        session = self._session(batch)
        binding, _ = self._bound(session, batch)
        session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu()))

    def time(self, batch: Batch, runs: Runs = TRIAL) -> Timing:
        session = self._session(batch)
        binding, resident = self._bound(session, batch)
        session.run_with_iobinding(binding)
        # reuse: no allocation in the timed runs
        for name, value in zip(self.output_names, binding.get_outputs()):
            binding.bind_ortvalue_output(name, value)

        def call() -> None:
            session.run_with_iobinding(binding)
            # the clock stops when the GPU is done, not when the launch returns
            binding.synchronize_outputs()

        return time_calls(call, runs)

    def close(self) -> None:
        self.session, self.by_shape = None, {}


# What ONNX Runtime's CUDA provider plans anew at each change of input shape (cuDNN's frontend).
REPLANNED_OPS = frozenset({"Conv", "ConvTranspose"})


def replanned_at_new_shapes(model: onnx.ModelProto) -> bool:
    """Whether ONNX Runtime's CUDA provider plans some of ``model``'s nodes again at every change of
    input shape (REPLANNED_OPS, in subgraphs too)."""
    return any(node.op_type in REPLANNED_OPS for node in all_nodes(model))

# Each session of a shape holds the weights on the GPU again: a model with more keeps one session, planned again at
# each change of shape, rather than risk the GPU's memory (a 5 GB network judged at four shapes would hold 20 GB).
PER_SHAPE_MAX_WEIGHTS = 1 << 30


class OrtCudaBackend(OrtNodeTimes, Backend):
    """CUDA execution provider on GPU ``device``; cuDNN/cuBLAS found through
    ``onnxruntime.preload_dlls()``.

    FP16 (Cast-lowered) runs on tensor cores. Q/DQ INT8 does not: the CUDA provider runs
    QuantizeLinear/DequantizeLinear as float ops around float kernels (slower than FP32, see
    docs/engines.md), so INT8 is left out of the search unless asked for. Only TensorRT fuses Q/DQ
    into INT8 kernels; candidates are lowered in the TensorRT Q/DQ form so that the plan exported
    from this search builds the same on TensorRT. FP32 follows ORT's default (TF32 allowed in
    cuDNN).
    """

    name = engines.ORT_CUDA
    qdq_form = QDQForm.TENSORRT
    # its CUDA kernel: the DequantizeLinear form would run as float ops
    int4_form = Int4Form.MATMUL_NBITS
    provider = "CUDAExecutionProvider"
    install = "pip uninstall onnxruntime && pip install onnxruntime-gpu, on a machine with an NVIDIA GPU"
    timing = ("per-request latency of one batch: wall time of one run_with_iobinding, inputs and "
              "outputs on the GPU, synchronised after every run (launch overhead counted, not "
              f"hidden by back-to-back runs); {TIME_CALLS}; {QUIET_THREADS}")
    slow_precisions = {
        Precision.INT8: "the CUDA execution provider runs Q/DQ INT8 as float ops, slower than "
                        "FP32; "
        "only TensorRT turns Q/DQ into INT8 kernels",
    }

    has_threads = True
    runs_from_a_cut = True

    @classmethod
    def create(cls, device: int, cache_dir: Path | None, threads: int) -> OrtCudaBackend:
        return cls(device, threads)

    def __init__(self, device: int = 0, threads: int = 0):
        import onnxruntime as ort

        if self.provider not in ort.get_available_providers():
            raise BackendError(
                f"--backend {self.name}: onnxruntime {ort.__version__} here has no {self.provider} "
                f"(available: {', '.join(ort.get_available_providers())}); {self.install}"
            )
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        # ORT 1.31 warns about plugin EP devices for every classic CUDA session
        ort.set_default_logger_severity(3)
        self._ort = ort
        self.device, self.threads = device, threads or threads_from_environment() or cores_per_gpu()
        gpus = gpu_facts()
        if gpus and not 0 <= device < len(gpus):
            raise BackendError(f"--device {device}: this machine has GPU(s) 0..{len(gpus) - 1}; "
                               "choose one of them")

    def info(self) -> EngineInfo:
        gpus = gpu_facts()
        gpu = gpus[self.device] if self.device < len(gpus) else {"name": f"cuda:{self.device}", "driver": "unknown"}
        from onnxruntime.capi import build_and_package_info as build

        versions = {"driver": gpu["driver"]}
        for key in ("cuda_version", "cudnn_version"):
            if getattr(build, key, None):
                versions[key.removesuffix("_version")] = str(getattr(build, key))
        return engine_info(
            self,
            f"{gpu['name']} (cuda:{self.device}" + (f", {self.threads} CPU threads" if self.threads else "") + ")",
            versions,
        )

    def session_providers(self, conv_search: str = "EXHAUSTIVE") -> list:
        """``conv_search``: how cuDNN's convolution algorithms are chosen (ONNX Runtime's
        ``cudnn_conv_algo_search``; EXHAUSTIVE, its default, is what a deployment's session does)."""
        return [("CUDAExecutionProvider", {"device_id": self.device, "cudnn_conv_algo_search": conv_search}),
                "CPUExecutionProvider"]

    def runner(self, model: StoredModel) -> OrtCudaRunner:
        # the CUDA provider's own convolutions only: TensorRT plans an engine for a range of shapes
        per_shape = (self.provider == "CUDAExecutionProvider" and model.weight_bytes() <= PER_SHAPE_MAX_WEIGHTS
                     and replanned_at_new_shapes(model.proto))
        return OrtCudaRunner(self._builder(model, "EXHAUSTIVE"), self.device, per_shape)

    def judging_runner(self, model: StoredModel) -> OrtCudaRunner:
        """One session on cuDNN's default convolution algorithms, chosen without a search: the
        exhaustive search (a deployment's) times every algorithm and the heuristic one queries cuDNN
        at each convolution's first run at each shape, which buys speed, not truer outputs. On an
        H200 a ppocr-rec one-unit plan judged at batch 32 and 1 took 1.0-1.2 s on heuristic sessions,
        0.30-0.34 s on one default session (benchmarks/results/cuda_judging_default_h200.json). The
        default algorithms compute FP32 without TF32: a one-unit loss is the unit's own error, not
        the TF32 floor under it (docs/engines.md). Each trial's plan is judged and timed as deployed
        (exhaustive)."""
        return OrtCudaRunner(self._builder(model, "DEFAULT"), self.device)

    def _builder(self, model: StoredModel, conv_search: str) -> Callable[[], tuple[object, tuple[str, ...]]]:
        def build():
            session, left_off = new_session(self._ort, model, self.session_options(),
                                            self.session_providers(conv_search))
            # ORT falls back to the CPU quietly: never time that as GPU
            if self.provider not in session.get_providers():
                raise BackendError(
                    f"onnxruntime did not put the candidate on {self.provider} (it chose "
                    f"{session.get_providers()})"
                )
            return session, left_off

        return build


class OrtTensorRTBackend(OrtCudaBackend):
    """ONNX Runtime's TensorRT execution provider: the CUDA provider's runner and timing, the graph
    handed to TensorRT, which fuses the TensorRT Q/DQ form into INT8 kernels (int8 on: explicit
    quantization from the graph's Q/DQ, no calibration table) and keeps the Casts' FP16 (fp16 off:
    no precision beyond the graph's). Engines and timings are cached in the study's cache folder.
    NEVER executed by autoprec's developers: neither TensorRT nor ONNX Runtime's TensorRT provider
    libraries can be installed where autoprec is made."""

    name = engines.ORT_TENSORRT
    int4_form = Int4Form.DEQUANTIZE
    provider = "TensorrtExecutionProvider"
    install = ("install onnxruntime-gpu built with the TensorRT provider and TensorRT's libraries "
               "(see ONNX Runtime's TensorRT execution provider page for the versions that match), "
               "on a machine with an NVIDIA GPU")
    slow_precisions = {}
    runs_from_a_cut = False
    caveat = ("ONNX Runtime's TensorRT execution provider has never been executed by autoprec's "
              "developers (its libraries cannot be installed where autoprec is made): check its "
              "first results with trtexec")

    @classmethod
    def create(cls, device: int, cache_dir: Path | None, threads: int) -> OrtTensorRTBackend:
        return cls(device, threads, cache_dir)

    def __init__(self, device: int = 0, threads: int = 0, cache_dir: Path | None = None):
        super().__init__(device, threads)
        self._check_the_provider_loads()
        self.cache = Path(cache_dir or tempfile.mkdtemp(prefix="autoprec-ort-tensorrt-")) / engines.ORT_TENSORRT
        for folder in ("engines", "timing"):
            (self.cache / folder).mkdir(parents=True, exist_ok=True)

    def session_providers(self, conv_search: str = "EXHAUSTIVE") -> list:
        options = {"device_id": self.device, "trt_int8_enable": True, "trt_fp16_enable": False,
                   "trt_engine_cache_enable": True,
                   "trt_engine_cache_path": str(self.cache / "engines"),
                   "trt_timing_cache_enable": True,
                   "trt_timing_cache_path": str(self.cache / "timing")}
        # the CUDA provider's, as ort-cuda's, for what TensorRT does not take
        return [(self.provider, options), *super().session_providers(conv_search)]

    def _check_the_provider_loads(self) -> None:
        """onnxruntime-gpu lists the TensorRT provider whether or not TensorRT's libraries are
        there; without them a session falls back to CUDA, printing its reason: refused now, in one
        line with that reason."""
        import contextlib
        import io

        graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe",
                                       [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                       [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
        probe.ir_version = 8  # what every onnxruntime reads (onnx writes its newest by default)
        printed = io.StringIO()
        # its provider bridge logs the failure as an error: said below
        self._ort.set_default_logger_severity(4)
        try:
            with contextlib.redirect_stdout(printed):
                session = self._ort.InferenceSession(probe.SerializeToString(),
                                                     providers=[(self.provider, {"device_id": self.device})])
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own error types: the provider cannot be used
            raise BackendError(f"--backend {self.name}: onnxruntime {self._ort.__version__} cannot "
                               f"make a session with its TensorRT provider ({first_line(exc)}); "
                               f"{self.install}") from None
        finally:
            self._ort.set_default_logger_severity(3)
        if self.provider not in session.get_providers():
            lines = [line.strip() for line in printed.getvalue().splitlines() if "TensorRT" in line]
            reason = lines[0][lines[0].find("Please"):] if lines and "Please" in lines[0] else (lines or [""])[0][-200:]
            raise BackendError(f"--backend {self.name}: onnxruntime {self._ort.__version__}'s "
                               "TensorRT provider does not load here "
                               f"({reason or 'no reason given'}); {self.install}")

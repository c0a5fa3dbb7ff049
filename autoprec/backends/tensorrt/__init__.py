"""TensorRT and TensorRT for RTX: strongly typed builds of the explicit-precision ONNX, timed with
CUDA events.

One code path for both: their Python APIs agree on everything used here but for what
:class:`~autoprec.backends.tensorrt.loader.Flavour` names (the module, strong typing, build-time
timing cache versus runtime cache, the GPUs an engine runs on). As Polygraphy's ``backend/trt``:
``loader`` imports TensorRT, parses and builds (no GPU needed), ``profile`` makes the optimisation
profile of a dynamic network, ``runner`` runs and times an engine on a GPU, ``layers`` reads what an
engine runs; this module is the backend that puts them together.

What has run (2026-11-23):

- The **build half** — ONNX parsing with the parser's errors, the network's strongly typed layer
  types checked against the plan, the builder, its verbose layer log — runs against the real
  TensorRT for RTX 1.7 builder on CPU-only machines, in every CI run (tests/test_tensorrt_rtx.py).
- The **run half** — deserializing, the engine inspector, ``execute_async_v3``, CUDA-event timing,
  the layer profiler, the runtime cache — has NEVER run: TensorRT proper cannot be installed on this
  project's machines, and TensorRT for RTX refuses their only GPU (an H100, compute capability 9.0).
  It is checked against a recording fake (tests/fake_tensorrt.py) and every TensorRT name it uses
  against TensorRT 11.4's bindings, the 10.x stubs and the installed TensorRT for RTX module.

Why TensorRT's API directly and not Polygraphy's: the search needs (1) one timing cache shared by
every candidate and persisted across runs (a runtime cache on RTX), (2) latency from CUDA events
around ``execute_async_v3`` with inputs and outputs resident on the device, and (3) what the
builder and the engine inspector say of each build.

Device memory and events come from cuda-python (``cuda.bindings.runtime``, NVIDIA's own) or, if
that is missing, pycuda.
"""

from __future__ import annotations

import codecs
import hashlib
import shutil
from pathlib import Path

from autoprec.analysis import subgraphs
from autoprec.analysis.calibrate import ActivationRanges
from autoprec.analysis.data import Batch
from autoprec.analysis.model_info import ModelInfo
from autoprec.backends.base import Backend
from autoprec.backends.doctor_steps import DoctorCase, Made, Step
from autoprec.backends.gpus import gpu_facts
from autoprec.backends.tensorrt.layers import EngineLayers, parse_engine_layers
from autoprec.backends.tensorrt.loader import (
    OPTIMIZATION_LEVEL,
    TENSORRT,
    TENSORRT_RTX,
    WORKSPACE_BYTES,
    BuiltEngine,
    Flavour,
    TimingCache,
    build_engine,
    capturing_logger,
    fidelity_report,
    import_tensorrt,
    installed,
    stamp_plan,
)
from autoprec.backends.tensorrt.runner import (
    TIMED_RUNS,
    WARMUP_RUNS,
    RuntimeCache,
    TensorRTRunner,
    cuda_api,
    cuda_importable,
)
from autoprec.core import atomic, engines, untrusted
from autoprec.core.errors import AutoprecError, BackendError
from autoprec.core.plan import Plan
from autoprec.core.stored import StoredModel
from autoprec.lower import QDQForm
from autoprec.record.trial import EngineInfo

# The package's public names (its modules: loader builds, runner runs, profile shapes, layers reads
# engines).
__all__ = ["OPTIMIZATION_LEVEL", "TENSORRT", "TENSORRT_RTX", "WORKSPACE_BYTES", "TensorRTBackend",
           "TensorRTRtxBackend",
           "build_engine", "capturing_logger", "fidelity_report", "import_tensorrt", "installed",
           "read_engine_layers",
           "stamp_plan"]

def engine_information(serialized: bytes) -> str:
    """The inspector's JSON for a serialized engine, with whichever TensorRT is installed (needs a
    GPU it runs on)."""
    found = installed()
    if found is None:
        raise BackendError(TENSORRT.install + " (or TensorRT for RTX: pip install "
                                              "'autoprec[tensorrt-rtx]')")
    flavour, trt = found
    logger = capturing_logger(trt)
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    if engine is None:
        raise BackendError(
            f"{trt.__name__} {trt.__version__} could not load the engine "
            f"({logger.last_error() or 'no reason given'}); inspect it on a GPU it was built for, "
            "with the TensorRT that built it"
        )
    return engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)


def check_gpu(flavour: Flavour, device: int) -> dict[str, str]:
    """The GPU ``device`` when this TensorRT runs engines on it; else one line: no GPU, no such
    index, or a compute capability it does not run (naming what to use instead)."""
    gpus = gpu_facts()
    if not gpus:
        raise BackendError(
            f"--backend {flavour.backend}: no NVIDIA GPU on this machine (nvidia-smi finds none), "
            "and a search times every candidate on one; builds alone run on the CPU: autoprec "
            "export RESULT --format python --build")
    if not 0 <= device < len(gpus):
        raise BackendError(f"--device {device}: this machine has GPU(s) 0..{len(gpus) - 1}; choose "
                           "one of them")
    gpu = gpus[device]
    capability = gpu.get("compute_capability", "")
    if flavour.gpus is not None and capability and capability not in flavour.gpus and not capability.startswith("12."):
        raise BackendError(
            f"--backend {flavour.backend}: GPU {device} ({gpu['name']}) has compute capability "
            f"{capability}, on which TensorRT for RTX does not run engines (it runs "
            f"{', '.join(flavour.gpus)}: A100, RTX 30/40/50, L4/L40, RTX PRO); use --backend "
            "tensorrt (TensorRT proper) or --backend ort-cuda on this GPU")
    return gpu


class NodeTimedEngines:
    """Engines built to be profiled, kept in the study's cache folder (where the worker processes
    look) until a trial of the same graph loads one instead of building it again: the sensitivity
    pass profiles the FP32 model and the all-units plans, which are the study's first trials, so
    each of them costs one build, not two. A trial takes its engine (the files go with it)."""

    REUSED = "built once for the sensitivity pass's profile of this same graph, then timed here"

    def __init__(self, folder: Path | None):
        self.folder = folder

    def _paths(self, model: StoredModel) -> tuple[Path, Path, str]:
        # the graph; weights: the folder's
        key = hashlib.sha256(model.proto.SerializeToString()).hexdigest()[:32]
        return self.folder / f"{key}.engine", self.folder / f"{key}.json", key

    def keep(self, model: StoredModel, built: BuiltEngine) -> None:
        if self.folder is None:
            return
        engine, facts, key = self._paths(model)
        atomic.write_bytes(engine, built.serialized)
        # last: engine whole
        atomic.write_keyed(facts, key, {"report": built.report, "planned": built.planned})

    def take(self, model: StoredModel) -> BuiltEngine | None:
        if self.folder is None:
            return None
        engine, facts, key = self._paths(model)
        kept = atomic.read_keyed(facts, key)
        try:
            serialized = untrusted.read_bytes(engine, f"the cache {self.folder}", limit=2**40) if kept else None
        except (OSError, ValueError):
            return None
        if serialized is None:
            return None
        facts.unlink(missing_ok=True)
        engine.unlink(missing_ok=True)
        return BuiltEngine(serialized, {**kept["report"], "reused_build": self.REUSED},
                           kept["planned"])

    def drop(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


class TensorRTBackend(Backend):
    """Strongly typed TensorRT builds of the TensorRT Q/DQ form (signed symmetric, inputs only)."""

    name = engines.TENSORRT
    flavour = TENSORRT
    qdq_form = QDQForm.TENSORRT
    # an engine build takes seconds to minutes: build the next one while one is timed
    default_build_workers = 2
    default_proposals = 8  # and evaluating a plan on ONNX Runtime's CPU takes a fraction of one
    one_shape_only = ("autoprec's TensorRT backends build for one shape (no optimisation profile "
                      "yet); time the exported engine with trtexec --shapes at min, opt and max")

    @classmethod
    def create(cls, device: int, cache_dir: Path | None, threads: int) -> TensorRTBackend:
        return cls(device, cache_dir)

    def __init__(self, device: int = 0, cache_dir: Path | None = None):
        # The doctor's fast steps, before any candidate is built: TensorRT, a GPU it runs engines
        # on, CUDA from Python.
        self._trt = import_tensorrt(self.flavour)
        self.gpu = check_gpu(self.flavour, device)
        cuda_importable(self.flavour)
        self.device = device
        folder = Path(cache_dir) if cache_dir else None
        self.timing_cache = TimingCache(folder / f"{self.name}.timing-cache" if folder else None)
        self.runtime_cache = RuntimeCache(folder / f"{self.name}.runtime-cache" if folder else None)
        self.node_timed = NodeTimedEngines(folder / f"{self.name}-profiled-engines" if folder else None)
        self._cuda = None

    @property
    def cuda(self):
        if self._cuda is None:
            self._cuda = cuda_api(self.device, self.flavour)
        return self._cuda

    def device_label(self) -> str:
        return f"CUDA device {self.device}"

    def info(self) -> EngineInfo:
        return EngineInfo(
            self.name,
            self.name,
            str(self._trt.__version__),
            "strongly typed",
            self.device_label(),
            self.qdq_form.value,
            caveat=self.flavour.caveat,
            timing=f"CUDA-event time of one execute_async_v3 on one batch, bindings on the GPU; "
                   f"median of "
            f"{TIMED_RUNS} runs after {WARMUP_RUNS} warm-up runs (never executed by autoprec's "
            f"developers)",
        )

    def lower(self, info: ModelInfo, plan: Plan, ranges: ActivationRanges | None) -> StoredModel:
        """The TensorRT Q/DQ form, stamped with the plan (unit → precision, nodes) so each build can
        be checked against what the network and the engine run."""
        return stamp_plan(super().lower(info, plan, ranges), info, plan)

    def build(self, model: StoredModel) -> BuiltEngine:
        """Parse and build (no GPU needed): the serialized engine and the build's own report."""
        return build_engine(self._trt, self.flavour, model, self.timing_cache)

    def runner(self, model: StoredModel) -> TensorRTRunner:
        return self._runner(self.node_timed.take(model) or self.build(model))

    def _runner(self, built: BuiltEngine) -> TensorRTRunner:
        return TensorRTRunner(
            self._trt, lambda: self.cuda, built,
            self.runtime_cache if self.flavour.runtime_cache else None
        )

    def drop_kept_builds(self) -> None:
        self.node_timed.drop()

    @classmethod
    def doctor_steps(cls, device: int, case: DoctorCase, made: Made) -> list[Step]:
        """Import, build at the measured shapes and with a profile (no GPU needed), then on the GPU:
        load, inspect, execute, compare, time, profile (see
        :mod:`autoprec.backends.tensorrt.steps`)."""
        from autoprec.backends.tensorrt.steps import tensorrt_steps

        return tensorrt_steps(cls, case, made, lambda: check_gpu(cls.flavour, device),
                              lambda: cuda_api(device, cls.flavour))

    def node_times(self, model: StoredModel, batch: Batch, runs: int = 10) -> dict[str, float]:
        """Seconds per run per ONNX node: each engine layer's time split evenly over the ONNX nodes
        it was built from (Metadata, else its name); layers naming none go to ``""``. The engine is
        kept for the trial of the same graph (:class:`NodeTimedEngines`)."""
        built = self.build(model)
        self.node_timed.keep(model, built)
        with self._runner(built) as runner:
            layers = {layer.name: layer for layer in parse_engine_layers(runner.layer_json).layers}
            per_layer = runner.layer_times(batch, runs)
        nodes = {
            subgraphs.label(scope, n.name) for scope, graph in subgraphs.graphs(model.proto.graph) for n in graph.node
        }
        times: dict[str, float] = {}
        for name, ms in per_layer.items():
            layer = layers.get(name)
            owners = [n for n in (layer.fused_from if layer else ()) if n in nodes] or [""]
            for owner in owners:
                times[owner] = times.get(owner, 0.0) + ms * 1e-3 / len(owners)
        return times


class TensorRTRtxBackend(TensorRTBackend):
    """TensorRT for RTX (PyPI): the same builds, engines that run on compute capability
    8.0/8.6/8.9/12.x, kernels compiled at the first run and kept in a runtime cache."""

    name = engines.TENSORRT_RTX
    flavour = TENSORRT_RTX
    # Seen in its builder's layer list (benchmarks/tensorrt_form.py): never run, as no engine of it
    # runs here.
    float_int8_ops = {"ConvTranspose": "TensorRT for RTX 1.7 builds a ConvTranspose between Q/DQ "
                                       "as an FP32 deconvolution after float Q/DQ arithmetic (its "
                                       "builder's layer list): slower than FP32"}

    def device_label(self) -> str:
        return (
            f"{self.gpu['name']} (cuda:{self.device}, compute capability "
            f"{self.gpu.get('compute_capability') or '?'})"
        )


def read_engine_layers(path: str | Path) -> EngineLayers:
    """A layer-information JSON file, or a serialized engine (``.plan``/``.engine``: needs
    TensorRT)."""
    path = Path(path)
    if not path.is_file():
        found = "no such file" if not path.exists() else ("a folder" if path.is_dir() else "not a "
                                                                                           "regular "
                                                                                           "file")
        raise AutoprecError(f"{path}: {found}; give an engine (.plan) or its layer-information "
                            f"JSON")
    if path.suffix.lower() == ".onnx":
        raise AutoprecError(
            f"{path}: an ONNX model, not an engine; build it first (e.g. autoprec export RESULT "
            "--format trtexec, then its build.sh) and inspect the engine or its layers.json"
        )
    with open(path, "rb") as f:
        head = f.read(4096)  # what the file is, before any more of it is read
    encoding = _json_encoding(head)
    if encoding is not None:
        try:
            raw = untrusted.read_bytes(path, "layer-information JSON", given=True)  # bounded
        except ValueError as exc:
            raise AutoprecError(f"{path}: {exc}") from None
        return parse_engine_layers(raw.decode(encoding, errors="replace"), str(path))
    if not head.strip() or (b"\0" not in head and _is_text(head)):
        raise AutoprecError(
            f"{path}: {'empty' if not head.strip() else 'text, but not JSON'}: neither "
            "layer-information JSON nor a serialized engine; give the engine (.plan) or trtexec "
            "--exportLayerInfo's JSON"
        )
    # TensorRT reads all of it
    return parse_engine_layers(engine_information(path.read_bytes()), str(path))


def _json_encoding(head: bytes) -> str | None:
    """The text encoding of a file whose start is JSON's (``{`` or ``[``): UTF-8, with a byte-order
    mark too, or UTF-16 (PowerShell's ``>`` writes it); None where it is not (a serialized
    engine)."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16"
    else:
        encoding = "utf-8-sig" if head.startswith(codecs.BOM_UTF8) else "utf-8"
    return encoding if head.decode(encoding, errors="ignore").lstrip()[:1] in ("{", "[") else None


def _is_text(head: bytes) -> bool:
    """Readable text (a cut multi-byte character at the end of ``head`` allowed), as a serialized
    engine never is."""
    try:
        text = head.decode("utf-8") if len(head) < 4096 else head[:-3].decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\n\r\t" for c in text)

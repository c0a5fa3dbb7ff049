"""``autoprec export RESULT --format F --build``: build the exported model with whichever TensorRT
is installed, and say what the build made of it.

TensorRT for RTX builds on a machine without a GPU: the plan file and the builder's own account of
it (per-layer types, which ONNX nodes each fused layer holds, checked against the plan) come out
here. Loading the engine (and its inspector's layers.json) needs a GPU that TensorRT runs on; where
there is none, the report says so rather than guessing.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoprec.analysis.model import model_sha256
from autoprec.backends.gpus import gpu_facts
from autoprec.backends.tensorrt import (
    TENSORRT,
    build_engine,
    capturing_logger,
    fidelity_report,
    installed,
)
from autoprec.backends.tensorrt.layers import (
    EngineLayers,
    parse_engine_layers,
    plan_fidelity,
)
from autoprec.core import atomic, stored
from autoprec.core.errors import BackendError, ExportError
from autoprec.core.profile import ShapeProfile

BUILD_SCHEMA = "autoprec.build/1"
# What each export format builds (trt10 and triton are for other builders: TensorRT <= 10's weak
# typing, ONNX Runtime).
BUILT_MODEL = {"trtexec": "model.onnx", "python": "model.onnx", "markdown": "model.onnx",
               "polygraphy": "model.onnx"}


@dataclass(frozen=True)
class ExportBuild:
    plan: Path
    report_path: Path
    report: dict[str, Any]
    # the engine's layers: the inspector's where the engine loads, else the builder's
    layers: EngineLayers | None
    # what the build wrote: the plan, the report, the inspector's layers.json
    files: tuple[Path, ...]


def check_buildable(fmt: str) -> None:
    """Refuse, before anything is written, a format whose model TensorRT's strongly typed builder is
    not for."""
    if fmt not in BUILT_MODEL:
        why = (
            "its --layerPrecisions build is TensorRT <= 10's weak typing, which only trtexec of "
            "those versions runs: run build_trt10.sh there"
            if fmt == "trt10"
            else "it is an ONNX Runtime model repository"
        )
        raise ExportError(f"--build: --format {fmt} is not built by autoprec ({why}); use --format "
                          "trtexec or python")


def build_export(folder: Path, fmt: str, profile: ShapeProfile | None = None,
                 trial: int | None = None) -> ExportBuild:
    """Build ``folder``'s model (``--format fmt``'s, the result's ``trial``) into ``model.plan``
    (for ``profile`` where its inputs are dynamic) and write ``build_report.json``, which names the
    trial and the model's sha256."""
    check_buildable(fmt)
    found = installed()
    if found is None:
        raise BackendError(
            "--build needs TensorRT: pip install 'autoprec[tensorrt-rtx]' (TensorRT for RTX, "
            f"PyPI, builds without a GPU) or {TENSORRT.install.split(': ', 1)[1]}"
        )
    flavour, trt = found
    built = build_engine(trt, flavour, stored.load(folder / BUILT_MODEL[fmt]), profile=profile)
    plan_path = atomic.write_bytes(folder / "model.plan", built.serialized)
    layers, loaded, load_note = built.layers, False, ""
    logger = capturing_logger(trt)
    engine = trt.Runtime(logger).deserialize_cuda_engine(built.serialized)
    checks = dict(built.report.get("fidelity_checks") or {})
    if engine is not None:  # a GPU this TensorRT runs on: the inspector's view of the loaded engine
        loaded = True
        layers = parse_engine_layers(
            engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON), "engine "
                                                                                                      "inspector"
        )
        atomic.write_json(folder / "layers.json", layers.to_json())
        if built.planned and (fidelity := plan_fidelity(layers, built.planned)) is not None:
            checks["engine inspector"] = fidelity.to_json()
    else:
        why = "no NVIDIA GPU here" if not gpu_facts() else logger.last_error() or "no reason given"
        load_note = (f"this machine cannot load the engine ({why}): "
                     + (f"{flavour.backend} runs engines on GPUs of compute capability "
                        f"{', '.join(flavour.gpus)}"
                        if flavour.gpus else "load it on a GPU TensorRT supports")
                     + "; the layers below are the builder's own account, not the inspector's")
    report = {
        "schema": BUILD_SCHEMA,
        "built_with": built.report["built_with"],
        "machine": {"platform": platform.platform(), "gpus": gpu_facts()},
        "model": BUILT_MODEL[fmt],
        "model_sha256": model_sha256(folder / BUILT_MODEL[fmt]),
        "trial": trial,
        "plan": plan_path.name,
        "plan_bytes": len(built.serialized),
        "shape_profile": profile.to_json() if profile is not None else None,
        "build_seconds": round(built.report["build_seconds"], 3),
        "engine_loaded_here": loaded,
        "note": load_note or "engine loaded here; layers from its inspector (layers.json)",
        **fidelity_report(checks),
        "layers": layers.to_json() if layers is not None else None,
        "warnings": built.report.get("warnings", []),
    }
    report_path = atomic.write_json(folder / "build_report.json", report)
    files = (plan_path, report_path, *([folder / "layers.json"] if loaded else []))
    return ExportBuild(plan_path, report_path, report, layers, files)


def summary_lines(outcome: ExportBuild) -> list[str]:
    """What the terminal says of a build: where it ran, the plan, and whether the plan was
    followed."""
    report = outcome.report
    fidelity = report["plan_fidelity"]
    lines = [f"built {outcome.plan} ({report['plan_bytes'] / 2**20:.1f} MiB) with "
             f"{report['built_with']} in {report['build_seconds']:.2f} s; report "
             f"{outcome.report_path}", report["note"]]
    if fidelity is not None:
        ignored = fidelity["ignored_units"]
        lines.append(
            f"plan check ({fidelity['source']}): {fidelity['checked_units']} units checked, "
            + (
                "all at their planned precision"
                if not ignored
                else f"{len(ignored)} NOT at their planned precision: "
                + ", ".join(f"{u['unit']} planned {u['planned']}, ran {'/'.join(u['ran'])}" for u in ignored[:5])
            )
        )
    return lines

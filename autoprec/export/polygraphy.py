"""``export --format polygraphy``: NVIDIA's own way to trust an engine, for the chosen plan.
``check.sh`` runs the given FP32 model on ONNX Runtime over the search's own evaluation data
(``inputs.json``, in Polygraphy's input format), builds model.onnx strongly typed with TensorRT and
compares the two, each output within tolerances taken from what the search measured of this plan;
then lists the engine's layers."""

from __future__ import annotations

import base64
import io
import math
import os
import shlex
from pathlib import Path
from typing import Sequence

import numpy as np

from autoprec.analysis.data import Batch
from autoprec.core import atomic
from autoprec.core.errors import ExportError
from autoprec.core.escape import printable
from autoprec.export.tensorrt import NOT_RUN, BuildSpec
from autoprec.record.trial import SHAPED

# The engine's outputs may differ from FP32 by this many times the largest error the search measured
# of the plan (ONNX Runtime ran its Q/DQ and Casts; TensorRT picks other kernels), and by at least
# this much.
TOLERANCE_FACTOR, TOLERANCE_FLOOR = 2.0, 1e-5


def polygraphy_inputs(batches: Sequence[Batch]) -> bytes:
    """The batches as ``polygraphy run --load-inputs`` reads them (polygraphy.json: a list of feed
    dicts, each array a base64 ``np.save`` tagged ``ndarray``), written without importing
    Polygraphy."""
    def encoded(array: np.ndarray) -> dict[str, str]:
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        return {"array": base64.b64encode(buffer.getvalue()).decode(),
                "polygraphy_class": "ndarray"}

    return atomic.json_text([{name: encoded(np.asarray(value)) for name, value in batch.items()}
                             for batch in batches]).encode()


def tolerances(spec: BuildSpec) -> dict[str, float]:
    """Per output: the absolute tolerance (see TOLERANCE_FACTOR) from the trial's largest error
    measured at any shape it was judged at (``logits @ prefill`` is ``logits``: inputs.json holds
    every shape's batches)."""
    found: dict[str, float] = {}
    for judged, metrics in spec.trial.metrics.items():
        output = judged.split(SHAPED, 1)[0]
        largest = float(metrics.get("max_abs", 0.0))
        if math.isfinite(largest):
            found[output] = max(found.get(output, 0.0), TOLERANCE_FACTOR * largest, TOLERANCE_FLOOR)
    return found


def _named(name: str, what: str) -> str:
    """A model's ``name`` as the start of one of Polygraphy's values (``NAME:...``); a name
    beginning with '-', which Polygraphy's parser would take for an option of its own
    (--gen-script=PATH writes a file), is refused."""
    if name.startswith("-"):
        raise ExportError(f"{what} '{printable(name)}' begins with '-': Polygraphy would read it "
                          "in check.sh as an option of its own, not a name; rename it in the "
                          "model (or export another format)")
    return name


def _shapes(spec: BuildSpec, point: str) -> list[str]:
    return [f"{_named(i.name, 'input')}:[{','.join(map(str, i.at(point)))}]"
            for i in spec.profile.inputs if i.dynamic_axes]


def source_from(folder: Path, source: Path) -> str:
    """The given model as check.sh names it: relative to the export's folder, which the script runs
    in, so it still runs after the result folder (with the model beside it) moves."""
    return os.path.relpath(Path(source).resolve(), Path(folder).resolve())


def check_script(spec: BuildSpec, folder: Path) -> str:
    """The commands, run in the script's own folder (``folder``, where the export is): the FP32
    reference, the strongly typed build compared with it, the engine's layers."""
    quoted = shlex.quote
    source = source_from(folder, spec.original_model)
    reference = [f"polygraphy run {quoted(source)} --onnxrt", "--load-inputs inputs.json",
                 "--save-outputs fp32_outputs.json"]
    compare = ["polygraphy run model.onnx --trt --strongly-typed", "--load-inputs inputs.json",
               "--load-outputs fp32_outputs.json", "--save-engine model.plan --profiling-verbosity "
                                                   "DETAILED",
               "--check-error-stat max"]
    if limits := tolerances(spec):
        compare.append(" ".join(["--atol", *(quoted(f"{_named(name, 'output')}:{limit:.3g}")
                                             for name, limit in limits.items()),
                                 "--rtol 0"]))
    if spec.keeps_source_dims:
        for point in ("min", "opt", "max"):
            if shapes := _shapes(spec, point):
                compare.append(" ".join([f"--trt-{point}-shapes", *map(quoted, shapes)]))
    inspect = ["polygraphy inspect model model.plan --model-type engine --show layers"]
    header = "\n".join(f"# {line}" for line in (
        NOT_RUN,
        f"Polygraphy's check of trial {spec.trial.number}: TensorRT (strongly typed) against the "
        "given FP32 model on ONNX Runtime, on the search's evaluation data;",
        f"each output's tolerance: {TOLERANCE_FACTOR:g}x the largest absolute error the search "
        "measured of this plan against FP32 (ONNX Runtime ran it). TensorRT picks other kernels: "
        "a failure is a reason to look, not proof.",
        f"The given model is named relative to this folder ({printable(source)}; it was "
        f"{printable(spec.original_model)} when this was written): move the result folder with the "
        "model beside it, or edit that path.",
    ))
    commands = (" \\\n    ".join(command) for command in (reference, compare, inspect))
    here = 'cd "$(dirname "$0")"  # the files it reads and writes are beside it'
    return "\n\n".join([f"#!/bin/sh\nset -e\n{here}", header, *commands]) + "\n"


def write_polygraphy_export(spec: BuildSpec, batches: Sequence[Batch], out: Path) -> list[Path]:
    script = atomic.write_bytes(out / "check.sh", check_script(spec, out).encode())
    script.chmod(0o755)
    return [atomic.write_bytes(out / "inputs.json", polygraphy_inputs(batches)), script]

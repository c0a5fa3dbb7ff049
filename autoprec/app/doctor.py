"""``autoprec doctor``: every engine call a search makes, one named step at a time, on a small
generated model (an FP32, an FP16 and an INT8 unit) — so a failure is met here, in seconds, not in
the middle of a search."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autoprec.analysis.calibrate import calibrate
from autoprec.analysis.model import analyse
from autoprec.analysis.preparation import cpu_session
from autoprec.backends import backend_class
from autoprec.backends.doctor_steps import DoctorCase, Made, NotHere, Step
from autoprec.core.errors import first_line
from autoprec.core.plan import Plan
from autoprec.core.search_space import load_search_space

# x → fp32 unit → fp16 unit → int8 unit → y; widths differ, so no unit is tied to another
WIDTHS = (16, 24, 32, 8)
UNITS = {"fc_fp32": "fp32", "fc_fp16": "fp16", "fc_int8": "int8"}
BATCH = {"min": 1, "opt": 2, "max": 4}  # the dynamic batch's profile


@dataclass(frozen=True)
class Outcome:
    """A step as the table shows it: passed, failed, "not here" (this machine lacks what it needs)
    or skipped."""

    step: str
    result: str
    said: str
    fix: str
    needed: bool

    @property
    def blocks_a_search(self) -> bool:
        return self.needed and self.result != "pass"


def doctor_model(folder: Path) -> Path:
    """A three-layer MLP with a dynamic batch, one MatMul+Add+Relu unit per precision."""
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for i, (name, (width_in, width_out)) in enumerate(zip(UNITS, zip(WIDTHS, WIDTHS[1:]))):
        weights += [numpy_helper.from_array(rng.normal(0, width_in**-0.5, (width_in, width_out)).astype(np.float32),
                                            f"{name}.w"),
                    numpy_helper.from_array(rng.normal(0, 0.1, width_out).astype(np.float32),
                                            f"{name}.b")]
        last = i == len(UNITS) - 1
        nodes += [helper.make_node("MatMul", [current, f"{name}.w"], [f"{name}.mm"], name=name),
                  helper.make_node("Add", [f"{name}.mm", f"{name}.b"],
                                   ["y" if last else f"{name}.add"],
                                   name=f"{name}.bias")]
        if not last:
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"],
                                          name=f"{name}.relu"))
            current = f"{name}.out"
    graph = helper.make_graph(nodes, "doctor",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTHS[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDTHS[-1]])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "doctor.onnx"
    onnx.save(model, str(path))
    return path


def doctor_case(folder: Path) -> DoctorCase:
    """The generated model analysed as a search would (a profile over the batch), calibrated on
    random data."""
    rows = lambda point: (BATCH[point], WIDTHS[0])  # noqa: E731
    info = analyse(doctor_model(folder), load_search_space(), {"x": rows("opt")},
                   min_shapes={"x": rows("min")},
                   max_shapes={"x": rows("max")}, cache=folder / "prepared")
    rng = np.random.default_rng(1)
    batches = [{"x": rng.normal(0, 1, rows("opt")).astype(np.float32)} for _ in range(4)]
    ranges = calibrate(info, batches, "doctor")
    units = {u.name: u.name for u in info.units}
    plan = Plan.from_json({"precisions": {units[n]: p for n, p in UNITS.items() if n in units},
                           "calibration": "minmax"})
    reference = dict(zip([o.name for o in info.outputs],
                         cpu_session(info.stored).run(None, batches[0])))
    return DoctorCase(info, plan, ranges, batches[0], reference)


def examine(backend: str, device: int = 0) -> list[Outcome]:
    """Run the engine's doctor steps in order; a step whose prerequisite did not pass is skipped."""
    engine = backend_class(backend)
    with tempfile.TemporaryDirectory(prefix="autoprec-doctor-") as scratch, contextlib.ExitStack() as stack:
        made = Made(stack, Path(scratch))
        steps = engine.doctor_steps(device, doctor_case(Path(scratch)), made)
        outcomes: dict[str, Outcome] = {}
        for step in steps:
            outcomes[step.name] = _outcome(step, outcomes)
        return list(outcomes.values())


def _outcome(step: Step, before: dict[str, Outcome]) -> Outcome:
    missing = [name for name in step.needs if before[name].result != "pass"]
    if missing:
        return Outcome(step.name, "skipped", f"needs: {', '.join(missing)}", "", step.needed)
    try:
        return Outcome(step.name, "pass", step.run(), "", step.needed)
    except NotHere as exc:
        return Outcome(step.name, "not here", str(exc), step.fix, step.needed)
    except Exception as exc:  # noqa: BLE001 - any error of an engine call is that step's failure, said as the engine said it
        said = first_line(exc, 400)
        return Outcome(step.name, "FAIL", f"{type(exc).__name__}: {said}", step.fix, step.needed)

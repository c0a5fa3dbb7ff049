"""The result directory: pareto.json, trials.json, best/plan.json, best/model.onnx — written atomically.

JSON only (never pickle), so results can be read by anything and loaded without running code.
Non-finite numbers (an overflowed candidate's loss, an exact match's SNR) are written as the
strings "inf" and "-inf", which ``float()`` reads back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from autoprec import atomic
from autoprec.backends.base import EngineInfo
from autoprec.errors import AutoprecError
from autoprec.model import ModelInfo
from autoprec.search import TrialRecord, uniform_trials

PARETO_SCHEMA = "autoprec.pareto/1"
PLAN_SCHEMA = "autoprec.plan/1"


@dataclass(frozen=True)
class SearchResult:
    """What a search found: every finished trial, the Pareto front, and the chosen plan."""

    out_dir: Path
    model: dict[str, Any]
    engine: EngineInfo
    search: dict[str, Any]
    trials: tuple[TrialRecord, ...]
    front: tuple[TrialRecord, ...]
    chosen: TrialRecord | None
    units: tuple[dict[str, Any], ...] = field(default=())

    def speedup_vs_fp32(self) -> dict[str, Any] | None:
        """The chosen plan against all-FP32, measured in the same study, and whether it beats timing noise."""
        fp32 = self.uniform().get("fp32")
        if fp32 is None or self.chosen is None:
            return None
        if self.chosen.retimed_ms and fp32.retimed_ms:  # interleaved rounds: every chosen round beats every FP32 one
            beyond = max(self.chosen.retimed_ms) < min(fp32.retimed_ms)
        else:
            beyond = self.chosen.measurement.latency.clearly_faster_than(fp32.measurement.latency)
        return {
            "fp32_trial": fp32.number,
            "speedup": fp32.latency_ms / self.chosen.latency_ms,
            "beyond_timing_noise": beyond,
            "retimed": bool(self.chosen.retimed_ms and fp32.retimed_ms),
        }

    def uniform(self) -> dict[str, TrialRecord]:
        """The all-fp32 / all-fp16 / all-int8 trials, where the study has them."""
        return uniform_trials(self.trials)


def json_safe(value: Any) -> Any:
    """Strict JSON has no infinities: write them as "inf" / "-inf" (``float()`` reads them back)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def trial_json(trial: TrialRecord) -> dict[str, Any]:
    m = trial.measurement
    return {
        "trial": trial.number,
        "latency_ms": m.latency.to_json(),
        "final_latency_ms": trial.latency_ms,
        "retimed_ms": list(trial.retimed_ms),
        "latency_unstable": m.unstable,
        "retimes": m.retimes,
        "accuracy_loss": m.loss,
        "feasible": trial.feasible,
        "metrics": m.metrics,
        "seconds": m.seconds,
        "duplicate_of": trial.duplicate_of,
        "plan": trial.plan.to_json(),
        "build": m.build,
    }


def plan_ignored(trial: TrialRecord) -> bool:
    """The engine's build report says it did not run some unit at its planned precision."""
    fidelity = (trial.measurement.build or {}).get("plan_fidelity") or {}
    return bool(fidelity.get("plan_ignored"))


def model_json(info: ModelInfo) -> dict[str, Any]:
    return {
        "path": str(Path(info.path).resolve()),
        "sha256": info.sha256,
        "inputs": {i.name: {"shape": list(i.shape), "dtype": i.dtype} for i in info.inputs},
        "outputs": {o.name: {"shape": list(o.shape), "dtype": o.dtype} for o in info.outputs},
        "units": len(info.units),
        "searchable_units": len(info.searchable_units),
        "preparation": list(info.notes),
    }


def units_json(info: ModelInfo) -> tuple[dict[str, Any], ...]:
    return tuple(
        {"name": u.name, "op_type": u.op_type, "fused": list(u.nodes[1:]), "allowed": [p.value for p in u.allowed]}
        for u in info.units
    )


def write_results(
    result: SearchResult, chosen_model: onnx.ModelProto | None, tensorrt_model: onnx.ModelProto | None
) -> list[Path]:
    """Write every result file atomically; returns the paths written."""
    out = result.out_dir
    header = {"model": result.model, "engine": result.engine.to_json(), "search": result.search}
    written = [
        atomic.write_json(
            out / "pareto.json",
            json_safe(
                {
                    "schema": PARETO_SCHEMA,
                    **header,
                    "front": [trial_json(t) for t in result.front],
                    "chosen": result.chosen.number if result.chosen else None,
                    "chosen_vs_fp32": result.speedup_vs_fp32(),
                    "uniform": {p: t.number for p, t in result.uniform().items()},
                }
            ),
        ),
        atomic.write_json(out / "trials.json", json_safe({"schema": PARETO_SCHEMA, **header, "trials": [trial_json(t) for t in result.trials]})),
    ]
    if result.chosen is not None and chosen_model is not None:
        best = out / "best"
        files = {"model.onnx": f"lowered for {result.engine.backend} ({result.engine.qdq_form} Q/DQ form); the model that was measured"}
        if tensorrt_model is not None:
            files["model.tensorrt.onnx"] = (
                "the same plan in TensorRT's Q/DQ form (signed symmetric, inputs only) for a strongly typed "
                "build; NOT measured here"
            )
        chosen = trial_json(result.chosen)
        plan_doc = {
            "schema": PLAN_SCHEMA,
            **header,
            **chosen,
            "units": [
                {**unit, "precision": result.chosen.plan[unit["name"]].value} for unit in result.units
            ],
            "files": files,
        }
        written.append(atomic.write_bytes(best / "model.onnx", chosen_model.SerializeToString()))
        if tensorrt_model is not None:
            written.append(atomic.write_bytes(best / "model.tensorrt.onnx", tensorrt_model.SerializeToString()))
        else:  # a resumed search may have chosen another plan: no stale artifact of the old one
            (best / "model.tensorrt.onnx").unlink(missing_ok=True)
        written.append(atomic.write_json(best / "plan.json", json_safe(plan_doc)))
    else:  # nothing chosen this time: an earlier run's best/ must not pass for this run's result
        for name in ("plan.json", "model.onnx", "model.tensorrt.onnx"):
            (out / "best" / name).unlink(missing_ok=True)
    return written


def load_json(path: Path) -> dict[str, Any]:
    """Read a result file (plain JSON; nothing is unpickled or executed)."""
    return json.loads(Path(path).read_text())


@dataclass(frozen=True)
class ResultFiles:
    """A result directory as written by a search: what plots, reports and comparisons read."""

    out_dir: Path
    pareto: dict[str, Any]
    trials: dict[str, Any]
    plan: dict[str, Any] | None
    sensitivity: dict[str, Any] | None = None  # sensitivity.json, when the search ran its sensitivity pass

    @property
    def chosen(self) -> dict[str, Any] | None:
        return next((t for t in self.pareto["front"] if t["trial"] == self.pareto["chosen"]), None)

    def trial(self, number: int) -> dict[str, Any] | None:
        return next((t for t in self.trials["trials"] if t["trial"] == number), None)


def read_result_dir(out_dir: str | Path) -> ResultFiles:
    """Load a result directory, or say plainly why it is not one."""
    out_dir = Path(out_dir)
    pareto_path = out_dir / "pareto.json"
    if not pareto_path.is_file():
        raise AutoprecError(f"{out_dir}: no pareto.json there; give the --out folder of a finished autoprec search")
    try:
        pareto = load_json(pareto_path)
        trials = load_json(out_dir / "trials.json")
        plan_path = out_dir / "best" / "plan.json"
        plan = load_json(plan_path) if plan_path.is_file() else None
        sensitivity = load_json(out_dir / "sensitivity.json") if (out_dir / "sensitivity.json").is_file() else None
    except (OSError, ValueError) as exc:
        raise AutoprecError(f"{out_dir}: its result files cannot be read ({exc}); rerun the search to rewrite them") from None
    if pareto.get("schema") != PARETO_SCHEMA:
        raise AutoprecError(f"{pareto_path}: schema {pareto.get('schema')!r} is not {PARETO_SCHEMA!r}; rerun the search")
    return ResultFiles(out_dir, pareto, trials, plan, sensitivity)

"""The numbers a search writes that timing cannot move, on two small seeded searches: the guard of a change that
must keep them (issue 53's redesign moved code, never numbers). :func:`searched` runs the two searches;
:func:`numbers` projects a result folder onto what the clock does not decide, so two runs on one machine agree.

Kept: each trial's plan, calibration, loss, metrics, feasibility and duplicate (by trial number, since the first
search's sampler is seeded and independent of the figures: random, no warm start); the second search's trials by
plan only (its warm start reads the engine's timings); the search record without what a clock decides; the
sensitivity pass's losses; the model's and units' record; and the set of every file's key paths, so that a
renamed or dropped key is seen (of best/plan.json its top-level keys: what lies below them follows the plan
shipped, which the re-timing picks — under load another one, whose deployment check says other things). Left
out: latencies, the front and the choice (the re-timing decides them), and every timed figure of the record
(TIMED)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import builders

from autoprec.backends.int8_sums import int8_sums

# pareto.json search keys a clock decides (or that follow from the chosen plan, which the re-timing picks).
TIMED = ("wall_seconds", "stage_seconds", "one_time_seconds", "retiming", "timing_drift", "held_out", "profile_timing",
         "engine_builds", "engine_builds_by_phase", "engine_builds_scope", "reference_evaluations", "reference",
         "trials_on_profile_builds", "decision_changes", "run")
# ... and of its sensitivity facts.
SENSITIVITY_TIMED = ("seconds", "evaluation_seconds", "warm_start_plans")
# Key paths present or not as the timings fall (a speed-up the final timing measured, a plan not shipped, a drift).
UNKEYED = (".not_shipped", ".chosen_vs_fp32", ".chosen_vs_source", ".final_rivals", ".final_timing",
           ".search.timing_drift", ".search.held_out", ".search.decision_changes")
# A trial's keys that hold no clock's figure.
TRIAL_KEPT = ("accuracy_loss", "feasible", "metrics", "duplicate_of")


def searched(folder: Path, search) -> dict[str, Path]:
    """The two searches, with ``search`` (``autoprec.search`` or a test's), their result folders by name."""
    import autoprec

    folder.mkdir(parents=True, exist_ok=True)
    model, data = builders.conv_with_data(folder, items=12)
    outs = {"random": folder / "random", "warm": folder / "warm"}
    search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data), judge=autoprec.JudgeSpec(max_loss=0.02),
        study=autoprec.StudySpec(budget=8, seed=0, sampler="random", warm_start=False), out=outs["random"]))
    search(autoprec.SearchConfig(
        autoprec.InputSpec(model, data=data), study=autoprec.StudySpec(budget=4, seed=0, warm_start=True),
        isolation=autoprec.IsolationSpec(isolate=False), out=outs["warm"]))
    return outs


def _key_paths(value: Any, where: str = "") -> set[str]:
    """Every key path of a JSON document, lists collapsed to ``[]`` (the names of a plan's units and of a model's
    outputs are data, not keys: collapsed to ``*``)."""
    if isinstance(value, dict):
        found = set()
        for key, item in value.items():
            name = "*" if where.endswith((".precisions", ".metrics", ".inputs", ".outputs", ".loss", ".gain",
                                          ".by_phase", ".counts_by_op")) else key
            found |= {f"{where}.{name}"} | _key_paths(item, f"{where}.{name}")
        return found
    if isinstance(value, list):
        return set().union(*(_key_paths(item, f"{where}[]") for item in value)) if value else set()
    return set()


def _masked(value: Any, roots: tuple[str, ...]) -> Any:
    """``value`` with the test's folders written as ``<tmp>``."""
    text = json.dumps(value, sort_keys=True)
    for root in roots:
        text = text.replace(root, "<tmp>")
    return json.loads(text)


def _rounded(value: Any) -> Any:
    """Floats to 9 significant digits: a kernel's last bit is not what this guard is about."""
    if isinstance(value, float):
        return float(f"{value:.9g}") if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def numbers(out: Path, by_number: bool) -> dict[str, Any]:
    """What of a result folder timing cannot move (see the module docstring)."""
    files = {name: json.loads((out / name).read_text()) for name in ("pareto.json", "trials.json", "best/plan.json",
                                                                      "sensitivity.json") if (out / name).is_file()}
    pareto, trials = files["pareto.json"], files["trials.json"]
    facts = {k: v for k, v in pareto["search"].items() if k not in TIMED}
    if facts.get("sensitivity"):
        facts["sensitivity"] = {k: v for k, v in facts["sensitivity"].items() if k not in SENSITIVITY_TIMED}
    if "sensitive_units" in facts:
        facts["sensitive_units"] = {k: v for k, v in facts["sensitive_units"].items() if k != "no_gain"}
    if not by_number:  # which plans ran after the uniform ones follows the engine's timings
        facts = {k: v for k, v in facts.items() if k not in ("rejected", "plan_ignored")}
    kept = {}
    for t in trials["trials"]:
        key = str(t["trial"]) if by_number else json.dumps(t["plan"], sort_keys=True)
        kept[key] = {"plan": t["plan"], **{k: t[k] for k in TRIAL_KEPT if by_number or k != "duplicate_of"}}
    found = {
        "search": facts,
        "model": pareto["model"],
        "engine": {k: pareto["engine"][k] for k in ("backend", "qdq_form", "measured")},
        "trials": kept if by_number else None,
        "plans": None if by_number else kept,
        "sensitivity": None if "sensitivity.json" not in files else {
            u["unit"]: {"op_type": u["op_type"], "loss": u["loss"]} for u in files["sensitivity.json"]["units"]},
        "keys": {name: sorted(k for k in _key_paths(document) if not k.startswith(UNKEYED)
                              and (name != "best/plan.json" or k.count(".") == 1))
                 for name, document in files.items()},
    }
    return _rounded(_masked(found, (str(out.parent.resolve()), str(out.parent))))


def compared(found: dict[str, Any], expected: dict[str, Any], where: str = "") -> list[str]:
    """Where ``found`` departs from ``expected``; for the warm search's plans, only plans both hold (and the
    uniform plans must be in both)."""
    if isinstance(expected, dict) and isinstance(found, dict):
        if where.endswith(".plans"):
            shared = set(found) & set(expected)
            missing = [p for p in expected if p not in found and _uniform(json.loads(p))]
            return [f"{where}: uniform plan missing: {p[:80]}" for p in missing] + [
                d for p in sorted(shared) for d in compared(found[p], expected[p], f"{where}[{p[:40]}…]")]
        keys = sorted(set(found) | set(expected))
        return [d for k in keys for d in (
            [f"{where}.{k}: only in {'the run' if k in found else 'the fixture'}"] if (k in found) != (k in expected)
            else compared(found[k], expected[k], f"{where}.{k}"))]
    if isinstance(expected, list) and isinstance(found, list) and len(found) == len(expected):
        return [d for i, (f, e) in enumerate(zip(found, expected)) for d in compared(f, e, f"{where}[{i}]")]
    if not _same(found, expected):
        return [f"{where}: {str(found)[:200]} != {str(expected)[:200]}"]
    return []


# How far a number may move before it is a change: ONNX Runtime's kernels differ by CPU (another vector width
# sums in another order), which moved losses of a few 1e-9 in their fifth digit; a change of code (a lowering,
# a calibration, a metric) moves them by far more. Relative to the number, or, for a figure in [0, 1], to its
# distance from the nearer end (a cosine of 0.99999 is judged by its 1e-5 from 1), so that no figure is loose.
RELATIVE = 1e-3
ABSOLUTE = 1e-12


def _same(found: Any, expected: Any) -> bool:
    """Equal, or both numbers (not flags) within :data:`RELATIVE` of each other."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (found, expected))
    if not numbers or not isinstance(found, float) or found == expected:  # counts and flags: exactly
        return found == expected
    scale = max(abs(found), abs(expected))
    if 0 <= min(found, expected) and max(found, expected) <= 1:
        scale = min(scale, max(1 - found, 1 - expected))
    return abs(found - expected) <= RELATIVE * scale + ABSOLUTE


def _uniform(plan: dict[str, Any]) -> bool:
    counts = plan["counts"]
    return max(counts.values()) == sum(counts.values())


def all_numbers(outs: dict[str, Path]) -> dict[str, Any]:
    return {"random": numbers(outs["random"], by_number=True), "warm": numbers(outs["warm"], by_number=False)}


if __name__ == "__main__":
    print(f"this CPU sums INT8 products as {int8_sums()}: its fixture is tests/fixtures/same_numbers.{int8_sums()}.json")

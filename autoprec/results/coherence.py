"""What a result's records say, checked against themselves and each other when they are read: a trial's figures
can be true (latencies finite and ordered, a loss that is a number, feasible exactly when within the limit, counts
that are its precisions), a speed-up lies within its own interval and says 'beyond timing noise' only where that
interval does, and best/plan.json and the front carry the very trial trials.json holds. A hand edit or a damaged
file that breaks one of these is refused in one line naming the file and the field, so no view shows a figure
beside another plan's or an impossible one as it is."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from autoprec.core.errors import AutoprecError

ROUNDING = 1e-9  # relative: a speed-up at its interval's edge, computed in another order


class Incoherent(Exception):
    """One record's problem, in words, and the file it is in."""

    def __init__(self, file: str, problem: str):
        super().__init__(problem)
        self.file, self.problem = file, problem


def check(out_dir: Path, pareto: dict[str, Any], trials: dict[str, Any], plan: dict[str, Any] | None) -> None:
    """Refuse, in one line, a result whose records contradict themselves or each other (see the module docstring)."""
    try:
        _check(pareto, trials, plan)
    except Incoherent as found:
        fix = ("give a changed plan to check or diagnose with --plan FILE (a copy outside the result) instead, or "
               "rerun the search" if found.file.startswith("best/") else "rerun the search to rewrite the result files")
        raise AutoprecError(f"{out_dir / found.file}: {found.problem}; it is not as autoprec wrote it (edited or "
                            f"damaged): {fix}") from None


def _check(pareto: dict[str, Any], trials: dict[str, Any], plan: dict[str, Any] | None) -> None:
    search = pareto["search"]
    max_loss = _limit(search.get("max_loss"))
    by_number = {t["trial"]: t for t in trials["trials"]}
    if len(by_number) != len(trials["trials"]):
        raise Incoherent("trials.json", "a trial number appears twice")
    if search["trials"] != len(by_number):
        raise Incoherent("pareto.json", f"search.trials says {search['trials']}, but trials.json holds "
                                        f"{len(by_number)} trial(s)")
    labels = str(search["metric"]).endswith("@labels")
    for trial in trials["trials"]:
        _trial(trial, max_loss, labels)
    if _run(trials) != _run(pareto):
        raise Incoherent("trials.json", "it is of another run than pareto.json (their search.run or model differ)")
    for entry in pareto["front"]:
        _same_trial("pareto.json", f"front trial {entry['trial']}", entry, by_number)
    chosen = pareto["chosen"]
    if chosen is not None and max_loss is not None and not by_number[chosen]["feasible"]:
        raise Incoherent("pareto.json", f"chosen trial {chosen} is not within --max-loss {max_loss:g} (loss "
                                        f"{_loss(by_number[chosen])}), yet the chosen plan is the fastest within it")
    for precision, number in pareto["uniform"].items():
        uniform = by_number[number]["plan"]
        if uniform["counts"].get(precision) != len(uniform["precisions"]):
            raise Incoherent("pareto.json", f"uniform.{precision} names trial {number}, whose plan is not all "
                                            f"{precision}")
    _claims(pareto, by_number)
    _facts(search, by_number)
    if plan is not None:
        _best(plan, pareto, by_number)


def _run(document: dict[str, Any]) -> tuple:
    """Which run of which model wrote a result file (an older result's files record no run: None)."""
    return document["search"].get("run"), document["model"]["sha256"]


def _limit(value: Any) -> float | None:
    if value is None:
        return None
    limit = float(value)
    if not (math.isfinite(limit) and limit >= 0):
        raise Incoherent("pareto.json", f"search.max_loss is {value!r}, not a finite loss of 0 or more")
    return limit


def _loss(trial: dict[str, Any]) -> float:
    return float(trial["accuracy_loss"])


def _trial(trial: dict[str, Any], max_loss: float | None, labels: bool) -> None:
    """One trial's own figures can be true."""
    where, latency = f"trial {trial['trial']}", trial["latency_ms"]
    times = {k: float(latency[k]) for k in ("p10_ms", "median_ms", "p90_ms")}
    times["final_latency_ms"] = float(trial["final_latency_ms"])
    times.update({f"retimed_ms[{i}]": float(v) for i, v in enumerate(trial["retimed_ms"])})
    for key, value in times.items():
        if not (math.isfinite(value) and value > 0):
            raise Incoherent("trials.json", f"{where}: {key} is {value:g}, not a time above 0")
    if not (times["p10_ms"] <= times["median_ms"] * (1 + ROUNDING)
            and times["median_ms"] <= times["p90_ms"] * (1 + ROUNDING)):
        raise Incoherent("trials.json", f"{where}: its p10 {times['p10_ms']:g}, median {times['median_ms']:g} and p90 "
                                        f"{times['p90_ms']:g} ms are not in order")
    loss = _loss(trial)
    if math.isnan(loss) or (loss < 0 and not labels) or loss == -math.inf:
        raise Incoherent("trials.json", f"{where}: accuracy_loss is {loss:g}, not a loss of 0 or more"
                         + ("" if not labels else " (or a finite drop against the labels)"))
    if trial["feasible"] != (max_loss is None or loss <= max_loss):
        raise Incoherent("trials.json", f"{where}: feasible is {trial['feasible']} with loss {loss:g} and --max-loss "
                                        f"{'none' if max_loss is None else f'{max_loss:g}'}")
    counted = Counter(trial["plan"]["precisions"].values())
    counts = trial["plan"]["counts"]
    if any(counts.get(p, 0) != counted.get(p, 0) for p in ("int4", "int8", "fp16", "fp32")):
        raise Incoherent("trials.json", f"{where}: its plan counts {counts} but its units are {dict(counted)}")


def _same_trial(file: str, what: str, entry: dict[str, Any], by_number: dict[int, dict[str, Any]]) -> None:
    """``entry`` (a front member, best/plan.json) is trials.json's trial of its number, field for field."""
    theirs = by_number.get(entry["trial"])
    if theirs is None:
        raise Incoherent(file, f"{what} is not in trials.json")
    differs = [key for key in theirs if key in entry and entry[key] != theirs[key]]
    if differs:
        raise Incoherent(file, f"{what}: its {', '.join(differs[:3])} {'differs' if len(differs) == 1 else 'differ'} "
                               f"from trial {entry['trial']}'s in trials.json (the figures are that plan's, as measured)")


def _best(plan: dict[str, Any], pareto: dict[str, Any], by_number: dict[int, dict[str, Any]]) -> None:
    """best/plan.json is the chosen trial of this very run, and its unit table is its plan."""
    if _run(plan) != _run(pareto):
        raise Incoherent("best/plan.json", "it is of another run than pareto.json (their search.run or model differ: "
                                           "best/ is from another run)")
    _same_trial("best/plan.json", f"trial {plan['trial']}", plan, by_number)
    precisions = plan["plan"]["precisions"]
    units = {u["name"]: u["precision"] for u in plan["units"]}
    if set(units) != set(precisions):
        raise Incoherent("best/plan.json", "its units are not the units its plan names")
    wrong = [name for name, precision in units.items() if precisions[name] != precision]
    if wrong:
        raise Incoherent("best/plan.json", f"unit {wrong[0]} is {units[wrong[0]]} in its unit table but "
                                           f"{precisions[wrong[0]]} in its plan")


def _claims(pareto: dict[str, Any], by_number: dict[int, dict[str, Any]]) -> None:
    """Every speed-up pareto.json states can be true, and names trials the study has."""
    versus, source = pareto.get("chosen_vs_fp32"), pareto.get("chosen_vs_source")
    claims = [("chosen_vs_fp32", versus), ("chosen_vs_source", source),
              ("chosen_vs_source.preparation", (source or {}).get("preparation")),
              ("not_shipped", pareto.get("not_shipped")),
              *((f"final_rivals[{i}]", r) for i, r in enumerate(pareto.get("final_rivals") or ()))]
    for where, claim in claims:
        if claim is not None:
            _claim(where, claim)
            if "trial" in claim and claim["trial"] not in by_number:
                raise Incoherent("pareto.json", f"{where} names trial {claim['trial']}, which trials.json lacks")
    uniform_fp32 = pareto["uniform"].get("fp32")
    if versus is not None and versus["fp32_trial"] not in by_number:
        raise Incoherent("pareto.json", f"chosen_vs_fp32 names trial {versus['fp32_trial']}, which trials.json lacks")
    if versus is not None and uniform_fp32 is not None and versus["fp32_trial"] != uniform_fp32:
        raise Incoherent("pareto.json", f"chosen_vs_fp32 is against trial {versus['fp32_trial']}, but the all-FP32 "
                                        f"trial is {uniform_fp32}")
    unproven = pareto.get("not_shipped")
    if unproven is not None and unproven["beyond_timing_noise"]:
        raise Incoherent("pareto.json", "not_shipped says its plan was faster beyond timing noise, which ships a plan")


def _claim(where: str, claim: dict[str, Any]) -> None:
    """A speed-up: a ratio above 0 inside its own interval, 'beyond timing noise' exactly where the interval lies
    above 1."""
    speedup = float(claim["speedup"])
    if not (math.isfinite(speedup) and speedup > 0):
        raise Incoherent("pareto.json", f"{where}.speedup is {speedup:g}, not a ratio above 0")
    if claim.get("low") is None:
        return
    low, high = float(claim["low"]), float(claim["high"])
    if not (0 < low <= high < math.inf) or not low <= speedup * (1 + ROUNDING) or not speedup <= high * (1 + ROUNDING):
        raise Incoherent("pareto.json", f"{where}: speed-up {speedup:g} outside its own interval {low:g}–{high:g}")
    confidence, rounds = claim.get("confidence"), claim.get("rounds")
    if confidence is not None and not 0 < float(confidence) < 1:
        raise Incoherent("pareto.json", f"{where}.confidence is {confidence!r}, not a share between 0 and 1")
    if rounds is not None and rounds < 1:
        raise Incoherent("pareto.json", f"{where}.rounds is {rounds}, not at least 1")
    if claim["beyond_timing_noise"] is not None and claim["beyond_timing_noise"] != (low > 1):
        raise Incoherent("pareto.json", f"{where}.beyond_timing_noise is {claim['beyond_timing_noise']} for the "
                                        f"interval {low:g}–{high:g}")


def _facts(search: dict[str, Any], by_number: dict[int, dict[str, Any]]) -> None:
    """The search's own figures a reader is shown: the plans judged on the calibration batches, the drift."""
    for judged in (search.get("held_out") or {}).get("judged", ()):
        if judged["trial"] not in by_number or math.isnan(float(judged["loss"])):
            raise Incoherent("pareto.json", f"search.held_out judged trial {judged['trial']} at loss "
                                            f"{judged['loss']!r}: not a trial with a loss")
    drift = search.get("timing_drift")
    if drift and not (math.isfinite(float(drift["largest_percent"])) and float(drift["largest_percent"]) >= 0
                      and 0 <= drift["outside_trial_spread"] <= drift["plans"]):
        raise Incoherent("pareto.json", f"search.timing_drift {drift} cannot be (a share of plans, a percent of 0 or "
                                        "more)")
    wall = float(search["wall_seconds"])
    if not (math.isfinite(wall) and wall >= 0):
        raise Incoherent("pareto.json", f"search.wall_seconds is {wall:g}, not a duration")

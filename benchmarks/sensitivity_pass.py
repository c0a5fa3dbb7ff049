"""The sensitivity pass's cost and its one-unit losses, per code checkout, side by side in one run.

``autoprec sensitivity MODEL`` (the pass a search starts with, alone, as a user runs it) with each ``--code``
checkout in turn, ``--rounds`` times: its wall clock, the pass's own seconds and its evaluations' (sensitivity.json),
and each checkout's one-unit losses against the first checkout's: how alike their rankings are (the correlation of
the losses' ranks), the largest relative difference of a loss above 1e-6, the largest absolute one of those below
(where two sessions' float rounding is all there is to see).

    git worktree add /tmp/before HEAD~1
    python -m benchmarks sensitivity_pass --code /tmp/before . --models yolov8n ppocr-rec ppocr-det
    python -m benchmarks sensitivity_pass --code /tmp/before . --backend ort-cuda --batch 32   # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import TINY, Report, parse_arguments, source_revision  # noqa: E402
from search_cost import run_cli  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402

QUICK = {"models": [TINY], "rounds": 1}
FLOOR = 1e-6  # losses at or below this are float rounding: compared by their absolute difference


def passed(code: Path, name: str, args: argparse.Namespace, out: Path) -> dict:
    """``autoprec sensitivity`` with the package in ``code``: its wall clock, and what sensitivity.json says."""
    wall = run_cli(code, name, "sensitivity", args, out)
    found = json.loads((out / "sensitivity.json").read_text())
    return {"wall_seconds": round(wall, 2), "pass_seconds": found["seconds"],
            "evaluation_seconds": found["evaluation_seconds"], "evaluations": found["evaluations"],
            "losses": {f"{u['unit']} {p}": v for u in found["units"] for p, v in u["loss"].items()}}


def agreement(first: dict[str, float], other: dict[str, float]) -> dict:
    """How far ``other``'s one-unit losses are from ``first``'s (the same plans)."""
    import numpy as np

    keys = sorted(first.keys() & other.keys())
    a, b = np.array([first[k] for k in keys]), np.array([other[k] for k in keys])
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    above = a > FLOOR
    ranks = [np.argsort(np.argsort(x)) for x in (a, b)]
    return {"plans": len(keys), "rank_correlation": round(float(np.corrcoef(*ranks)[0, 1]), 6) if len(a) > 1 else None,
            "max_relative_above_floor": float(np.max(np.abs(b[above] - a[above]) / a[above])) if above.any() else None,
            "max_absolute_at_floor": float(np.max(np.abs(b[~above] - a[~above]))) if (~above).any() else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["yolov8n", "ppocr-rec", "ppocr-det"])
    parser.add_argument("--code", nargs="*", type=Path, default=[Path(".")], help="checkouts of autoprec, in turn")
    parser.add_argument("--rounds", type=int, default=2, help="each checkout's pass this many times, in turn")
    parser.add_argument("--backend", default="ort-cpu")
    parser.add_argument("--batch", type=int, help="the data's items at this batch (default: the zoo's)")
    args = parse_arguments(parser, argv, QUICK)
    labels = [source_revision(code) or str(code) for code in args.code]
    if len(set(labels)) < len(labels):  # two checkouts of one commit
        labels = [f"{label}#{i}" for i, label in enumerate(labels)]
    report = Report("sensitivity_pass", args, get_backend(args.backend), code_labels=labels, models={})
    print(f"{'model':<12}{'code':<16}{'pass s':>8}{'evals s':>9}{'evals':>7}{'×first':>8}  losses against the first code")
    with tempfile.TemporaryDirectory(prefix="autoprec-pass-") as tmp:
        for name in args.models:
            runs: dict[str, list[dict]] = {label: [] for label in labels}
            for i in range(args.rounds):  # in turn: a slower minute of the machine falls on every checkout
                for code, label in zip(args.code, labels):
                    folder = Path(tmp) / f"{name}-{labels.index(label)}-{i}"
                    folder.mkdir()
                    runs[label].append(passed(code.resolve(), name, args, folder / "out"))
            first = statistics.median(r["evaluation_seconds"] for r in runs[labels[0]])
            rows = report["models"][name] = {}
            for label, found in runs.items():
                evaluations = statistics.median(r["evaluation_seconds"] for r in found)
                rows[label] = {"runs": [{k: v for k, v in r.items() if k != "losses"} for r in found],
                               "evaluation_seconds_median": round(evaluations, 3),
                               "evaluation_vs_first_code": round(evaluations / first, 3),
                               "losses_vs_first_code": agreement(runs[labels[0]][0]["losses"], found[0]["losses"])}
                row = rows[label]
                print(f"{name:<12}{label[:15]:<16}{statistics.median(r['pass_seconds'] for r in found):>8.2f}"
                      f"{evaluations:>9.2f}{found[0]['evaluations']:>7}{row['evaluation_vs_first_code']:>8.3f}  "
                      f"{row['losses_vs_first_code']}", flush=True)
            report.write()
    print(f"wrote {report.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

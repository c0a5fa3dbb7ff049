"""What the study's SQLite storage costs a search: trials asked, suggested and told through autoprec's storage
(SQLite's write-ahead log on a local disk, ``coordination.storage_for``) beside Optuna's plain RDB storage on the same
kind of file (SQLite's rollback journal: a sync of the disk at every commit, what autoprec used before), alternating.

Each trial as a search's asks it: ``--dimensions`` categorical parameters (a trial of yolov8n has 63; Optuna commits
each on its own), a measurement stored as a trial attribute, the two objectives told. Outside a search, so that what
is measured is the storage alone (a whole search's stages move by more than this between runs on a noisy VM).

    python -m benchmarks study_storage [--trials 16] [--dimensions 63] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))
from _harness import Report, parse_arguments  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402
from autoprec.study.coordination import file_system, log_folded, storage_for  # noqa: E402

QUICK = {"trials": 2, "dimensions": 4, "repeats": 1}
ARMS = {"rollback journal (Optuna's RDB storage as it comes)": lambda url: optuna.storages.RDBStorage(
            url, engine_kwargs={"connect_args": {"timeout": 30}}),
        "write-ahead log (autoprec's storage_for)": storage_for}


def trials_seconds(make, folder: Path, trials: int, dimensions: int) -> float:
    """Seconds to run ``trials`` trials through a new study in ``folder`` with the storage ``make`` opens."""
    url = f"sqlite:///{folder / 'study.db'}"
    with log_folded(url):
        study = optuna.create_study(storage=make(url), directions=["minimize", "minimize"],
                                    sampler=optuna.samplers.RandomSampler(seed=0))
        started = time.perf_counter()
        for _ in range(trials):
            trial = study.ask()
            plan = [trial.suggest_categorical(f"unit{i}", ["int8", "fp16", "fp32"]) for i in range(dimensions)]
            trial.set_user_attr("measurement", {"plan": plan, "latency_ms": 1.0})
            study.tell(trial, [1.0, 0.0])
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--dimensions", type=int, default=63)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", type=Path, default=None, help="where the databases go (default: a temporary one)")
    args = parse_arguments(parser, argv, QUICK)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    report = Report("study_storage", args, get_backend("ort-cpu"), runs={name: [] for name in ARMS})
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        for repeat in range(args.repeats):
            for arm, make in ARMS.items():
                folder = Path(tmp) / f"{repeat}-{len(report['runs'][arm])}-{arm[:5]}"
                folder.mkdir()
                report["runs"][arm].append(round(trials_seconds(make, folder, args.trials, args.dimensions), 3))
        report["folder_file_system"] = file_system(Path(tmp) / "study.db") or "unknown"
    medians = {arm: statistics.median(runs) for arm, runs in report["runs"].items()}
    report["median_seconds"] = medians
    plain, ahead = medians.values()
    report["rollback_over_wal"] = round(plain / ahead, 2)
    report.write()
    print(f"\n{args.trials} trials of {args.dimensions} parameters, {args.repeats} runs each, alternating; "
          f"{report['machine']} ({report['folder_file_system']})")
    for arm, runs in report["runs"].items():
        print(f"{arm:<52} median {medians[arm]:.3f} s  runs {runs}")
    print(f"rollback journal / write-ahead log: {report['rollback_over_wal']}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m benchmarks --list | --quick-all | NAME [--quick] [ARGS]: see the package's docstring."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import BENCHMARKS, HERE, listing, run_quick

USAGE = "usage: python -m benchmarks --list | --quick-all | NAME [--quick] [ARGS]"


def quick_all() -> int:
    """Every --quick CI runs, one after the other, a line each; exit 1 when one failed (its stderr's end printed)."""
    names = [name for name, benchmark in BENCHMARKS.items() if benchmark.skip is None]
    print(f"{len(names)} quick benchmarks ({len(BENCHMARKS) - len(names)} not in CI: python -m benchmarks --list)",
          flush=True)
    started, failed = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="autoprec-quick-") as folder:
        os.chmod(folder, 0o755)  # distributed's PostgreSQL server runs as the postgres user and makes its files in here
        for name in names:
            (Path(folder) / name).mkdir()
            run = run_quick(name, Path(folder) / name)
            print(run.line(), flush=True)
            if run.problem:
                print(run.problem, file=sys.stderr, flush=True)
                failed.append(name)
    print(f"{len(names) - len(failed)} of {len(names)} passed in {time.monotonic() - started:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("--list", "-h", "--help"):
        print(listing() if argv[:1] == ["--list"] else f"{USAGE}\n\n{listing()}")
        return 0
    if argv == ["--quick-all"]:
        return quick_all()
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"{USAGE}\nbenchmarks: no benchmark {name!r}; python -m benchmarks --list names them", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))  # as `python benchmarks/NAME.py` runs it: its helpers import by their names
    return importlib.import_module(name).main(rest)


if __name__ == "__main__":
    sys.exit(main())

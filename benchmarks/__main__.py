"""python -m benchmarks --list | NAME [--quick] [ARGS]: see the package's docstring."""

from __future__ import annotations

import importlib
import sys

from benchmarks import BENCHMARKS, HERE, listing

USAGE = "usage: python -m benchmarks --list | NAME [--quick] [ARGS]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("--list", "-h", "--help"):
        print(listing() if argv[:1] == ["--list"] else f"{USAGE}\n\n{listing()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"{USAGE}\nbenchmarks: no benchmark {name!r}; python -m benchmarks --list names them", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))  # as `python benchmarks/NAME.py` runs it: its helpers import by their names
    return importlib.import_module(name).main(rest)


if __name__ == "__main__":
    sys.exit(main())

"""autoprec's benchmarks, run from the repository's root:

    python -m benchmarks --list                   # every benchmark, its line, and whether CI runs its --quick
    python -m benchmarks NAME [--quick] [ARGS]    # one (python -m benchmarks NAME --help: its arguments)
    python -m benchmarks --quick-all              # every --quick CI runs, one process each; exit 1 if one fails

Each writes one JSON through ``_harness.Report`` (the commit, versions, machine, engine, date and arguments beside
its figures), to ``benchmarks/results/NAME.json`` unless ``--json`` says where; ``--quick`` runs it end to end on a
tiny generated model in seconds and writes to a temporary folder. CI (``.ci/run``) runs ``--quick-all`` after the
test suite. One-off experiments whose figures the docs cite are in ``archive/``; the other modules here are the
benchmarks' helpers (:data:`HELPERS`)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass(frozen=True)
class Need:
    """What a benchmark's --quick needs beyond the test extras: absent, it is skipped, unless ``variable`` is set in
    the environment (as CI sets it), which makes the absence a failure."""

    missing: str  # what is missing, and how to install it
    variable: str
    present: Callable[[], bool]


def _postgres_server() -> bool:
    sys.path.insert(0, str(REPO / "tests"))
    import postgres

    return postgres.server_binaries() is not None


def _tensorrt_rtx() -> bool:
    from autoprec.backends.tensorrt import TENSORRT_RTX

    return any(importlib.util.find_spec(module) for module in TENSORRT_RTX.modules)


POSTGRES = Need("no PostgreSQL server installed (apt-get install postgresql)", "AUTOPREC_REQUIRE_POSTGRES",
                _postgres_server)
TENSORRT_FOR_RTX = Need("TensorRT for RTX is not installed (pip install '.[tensorrt-rtx]')",
                        "AUTOPREC_REQUIRE_TENSORRT_RTX", _tensorrt_rtx)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark (``benchmarks/NAME.py``, its ``main(argv)``) and how CI runs its --quick."""

    name: str
    command: tuple[str, ...] = ()  # what comes before --quick: a benchmark of subcommands, the one CI runs
    needs: Need | None = None
    skip: str | None = None  # why CI cannot run its --quick (None: it does)

    def quick_argv(self, json_path: Path) -> list[str]:
        return [self.name, *self.command, "--quick", "--json", str(json_path)]


# The benchmarks, in the order the listing gives them. The GPU ones' --quick runs the same comparison on the CPU.
BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("search_quality"),
    Benchmark("builds"),
    Benchmark("peers"),
    Benchmark("trial_cost"),
    Benchmark("search_cost"),
    Benchmark("timing_noise"),
    Benchmark("timing_agreement"),
    Benchmark("a_over_a"),
    Benchmark("timing_blocks"),
    Benchmark("study_storage"),
    Benchmark("spinning_stop"),
    Benchmark("plain_session"),
    Benchmark("shipped_speedup"),
    Benchmark("qdq_forms"),
    Benchmark("tensorrt_form", needs=TENSORRT_FOR_RTX),
    Benchmark("scale"),
    Benchmark("distributed", needs=POSTGRES),
    Benchmark("exports", command=("cpu",)),
    Benchmark("decoders"),
    Benchmark("judge_cost"),
    Benchmark("sensitivity_pass"),
    Benchmark("gpu"),
    Benchmark("fp16_regions"),
    Benchmark("reference_gap"),
)}


# Modules that are no benchmark: what the benchmarks share, make their models with, or carry to a GPU machine.
HELPERS = ("_harness", "synthetic", "export_corpus", "decoder_corpus", "quark_quantize", "carry_weights",
           "held_out_check")

# What every report records of where and how it ran (``_harness.Report``), and the versions among it.
PROVENANCE = frozenset({"date", "machine", "engine", "code", "versions", "arguments", "mode"})
VERSIONS = frozenset({"autoprec", "onnxruntime", "onnx", "optuna", "numpy", "python"})


def description(name: str) -> str:
    """The first line of a benchmark's docstring (read, not imported: listing loads no engine)."""
    tree = ast.parse((HERE / f"{name}.py").read_text())
    return (ast.get_docstring(tree) or "").splitlines()[0]


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    rows = [f"{'benchmark':<{width}}  CI      what it measures"]
    for name, benchmark in BENCHMARKS.items():
        rows.append(f"{name:<{width}}  {'quick' if benchmark.skip is None else 'skip':<6}  {description(name)}"
                    + ("" if benchmark.skip is None else f" (not in CI: {benchmark.skip})"))
    return "\n".join(rows)


@dataclass(frozen=True)
class QuickRun:
    """One --quick as CI runs it: ``problem`` None when it ran, wrote its JSON and the JSON says where and how."""

    name: str
    seconds: float
    problem: str | None = None
    skipped: str | None = None  # why it did not run (a need missing where nothing requires it)

    def line(self) -> str:
        verdict = f"skipped: {self.skipped}" if self.skipped else "ok" if self.problem is None else "FAILED"
        return f"{self.name:<18} {self.seconds:6.1f} s  {verdict}"


def run_quick(name: str, folder: Path) -> QuickRun:
    """``python -m benchmarks NAME --quick`` in a process of its own, its JSON and temporary files in ``folder`` (its
    own device lock: not the turns of searches beside it), then its report's provenance checked."""
    benchmark = BENCHMARKS[name]
    if benchmark.needs and not benchmark.needs.present():
        if os.environ.get(benchmark.needs.variable):
            return QuickRun(name, 0.0, f"{benchmark.needs.variable} is set but {benchmark.needs.missing}")
        return QuickRun(name, 0.0, skipped=benchmark.needs.missing)
    out = folder / f"{name}.json"
    started = time.monotonic()
    ran = subprocess.run([sys.executable, "-m", "benchmarks", *benchmark.quick_argv(out)], cwd=REPO,
                         env={**os.environ, "TMPDIR": str(folder)}, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    if ran.returncode != 0:
        return QuickRun(name, seconds, f"exit {ran.returncode}:\n{ran.stderr[-3000:]}")
    return QuickRun(name, seconds, report_problem(out))


def report_problem(path: Path) -> str | None:
    """What a quick run's JSON lacks of where and how it ran, in words (None: nothing)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return f"no JSON at {path}: {error}"
    lacking = sorted(PROVENANCE - set(report)) + sorted(VERSIONS - set(report.get("versions", {})))
    if lacking:
        return f"{path.name} lacks {', '.join(lacking)}"
    if report["mode"] != "quick" or report["arguments"].get("quick") is not True:
        return f"{path.name} does not say it was a quick run (mode {report['mode']!r})"
    return None

"""The benchmarks as a suite: every benchmark the runner lists for CI runs its ``--quick`` here end to end
(``python -m benchmarks NAME --quick``, a process each, on a tiny generated model) and writes its JSON with where
and how it ran. The benchmarks import autoprec's internals: a change that breaks one fails here.

A benchmark that needs a PostgreSQL server or TensorRT for RTX is skipped where they are missing, unless CI's
AUTOPREC_REQUIRE_POSTGRES / AUTOPREC_REQUIRE_TENSORRT_RTX make that a failure."""

import importlib.util
import json
import os
import subprocess
import sys

import postgres
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))
from autoprec.backends.tensorrt import TENSORRT_RTX  # noqa: E402
from benchmarks import BENCHMARKS, HELPERS  # noqa: E402

# What a benchmark's --quick needs beyond the test extras: (there, the variable that makes its absence a failure).
NEEDS = {
    "distributed": (lambda: postgres.server_binaries() is not None, "AUTOPREC_REQUIRE_POSTGRES",
                    "no PostgreSQL server installed (apt-get install postgresql)"),
    "tensorrt_form": (lambda: any(importlib.util.find_spec(m) for m in TENSORRT_RTX.modules),
                      "AUTOPREC_REQUIRE_TENSORRT_RTX", "TensorRT for RTX is not installed (pip install '.[tensorrt-rtx]')"),
}
COMMANDS = {"exports": ["exports", "cpu"]}  # a benchmark of subcommands: the one --quick runs
PROVENANCE = {"date", "machine", "engine", "code", "versions", "arguments", "mode"}
VERSIONS = {"autoprec", "onnxruntime", "onnx", "optuna", "numpy", "python"}


def runner(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("name", [name for name, why in BENCHMARKS.items() if why is None])
def test_a_quick_run_writes_its_json_with_where_and_how_it_ran(name, tmp_path):
    if name in NEEDS and not NEEDS[name][0]():
        available, variable, missing = NEEDS[name]
        if os.environ.get(variable):
            pytest.fail(f"{variable} is set but {missing}")
        pytest.skip(missing)
    out = tmp_path / "quick.json"
    # a temporary folder of its own: its own device lock, not the turns of the suite's searches beside it
    ran = runner(*COMMANDS.get(name, [name]), "--quick", "--json", str(out), env={**os.environ, "TMPDIR": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(out.read_text())
    assert PROVENANCE <= set(report) and VERSIONS <= set(report["versions"]), sorted(report)
    assert report["mode"] == "quick" and report["arguments"]["quick"] is True


def test_the_listing_names_every_benchmark_and_what_ci_runs():
    listed = runner("--list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
    assert rows == {name: "quick" if why is None else "skip" for name, why in BENCHMARKS.items()}
    assert sum(why is None for why in BENCHMARKS.values()) >= 10


def test_every_script_is_a_listed_benchmark_or_a_helper():
    """A script added to benchmarks/ is run by this suite, or said to be a helper: none runs nowhere."""
    scripts = {path.stem for path in (REPO / "benchmarks").glob("*.py")} - {"__init__", "__main__"}
    assert scripts == set(BENCHMARKS) | set(HELPERS)


def test_an_unknown_benchmark_is_one_line_and_exit_2():
    ran = runner("nope")
    assert ran.returncode == 2 and "no benchmark 'nope'" in ran.stderr

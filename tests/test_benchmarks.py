"""The benchmarks as a suite: the runner's listing, and the path CI's ``python -m benchmarks --quick-all`` (run by
.ci/run after this suite: every quick together takes minutes) takes for each benchmark, on two fast ones here.
The benchmarks import autoprec's internals: test_layout.py checks that what they import still exists."""

import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))
from benchmarks import BENCHMARKS, HELPERS, report_problem, run_quick  # noqa: E402

# Fast quick runs (a few seconds each): one that times plans, one that runs a search's lowering and the CPU's FP16.
SAMPLE = ("timing_noise", "fp16_regions")


def runner(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("name", SAMPLE)
def test_a_quick_run_writes_its_json_with_where_and_how_it_ran(name, tmp_path):
    run = run_quick(name, tmp_path)
    assert run.problem is None and run.skipped is None, run.problem
    assert report_problem(tmp_path / "missing.json").startswith("no JSON")


def test_the_listing_names_every_benchmark_and_what_ci_runs():
    listed = runner("--list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
    assert rows == {name: "quick" if b.skip is None else "skip" for name, b in BENCHMARKS.items()}
    assert sum(b.skip is None for b in BENCHMARKS.values()) >= 10


def test_every_script_is_a_listed_benchmark_or_a_helper():
    """A script added to benchmarks/ is run by CI's quick runs, or said to be a helper: none runs nowhere."""
    scripts = {path.stem for path in (REPO / "benchmarks").glob("*.py")} - {"__init__", "__main__"}
    assert scripts == set(BENCHMARKS) | set(HELPERS)


def test_an_unknown_benchmark_is_one_line_and_exit_2():
    ran = runner("nope")
    assert ran.returncode == 2 and "no benchmark 'nope'" in ran.stderr

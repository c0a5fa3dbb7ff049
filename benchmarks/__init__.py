"""autoprec's benchmarks, run from the repository's root one at a time:

    python -m benchmarks --list                   # every benchmark, its line, and whether CI runs its --quick
    python -m benchmarks NAME [--quick] [ARGS]    # one (python -m benchmarks NAME --help: its arguments)

Each writes one JSON through ``_harness.Report`` (the commit, versions, machine, engine, date and arguments beside
its figures), to ``benchmarks/results/NAME.json`` unless ``--json`` says where; ``--quick`` runs it end to end on a
tiny generated model in seconds and writes to a temporary folder (tests/test_benchmarks.py runs every --quick CI
can). One-off experiments whose figures the docs cite are in ``archive/``; the other modules here are the
benchmarks' helpers (:data:`HELPERS`)."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The benchmarks, in the order the listing gives them. A value says why CI cannot run the benchmark's --quick
# (None: it runs, in tests/test_benchmarks.py).
BENCHMARKS: dict[str, str | None] = {
    "search_quality": None,
    "builds": None,
    "peers": None,
    "trial_cost": None,
    "timing_noise": None,
    "timing_agreement": None,
    "a_over_a": None,
    "plain_session": None,
    "qdq_forms": None,
    "tensorrt_form": None,
    "scale": None,
    "distributed": None,
    "exports": None,
    "decoders": None,
    "judge_cost": None,
    "gpu": None,
    "fp16_regions": None,
    "reference_gap": None,
}


# Modules that are no benchmark: what the benchmarks share, make their models with, or carry to a GPU machine.
HELPERS = ("_harness", "synthetic", "export_corpus", "decoder_corpus", "quark_quantize", "carry_weights")


def description(name: str) -> str:
    """The first line of a benchmark's docstring (read, not imported: listing loads no engine)."""
    tree = ast.parse((HERE / f"{name}.py").read_text())
    return (ast.get_docstring(tree) or "").splitlines()[0]


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    rows = [f"{'benchmark':<{width}}  CI      what it measures"]
    for name, why in BENCHMARKS.items():
        rows.append(f"{name:<{width}}  {'quick' if why is None else 'skip':<6}  {description(name)}"
                    + ("" if why is None else f" (not in CI: {why})"))
    return "\n".join(rows)

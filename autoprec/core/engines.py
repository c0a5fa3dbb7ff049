"""The engines a search measures on, by name: one spelling of each, which every option, record and
Q/DQ form uses (``--backend``, ``pareto.json``'s ``engine.backend``, the lowering's form)."""

import os

ORT_CPU = "ort-cpu"  # ONNX Runtime's CPU provider: the embedded default, and the reference executor
ORT_CUDA = "ort-cuda"
ORT_TENSORRT = "ort-tensorrt"
TENSORRT = "tensorrt"
TENSORRT_RTX = "tensorrt-rtx"

DEFAULT = ORT_CPU
# The engine that judges plans without building them on the target (ONNX Runtime on the CPU runs
# every Q/DQ form) and computes the FP32 reference.
REFERENCE = ORT_CPU

MAX_THREADS_PER_CORE = 4


def too_many_threads(threads: int) -> str | None:
    """Why ``threads`` engine threads (``--threads``, AUTOPREC_THREADS) are refused on this machine,
    or None."""
    cores = os.cpu_count() or 1
    if threads > MAX_THREADS_PER_CORE * cores:
        return (f"more than {MAX_THREADS_PER_CORE}× this machine's {cores} cores; timings with "
                "threads fighting over cores measure the contention")
    return None

"""The NVIDIA GPUs of this machine, as nvidia-smi reports them (no CUDA library needed to ask)."""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache


@lru_cache(maxsize=1)
def gpu_facts() -> list[dict[str, str]]:
    """Name, driver and compute capability ("8.6", or "" where the driver cannot say) of each GPU;
    empty when there is no nvidia-smi (no NVIDIA driver)."""
    for fields in (("name", "driver_version", "compute_cap"), ("name", "driver_version")):
        try:
            out = subprocess.run(
                ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        rows = [dict(zip(("name", "driver", "compute_capability"),
                         (f.strip() for f in line.split(","))))
                for line in out.splitlines() if line.strip()]
        return [{"compute_capability": "", **row} for row in rows]
    return []


def cores_per_gpu() -> int:
    """The CPU cores each GPU's worker gets where one worker per GPU shares this host
    (docs/workers.md): the cores this process may use over the GPUs it may use
    (``CUDA_VISIBLE_DEVICES``); 0 (the engine's default, every core) with fewer than two. ONNX
    Runtime's default, a thread per core in every worker's GPU sessions, would have four workers'
    threads spin against each other, slowing the candidate another worker times; a GPU session runs
    little on the CPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = len([d for d in visible.split(",") if d.strip()]) if visible is not None else len(gpu_facts())
    return max(1, len(os.sched_getaffinity(0)) // gpus) if gpus > 1 else 0

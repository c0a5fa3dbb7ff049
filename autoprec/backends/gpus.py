"""The NVIDIA GPUs of this machine, as nvidia-smi reports them (no CUDA library needed to ask)."""

from __future__ import annotations

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
        rows = [dict(zip(("name", "driver", "compute_capability"), (f.strip() for f in line.split(","))))
                for line in out.splitlines() if line.strip()]
        return [{"compute_capability": "", **row} for row in rows]
    return []

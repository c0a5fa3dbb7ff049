#!/bin/bash
# On the GPU machine (after benchmarks/gpu_carry.sh's calls, in the last: `bash benchmarks/gpu_carry.sh device &&
# bash benchmarks/int4_embedding_gpu.sh`): an INT4 embedding (32 000 × 1024, GatherBlockQuantized) on ONNX Runtime's
# CUDA provider — which provider ran each node (the session's profile), its rows against the CPU provider's, and
# the median of 200 runs of the graph (ids [2, 5]) beside the FP32 table's Gather. Prints JSON.
set -e
export PYTHONPATH=/tmp/site:$PYTHONPATH
cd "$(dirname "$0")/.."
python3 - <<'PY'
import json, statistics, sys, time
from pathlib import Path
import numpy as np
import onnxruntime as ort
sys.path.insert(0, "tests")
ort.preload_dlls()
import builders
from autoprec.analysis.model import analyse
from autoprec.core.plan import Plan
from autoprec.core.search_space import load_search_space
from autoprec.lower import Int4Form, QDQForm, lower_plan

tmp = Path("/tmp/embcuda"); tmp.mkdir(exist_ok=True)
table = np.random.default_rng(0).normal(0, 0.5, (32000, 1024)).astype(np.float32)
info = analyse(builders.save(builders.embedding_lookup(table, 32), tmp / "e.onnx"), load_search_space())
ids = {"ids": np.random.default_rng(1).integers(0, 100, (2, 5))}
out = {}
for plan in ("fp32", "int4"):
    low = lower_plan(info, Plan.from_mapping({"embed": plan, "proj": "fp32"}), None, QDQForm.ORT_CPU,
                     Int4Form.MATMUL_NBITS)
    with low.file() as path:
        o = ort.SessionOptions(); o.enable_profiling = True; o.profile_file_prefix = str(tmp / f"p{plan}")
        cuda = ort.InferenceSession(str(path), o,
                                    providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        cpu = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    a, b = cuda.run(None, ids)[0], cpu.run(None, ids)[0]
    for _ in range(20): cuda.run(None, ids)
    ms = []
    for _ in range(200):
        t = time.perf_counter(); cuda.run(None, ids); ms.append((time.perf_counter() - t) * 1e3)
    events = json.load(open(cuda.end_profiling()))
    placed = sorted({(e["args"]["op_name"], e["args"].get("provider")) for e in events
                     if e.get("cat") == "Node" and "op_name" in e.get("args", {})})
    out[plan] = {"max_abs_cuda_vs_cpu": float(np.abs(a - b).max()), "median_ms": statistics.median(ms), "nodes": placed}
print(ort.__version__, json.dumps(out, indent=1))
PY

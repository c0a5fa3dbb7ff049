"""What one candidate's measurement costs on its GPU when the workers of 1, 2 … N GPUs measure at once.

A four-GPU search ran each trial ~10 % longer than a one-GPU search (docs/workers.md, "evaluate" 1.28 -> 1.43 s on
ppocr-cls), and most of a trial on ONNX Runtime's CUDA provider is its first run. This splits a candidate's
measurement as the search makes it (``backend.runner``: session build; the first evaluation batch; the other
evaluation batches; ``runner.time`` on batch 0; the session released) and repeats it in k processes at once, one
per GPU, started together, for each setting:

- ``search``: as the search runs it (intra-op threads: the host's cores over its GPUs; their spinning on;
  cuDNN's EXHAUSTIVE algorithm search, ONNX Runtime's default);
- ``no-spin``: the same threads told not to spin while they wait for work
  (``session.intra_op.allow_spinning`` 0);
- ``1-thread``: one intra-op thread;
- ``heuristic``: cuDNN's HEURISTIC algorithm search;

with the latency each gives (a setting that saves build time but picks slower kernels is no gain) and the CPU
seconds a candidate takes (user and system, of its process: spinning threads show there).

The candidates are random FP16/FP32 plans of the zoo model (the same ``--plans`` in every process and setting),
lowered once. Per setting and k: the median seconds of each phase over every process's candidates, the candidate's
total, its ratio to k = 1's, and the median latency. Engine, device, model, batch and repeats are in the JSON.

    python benchmarks/trial_contention.py --gpus 4 --gpu-counts 1 4 --models ppocr-cls@32 ppocr-det@8
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).parent))
from _harness import machine_facts  # noqa: E402

from autoprec.backends import get_backend  # noqa: E402
from autoprec.backends.gpus import cores_per_gpu  # noqa: E402
from autoprec.backends.onnxruntime import OrtCudaBackend  # noqa: E402
from autoprec.core import atomic  # noqa: E402
from autoprec.core.plan import Precision  # noqa: E402
from autoprec.core.stored import StoredModel  # noqa: E402
from autoprec.results.files import json_safe  # noqa: E402
from autoprec.study.optimize import plan_from_params  # noqa: E402

PHASES = ("build", "first_run", "other_runs", "time", "release")


@dataclass(frozen=True)
class Setting:
    """How a candidate's session is made: intra-op threads (0: the search's), their spinning, cuDNN's search."""

    threads: int = 0
    spinning: bool = True
    algo: str = "EXHAUSTIVE"


SETTINGS = {"search": Setting(), "no-spin": Setting(spinning=False), "1-thread": Setting(threads=1),
            "heuristic": Setting(algo="HEURISTIC")}


class SettingBackend(OrtCudaBackend):
    """The search's CUDA backend with one :class:`Setting` (the only difference)."""

    def __init__(self, device: int, setting: Setting):
        super().__init__(device, setting.threads)
        self.setting = setting

    def session_options(self):
        options = super().session_options()
        if not self.setting.spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options

    def session_providers(self) -> list:
        return [(self.provider, {"device_id": self.device, "cudnn_conv_algo_search": self.setting.algo}),
                "CPUExecutionProvider"]


def backend_for(engine: str, device: int, setting: Setting):
    """ort-cuda as ``setting`` says; ort-cpu (no cuDNN: the algorithm search unused) only to try the script on a
    machine without a GPU, where the processes share the CPU."""
    if engine == "ort-cpu":
        return get_backend("ort-cpu", threads=setting.threads)
    return SettingBackend(device, setting)


def lowered_plans(engine: str, name: str, batch: int, plans: int, folder: Path, seed: int = 0) -> tuple[list[Path], Path]:
    """``plans`` random FP16/FP32 plans of zoo:NAME at ``batch``, lowered for ``engine`` and written to ``folder``;
    the evaluation batches in an .npz beside them."""
    from gpu import batch_data

    from autoprec.analysis.baseline import load_baseline
    from autoprec.app.resolve import engine_space
    from autoprec.core.search_space import load_search_space

    model_path, data, shapes = batch_data(name, batch, folder)
    engine = get_backend(engine)
    space, _, _ = engine_space(load_search_space(), engine, None)
    baseline = load_baseline(model_path, space, data, shapes)
    rng = random.Random(seed)
    paths = []
    for i in range(plans):
        choices = {u.name: rng.choice([p for p in (Precision.FP16, Precision.FP32) if p in u.allowed]).value
                   for u in baseline.info.dimensions}
        stored = engine.lower(baseline.info, plan_from_params(baseline.info, choices, "minmax"), baseline.ranges)
        path = Path(stored.folder) / f"contention-{i}.onnx"
        path.write_bytes(stored.proto.SerializeToString())
        paths.append(path)
    batches = folder / f"{name}-evaluation.npz"
    np.savez(batches, **{f"{i}:{k}": v for i, b in enumerate(baseline.dataset.evaluation) for k, v in b.items()})
    return paths, batches


def _batches(path: Path) -> list[dict[str, np.ndarray]]:
    out: dict[int, dict] = {}
    with np.load(path) as npz:
        for key in npz.files:
            i, name = key.split(":", 1)
            out.setdefault(int(i), {})[name] = npz[key]
    return [out[i] for i in sorted(out)]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measure_in_turn(engine: str, device: int, setting: Setting, paths: list[str], batches_path: str, start,
                     results) -> None:
    """One process: every candidate on GPU ``device``, phase by phase (after the others are ready to start)."""
    backend = backend_for(engine, device, setting)
    batches = _batches(Path(batches_path))
    models = [StoredModel(onnx.load(p, load_external_data=False), Path(p).parent) for p in paths]
    start.wait()
    rows = []
    for model in models:
        cpu, t0 = _cpu_seconds(), time.perf_counter()
        with backend.runner(model) as runner:
            t1 = time.perf_counter()
            runner.run(batches[0])
            t2 = time.perf_counter()
            for batch in batches[1:]:
                runner.run(batch)
            t3 = time.perf_counter()
            latency = runner.time(batches[0])
            t4 = time.perf_counter()
        t5 = time.perf_counter()
        rows.append({"build": t1 - t0, "first_run": t2 - t1, "other_runs": t3 - t2, "time": t4 - t3, "release": t5 - t4,
                     "cpu_s": _cpu_seconds() - cpu, "latency_ms": latency.median_ms})
    results.put((device, rows))


def at_once(engine: str, gpus: int, setting: Setting, paths: list[Path], batches: Path) -> list[dict]:
    """Every process's rows, one process per GPU 0..gpus-1, started together."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(gpus), context.Queue()
    procs = [context.Process(target=_measure_in_turn, args=(engine, d, setting, [str(p) for p in paths],
                                                            str(batches), start, results)) for d in range(gpus)]
    for p in procs:
        p.start()
    rows: list[dict] = []
    for _ in procs:
        while True:
            try:
                rows += results.get(timeout=5)[1]
                break
            except queue.Empty:
                if any(p.exitcode for p in procs):  # a process that died never reports: stop, not wait
                    for p in procs:
                        p.kill()
                    raise SystemExit("a measuring process failed: see its traceback above") from None
    for p in procs:
        p.join()
    return rows


def summary(rows: list[dict], alone: dict | None) -> dict:
    out = {k: round(statistics.median(r[k] for r in rows), 4) for k in PHASES}
    out["candidate_s"] = round(sum(out[k] for k in PHASES), 4)
    out["cpu_s"] = round(statistics.median(r["cpu_s"] for r in rows), 3)
    out["latency_ms"] = round(statistics.median(r["latency_ms"] for r in rows), 4)
    out["candidates"] = len(rows)
    if alone is not None:
        out["candidate_vs_alone"] = round(out["candidate_s"] / alone["candidate_s"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["ppocr-cls@32", "ppocr-det@8"])
    parser.add_argument("--gpus", type=int, default=2, help="the most processes at once (one per GPU)")
    parser.add_argument("--plans", type=int, default=12, help="random plans measured by each process")
    parser.add_argument("--settings", nargs="*", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--gpu-counts", type=int, nargs="*", help="processes at once (default: 1, 2, 4 … --gpus)")
    parser.add_argument("--backend", choices=["ort-cuda", "ort-cpu"], default="ort-cuda",
                        help="ort-cpu only to try the script without a GPU")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "trial_contention.json")
    args = parser.parse_args(argv)
    counts = args.gpu_counts or sorted({*(2**k for k in range(args.gpus.bit_length()) if 2**k <= args.gpus), args.gpus})
    report = {**machine_facts(get_backend(args.backend)), "plans": args.plans, "gpu_counts": counts,
              "search_threads": cores_per_gpu(), "settings": {n: asdict(SETTINGS[n]) for n in args.settings},
              "models": {}}
    print(f"{'model':<16}{'setting':>10}{'GPUs':>5}" + "".join(f"{k:>11}" for k in PHASES)
          + f"{'candidate':>11}{'×alone':>8}{'CPU s':>8}{'ms':>9}")
    with tempfile.TemporaryDirectory(prefix="autoprec-contention-") as tmp:
        for entry in args.models:
            name, _, batch = entry.partition("@")
            paths, batches = lowered_plans(args.backend, name, int(batch or 32), args.plans, Path(tmp))
            rows = report["models"][entry] = {}
            for setting in args.settings:
                alone = None
                for k in counts:
                    row = summary(at_once(args.backend, k, SETTINGS[setting], paths, batches), alone)
                    alone = alone or row
                    rows[f"{setting} gpus={k}"] = row
                    print(f"{entry:<16}{setting:>10}{k:>5}" + "".join(f"{row[p]:>11.3f}" for p in PHASES)
                          + f"{row['candidate_s']:>11.3f}{row.get('candidate_vs_alone', 1.0):>8.3f}"
                          + f"{row['cpu_s']:>8.2f}{row['latency_ms']:>9.3f}", flush=True)
                    atomic.write_json(args.json, json_safe(report))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared pieces of the benchmarks: the one way a benchmark records (its report: the commit, versions, machine and
engine, date and arguments beside what it measured, written where its arguments say), ``--quick``'s tiny model,
the per-model loop, one prepared zoo model, a measurement cache, models timed side by side."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import functools
import hashlib
import itertools
import json
import math
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime
import optuna

import autoprec
from autoprec.analysis.baseline import Baseline, load_baseline
from autoprec.analysis.data import Batch
from autoprec.app.resolve import declared_tasks, engine_space, judge_for, metric_for, resolve_model
from autoprec.backends import get_backend
from autoprec.backends.base import Backend
from autoprec.core import atomic
from autoprec.core.plan import Plan
from autoprec.core.search_space import load_search_space
from autoprec.core.stored import StoredModel
from autoprec.core.timing import Timing
from autoprec.measure.accuracy import Judge, resolve_metric
from autoprec.measure.measurement import Screen, accuracy_loss, measure
from autoprec.measure.speedup import in_turn
from autoprec.record.trial import Measurement
from autoprec.results.files import json_safe
from autoprec.study.opening import default_sampler, open_study
from autoprec.study.optimize import run_study, seed_plans
from autoprec.study.reading import finished_records

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# The model every --quick runs: tests/builders.py's conv net (batch dim N), made in this process with image-like items.
TINY = "tiny"
QUICK_HELP = (f"that the benchmark runs end to end and writes its JSON, not its figures: the model {TINY!r} (a small "
              "generated conv net), the smallest budget and rounds; the JSON goes to a temporary folder unless --json")


def machine_facts(backend: Backend) -> dict:
    engine = backend.info()
    return {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()} · {engine.device} · {platform.platform()}",
        "engine": engine.to_json(),
        "code": source_revision(),
        "versions": {"autoprec": autoprec.__version__, "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
                     "optuna": optuna.__version__, "numpy": np.__version__, "python": platform.python_version()},
    }


def source_revision(checkout: Path = HERE) -> str | None:
    """The commit a checkout holds (``-dirty``: with uncommitted changes), so that figures are tied to the code
    that produced them; None outside a git checkout. By default this one: the commit the benchmark ran."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=checkout,
                              capture_output=True, text=True, check=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--quick`` and ``--json``, which every benchmark takes (see :class:`Report`)."""
    parser.add_argument("--quick", action="store_true", help=QUICK_HELP)
    parser.add_argument("--json", type=Path, help="where the JSON goes (default: benchmarks/results/; with --quick, "
                                                  "a temporary folder)")


def add_retime_argument(parser: argparse.ArgumentParser) -> None:
    """``--retime-seconds`` for a benchmark that runs searches: their final timing's limit (``QUICK_RETIME``, its
    shortest: six blocks of rounds, with --quick)."""
    parser.add_argument("--retime-seconds", type=float, default=10.0, help="the searches' --retime-seconds")


QUICK_RETIME = 0.1


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                    quick: Mapping[str, Any]) -> argparse.Namespace:
    """The arguments (``--quick`` and ``--json`` added), with ``quick``'s values in place of the defaults they name
    when --quick is given (a value given on the command line stays)."""
    add_output_arguments(parser)
    return with_quick(parser, parser.parse_args(argv), quick)


def with_quick(parser: argparse.ArgumentParser, args: argparse.Namespace,
               quick: Mapping[str, Any]) -> argparse.Namespace:
    if args.quick:
        for key, value in quick.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    return args


class Report(dict):
    """A benchmark's JSON: where and how it ran (the date, machine, engine, commit and versions of
    :func:`machine_facts`, its arguments, quick or full), then what it found. :meth:`write` puts it whole, after
    each step, at ``--json``, else at ``benchmarks/results/NAME.json``; with --quick in a temporary folder, so that
    a quick run never replaces the figures the docs cite."""

    def __init__(self, name: str, args: argparse.Namespace, backend: Backend, **found: Any):
        super().__init__(machine_facts(backend), arguments=json.loads(json.dumps(vars(args), default=str)),
                         mode="quick" if args.quick else "full", **found)
        self.path = args.json or (quick_folder() if args.quick else RESULTS) / f"{name}.json"

    def write(self) -> Path:
        atomic.write_json(self.path, json_safe(self))
        return self.path


def quick_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / "autoprec-benchmarks"
    folder.mkdir(exist_ok=True)
    return folder


def model_source(name: str) -> tuple[str, Path | None, dict[str, list[int]] | None]:
    """What a search is given for a benchmark's model NAME: ``zoo:NAME`` (its own data and shapes), for
    :data:`TINY` the generated conv net, its items and its input shape, or a model file (``*.onnx``: a generated
    one, benchmarks/synthetic.py) as it is, searched on random inputs."""
    if name.endswith(".onnx"):
        return name, None, None
    if name != TINY:
        return f"zoo:{name}", None, None
    return str(_tiny()["model"]), _tiny()["data"], {"x": [1, 3, 16, 16]}


def resolve(name: str) -> tuple[Path, Any, Mapping[str, Sequence[int]] | None, str]:
    """:func:`autoprec.app.resolve.resolve_model` of a benchmark's model NAME (see :func:`model_source`)."""
    return resolve_model(*model_source(name))


TINY_ITEMS = 24


@functools.cache
def _tiny() -> dict[str, Path]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import builders

    folder = Path(tempfile.mkdtemp(prefix="autoprec-tiny-"))
    atexit.register(shutil.rmtree, folder, True)
    model, data = builders.conv_with_data(folder, TINY_ITEMS, batch="N", name=f"{TINY}.onnx")
    return {"model": model, "data": data}


def run_models(report: Report, names: Iterable[str], run: Callable[[str], dict]) -> None:
    """``report["models"][name] = run(name)`` (with the commit that measured it) for each, the report written after
    each model so that an interrupted run keeps what it measured.

    Models an earlier run of the same benchmark wrote to the report's file on the same machine, engine
    and settings are kept (listed under ``"earlier_runs"`` with their date), so a long benchmark can
    be run a few models at a time."""
    names = list(names)
    earlier = _earlier_models(report, names)
    if earlier:
        report["models"].update(earlier["models"])
        report["earlier_runs"] = earlier["runs"]
    for name in names:
        print(f"[{name}] …", file=sys.stderr, flush=True)
        report["models"][name] = {**run(name), "code": report.get("code")}
        report.write()


def _earlier_models(report: Report, rerun: list[str]) -> dict:
    try:
        earlier = json.loads(report.path.read_text())
    except (OSError, ValueError):
        return {}
    same = ("machine", "mode", "budget", "seeds", "reference_trials")
    engine_identity = ("backend", "engine", "version", "provider", "device", "qdq_form")

    def engine(r: dict) -> tuple:
        return tuple((r.get("engine") or {}).get(k) for k in engine_identity)

    if any(earlier.get(key) != report.get(key) for key in same) or engine(earlier) != engine(report):
        return {}
    kept = {name: m for name, m in earlier.get("models", {}).items() if name not in rerun}
    runs = {name: date for name, date in earlier.get("earlier_runs", {}).items() if name in kept}
    runs.update({name: earlier["date"] for name in kept if name not in runs})
    return {"models": kept, "runs": runs} if kept else {}


def model_sources(zoo: str, given: Iterable[str]) -> dict[str, tuple[str, Path | None]]:
    """name -> (model, data): zoo entries (or :data:`TINY`) by name, comma-separated, and
    ``NAME=MODEL.onnx[:DATA.npz]`` models."""
    sources: dict[str, tuple[str, Path | None]] = {name: model_source(name)[:2] for name in filter(None, zoo.split(","))}
    for spec in given:
        name, _, rest = spec.partition("=")
        model, _, data = rest.partition(":")
        sources[name] = (model, Path(data) if data else None)
    return sources


def model_key(model: StoredModel) -> str:
    """What a model is within one run: its graph and the folder its weights live in (equal graphs in one
    folder are equal models; the graph alone holds no weights over 1 KiB)."""
    digest = hashlib.sha256(model.proto.SerializeToString())
    digest.update(str(model.folder).encode())
    return digest.hexdigest()


@dataclass
class CachedMeasure:
    """In-process measurement, each distinct lowered model measured once across every study of a run.

    Sharing measurements means two methods that propose the same plan see the same numbers, so
    their comparison is not decided by timing noise; it also makes the dense reference affordable.
    """

    backend: Backend
    baseline: Baseline
    judge: Judge
    screen: Screen | None = None  # cheap rejection, as a search with --max-loss does it
    cache: dict[str, Measurement] = field(default_factory=dict)
    measured: int = 0

    losses: dict[str, float] = field(default_factory=dict)  # plans judged for their loss only (not timed)

    def __call__(self, plan: Plan) -> Measurement:
        """A study's ``measure``: the plan lowered here, then :meth:`measure_model`."""
        return self.measure_model(self._lower(plan))

    def measure_model(self, model: StoredModel) -> Measurement:
        key = model_key(model)
        if key not in self.cache:
            self.measured += 1
            self.cache[key] = measure(self.backend, model, self.baseline.dataset.evaluation, self.judge, self.screen)
        return self.cache[key]

    def loss(self, plan: Plan) -> float:
        """The judge's loss on every evaluation batch, untimed (a reference executor's), each plan once."""
        model = self._lower(plan)
        key = model_key(model)
        if key not in self.losses:
            self.losses[key] = accuracy_loss(self.backend, model, self.baseline.dataset.evaluation, self.judge)
        return self.losses[key]

    def _lower(self, plan: Plan) -> StoredModel:
        return self.backend.lower(self.baseline.info, plan, self.baseline.ranges)


def plain_run_ms(session: onnxruntime.InferenceSession, feeds: dict, warmup: int, runs: int) -> list[float]:
    """A plain ONNX Runtime session as a user times it: ``warmup`` runs, then each of ``runs`` runs' wall time (ms)."""
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_interleaved(
    backend: Backend, models: Sequence[StoredModel], batch: Batch, rounds: int
) -> list[list[Timing] | None]:
    """Build each model once, then time them in turn, ``rounds`` times, so drift (a busy neighbour,
    clocks) hits all alike, each round starting one model later (``in_turn``). A model that fails to build or
    run gets None; the others go on.

    Every model's engine stays alive to the end: fine for the zoo's small models, not for large ones
    (the search itself times one plan at a time beside all-FP32: ``autoprec.measure.measurement.time_paired``)."""
    with contextlib.ExitStack() as stack:
        runners = []
        for model in models:
            try:
                runner = stack.enter_context(backend.runner(model))
                runner.run(batch)  # first run: allocations and kernel selection stay out of the rounds
                runners.append(runner)
            except Exception:  # noqa: BLE001 - engines raise their own types; this model is left out
                runners.append(None)
        timings: list[list[Timing] | None] = [[] if r is not None else None for r in runners]
        for round_ in range(rounds):
            for i in in_turn(range(len(runners)), round_):
                runner = runners[i]
                if timings[i] is not None:
                    try:
                        timings[i].append(runner.time(batch))
                    except Exception:  # noqa: BLE001
                        timings[i] = None
    return timings


def prepare_zoo(name: str, backend: str = "ort-cpu") -> tuple[Baseline, Backend]:
    """The zoo model (or :data:`TINY`) prepared as ``autoprec search zoo:NAME`` on ``backend`` prepares it: in the
    space that engine searches (its pinned ops and slow precisions left out)."""
    model_path, data, shapes, _ = resolve(name)
    engine = get_backend(backend)
    space, _, _ = engine_space(load_search_space(), engine, None)
    return load_baseline(model_path, space, data, shapes), engine


def zoo_judge(name: str, baseline: Baseline, metric: str = "cosine") -> Judge:
    """The judge a search of zoo:NAME with --metric METRIC uses: the entry's task metric and its labels beside."""
    tasks = declared_tasks(model_source(name)[0])
    return judge_for(metric_for(resolve_metric(metric, tasks), baseline.info, baseline.dataset), baseline)[0]


# The task metrics a benchmark reports beside its loss (see autoprec.measure.accuracy): higher or lower is better.
TASK_KEYS = ("top1", "cer", "map50", "nn_agreement", "top1_labels", "cer_labels", "map50_labels")


def task_metrics(metrics: dict) -> dict:
    """The task metrics among a measurement's per-output metrics, by output."""
    found = {name: {k: round(v, 4) for k, v in values.items() if k in TASK_KEYS} for name, values in metrics.items()}
    return {name: values for name, values in found.items() if values}


def dense_reference(ctx, trials: int, name: str) -> tuple[list, int]:
    """The reference front's study: every plan where the plan space has at most ``trials`` plans,
    else ``trials`` of them (the uniform plans first, then multivariate TPE). Returns its finished
    records and its size."""
    units = ctx.info.searchable_units
    space = math.prod(len(u.allowed) for u in units)
    study = open_study(optuna.storages.InMemoryStorage(), f"{name}-reference", {}, default_sampler(1000))
    if space <= trials:  # exhaustive
        for choice in itertools.product(*[[p.value for p in u.allowed] for u in units]):
            study.enqueue_trial(dict(zip([u.name for u in units], choice)))
    else:
        seed_plans(study, ctx)
    run_study(study, ctx, min(space, trials))
    return finished_records(study), min(space, trials)

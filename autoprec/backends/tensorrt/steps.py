"""``autoprec doctor`` on TensorRT: what a search and an export ask of it, in order. The build steps
need no GPU (TensorRT for RTX runs them anywhere); loading, running and timing an engine need a GPU
it runs on."""

from __future__ import annotations

from typing import Any, Callable

from autoprec.backends.doctor_steps import DoctorCase, Made, NotHere, Step, running_steps
from autoprec.backends.tensorrt.layers import parse_engine_layers
from autoprec.backends.tensorrt.loader import TimingCache, build_engine, import_tensorrt, stamp_plan
from autoprec.backends.tensorrt.runner import RuntimeCache, TensorRTRunner
from autoprec.core.errors import BackendError
from autoprec.lower import lower_plan


def tensorrt_steps(backend: type, case: DoctorCase, made: Made,
                   gpu_found: Callable[[], dict[str, str]],
                   cuda: Callable[[], Any]) -> list[Step]:
    """``backend``: the TensorRT backend class (its flavour and Q/DQ form); ``gpu_found`` and
    ``cuda``: its GPU check and CUDA API for the device asked."""
    flavour, folder = backend.flavour, made.folder
    timing_cache = TimingCache(folder / "timing-cache" if flavour.timing_cache else None)

    def imported() -> str:
        made["trt"] = trt = import_tensorrt(flavour)
        return f"{trt.__name__} {trt.__version__}"

    def lowered() -> str:
        for key, info in (("fixed", case.info), ("dynamic", case.info.for_deployment())):
            made[key] = stamp_plan(lower_plan(info, case.plan, case.ranges, backend.qdq_form), info, case.plan)
        return f"{backend.qdq_form.value} Q/DQ form at the measured shapes and on the deployable dims"

    def built() -> str:
        made["built"] = engine = build_engine(made["trt"], flavour, made["fixed"], timing_cache)
        fidelity = engine.report.get("plan_fidelity") or {}
        if fidelity.get("plan_ignored"):
            raise BackendError(f"the engine ignores the plan: {fidelity['ignored_units']} "
                               f"({fidelity['source']})")
        checked = f"{fidelity['checked_units']} units at their planned precision ({fidelity['source']})" \
            if fidelity else "no layer precisions reported"
        return f"{len(engine.serialized)} bytes in {engine.report['build_seconds']:.1f} s; {checked}"

    def built_with_profile() -> str:
        profile = case.info.shape_profile
        build_engine(made["trt"], flavour, made["dynamic"], timing_cache, profile=profile)
        return "; ".join(f"{i.name} min {list(i.min)} opt {list(i.opt)} max {list(i.max)}" for i in profile.inputs)

    def cached() -> str:
        return f"{timing_cache.path} ({timing_cache.path.stat().st_size} bytes)"

    def gpu() -> str:
        try:
            found = gpu_found()
        except BackendError as exc:
            raise NotHere(str(exc)) from None
        return f"{found['name']}, compute capability {found.get('compute_capability') or '?'}"

    def cuda_from_python() -> str:
        made["cuda"] = api = cuda()
        return type(api).__name__

    def loaded() -> str:
        cache = RuntimeCache(folder / "runtime-cache" if flavour.runtime_cache else None)
        made["runner"] = made.stack.enter_context(TensorRTRunner(made["trt"], lambda: made["cuda"], made["built"],
                                                                 cache if flavour.runtime_cache else None))
        return "deserialised, execution context made"

    def inspected() -> str:
        layers = parse_engine_layers(made["runner"].layer_json).layers
        return f"{len(layers)} layers in the inspector's JSON"

    def profiled() -> str:
        return f"{len(made['runner'].layer_times(case.batch, 3))} layers timed by the profiler"

    build_fix = "see TensorRT's message; run again with --verbose for its log"
    return [
        Step("import", imported, flavour.install),
        Step("lower the plan", lowered, "a bug in autoprec's lowering: report it with --verbose",
             ("import",)),
        Step("build strongly typed", built, build_fix, ("lower the plan",)),
        Step("build with a profile (export)", built_with_profile, build_fix, ("lower the plan",),
             needed=False),
        *([Step("timing cache", cached, "the folder cannot hold it: check its space and rights",
                ("build strongly typed",), needed=False)] if flavour.timing_cache else []),
        Step("GPU", gpu, _gpu_fix(flavour)),
        Step("CUDA from Python", cuda_from_python, flavour.install, ("GPU",)),
        Step("load (deserialise)", loaded, build_fix, ("build strongly typed", "CUDA from Python")),
        Step("inspector JSON", inspected, build_fix, ("load (deserialise)",), needed=False),
        *running_steps(made, case, "load (deserialise)"),
        Step("profiler", profiled, "the search still runs, without its ranking by time",
             ("execute",), needed=False),
    ]


def _gpu_fix(flavour: Any) -> str:
    """Where a TensorRT flavour runs engines, as the fix for a machine it does not run them on."""
    if not flavour.gpus:
        return "run on a machine with an NVIDIA GPU this TensorRT supports"
    runs_on = [g for g in flavour.gpus if not g.startswith("12.")] + ["12.x"]
    return f"run on a GPU of compute capability {', '.join(runs_on)} (A100, RTX 30/40/50, L4/L40, RTX PRO)"

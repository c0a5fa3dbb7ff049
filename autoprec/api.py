"""autoprec's Python API: one function per verb of the command line, same options as keywords.

    import autoprec.api as ap
    result = ap.search(ap.SearchConfig(ap.InputSpec("model.onnx", data="samples/"), judge=ap.JudgeSpec(max_loss=0.01),
                                       study=ap.StudySpec(budget=50)))
    ap.check_plan(result.out_dir)  # the search's own judge, engine and data

The pipelines behind them live in :mod:`autoprec.app`; nothing here prints unless asked to.
"""

from autoprec.app.config import SearchConfig
from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.recorded import recorded_config, recreate
from autoprec.app.search import search
from autoprec.app.search_specs import IsolationSpec, SpaceSpec, StudySpec
from autoprec.app.sensitivity_pass import sensitivity
from autoprec.app.specs import EngineSpec, InputSpec
from autoprec.app.verbs import (
    activation_report,
    check_plan,
    diagnose_plan,
    lowered_for_export,
    study_status,
    tensorrt_build_spec,
)

__all__ = ["EngineSpec", "InputSpec", "IsolationSpec", "JudgeSpec", "SearchConfig", "SpaceSpec",
           "StudySpec",
           "activation_report", "check_plan", "diagnose_plan", "lowered_for_export",
           "recorded_config", "recreate",
           "search", "sensitivity", "study_status", "tensorrt_build_spec"]

"""autoprec's Python API: one function per verb of the command line, same options as keywords.

    import autoprec.api as ap
    result = ap.search("model.onnx", budget=50, data="samples/", max_loss=0.01)
    ap.check_plan(result.out_dir, None, max_loss=0.01)

The pipelines behind them live in :mod:`autoprec.app`; nothing here prints unless asked to.
"""

from autoprec.app.prepare import recreate
from autoprec.app.search import search
from autoprec.app.sensitivity import sensitivity
from autoprec.app.verbs import (
    activation_report,
    check_plan,
    diagnose_plan,
    lowered_for_export,
    study_status,
    tensorrt_build_spec,
)

__all__ = ["activation_report", "check_plan", "diagnose_plan", "lowered_for_export", "recreate", "search",
           "sensitivity", "study_status", "tensorrt_build_spec"]

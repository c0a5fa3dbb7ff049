"""autoprec: per-layer INT8/FP16/FP32 precision search for ONNX models, by measurement.

    import autoprec
    result = autoprec.search(autoprec.SearchConfig(autoprec.InputSpec("model.onnx", data="samples/"),
                                                   judge=autoprec.JudgeSpec(max_loss=0.01),
                                                   study=autoprec.StudySpec(budget=50)))
"""

import logging

from autoprec.api import (
    EngineSpec,
    InputSpec,
    IsolationSpec,
    JudgeSpec,
    SearchConfig,
    SpaceSpec,
    StudySpec,
    search,
)
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Plan, Precision
from autoprec.results.files import SearchResult

# the API logs; only the command line prints
logging.getLogger("autoprec").addHandler(logging.NullHandler())

__all__ = ["AutoprecError", "EngineSpec", "InputSpec", "IsolationSpec", "JudgeSpec", "Plan",
           "Precision",
           "SearchConfig", "SearchResult", "SpaceSpec", "StudySpec", "search"]
__version__ = "0.1.0"

"""autoprec: per-layer INT8/FP16/FP32 precision search for ONNX models, by measurement.

    import autoprec
    result = autoprec.search(autoprec.SearchConfig(autoprec.InputSpec("model.onnx", data="samples/"),
                                                   judge=autoprec.JudgeSpec(max_loss=0.01),
                                                   study=autoprec.StudySpec(budget=50)))

The names below are imported when first used: a measuring worker, which imports
``autoprec.measure`` alone, starts without the search's own imports (Optuna, the command line's,
the plots': 0.7 of its 1.3 s on a 2-core VM).
"""

import importlib
import logging

# the API logs; only the command line prints
logging.getLogger("autoprec").addHandler(logging.NullHandler())

_HOMES = {
    "EngineSpec": "autoprec.api", "InputSpec": "autoprec.api", "IsolationSpec": "autoprec.api",
    "JudgeSpec": "autoprec.api", "SearchConfig": "autoprec.api", "SpaceSpec": "autoprec.api",
    "StudySpec": "autoprec.api", "search": "autoprec.api",
    "AutoprecError": "autoprec.core.errors",
    "Plan": "autoprec.core.plan", "Precision": "autoprec.core.plan",
    "SearchResult": "autoprec.results.files",
}
__all__ = sorted(_HOMES)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'autoprec' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])

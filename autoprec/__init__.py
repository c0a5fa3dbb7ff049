"""autoprec: per-layer INT8/FP16/FP32 precision search for ONNX models, by measurement.

    import autoprec
    result = autoprec.search("model.onnx", budget=50, data="samples/", max_loss=0.01)
"""

import logging

from autoprec.api import search
from autoprec.core.errors import AutoprecError
from autoprec.core.plan import Plan, Precision
from autoprec.results.files import SearchResult

logging.getLogger("autoprec").addHandler(logging.NullHandler())  # the API logs; only the command line prints

__all__ = ["AutoprecError", "Plan", "Precision", "SearchResult", "search"]
__version__ = "0.1.0"

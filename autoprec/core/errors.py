"""User-facing failures: each says what went wrong, with which input, and what to do."""

import re


class AutoprecError(Exception):
    """Base class: the CLI prints these as one line and exits 2, with no traceback."""


class ModelError(AutoprecError):
    """The ONNX model cannot be loaded, checked, shape-fixed or searched."""


class DataError(AutoprecError):
    """The sample inputs do not fit the model."""


class SearchSpaceError(AutoprecError):
    """The search-space file or an override is invalid."""


class StudyError(AutoprecError):
    """The Optuna storage or study cannot be used for this search."""


class SearchFailed(AutoprecError):
    """No candidate could be measured: the search has no result to choose from."""


class BackendError(AutoprecError):
    """An inference engine is missing or cannot run a candidate."""


class ExportError(AutoprecError):
    """An export cannot represent the result faithfully (or safely) in the requested format."""


class MetricError(AutoprecError):
    """The accuracy metric itself is wrong (a user's loss function below 0): not one plan's fault, so the
    search stops rather than failing every trial with it."""


def first_line(exc: BaseException) -> str:
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(exc).strip())
    return (text.splitlines() or [type(exc).__name__])[0][:300]

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


class FolderError(AutoprecError):
    """A result, export or cache folder holds what autoprec did not put there (a link, a FIFO, a
    device, a file too large or too deep to read): autoprec reads and writes such a folder as input,
    not trust."""


class MetricError(AutoprecError):
    """The accuracy metric itself is wrong (a user's loss function below 0): not one plan's fault,
    so the search stops rather than failing every trial with it."""


ONNXRUNTIME_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")


def first_line(error: BaseException | str, limit: int | None = 300, empty: str | None = None) -> str:
    """What a one-line message quotes of a cause: the first line of an error's text (an exception,
    or one stored as text), ONNX Runtime's "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : " prefix
    dropped, at most ``limit`` characters (None: the whole line). A text with no line is ``empty``:
    by default an exception's type name, for a stored text nothing (pass ``empty=""`` where the
    message names the type beside it)."""
    text = ONNXRUNTIME_PREFIX.sub("", str(error).strip())
    if empty is None:
        empty = type(error).__name__ if isinstance(error, BaseException) else ""
    return (text.splitlines() or [empty])[0][:limit]

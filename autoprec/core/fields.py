"""A JSON document read field by field: each read checks the value's kind where it is read, and a
value that is not of the kind autoprec writes is refused in one line naming the file and the field's
path (``front[0].plan.counts.int8``). The typed values of the result files read themselves through
it, so their ``from_json`` is also their check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Sequence

from autoprec.core.errors import AutoprecError

NON_FINITE = ("inf", "-inf", "nan")  # how a result file writes the numbers strict JSON lacks


class RecordError(AutoprecError):
    """A result file that is not as autoprec wrote it."""


@dataclass(frozen=True)
class Fields:
    """``value`` found at ``path`` in ``file``."""

    value: Any
    file: Path
    path: str = ""

    def refuse(self, problem: str) -> NoReturn:
        fix = ("give a changed plan to check or diagnose with --plan FILE (a copy outside the "
               "result) instead, or rerun the search" if Path(self.file).parent.name == "best" else
               "rerun the search to rewrite the result files")
        raise RecordError(f"{self.file}: {problem}; it is not as autoprec wrote it (edited or "
                          f"damaged): {fix}")

    @property
    def _name(self) -> str:
        return self.path or "the top level"

    def as_object(self) -> dict[str, Any]:
        """The value, which must be a JSON object."""
        if not isinstance(self.value, dict):
            self.refuse(f"{self._name} is not an object")
        return self.value

    def _at(self, key: str) -> Fields:
        return Fields(self.as_object()[key], self.file, f"{self.path}.{key}".lstrip("."))

    def __getitem__(self, key: str) -> Fields:
        if key not in self.as_object():
            self.refuse(f"{self.path}.{key} is missing".lstrip("."))
        return self._at(key)

    def get(self, key: str) -> Fields | None:
        """The field where the document has it (a key that older results lack), else None."""
        return self._at(key) if key in self.as_object() else None

    def nullable(self) -> Fields | None:
        """None where the value is null."""
        return None if self.value is None else self

    def text_or_none(self) -> str | None:
        """A text, or None where the value is null."""
        return None if self.value is None else self.text()

    def number_or_none(self) -> float | None:
        """A number (as a float), or None where the value is null."""
        return None if self.value is None else float(self.number())

    def kind(self, *kinds: type) -> Any:
        """The value, which must be of one of ``kinds`` (a bool is no int)."""
        value = self.value
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self.refuse(f"{self._name} is {value!r:.60}, not "
                        f"{' or '.join(k.__name__ for k in kinds)}")
        return value

    def number(self) -> float:
        """An int or float, or "inf" / "-inf" / "nan" as autoprec writes those (read back as
        floats)."""
        value = self.value
        if isinstance(value, str) and value in NON_FINITE:
            return float(value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self.refuse(f"{self._name} is {value!r:.60}, not a number")
        return value

    def integer(self) -> int:
        return self.kind(int)

    def text(self) -> str:
        return self.kind(str)

    def flag(self) -> bool:
        return self.kind(bool)

    def one_of(self, values: Sequence[Any]) -> Any:
        if self.value not in values:
            self.refuse(f"{self._name} is {self.value!r:.60}, not one of "
                        f"{', '.join(map(str, values))}")
        return self.value

    def items(self) -> list[Fields]:
        if not isinstance(self.value, list):
            self.refuse(f"{self._name} is not a list")
        return [Fields(item, self.file, f"{self.path}[{i}]") for i, item in enumerate(self.value)]

    def mapping(self) -> dict[str, Fields]:
        """An object with any keys (its values read by the caller)."""
        return {key: self._at(key) for key in self.as_object()}

    def numbers(self) -> list[float]:
        return [item.number() for item in self.items()]

    def integers(self) -> list[int]:
        return [item.integer() for item in self.items()]

    def texts(self) -> list[str]:
        return [item.text() for item in self.items()]

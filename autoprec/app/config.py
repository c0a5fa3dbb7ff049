"""What a search is asked, in the spec groups every verb shares (see :mod:`autoprec.app.specs`),
checked once, whether it came from the command line or the Python API; recorded in the result, read
back from it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from autoprec.app.judge_specs import JudgeSpec
from autoprec.app.search_specs import IsolationSpec, SpaceSpec, StudySpec
from autoprec.app.specs import EngineSpec, Group, InputSpec
from autoprec.backends import BACKENDS, backend_class
from autoprec.core.errors import AutoprecError

GROUPS = {"inputs": InputSpec, "engine": EngineSpec, "judge": JudgeSpec, "space": SpaceSpec,
          "study": StudySpec,
          "isolation": IsolationSpec}


@dataclass(frozen=True)
class SearchConfig:
    """The options of ``autoprec search``, by group (see :func:`autoprec.app.search.search` for what
    each does), and the few that belong to the search alone: where it writes, progress, the final
    timing, ``--time-shapes``, the figures."""

    inputs: InputSpec
    engine: EngineSpec = field(default_factory=EngineSpec)
    judge: JudgeSpec = field(default_factory=JudgeSpec)
    space: SpaceSpec = field(default_factory=SpaceSpec)
    study: StudySpec = field(default_factory=StudySpec)
    isolation: IsolationSpec = field(default_factory=IsolationSpec)
    out: str | os.PathLike | None = None
    progress: bool = False
    time_shapes: bool = False
    # None: ShipRule.final_seconds of the search's measuring stages
    retime_seconds: float | None = None
    ship_within_noise: bool = False
    plots: bool = True

    def checked(self) -> SearchConfig:
        """This configuration, or one line naming the option that cannot be used and why."""
        for group, spec in GROUPS.items():
            if not isinstance(getattr(self, group), spec):
                raise AutoprecError(f"SearchConfig({group}=...): takes {spec.__name__}(...), not a "
                                    f"{type(getattr(self, group)).__name__}")
            getattr(self, group).checked()
        if self.time_shapes and (why := backend_class(self.engine.backend).one_shape_only):
            able = [name for name in BACKENDS if not backend_class(name).one_shape_only]
            raise AutoprecError(f"--time-shapes on {self.engine.backend}: {why}, or search with "
                                f"--backend {' / '.join(able)}")
        if self.retime_seconds is not None and not (self.retime_seconds > 0 and math.isfinite(self.retime_seconds)):
            raise AutoprecError(f"--retime-seconds {self.retime_seconds}: must be a finite number "
                                "more than 0")
        return self

    def groups(self) -> dict[str, Group]:
        """The spec groups by name (what a result records of the search:
        :func:`autoprec.app.specs.recorded`)."""
        return {name: getattr(self, name) for name in GROUPS}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchConfig:
        return cls(**{name: spec.from_json(data[name]) for name, spec in GROUPS.items() if name in data})

"""The installed package contains every subpackage (an editable install or the source tree would hide a gap), and
imports what each use of it needs."""

import ast
import re
import subprocess
import sys

from conftest import REPO

import autoprec


def test_every_subpackage_is_in_the_wheel():
    text = (REPO / "pyproject.toml").read_text()
    listed = set(ast.literal_eval(re.search(r"^packages = (\[.*\])$", text, re.M).group(1)))
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "autoprec").rglob("__init__.py")}
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"


def test_every_public_name_is_there_when_first_asked_for():
    assert set(autoprec.__all__) <= set(dir(autoprec))
    assert all(getattr(autoprec, name) is not None for name in autoprec.__all__)
    assert autoprec.Plan.__module__ == "autoprec.core.plan" and callable(autoprec.search)


def test_a_measuring_worker_starts_without_the_searchs_imports():
    """A worker imports autoprec.measure alone: Optuna, the figures' and the command line's modules stay out of
    every worker's start (0.7 of its 1.3 s on a 2-core VM)."""
    done = subprocess.run([sys.executable, "-c", "import sys, autoprec.measure.isolation\n"
                           "print(sorted(m for m in ('optuna', 'matplotlib', 'rich', 'PIL') if m in sys.modules))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])

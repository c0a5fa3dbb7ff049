"""The installed package contains every subpackage (an editable install or the source tree would hide a gap)."""

import ast
import re

from conftest import REPO


def test_every_subpackage_is_in_the_wheel():
    text = (REPO / "pyproject.toml").read_text()
    listed = set(ast.literal_eval(re.search(r"^packages = (\[.*\])$", text, re.M).group(1)))
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "autoprec").rglob("__init__.py")}
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"

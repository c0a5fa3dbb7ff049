"""The README stays a page a newcomer reads in minutes; the rest lives in docs/, which builds cleanly."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_fits_on_a_screen_and_links_only_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)", readme)
    assert links and all((ROOT / link).is_file() for link in links), links
    quick = readme.split("## Quick start")[1].split("```bash")[1].split("```")[0].strip().splitlines()
    assert len(quick) == 2 and "pytest" in quick[1]  # exactly two commands: the search, then the tests


def test_docs_build_strictly(tmp_path):  # MkDocs comes with the test extra
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(page in nav for page in pages)  # every page is reachable from the navigation

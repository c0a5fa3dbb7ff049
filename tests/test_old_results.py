"""A result written before issue 53's redesign (tests/fixtures/result_before_53, by
tests/fixtures/make_result_before_53.py) reads as it did: the verbs that read it print what they printed then, one
without the keys older results lack still shows, the verbs that re-create it run, and its study resumes."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import builders
import pytest
import same_numbers
from searching import main, search

import autoprec

FIXTURE = Path(__file__).parent / "fixtures" / "result_before_53"
SOURCE = (FIXTURE / "SOURCE").read_text().strip()
EXPECTED = FIXTURE / "expected"
FILES = ("pareto.json", "trials.json", "best/plan.json")


def _printed(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(list(argv))
    return status, out.getvalue()


@pytest.fixture
def older(tmp_path, monkeypatch) -> Path:
    """The fixture's result in ``tmp_path / "result"`` beside its model and data (made again, the same bytes), the
    paths it records moved there, the working directory ``tmp_path`` (the verbs name it "result", as when the
    fixture was written)."""
    builders.mlp_with_data(tmp_path)
    shutil.copytree(FIXTURE / "result", tmp_path / "result")
    for name in FILES:
        path = tmp_path / "result" / name
        path.write_text(path.read_text().replace(SOURCE, str(tmp_path)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "160")
    return tmp_path


def test_an_older_result_shows_and_compares_as_it_did(older):
    status, shown = _printed("show", "result")
    assert status == 0 and shown == (EXPECTED / "show.txt").read_text()
    status, shown = _printed("show", "result", "--json")
    expected = json.loads((EXPECTED / "show.json").read_text().replace(SOURCE, str(older)))
    assert status == 0 and json.loads(shown) == expected
    status, shown = _printed("compare", "result", "result")
    assert status == 0 and shown == (EXPECTED / "compare.txt").read_text()
    assert _printed("report", "result")[0] == 0 and (older / "result" / "report.html").is_file()
    assert _printed("plot", "result")[0] == 0


def test_an_older_results_build_card_and_check_are_as_they_were(older):
    assert _printed("export", "result", "--format", "markdown", "--out", "card")[0] == 0
    assert (older / "card" / "BUILD.md").read_text() == (EXPECTED / "BUILD.md").read_text().replace(SOURCE, str(older))
    assert _printed("check", "result")[0] in (0, 1)  # re-measured on this machine: a verdict, never a refusal


def test_an_older_result_without_the_keys_older_ones_lack_still_shows(older):
    optional = json.loads((EXPECTED / "optional_keys.json").read_text())
    for name in FILES:
        path = older / "result" / name
        document = json.loads(path.read_text())
        for section, keys in (("search", optional["search"]), ("engine", optional["engine"]),
                              ("model", optional["model"])):
            for key in keys:
                document[section].pop(key, None)
        for key in optional["pareto"] if name == "pareto.json" else optional["plan"] if name != "trials.json" else ():
            document.pop(key, None)
        path.write_text(json.dumps(document))
    assert _printed("show", "result")[0] == 0
    assert _printed("show", "result", "--json")[0] == 0
    assert _printed("compare", "result", "result")[0] == 0


def test_an_older_study_resumes_without_a_new_trial_and_with_its_numbers(older):
    before = same_numbers.numbers(older / "result", by_number=True)
    search(autoprec.SearchConfig(
        autoprec.InputSpec(older / "mlp.onnx", data=older / "data.npz"), judge=autoprec.JudgeSpec(max_loss=0.02),
        study=autoprec.StudySpec(budget=6, seed=0), isolation=autoprec.IsolationSpec(isolate=False),
        out=older / "result"))
    after = same_numbers.numbers(older / "result", by_number=True)
    assert after["search"]["sensitivity"].pop("from_cache") and not before["search"]["sensitivity"].pop("from_cache")
    assert after["trials"] == before["trials"]
    for part in ("search", "model", "sensitivity"):  # (which plan best/ holds is the timings' to decide)
        differ = same_numbers.compared(after[part], before[part], part)
        # keys a later autoprec adds are no changed number; how the search was asked is spelled as it spells it now
        assert [d for d in differ if not d.endswith("only in the run") and ".spec." not in d] == []

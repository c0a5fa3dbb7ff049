"""The guard of a change that must keep a search's numbers (issue 53 moved code, never numbers): two small seeded
searches, projected onto what timing cannot move (tests/same_numbers.py), against the projection the code before
the change wrote (tests/fixtures/same_numbers.json).

The fixture is regenerated, never edited by hand, on the machine whose tests compare against it (ONNX Runtime's
kernels differ by CPU), from the commit that wrote it (see git log of the file):

    AUTOPREC_SAME_NUMBERS=write python -m pytest tests/test_same_numbers.py
"""

import json
import os
from pathlib import Path

import pytest
import same_numbers
from searching import search

FIXTURE = Path(__file__).parent / "fixtures" / "same_numbers.json"


def test_two_seeded_searches_write_the_numbers_they_wrote_before(tmp_path):
    found = same_numbers.all_numbers(same_numbers.searched(tmp_path, search))
    if os.environ.get("AUTOPREC_SAME_NUMBERS") == "write":
        FIXTURE.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote {FIXTURE}")
    expected = json.loads(FIXTURE.read_text())
    assert same_numbers.compared(found, expected) == []

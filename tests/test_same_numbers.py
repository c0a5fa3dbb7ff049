"""The guard of a change that must keep a search's numbers (issue 53 moved code, never numbers): two small seeded
searches, projected onto what timing cannot move (tests/same_numbers.py), against the projection the code before
the change wrote (tests/fixtures/same_numbers.<sums>.json).

Numbers are compared within a tolerance that a kernel's rounding on another CPU stays inside and a change of code
does not (tests/same_numbers.py's RELATIVE). How a CPU sums INT8 products moves a quantized trial's loss far more
(200-fold on the guard's first Conv: x86 without VNNI adds pairs of products in int16, which saturate), so there is
a fixture for each way (autoprec.backends.int8_sums: ``int32`` or ``int16-pairs``), each holding on every CPU of its
kind. A fixture is regenerated, never edited by hand, from the commit that wrote it (see git log of the file), on a
CPU of its kind (``python tests/same_numbers.py`` says which this one is):

    AUTOPREC_SAME_NUMBERS=write python -m pytest tests/test_same_numbers.py
"""

import json
import os
from pathlib import Path

import pytest
import same_numbers
from searching import search

from autoprec.backends.int8_sums import int8_sums

FIXTURES = Path(__file__).parent / "fixtures"


def test_two_seeded_searches_write_the_numbers_they_wrote_before(tmp_path):
    fixture = FIXTURES / f"same_numbers.{int8_sums()}.json"
    found = same_numbers.all_numbers(same_numbers.searched(tmp_path, search))
    if os.environ.get("AUTOPREC_SAME_NUMBERS") == "write":
        fixture.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote {fixture}")
    assert fixture.is_file(), (f"no {fixture.name}: this CPU sums INT8 products as no fixture's CPU did; write one "
                               "with AUTOPREC_SAME_NUMBERS=write from the commit of the others (git log tests/fixtures)")
    expected = json.loads(fixture.read_text())
    assert same_numbers.compared(found, expected) == []


def test_the_guard_tells_a_kernels_rounding_from_a_change():
    """Another CPU's kernels moved losses in their fifth digit: the same numbers. A change of code moves them more."""
    fixture = {"loss": 2.88234847e-09, "cosine": 0.99999712, "trials": 8, "plan": "int8", "feasible": True}
    rounding = {**fixture, "loss": 2.88231672e-09, "cosine": 0.999997121}
    assert same_numbers.compared(rounding, fixture) == []
    for changed in ({"loss": 2.9e-09}, {"cosine": 0.99999}, {"trials": 9}, {"feasible": False}, {"plan": "fp16"}):
        assert same_numbers.compared({**fixture, **changed}, fixture) != [], changed

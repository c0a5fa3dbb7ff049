"""Repeated structures: the layers of a transformer cost the search one dimension per pattern and position,
not one per layer (generated encoders with random weights: structure is what is tested)."""

import sys

import builders
import numpy as np
import pytest
import searching
from conftest import REPO

import autoprec
from autoprec.analysis.model import analyse
from autoprec.core.plan import Precision
from autoprec.core.search_space import load_search_space
from autoprec.study.optimize import distributions, plan_from_params

sys.path.insert(0, str(REPO / "benchmarks"))
import synthetic  # noqa: E402


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    folder = tmp_path_factory.mktemp("encoders")
    return {layers: synthetic.encoder(folder / f"enc{layers}.onnx", layers=layers, hidden=64, tokens=8, vocab=50)
            for layers in (2, 6)}


def test_an_encoders_layers_add_no_dimension(encoders):
    space = load_search_space()
    two, six = (analyse(encoders[n], space) for n in (2, 6))
    assert len(six.searchable_units) > 2.5 * len(two.searchable_units)
    assert len(six.dimensions) == len(two.dimensions) < len(two.searchable_units)
    q = next(u for u in six.dimensions if u.name == "l0.q/MatMul")
    assert six.members(q.name) == [f"l{i}.q/MatMul" for i in range(6)]  # the query projections, not the keys
    assert "l0.k/MatMul" in {u.name for u in six.dimensions}


def test_a_tied_pattern_takes_one_precision_and_separate_repeats_undoes_it(encoders):
    info = analyse(encoders[6], load_search_space())
    params = {name: "fp32" for name in distributions(info)}
    params["l0.ffn_up/MatMul"] = "int8"
    plan = plan_from_params(info, params, "percentile-99.99").as_dict()
    assert {n for n, p in plan.items() if p is Precision.INT8} == {f"l{i}.ffn_up/MatMul" for i in range(6)}
    assert len(distributions(info.untied())) == len(info.searchable_units)
    narrowed = info.without([Precision.INT8], ["l0.ffn_up/MatMul"], "test")  # a pattern's units go together
    assert len(narrowed.members("l0.ffn_up/MatMul")) == 6
    assert all(Precision.INT8 not in narrowed.unit(n).allowed for n in narrowed.members("l0.ffn_up/MatMul"))


def test_the_sensitivity_pass_evaluates_each_pattern_once(encoders, tmp_path):
    ids = tmp_path / "ids.npz"
    np.savez(ids, input_ids=np.random.default_rng(0).integers(0, 50, (8, 8)).astype(np.int64))
    result = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(encoders[6], data=ids), study=autoprec.StudySpec(budget=3), out=tmp_path / "tied"
        )
    )
    separate = searching.search(
        autoprec.SearchConfig(
            autoprec.InputSpec(encoders[6], data=ids),
            space=autoprec.SpaceSpec(tie_repeats=False),
            study=autoprec.StudySpec(budget=3),
            out=tmp_path / "separate",
        )
    )
    tied, apart = (r.search["sensitivity"]["evaluations"] for r in (result, separate))
    assert apart > 4 * tied
    assert result.search["dimensions"] < separate.search["dimensions"]
    assert result.search["tied_units"] > 0 and separate.search["tied_units"] == 0
    for trial in result.trials:  # every measured plan gives a pattern's units one precision
        plan = trial.plan.as_dict()
        assert len({plan[f"l{i}.v/MatMul"] for i in range(6)}) == 1


def test_a_unit_that_differs_stays_apart(tmp_path):
    info = analyse(builders.save(builders.mlp(), tmp_path / "mlp.onnx"), load_search_space())
    assert info.dimensions == info.searchable_units  # no two layers alike: nothing tied

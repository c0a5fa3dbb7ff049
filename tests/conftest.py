import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import builders  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _the_api_logs_and_only_the_cli_shows_it():
    """The command line installs its handler on autoprec's logger; each test starts without it, so a
    test of the Python API sees what the API alone does (logs, never prints)."""
    yield
    log = logging.getLogger("autoprec")
    for handler in [h for h in log.handlers if not isinstance(h, logging.NullHandler)]:
        log.removeHandler(handler)
    log.setLevel(logging.NOTSET)


@pytest.fixture(scope="session", autouse=True)
def _no_final_timing():
    """The final timing of a search's chosen plan (>= 6 interleaved rounds of three models, up to
    --retime-seconds) is left out of the tests that are not about it (those are marked ``final_timing``):
    with it in every search the suite would not stay under 10 minutes. Without it a search states its
    speed-up as where the final timing fails: from the re-timing's rounds. Session-wide, so module-scoped
    searches go without it too; yields the real one."""
    import autoprec.app.search as search
    from autoprec.results.record import Versus

    real, patch = search._compare_chosen, pytest.MonkeyPatch()
    patch.setattr(search, "_compare_chosen", lambda measurer, trials, chosen, config, apart, holding: (chosen, Versus()))
    yield real
    patch.undo()


@pytest.fixture(autouse=True)
def _final_timing_where_a_test_is_about_it(request, monkeypatch, _no_final_timing):
    if request.node.get_closest_marker("final_timing") is not None:
        monkeypatch.setattr("autoprec.app.search._compare_chosen", _no_final_timing)


@pytest.fixture
def conv_model(tmp_path):
    return builders.save(builders.conv_net(), tmp_path / "conv.onnx")


@pytest.fixture
def conv_data(tmp_path):
    path = tmp_path / "conv_data.npz"
    np.savez(path, x=builders.image_like(12))
    return path


@pytest.fixture
def mlp_model(tmp_path):
    return builders.save(builders.mlp(), tmp_path / "mlp.onnx")


@pytest.fixture
def attention_model(tmp_path):
    return builders.save(builders.attention(), tmp_path / "attention.onnx")

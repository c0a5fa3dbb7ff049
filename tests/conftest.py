import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import builders  # noqa: E402

# pytest-xdist's workers set COLUMNS=80; the tests see a pipe as CI's log does, without it (tables get their room)
os.environ.pop("COLUMNS", None)

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


@pytest.fixture
def workdir(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    builders.save(builders.conv_net(), folder / "conv.onnx")
    return folder


@pytest.fixture(scope="session")
def conv_result(tmp_path_factory):
    """One finished search (with its sensitivity pass) whose files the probes damage, each on a copy."""
    import searching

    import autoprec as api

    root = tmp_path_factory.mktemp("victim")
    model, data = builders.conv_with_data(root, 12)
    out = root / "result"
    searching.search(api.SearchConfig(api.InputSpec(model, data=data), study=api.StudySpec(budget=4), out=out))
    return out


@pytest.fixture(scope="session")
def conv_result_with_a_limit(tmp_path_factory):
    """One finished search with a loss limit, whose files the probes edit, each on a copy."""
    import searching

    import autoprec as api

    root = tmp_path_factory.mktemp("searched")
    model, data = builders.conv_with_data(root, 12)
    out = root / "result"
    searching.search(api.SearchConfig(api.InputSpec(model, data=data), judge=api.JudgeSpec(max_loss=0.5),
                                study=api.StudySpec(budget=4), out=out))
    return out

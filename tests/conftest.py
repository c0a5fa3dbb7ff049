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

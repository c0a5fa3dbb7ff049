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
# --threads' default (autoprec.backends.onnxruntime.threads_from_environment) for every search the tests start, in
# this process and the ones it starts: the suite's processes share the cores, and sessions of a thread per core
# spinning on each took 19 % more of its wall clock (877 -> 712 s on 2 cores, 2026-11-30). The tests time nothing
# they compare with a figure; those of the default itself build their engines with threads given.
os.environ.setdefault("AUTOPREC_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one test process more than the cores. Many tests wait on child processes of their
    own (a search's workers starting, killed, timed out; a study's heartbeat; a signal's delivery),
    and the extra process fills those waits: on 2 cores 516 to 588 s in five runs, against 517 to
    647 s in nine with one per core (2026-11-29)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


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
def conv(conv_model, conv_data):
    """The conv net analysed, its data, and the activation ranges calibrated on that data."""
    from autoprec.analysis.calibrate import calibrate
    from autoprec.analysis.data import build_dataset
    from autoprec.analysis.model import analyse
    from autoprec.core.search_space import load_search_space

    info = analyse(conv_model, load_search_space())
    data = build_dataset(conv_data, info.inputs)
    return info, data, calibrate(info, data.calibration, data.fingerprint())


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
    """One finished search of the conv net with a loss limit (and its sensitivity pass), whose files the probes
    damage or edit, each on a copy."""
    import searching

    import autoprec as api

    root = tmp_path_factory.mktemp("searched")
    model, data = builders.conv_with_data(root, 12)
    out = root / "result"
    searching.search(api.SearchConfig(api.InputSpec(model, data=data), judge=api.JudgeSpec(max_loss=0.5),
                                      study=api.StudySpec(budget=4), out=out))
    return out

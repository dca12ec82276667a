"""Parametrization of the checkpoint suite: reference x prompt (`case`), stored layer (`layer`), `mode`."""

import harness
import pytest


def pytest_generate_tests(metafunc):
    if "case_id" in metafunc.fixturenames:
        metafunc.parametrize("case_id", harness.REFS, ids=[f"{harness.KINDS[r]}-{p}" for r, p in harness.REFS])
    if "layer" in metafunc.fixturenames:
        metafunc.parametrize("layer", harness.stored_layers(), ids=lambda n: f"layer{n}")
    if "mode" in metafunc.fixturenames:
        metafunc.parametrize("mode", harness.MODES)


@pytest.fixture
def case(model, case_id):
    return harness.Case(model, *case_id)

"""The fast tier's share of a parametrized test: conftest.py runs the tiers, tests/README.md says what each covers."""

import pytest


def param(*values, fast, id=None, marks=()):  # one parameter, marked slow unless `fast` (and with `marks`)
    return pytest.param(*values, id=id, marks=(*marks, *(() if fast else (pytest.mark.slow,))))


def first_fast(values):  # the first value in the fast tier, the rest in the slow one
    return [param(v, fast=i == 0) for i, v in enumerate(values)]

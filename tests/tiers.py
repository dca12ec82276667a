"""The fast tier's share of a parametrized test: conftest.py runs the tiers, tests/README.md says what each covers."""

import pytest


def param(*values, fast, id=None, marks=()):  # one parameter, marked slow unless `fast` (and with `marks`)
    return pytest.param(*values, id=id, marks=(*marks, *(() if fast else (pytest.mark.slow,))))


def first_fast(values, n=1):  # the first n values in the fast tier, the rest in the slow one (a tuple: several
    return [param(*(v if isinstance(v, tuple) else (v,)), fast=i < n) for i, v in enumerate(values)]  # parameters)

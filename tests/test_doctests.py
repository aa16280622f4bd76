"""The examples in docstrings run: a module whose example lies fails here."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.unit

MODULES = [
    "tfmagic.logs",
    "tfmagic.logfilter",
    "tfmagic.magics.verbs",
    "tfmagic.gilshare",
    "tfmagic.pace",
    "tfmagic.units",
    "tfmagic.network.links",
    "tfmagic.training.calibrate",
    "tfmagic.experiments.base",
    "tfmagic.experiments.exponential_steps",
    "tfmagic.experiments.ps_scaling",
    "tfmagic.launchers.local",
    "tfmagic.task.host",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result

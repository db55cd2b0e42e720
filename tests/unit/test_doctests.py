"""The pure core's docstring examples run (`nbdist.core`, `nbdist.algorithms`): they are its
documentation, worked out by hand, so one that no longer holds fails here (an edit once broke
the updater's, unseen, since nothing ran them)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import nbdist.algorithms
import nbdist.core

MODULES = sorted(f"{package.__name__}.{info.name}"
                 for package in (nbdist.core, nbdist.algorithms)
                 for info in pkgutil.iter_modules(package.__path__)) + ["nbdist.algorithms"]


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"

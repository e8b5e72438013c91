"""Reusable test helpers (temp git repositories, ...)."""
import importlib.util

import pytest


def require_module(name: str) -> None:
    """Skip the calling test module where ``name`` is not installed, without importing it:
    ``pytest.importorskip("tensorflow")`` at a module's top imported TensorFlow (~6 s of CPU)
    in every xdist worker as it collected the suite, whether or not it ran a test of that module."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed", allow_module_level=True)

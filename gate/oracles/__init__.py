"""Oracles: outputs -> error figures. No search, no framework imports."""
from .precision import Metrics, compare, ulp

__all__ = ["Metrics", "compare", "ulp"]

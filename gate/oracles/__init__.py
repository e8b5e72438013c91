"""Oracles: outputs -> error figures. No search, no framework imports."""
from .pair_metrics import closer, compare_pair
from .precision import Metrics, compare, ulp

__all__ = ["Metrics", "compare", "ulp", "compare_pair", "closer"]

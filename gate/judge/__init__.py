"""Judge: findings + baselines + thresholds -> a verdict per operator x variant."""
from .verdict import GateReport, VariantVerdict

__all__ = ["GateReport", "VariantVerdict"]

"""dl-gate: a CI regression gate for deep-learning operators.

The package is a pipeline; its sub-packages are the stages in the order data flows:

    changes -> select -> plan -> fuzz -> judge -> localise -> report

with ``ops`` (operator specs as data), ``backends`` (torch / tensorflow behind one
interface) and ``oracles`` (outputs -> error figures) beside them.
"""

__version__ = "0.1.0"
HARNESS_VERSION = "2"  # bump when a change makes old baselines incomparable (2: search past NaN/Inf, all-zero reference floor, seed rules)

"""A small user-style operator library with *planted regressions*, for bench/predoo_compare.py.

Each module ships ``base`` (the code on the PR's base branch) and ``head`` (the PR's change):
the head keeps the same float64 behaviour but loses precision in one input region only, the
way real operator regressions do (FIELD_GUIDE §3). ``ops.yml`` declares the head operators as
a user would in ``.dl-gate.yml``."""

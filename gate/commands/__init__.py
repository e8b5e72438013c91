"""One module per ``dl-gate`` sub-command (see gate/cli.py)."""

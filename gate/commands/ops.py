"""``dl-gate ops``: list the operator catalogue (never imports a framework)."""
from __future__ import annotations

import argparse
import json

from ..backends import FRAMEWORKS
from .common import add_config_arg, load, print_table, write_json


def register(sub) -> None:
    p = sub.add_parser("ops", help="list the operator catalogue", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  dl-gate ops --framework torch\n  dl-gate ops --json ops.json")
    add_config_arg(p)
    p.add_argument("--framework", choices=list(FRAMEWORKS), help="only this framework's operators")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write the catalogue as JSON to FILE ('-' or no FILE: stdout)")
    p.set_defaults(func=run)


def run(args) -> int:
    _, catalog = load(args)
    specs = [s for s in catalog if not args.framework or s.framework == args.framework]
    if args.json:
        write_json(args.json, [s.to_dict() for s in specs])
        return 0
    print_table(("operator", "kind", "dtypes", "origin", "callable"),
                [(s.name, s.kind, ",".join(s.dtypes), s.origin, s.callable)
                 for s in sorted(specs, key=lambda s: (s.origin != "user", s.framework, s.name))])
    counts = {}
    for s in specs:
        counts[s.framework] = counts.get(s.framework, 0) + 1
    print(f"\n{len(specs)} operators: " + ", ".join(f"{n} {fw}" for fw, n in sorted(counts.items())))
    return 0

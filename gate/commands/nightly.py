"""``dl-gate nightly``: the scheduled run's graph fuzzing (MCTS or random arm) and
deployment-path differentials within one budget; prints the rows worth a look, the coverage
figures and export failures grouped by converter function."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ..errors import GateError
from ..ops.spec import FLOAT_DTYPES
from .common import add_config_arg, load, print_table, seconds, split_list
from .common import fmt_num as fmt


def register(sub) -> None:
    p = sub.add_parser("nightly", help="graph fuzzing and export differentials (the scheduled run)", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  dl-gate nightly --budget 300 --ops torch.softmax --json nightly.json")
    add_config_arg(p)
    p.add_argument("--budget", type=seconds, default=300.0, metavar="SECONDS", help="total seconds (default 300)")
    p.add_argument("--seed", type=int, help="random seed (default: the config's, else 0)")
    p.add_argument("--arm", default="mcts", choices=["mcts", "random"], help="graph generator (default mcts)")
    p.add_argument("--framework", action="append", metavar="FW", help="torch and/or tensorflow (default torch)")
    p.add_argument("--dtype", action="append", metavar="DTYPE", help="graph dtypes (default float16)")
    p.add_argument("--share", metavar="graphs=F,export=F", help="budget split (default graphs=0.5,export=0.5)")
    p.add_argument("--graphs", type=int, metavar="N", help="evaluate exactly N graphs (reproducible) instead of a time share")
    p.add_argument("--ops", action="append", metavar="OP", help="only these operators (graphs and exports)")
    p.add_argument("--op", action="append", dest="ops", help=argparse.SUPPRESS)  # deprecated spelling of --ops
    p.add_argument("--export-path", action="append", metavar="PATH", help="only these deployment paths")
    p.add_argument("--all", action="store_true", help="print every row, not only the ones worth a look")
    p.add_argument("--json", metavar="FILE", help="write the run (rows, coverage, groups) as JSON")
    p.set_defaults(func=run)


def parse_share(text):
    if not text:
        return None
    out = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise GateError(f"bad --share {text!r} (use graphs=0.5,export=0.5)") from None
        if not sep:
            raise GateError(f"bad --share {text!r} (use graphs=0.5,export=0.5)")
    return out




def detail(f) -> str:
    ex = f.extra or {}
    if f.variant.oracle == "graph":
        fd = ex.get("first_diverging")
        if fd:
            return f"first diverging: n{fd['node']} {fd['op']} ({fd['cause']}, R={fmt(fd['R'])})"
        return f.message or ""
    fail = ex.get("failure")
    if fail:
        return f"{fail.get('kind')}: {fail.get('stage')} in {fail.get('converter_function', '-')}: {fail.get('error', '')}"
    if ex.get("differs") or ex.get("diverges"):
        return (f"differs from eager (vs f64: export {fmt(ex.get('export_vs_f64_ulp'))} ulp,"
                f" eager {fmt(ex.get('eager_vs_f64_ulp'))} ulp{', diverges' if ex.get('diverges') else ''})")
    return f.message or "matches eager"


def worth_a_look(f) -> bool:
    ex = f.extra or {}
    if f.crashes or (f.metrics is not None and f.metrics.severity == math.inf):
        return True
    if f.variant.oracle == "graph":
        return bool(ex.get("first_diverging"))
    return bool(ex.get("diverges") or (ex.get("failure") or {}).get("kind") == "failure")


def run(args) -> int:
    from ..graphs.coverage import format_figures
    from ..graphs.nightly import nightly

    cfg, catalog = load(args)
    dtypes = split_list(args.dtype) or ["float16"]
    for d in dtypes:
        if d not in FLOAT_DTYPES or d == "float64":
            raise GateError(f"unknown graph dtype {d!r} (use float16, bfloat16 or float32)")
    frameworks = split_list(args.framework) or ["torch"]
    for fw in frameworks:
        if fw not in ("torch", "tensorflow"):
            raise GateError(f"unknown framework {fw!r} (use torch or tensorflow)")
    if args.graphs is not None and args.graphs <= 0:
        raise GateError("--graphs must be a positive number")
    seed = args.seed if args.seed is not None else cfg.seed

    def say(msg: str) -> None:  # progress lines go to stderr, the table to stdout
        print(f"dl-gate nightly: {msg}", file=sys.stderr)

    print(f"dl-gate nightly: seed {seed}, budget {args.budget:g}s, arm {args.arm}, frameworks {', '.join(frameworks)}",
          file=sys.stderr)
    specs = catalog.select(split_list(args.ops)) if args.ops else list(catalog)
    res = nightly(specs, budget_seconds=args.budget, seed=seed, frameworks=frameworks,
                  share=parse_share(args.share), arm=args.arm, dtypes=dtypes, max_graphs=args.graphs,
                  export_paths=split_list(args.export_path), progress=say)
    rows = []
    shown = [f for f in res.findings if args.all or worth_a_look(f)]
    for f in shown:
        m = f.metrics
        rows.append((f.id, f.status, str(f.evals), fmt(m.ulp) if m else "-", str(m.nonfinite) if m else "-",
                     str(sum(c.count for c in f.crashes)), detail(f)))
    print_table(("row", "status", "evals", "max ulp", "nan/inf", "crash", "detail"), rows)
    n_graph = sum(1 for f in res.findings if f.variant.oracle == "graph")
    n_export = len(res.findings) - n_graph
    print(f"\n{len(shown)} of {len(res.findings)} rows shown ({n_graph} graph, {n_export} export)"
          + ("" if args.all else "; --all prints every row"))
    for fw, camp in res.campaigns.items():
        print(f"graphs ({fw}, {camp.arm}): {camp.graphs} graphs ({camp.valid} valid), {camp.evals} evaluations, "
              f"{len(camp.failures)} unique failures in {camp.seconds:.1f}s")
        print(f"coverage ({fw}): {format_figures(camp.coverage)}")
    if res.export_failures:
        print("export failures where eager works, by converter function:")
        for key, ids in res.export_failures.items():
            print(f"  {key}: {len(ids)} ({', '.join(i.split('[')[0] for i in ids[:6])}{', …' if len(ids) > 6 else ''})")
    unsupported = sum(1 for f in res.findings if f.variant.oracle == "export" and f.status == "unsupported")
    if unsupported:
        print(f"export rows classified unsupported (not findings): {unsupported}")
    if res.not_covered:
        print(f"not covered within the budget: {len(res.not_covered)} export rows")
    for note in res.notes:
        if "not a graph node" not in note:
            print(f"note: {note}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res.to_dict(with_inputs=True), indent=1))
    return 0

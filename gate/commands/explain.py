"""``dl-gate explain FINDING``: everything the gate found out about one regression.

FINDING is ``REPORT_DIR/report.json#op[variant]`` (or ``REPORT_DIR#op[variant]``), or a report
directory / ``report.json`` with ``--id op[variant]``; without an id every diagnosed finding is
shown. An id may be given by operator name alone when only one of its variants failed."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import GateError
from .common import write_json


def register(sub) -> None:
    p = sub.add_parser("explain", help="show a regression's diagnosis: variant, parameter, minimal input, "
                                        "sub-operation, changed code, repro", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  dl-gate explain 'dl-gate-out/report.json#torch.softmax[float16/cpu/input]'")
    p.add_argument("finding", metavar="FINDING", help="REPORT_DIR/report.json#op[variant], or a report directory")
    p.add_argument("--id", metavar="OP[VARIANT]", help="which finding (default: all diagnosed ones)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write the diagnosis (and details) as JSON to FILE ('-' or no FILE: stdout)")
    p.add_argument("--verbose", "-v", action="store_true", help="every traced sub-operation, not the first 40")
    p.set_defaults(func=run)


def _report_path(where: str) -> Path:
    p = Path(where)
    if p.is_dir():
        p = p / "report.json"
    if not p.exists():
        raise GateError(f"no report at {p} (pass the --out directory of `dl-gate run`, or its report.json)")
    return p


def run(args) -> int:
    from ..localise.explain import load_details, render, verdict_id

    where, _, fid = args.finding.partition("#")
    fid = args.id or fid or None
    path = _report_path(where)
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise GateError(f"{path} is not a dl-gate report: {exc}") from None
    verdicts = [v for v in doc.get("verdicts") or [] if isinstance(v, dict)]
    if fid:
        chosen = [v for v in verdicts if verdict_id(v) == fid]
        if not chosen:
            chosen = [v for v in verdicts if v.get("op") == fid and v.get("diagnosis")]
        if not chosen:
            known = sorted(verdict_id(v) for v in verdicts if v.get("diagnosis")) or ["(none diagnosed)"]
            raise GateError(f"no finding {fid!r} in {path}; diagnosed findings: {', '.join(known)}")
    else:
        chosen = [v for v in verdicts if v.get("diagnosis")]
        if not chosen:
            print(f"{path}: no diagnosed finding (outcome {doc.get('outcome')}: {doc.get('reason')})")
            return 0
    if args.json:
        out = []
        for v in chosen:
            out.append({"id": verdict_id(v), "verdict": v, "details": load_details(path.parent, v)})
        write_json(args.json, out if len(out) > 1 else out[0])
        return 0
    print("\n\n".join(render(v, load_details(path.parent, v), verbose=args.verbose) for v in chosen))
    return 0

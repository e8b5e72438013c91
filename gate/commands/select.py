"""``dl-gate select --base REF [--head REF]``: the operators a pull request can change, each with
its reasons, plus what was cleared, unmapped or is uncovered (so a user can audit the choice)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import load_config
from ..errors import GateError
from ..ops.catalog import load_catalog
from .common import add_config_arg

SHOW_REASONS = 3


def register(sub) -> None:
    p = sub.add_parser("select", help="list the operators a diff can change, with the reasons", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  dl-gate select --base origin/main --json selection.json")
    p.add_argument("--base", required=True, metavar="REF", help="base ref of the pull request (e.g. origin/main)")
    p.add_argument("--head", default="HEAD", metavar="REF", help="head ref (default HEAD); diffed against merge-base(base, head)")
    p.add_argument("--repo", default=".", metavar="DIR", help="the git repository (default: current directory)")
    add_config_arg(p)
    p.add_argument("--json", metavar="FILE", help="also write the selection as JSON to FILE ('-' for stdout only)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..changes.git import Git
    from ..select import select_ops

    repo = Path(args.repo)
    git = Git(repo)  # one-line error for a missing directory or a non-repository
    root = git.root
    git.resolve(args.base), git.resolve(args.head)  # bad refs fail before any config is read
    git.close()
    cfg = load_config(args.config) if args.config else load_config(search_from=root)
    catalog = load_catalog(cfg.ops, builtin=cfg.builtin)
    sel = select_ops(root, args.base, args.head, catalog, cfg)
    if args.json == "-":
        print(json.dumps(sel.to_dict(), indent=1))
        return 0
    print_selection(sel, file=sys.stdout)
    if args.json:
        out = Path(args.json)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(sel.to_dict(), indent=1) + "\n")
        except OSError as exc:
            raise GateError(f"cannot write {out}: {exc.strerror or exc}") from None
        print(f"\nselection written to {out}")
    return 0


def print_selection(sel, file=sys.stdout) -> None:
    w = lambda s="": print(s, file=file)  # noqa: E731
    w(f"dl-gate select: {sel.base}...{sel.head} (merge-base {sel.merge_base[:10]}, head {sel.head_sha[:10]}): "
      f"{sel.files_changed} file{'s' if sel.files_changed != 1 else ''} changed")
    n = len(sel.selected)
    w(f"\nselected {n} operator{'s' if n != 1 else ''}" + (":" if n else " (nothing to fuzz)"))
    for s in sel.selected:
        w(f"  {s.op}")
        for r in s.reasons[:SHOW_REASONS]:
            w(f"      {r.file}:{r.line}  [{r.kind}]  {' -> '.join(r.path)}")
        if len(s.reasons) > SHOW_REASONS:
            w(f"      (+{len(s.reasons) - SHOW_REASONS} more reasons in --json)")
    if sel.uncovered_native:
        w(f"\nnative ops changed that no catalogue row declares ({len(sel.uncovered_native)}): add rows to cover them")
        for u in sel.uncovered_native:
            r = u.reasons[0] if u.reasons else None
            w(f"  {u.framework} {u.op}" + (f"  <- {r.file}:{r.line} {r.symbol}" if r else ""))
    if sel.cleared:
        w(f"\ncleared {len(sel.cleared)} changed symbol{'s' if len(sel.cleared) != 1 else ''}:")
        for c in sel.cleared:
            w(f"  {c.file}:{c.line}  {c.symbol}: {c.why}")
    if sel.unmapped:
        w(f"\nunmapped {len(sel.unmapped)} changed file{'s' if len(sel.unmapped) != 1 else ''}:")
        for u in sel.unmapped:
            w(f"  {u.file}: {u.why}")
    if sel.capped:
        w(f"\nleft out by select.cap ({len(sel.capped)}): {', '.join(sel.capped)}")
    for note in sel.notes:
        w(f"note: {note}")

"""The base side of localisation: ``python -m gate.localise.worker DIR`` in the base worktree.

One long-lived process per localisation run (a Python + framework start costs seconds, and
shrinking asks the base many small questions). It reads one JSON request per line on stdin and
answers one JSON line on the protocol channel (the original stdout; the operator's own prints
are sent to stderr). Arrays travel as ``.npz`` files in DIR.

Requests::

    {"id": 1, "type": "hello"}
    {"id": 2, "type": "replay", "jobs": [{"key", "spec", "variant", "inputs": [npz, ...]}]}
        -> {"id", "jobs": [{"key", "results": [ReplayResult.to_json + "arrays": npz|null]}]}
    {"id": 3, "type": "trace", "spec", "variant", "input": npz, "float64_run": bool}
        -> {"id", "trace": {...}}   (see gate.localise.trace.trace_op)
    {"type": "exit"}
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np


def _setup(work: Path, req: dict) -> None:
    root = Path(req["root"])
    for p in reversed(req.get("python_path") or ["."]):
        sys.path.insert(0, str((root / p).resolve()))


def _replay(work: Path, req: dict) -> dict:
    from ..search.inputs import Candidate
    from ..judge.replay import replay
    from ..ops.spec import OpSpec
    from ..plan import Variant

    out = {"jobs": []}
    for j, job in enumerate(req["jobs"]):
        spec = OpSpec.from_dict(job["spec"], origin="user")
        variant = Variant(**job["variant"])
        cands = [Candidate.load((work / f).read_bytes()) for f in job["inputs"]]
        results = []
        for i, r in enumerate(replay(spec, variant, cands)):
            d = r.to_json()
            d["arrays"] = None
            if r.outputs is not None:
                name = f"r{req['id']}-{j}-{i}.npz"
                arrays = {f"o{k}": a for k, a in enumerate(r.outputs)}
                arrays.update({f"r{k}": a for k, a in enumerate(r.reference or [])})
                np.savez(work / name, **arrays)
                d["arrays"] = name
            results.append(d)
        out["jobs"].append({"key": job["key"], "results": results})
    return out


def _trace(work: Path, req: dict, root: str) -> dict:
    from ..search.inputs import Candidate
    from ..ops.spec import OpSpec
    from ..plan import Variant
    from .trace import trace_op

    spec = OpSpec.from_dict(req["spec"], origin="user")
    variant = Variant(**req["variant"])
    cand = Candidate.load((work / req["input"]).read_bytes())
    res = trace_op(spec, variant, cand, root=root, float64_run=bool(req.get("float64_run")))
    name = f"t{req['id']}.npz"
    return {"trace": res.save(work / name, name)}


def main(work_dir: str) -> int:
    work = Path(work_dir)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the operator library's prints must not corrupt the protocol
    sys.stdout = sys.stderr
    setup = json.loads((work / "setup.json").read_text())
    _setup(work, setup)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        kind = req.get("type")
        if kind == "exit":
            break
        resp: dict = {"id": req.get("id")}
        try:
            with np.errstate(all="ignore"):
                if kind == "hello":
                    resp["ok"] = True
                elif kind == "replay":
                    resp.update(_replay(work, req))
                elif kind == "trace":
                    resp.update(_trace(work, req, setup["root"]))
                else:
                    resp["error"] = f"unknown request type {kind!r}"
        except Exception as exc:  # answer, never die: the caller records it as a note
            resp["error"] = f"{type(exc).__name__}: {exc}"
            resp["traceback"] = traceback.format_exc(limit=6)
        proto.write(json.dumps(resp) + "\n")
        proto.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Worker for :func:`gate.judge.replay.replay_in_tree`: ``python -m gate.judge.replay_worker DIR``
with the base worktree as cwd. Reads ``DIR/request.json``, writes ``DIR/response.json`` and one
``out-<job>-<i>.npz`` (outputs ``o*`` and references ``r*``) per evaluated input."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(work: str) -> int:
    work_dir = Path(work)
    req = json.loads((work_dir / "request.json").read_text())
    root = Path(req["root"])
    for p in reversed(req.get("python_path") or ["."]):
        sys.path.insert(0, str((root / p).resolve()))
    from gate.search.inputs import Candidate
    from gate.judge.replay import replay
    from gate.ops.spec import OpSpec
    from gate.plan import Variant

    isolate = None
    if req.get("isolate"):
        from gate.backends.isolate import IsolateOptions

        isolate = IsolateOptions(**req["isolate"])
    resp = {"jobs": []}
    for j, job in enumerate(req["jobs"]):
        spec = OpSpec.from_dict(job["spec"], origin="user")
        variant = Variant(**job["variant"])
        cands = [Candidate.load((work_dir / f).read_bytes()) for f in job["inputs"]]
        results = replay(spec, variant, cands, isolate=isolate)
        for i, r in enumerate(results):
            if r.outputs is not None:
                arrays = {f"o{k}": a for k, a in enumerate(r.outputs)}
                arrays.update({f"r{k}": a for k, a in enumerate(r.reference or [])})
                np.savez(work_dir / f"out-{j}-{i}.npz", **arrays)
        resp["jobs"].append({"key": job["key"], "index": j, "results": [r.to_json() for r in results]})
    (work_dir / "response.json").write_text(json.dumps(resp))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

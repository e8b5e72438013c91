"""How long ``select_ops`` takes on a 200-file repository (target: under 5 s).

Builds a git repository in a temp dir: 160 Python modules (an operator library: 20 packages of
ops, helpers shared across packages, nn.Module classes, re-exports), 30 C++ files (custom ops
with TORCH_LIBRARY registrations and shared helpers in headers) and 10 other files, with 120
operators declared in .dl-gate.yml. Then times ``select_ops`` (git diff, both-side parsing,
call graph, C++ search) for three pull requests and prints the seconds.

    python bench/select_speed.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate.config import parse_config  # noqa: E402
from gate.ops.catalog import load_catalog  # noqa: E402
from gate.select import select_ops  # noqa: E402
from tests.helpers.gitrepo import GitRepo  # noqa: E402

N_PKG, OPS_PER_PKG, HELPERS_PER_PKG = 20, 6, 2  # 20 x (1 __init__ + 1 ops + 1 layers + 2 helpers + 3 extra) = 160


def build(root: Path) -> GitRepo:
    files = {}
    ops_cfg = []
    for p in range(N_PKG):
        pkg = f"lib/pkg{p:02d}"
        files[f"{pkg}/__init__.py"] = f"from .ops import *\nfrom .layers import Layer{p}\n"
        for h in range(HELPERS_PER_PKG):
            files[f"{pkg}/_helper{h}.py"] = "\n".join(
                [f"import math\nfrom lib.pkg{(p + 1) % N_PKG:02d}._helper{h} import base{h} as _up\n" if p else "import math\n"]
                + [f"def base{h}(x):\n    return {'_up(x)' if p else 'x'} * {h + 1}.0\n"]
                + [f"def h{h}_{k}(x):\n    '''helper {k}'''\n    return base{h}(x) + math.sin(x) * {k}\n" for k in range(8)])
        for e in range(3):
            files[f"{pkg}/extra{e}.py"] = "\n".join(
                f"def extra{e}_{k}(x):\n    return x ** {k + 1}\n" for k in range(10))
        body = ["import math", *(f"from ._helper{h} import *" for h in range(HELPERS_PER_PKG)), "from .extra0 import extra0_1", ""]
        for o in range(OPS_PER_PKG):
            body.append(f"def op{o}(x):\n    \"\"\"Operator {o}.\"\"\"\n    return h{o % HELPERS_PER_PKG}_{o}(x) + extra0_1(x)\n")
            ops_cfg.append(f"  - {{name: p{p}.op{o}, callable: \"lib.pkg{p:02d}:op{o}\", inputs: [{{name: x, shape: [4]}}]}}")
        files[f"{pkg}/ops.py"] = "\n".join(body)
        files[f"{pkg}/layers.py"] = (f"import torch\nfrom .ops import op0, op1\n\n\nclass Layer{p}(torch.nn.Module):\n"
                                     f"    def forward(self, x):\n        return op0(x) * op1(x)\n")
        ops_cfg.append(f"  - {{name: p{p}.layer, callable: \"lib.pkg{p:02d}.layers:Layer{p}\", inputs: [{{name: x, shape: [4]}}]}}")
    for c in range(10):
        files[f"csrc/common{c}.h"] = f"#pragma once\n#include <torch/library.h>\ninline float scale{c}(float x) {{ return x * {c + 1}.0f; }}\n"
        files[f"csrc/kern{c}a.cpp"] = (f"#include \"csrc/common{c}.h\"\nnamespace myops {{\nat::Tensor k{c}_cpu(const at::Tensor& x) {{\n"
                                       f"  return x * scale{c}(2.0f);\n}}\n}}\nTORCH_LIBRARY_FRAGMENT(myops, m) {{\n"
                                       f"  m.def(\"k{c}(Tensor x) -> Tensor\");\n}}\nTORCH_LIBRARY_IMPL(myops, CPU, m) {{\n"
                                       f"  m.impl(\"k{c}\", TORCH_FN(myops::k{c}_cpu));\n}}\n")
        ops_cfg.append(f"  - {{name: myops.k{c}, callable: \"lib.pkg00:op0\", native: [\"myops::k{c}\"], "
                       f"inputs: [{{name: x, shape: [4]}}]}}")
        files[f"csrc/kern{c}b.cu"] = f"#include \"csrc/common{c}.h\"\n__global__ void g{c}(float* x) {{ x[0] = scale{c}(x[0]); }}\n"
    for d in range(10):
        files[f"docs/page{d}.md"] = f"# page {d}\n"
    files[".dl-gate.yml"] = "python_path: [\".\"]\nops:\n" + "\n".join(ops_cfg) + "\n"
    assert len(files) == 201, len(files)  # 200 source/doc files + the config
    r = GitRepo.init(root / "big")
    r.write(files, dedent=False)
    r.commit("base")
    return r


PRS = {
    "shared helper (reached by many ops)": lambda r: _edit(r, "lib/pkg05/_helper0.py", "return _up(x) * 1.0", "return _up(x) * 1.5"),
    "docstrings + formatting only": lambda r: _edit(r, "lib/pkg07/ops.py", '"""Operator 3."""', '"""Operator three."""'),
    "C++ header helper": lambda r: _edit(r, "csrc/common3.h", "x * 4.0f", "x * 4.5f"),
}


def _edit(r, path, old, new):
    src = r.read(path)
    assert old in src, (path, old)
    r.write({path: src.replace(old, new)}, dedent=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = build(Path(tmp))
        cfg = parse_config(r.read(".dl-gate.yml"), r.path / ".dl-gate.yml", r.path)
        cat = load_catalog(cfg.ops, builtin=cfg.builtin)
        n_files = len(r.git("ls-files").splitlines())
        print(f"repository: {n_files} files, {len(cat)} operators declared")
        worst = 0.0
        for i, (name, change) in enumerate(PRS.items()):
            r.checkout("main")
            r.branch(f"pr{i}")
            change(r)
            r.commit(name)
            r.checkout("main")
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                sel = select_ops(r.path, "main", f"pr{i}", cat, cfg)
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            worst = max(worst, max(times))
            print(f"  {name:38s} selected {len(sel.op_names()):3d} ops, cleared {len(sel.cleared):2d}, "
                  f"uncovered {len(sel.uncovered_native)}: median {med:.2f} s (min {min(times):.2f}, max {max(times):.2f})")
        print(f"slowest selection: {worst:.2f} s (target < 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

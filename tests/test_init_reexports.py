"""A package whose definitions live in private modules and are re-exported by public ones
(SimplexLab/TorchJD: `torchjd/scalarization/__init__.py` imports `GeometricMean` from
`_geometric_mean.py`, every aggregator likewise): zero config said "package torchjd defines no
public function or class" and wrote nothing. The AST scan now follows the re-exports."""
from __future__ import annotations

from pathlib import Path

from gate.init.discover import find_package, scan


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_a_private_modules_definitions_count_where_a_public_module_re_exports_them(tmp_path):
    _write(tmp_path, {
        "src/lib/__init__.py": "from ._impl import public_fn, Cls\nfrom ._impl import other as renamed\n"
                               "from ._chain import deep_fn\nfrom . import sub\n",
        "src/lib/_impl.py": "def public_fn(x):\n    return x\n\n\nclass Cls:\n    pass\n\n\n"
                            "def not_exported(x):\n    return x\n\n\ndef other(x):\n    return x\n\n\n"
                            "def _priv(x):\n    return x\n",
        "src/lib/sub/__init__.py": "from ._x import *\nfrom lib.sub._y import absolute_fn\n",
        "src/lib/sub/_x.py": "__all__ = ['thing']\n\n\ndef thing(x):\n    return x\n\n\ndef hidden(x):\n    return x\n",
        "src/lib/sub/_y.py": "def absolute_fn(x):\n    return x\n",
        "src/lib/_chain/__init__.py": "from ._deep import deep_fn\n",
        "src/lib/_chain/_deep.py": "def deep_fn(x):\n    return x\n",
        "src/lib/ops.py": "def plain(x):\n    return x\n",
        "pyproject.toml": "[project]\nname = 'lib'\n",
    })
    pkg = find_package(tmp_path)
    syms, bad = scan(pkg, tmp_path)
    got = {(m, s.name): s.file for m, ss in syms.items() for s in ss}
    assert not bad
    assert got == {("lib", "public_fn"): "src/lib/_impl.py", ("lib", "Cls"): "src/lib/_impl.py",
                   ("lib", "deep_fn"): "src/lib/_chain/_deep.py", ("lib.sub", "thing"): "src/lib/sub/_x.py",
                   ("lib.sub", "absolute_fn"): "src/lib/sub/_y.py", ("lib.ops", "plain"): "src/lib/ops.py"}, got
    # each under the public name it is imported by, at its definition's line
    line = next(s.line for s in syms["lib"] if s.name == "Cls")
    assert line == 5
    # a private definition named with --ops is still taken where it is
    syms, _ = scan(pkg, tmp_path, named=["lib._impl.not_exported"])
    assert ("lib._impl", "not_exported") in {(m, s.name) for m, ss in syms.items() for s in ss}

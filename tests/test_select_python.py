"""Selection on a Python operator library (real git repository, real .dl-gate.yml): each pull
request's selected set is asserted exactly (precision and recall), with its reasons, cleared
symbols and unmapped files."""
import pytest

from gate.config import parse_config
from gate.ops.catalog import load_catalog
from gate.select import select_ops
from gate.select.model import Selection
from tests.fixtures.select_trees import PYLIB, PYLIB_CONFIG
from tests.helpers.gitrepo import GitRepo


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    r = GitRepo.init(tmp_path_factory.mktemp("pylib") / "lib")
    r.write({**PYLIB, ".dl-gate.yml": PYLIB_CONFIG})
    r.commit("base")
    cfg = parse_config(r.read(".dl-gate.yml"), r.path / ".dl-gate.yml", r.path)
    return r, cfg, load_catalog(cfg.ops, builtin=cfg.builtin)


def edit(r, path, old, new):
    src = r.read(path)
    assert old in src, (path, old)
    r.write({path: src.replace(old, new)}, dedent=False)


def pr(lib, name, change) -> Selection:
    r, cfg, cat = lib
    r.checkout("main")
    r.branch(name)
    change(r)
    r.commit(name)
    r.checkout("main")
    return select_ops(r.path, "main", name, cat, cfg)


def cleared(sel):
    return {c.symbol: c.why for c in sel.cleared}


# (name, change, expected selection) ---------------------------------------------------------
CASES = [
    ("one-op", lambda r: edit(r, "src/mylib/ops.py", "math.log1p(math.exp(x))", "math.log(1 + math.exp(x))"),
     # Swish inherits Gate, whose gate() calls softplus_x
     {"mylib.softplus", "mylib.swish"}),
    ("one-op-pure-deletion", lambda r: edit(r, "src/mylib/ops.py", "    return H.clamp_eps(x) * 2\n",
                                             "    return H.clamp_eps(x) * 2\n    return x\n"),
     {"mylib.scaled"}),
    ("shared-helper", lambda r: edit(r, "src/mylib/_helpers.py", "0.044715", "0.0447"),
     {"mylib.gelu"}),  # reached through the re-export in mylib/__init__.py
    ("constant", lambda r: edit(r, "src/mylib/_helpers.py", "EPS = 1e-6", "EPS = 1e-7"),
     {"mylib.scaled"}),
    ("module-docstring", lambda r: edit(r, "src/mylib/_helpers.py", "EPS = 1e-6", '"""Numerical helpers."""\nEPS = 1e-6'),
     set()),
    ("base-class-method", lambda r: edit(r, "src/mylib/layers.py", "return softplus_x(x)", "return softplus_x(x) * 1.0"),
     {"mylib.swish"}),
    # the class, or its inherited .apply (how an autograd.Function is called), reaches backward
    ("autograd-backward", lambda r: edit(r, "src/mylib/fn.py", "return g * 2", "return g * 2.0"),
     {"mylib.myfn", "mylib.myfn_apply"}),
    ("keras-layer-helper", lambda r: edit(r, "src/mylib/kmath.py", "a * x + b", "b + a * x"),
     {"mylib.dense"}),
    ("docstrings-only", lambda r: edit(r, "src/mylib/ops.py", "Gaussian error linear unit (tanh approximation).",
                                       "GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."),
     set()),
    ("formatting-and-annotations", lambda r: edit(
        r, "src/mylib/ops.py",
        "def softplus_x(x):\n    return math.log1p(math.exp(x))",
        "def softplus_x(x: float) -> float:  # softplus\n    return math.log1p(\n        math.exp(x)\n    )"),
     set()),
    ("rename-module", lambda r: (r.move("src/mylib/_helpers.py", "src/mylib/_math.py"),
                                 edit(r, "src/mylib/ops.py", "from ._helpers import poly\nfrom . import _helpers as H",
                                      "from ._math import poly\nfrom . import _math as H")),
     set()),
    ("rename-function", lambda r: (edit(r, "src/mylib/_helpers.py", "def poly(x):", "def cubic_term(x):"),
                                   edit(r, "src/mylib/ops.py", "import poly", "import cubic_term"),
                                   edit(r, "src/mylib/ops.py", "* poly(x)", "* cubic_term(x)")),
     set()),
    ("rename-and-edit", lambda r: (edit(r, "src/mylib/_helpers.py", "def poly(x):\n    return x + 0.044715",
                                        "def cubic_term(x):\n    return x + 0.0447"),
                                   edit(r, "src/mylib/ops.py", "import poly", "import cubic_term"),
                                   edit(r, "src/mylib/ops.py", "* poly(x)", "* cubic_term(x)")),
     {"mylib.gelu"}),
    ("delete-helper", lambda r: (edit(r, "src/mylib/_helpers.py", "def clamp_eps(x):\n    return max(x, EPS)\n", ""),
                                 edit(r, "src/mylib/ops.py", "H.clamp_eps(x)", "max(x, H.EPS)")),
     {"mylib.scaled"}),
    ("new-module", lambda r: (r.write({"src/mylib/_extra.py": "def twice(x):\n    return 2 * x\n"}),
                              edit(r, "src/mylib/ops.py", "return H.clamp_eps(x) * 2", "return twice(H.clamp_eps(x))"),
                              edit(r, "src/mylib/ops.py", "import math\n", "import math\nfrom ._extra import twice\n")),
     {"mylib.scaled"}),
    ("dead-code-readme-script", lambda r: (edit(r, "src/mylib/_helpers.py", "def unused(x):\n    return x",
                                                "def unused(x):\n    return -x"),
                                           edit(r, "README.md", "# mylib", "# mylib: fast ops"),
                                           edit(r, "tools/bump_version.py", "print(bump(1))", "print(bump(2))")),
     set()),
    # a method operator (callable: module:Class.method): its body, the override deleted (the
    # inherited method runs: geoopt's revert of 71c7f63), a method it calls through self; not an
    # overridden base method nor a sibling it never calls
    ("method-body", lambda r: edit(r, "src/mylib/manifolds.py", "clamp_min(1e-30)", "clamp_min(1e-38)"),
     {"mylib.spd_norm"}),
    ("method-override-deleted", lambda r: edit(
        r, "src/mylib/manifolds.py",
        "\n    def norm(self, x, u):\n        n = self.inner(x, u)\n        return torch.where(n == 0, n, n.clamp_min(1e-30).sqrt())\n", "\n"),
     {"mylib.spd_norm"}),
    ("method-called-through-self", lambda r: edit(r, "src/mylib/manifolds.py", "(u * u * 2)", "(2 * u * u)"),
     {"mylib.spd_norm"}),
    ("method-overridden-or-not-called", lambda r: (edit(r, "src/mylib/manifolds.py", "(u * u).sum(-1)", "(u ** 2).sum(-1)"),
                                                   edit(r, "src/mylib/manifolds.py", "return x + u", "return u + x")),
     set()),
    ("cuda-file-by-select-map", lambda r: r.write({"csrc/kernels/gelu.cu": "__global__ void k(float* x) { x[0] = 1.0f; }\n"}),
     {"mylib.gelu"}),
    ("ignored-docs-and-binary", lambda r: (r.write({"docs/index.md": "more docs\n"}),
                                           r.write({"assets/logo.png": b"\x89PNG\r\n\x1a\n\x00\x01changed"})),
     set()),
]


@pytest.mark.parametrize("name,change,expected", CASES, ids=[c[0] for c in CASES])
def test_selected_set_is_exact(lib, name, change, expected):
    sel = pr(lib, name, change)
    assert set(sel.op_names()) == expected, [(s.op, [r.path for r in s.reasons]) for s in sel.selected]
    for s in sel.selected:
        assert s.reasons and all(r.path[-1] == s.op and r.line >= 1 for r in s.reasons)


def test_reasons_name_the_changed_symbol_and_the_path(lib):
    sel = pr(lib, "reason-helper", lambda r: edit(r, "src/mylib/_helpers.py", "0.044715", "0.04"))
    (reason,) = sel.get("mylib.gelu").reasons
    assert (reason.file, reason.line, reason.symbol, reason.kind) == ("src/mylib/_helpers.py", 5, "mylib._helpers:poly", "python")
    assert reason.path == ["mylib._helpers:poly", "mylib.ops:gelu", "mylib:gelu", "mylib.gelu"]


def test_cleared_and_unmapped_are_listed_with_why(lib):
    sel = pr(lib, "audit", lambda r: (
        edit(r, "src/mylib/ops.py", "Gaussian error linear unit (tanh approximation).", "GELU."),
        edit(r, "src/mylib/_helpers.py", "def unused(x):\n    return x", "def unused(x):\n    return x + 0"),
        edit(r, "tools/bump_version.py", "print(bump(1))", "print(bump(3))"),
        edit(r, "README.md", "# mylib", "# mylib!"),
        r.write({"docs/index.md": "changed\n"}),
        r.write({"assets/logo.png": b"\x89PNG\r\n\x1a\n\x00new"})))
    assert sel.op_names() == []
    why = cleared(sel)
    assert "docstring" in why["mylib.ops:gelu"]
    assert why["mylib._helpers:unused"] == "not reachable from any operator in the catalogue"
    assert "__main__" in why["tools.bump_version:<main>"]
    unmapped = {u.file: u.why for u in sel.unmapped}
    assert set(unmapped) == {"README.md", "docs/index.md", "assets/logo.png"}
    assert unmapped["docs/index.md"] == "ignored by select.ignore 'docs/**'"
    assert unmapped["assets/logo.png"] == "binary file"
    assert Selection.from_dict(sel.to_dict()).to_dict() == sel.to_dict()


def test_rename_is_cleared_with_the_reason(lib):
    sel = pr(lib, "rename-why", lambda r: (r.move("src/mylib/_helpers.py", "src/mylib/_math.py"),
                                           edit(r, "src/mylib/ops.py", "from ._helpers import poly", "from ._math import poly"),
                                           edit(r, "src/mylib/ops.py", "from . import _helpers as H", "from . import _math as H")))
    why = cleared(sel)
    assert why["mylib._math:<module>"].startswith("moved from src/mylib/_helpers.py")
    assert "same definition (mylib._math:poly)" in why["mylib.ops:poly"]
    assert sel.unmapped == []


def test_select_all_file_is_capped(lib):
    sel = pr(lib, "build", lambda r: edit(r, "setup.py", "name='mylib'", "name='mylib', version='2'"))
    # cap 3: the first three catalogue rows, the rest listed as capped, never silently dropped
    assert sel.op_names() == ["mylib.gelu", "mylib.scaled", "mylib.softplus"]
    assert sel.capped == ["mylib.swish", "mylib.myfn", "mylib.myfn_apply", "mylib.dense", "mylib.erf_decomp",
                          "mylib.spd_norm"]
    assert all(r.kind == "select-all" for s in sel.selected for r in s.reasons)


def test_select_all_keeps_specific_reasons_first(lib):
    sel = pr(lib, "build-and-op", lambda r: (edit(r, "setup.py", "name='mylib'", "name='mylib2'"),
                                             edit(r, "src/mylib/kmath.py", "a * x + b", "a * x - b")))
    assert "mylib.dense" in sel.op_names() and len(sel.op_names()) == 3
    assert sel.get("mylib.dense").reasons[0].kind == "python"


def test_sources_pick_up_what_analysis_cannot_attribute(tmp_path):
    r = GitRepo.init(tmp_path / "r")
    r.write({
        "lib/ops.py": """\
            import torch

            _TABLE = {}


            def register(name):
                def deco(fn):
                    _TABLE[name] = fn
                    return fn
                return deco


            @register("sq")
            def _square(x):
                return x * x


            def apply(x, kind="sq"):
                return _TABLE[kind](x)


            def neg(x):
                return -x
            """,
        "lib/kernels/apply.metal": "kernel void k() {}\n",
        ".dl-gate.yml": """\
            ops:
              - {name: lib.apply, callable: "lib.ops:apply", sources: [lib/ops.py, lib/kernels/*.metal], inputs: [{name: x, shape: [4]}]}
              - {name: lib.neg, callable: "lib.ops:neg", inputs: [{name: x, shape: [4]}]}
            """,
    })
    r.commit("base")
    cfg = parse_config(r.read(".dl-gate.yml"), r.path / ".dl-gate.yml", r.path)
    cat = load_catalog(cfg.ops, builtin=cfg.builtin)
    r.branch("pr")
    edit(r, "lib/ops.py", "return x * x", "return x ** 2")  # reached only through the _TABLE dispatch
    r.commit("pr")
    sel = select_ops(r.path, "main", "pr", cat, cfg)
    assert sel.op_names() == ["lib.apply"]
    assert sel.get("lib.apply").reasons[0].kind == "sources"
    r.checkout("main")
    r.branch("pr2")
    edit(r, "lib/kernels/apply.metal", "{}", "{ }")
    edit(r, "lib/ops.py", "return -x", "return 0 - x")
    r.commit("pr2")
    sel = select_ops(r.path, "main", "pr2", cat, cfg)
    assert sel.op_names() == ["lib.apply", "lib.neg"]  # neg by the call graph, never apply's sources glob
    assert [x.kind for x in sel.get("lib.apply").reasons] == ["sources"]
    assert [x.kind for x in sel.get("lib.neg").reasons] == ["python"]


def test_unknown_op_in_select_map_is_a_config_error(lib):
    from gate.errors import ConfigError

    r, cfg, cat = lib
    cfg.raw.setdefault("select", {})
    bad = type(cfg)(path=cfg.path, root=cfg.root, raw={**cfg.raw, "select": {"map": {"x/**": ["nope.op"]}}}, ops=cfg.ops)
    with pytest.raises(ConfigError, match="select.map 'x/\\*\\*': unknown operator 'nope.op'"):
        select_ops(r.path, "main", "main", cat, bad)


def test_an_inherited_method_reaches_the_overrides_it_calls_through_self(tmp_path):
    """Before geoopt's 71c7f63 SPD.norm was Manifold.norm, whose ``self.inner`` on an SPD runs
    SPD.inner: a change there reaches the row ``SPD.norm`` (its entry is the class as a whole),
    though the base's own inner would not."""
    r = GitRepo.init(tmp_path / "lib")
    src = PYLIB["src/mylib/manifolds.py"].replace(
        "\n            def norm(self, x, u):\n                n = self.inner(x, u)\n"
        "                return torch.where(n == 0, n, n.clamp_min(1e-30).sqrt())\n", "\n")
    assert src.count("def norm") == 1
    r.write({"src/mylib/__init__.py": "", "src/mylib/manifolds.py": src, ".dl-gate.yml": PYLIB_CONFIG})
    r.commit("base")
    cfg = parse_config(r.read(".dl-gate.yml"), r.path / ".dl-gate.yml", r.path)
    sel = pr((r, cfg, load_catalog(cfg.ops, builtin=cfg.builtin)), "sub-inner",
             lambda r: edit(r, "src/mylib/manifolds.py", "(u * u * 2)", "(2 * u * u)"))
    assert sel.op_names() == ["mylib.spd_norm"], sel.to_dict()


MIXING = '''\
import torch


def l1norm(t, dim):
    return t / t.abs().sum(dim, keepdim=True)


def sinkhorn(log_alpha, iters=4):
    alpha = log_alpha.exp()
    for _ in range(iters):
        alpha = l1norm(alpha, -1)
    return alpha


def setup_defaults():
    torch.set_default_dtype(torch.float32)


class Mixer(torch.nn.Module):
    def forward(self, x):
        return sinkhorn(x) @ x


def fast_project(self, x):
    return x / x.norm()


Mixer.sinkhorn = staticmethod(sinkhorn)
Mixer.project = fast_project
register = [Mixer]
setup_defaults()

if __name__ == "__main__":
    Mixer()(torch.randn(3, 3))
'''
MIXING_CONFIG = """
python_path: [src]
ops:
  - {name: mix.l1norm, callable: "mix.ops:l1norm", inputs: [{name: t, shape: [4]}], params: {dim: -1}}
  - {name: mix.sinkhorn, callable: "mix.ops:sinkhorn", inputs: [{name: log_alpha, shape: [3, 3]}]}
  - {name: mix.mixer, callable: "mix.ops:Mixer", inputs: [{name: x, shape: [3, 3]}]}
"""


@pytest.mark.parametrize("change, expected", [
    # a method of a class that a top-level statement only names (an alias set on it): that class
    # alone, not every operator of the file (lucidrains/hyper-connections 072bc2f)
    (("sinkhorn(x) @ x", "sinkhorn(x).float() @ x"), {"mix.mixer"}),
    # a function the module calls when imported: every operator of the file
    (("torch.set_default_dtype(torch.float32)", "torch.set_default_dtype(torch.float64)"),
     {"mix.l1norm", "mix.sinkhorn", "mix.mixer"}),
    # a helper: what calls it
    (("t.abs().sum(dim, keepdim=True)", "t.abs().sum(dim, keepdim=True).clamp_min(1e-12)"),
     {"mix.l1norm", "mix.sinkhorn", "mix.mixer"}),
    # a function the module sets on a class (a method patched in): that class runs it
    (("return x / x.norm()", "return x / x.norm().clamp_min(1e-12)"), {"mix.mixer"}),
    # the script entry is not run by an import (kept apart from <module> by gate.changes.pysrc): nothing
    (("Mixer()(torch.randn(3, 3))", "Mixer()(torch.randn(4, 4))"), set()),
])
def test_a_top_level_statement_that_names_a_class_does_not_carry_its_changes_to_the_whole_file(tmp_path, change,
                                                                                               expected):
    r = GitRepo.init(tmp_path / "lib")
    r.write({"src/mix/__init__.py": "", "src/mix/ops.py": MIXING, ".dl-gate.yml": MIXING_CONFIG}, dedent=False)
    r.commit("base")
    cfg = parse_config(r.read(".dl-gate.yml"), r.path / ".dl-gate.yml", r.path)
    sel = pr((r, cfg, load_catalog(cfg.ops, builtin=cfg.builtin)), "pr", lambda r: edit(r, "src/mix/ops.py", *change))
    assert set(sel.op_names()) == expected, sel.to_dict()

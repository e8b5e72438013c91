"""The changes stage on real git repositories: merge-base, -U0 hunks (zero-length ones touch their
neighbours), renames / deletions / new / binary files, and changed symbols (Python via ast on both
sides, C++ via tree-sitter) with docstring/format-only edits cleared."""
import pytest

from gate.changes import collect_changes
from gate.changes.diff import parse_diff
from gate.changes.git import Git, GitError
from gate.changes.model import ChangeSet, Hunk
from tests.helpers.gitrepo import GitRepo


@pytest.fixture
def repo(tmp_path):
    r = GitRepo.init(tmp_path / "r")
    r.write({
        "pkg/__init__.py": "",
        "pkg/a.py": """\
            def f(x):
                \"\"\"Doc.\"\"\"
                return x + 1


            def g(x):
                return x * 2


            class K:
                scale = 2.0

                def m(self, x):
                    return x * self.scale
            """,
        "notes.txt": "".join(f"line {i}\n" for i in range(1, 31)),
        "old_name.txt": "".join(f"row {i}\n" for i in range(1, 31)),
        "gone.txt": "bye\n",
        "blob.bin": b"\x00\x01\x02",
    })
    r.commit("base")
    return r


def _syms(cs: ChangeSet):
    return {s.symbol: s for s in cs.symbols}


def test_files_statuses_and_hunks(repo):
    repo.branch("pr")
    notes = repo.read("notes.txt").replace("line 5\n", "LINE 5\n").replace("line 10\n", "").replace(
        "line 20\n", "line 20\nline 20b\n")
    repo.write({"notes.txt": notes, "new.txt": "hello\n", "blob.bin": b"\x00\x09"})
    repo.move("old_name.txt", "sub/new_name.txt")
    repo.remove("gone.txt")
    repo.commit("pr")
    cs = collect_changes(repo.path, "main", "pr")
    by = {f.path: f for f in cs.files}
    assert set(by) == {"notes.txt", "new.txt", "blob.bin", "sub/new_name.txt", "gone.txt"}
    assert by["new.txt"].status == "added" and by["new.txt"].at_base is None
    assert by["gone.txt"].status == "deleted" and by["gone.txt"].at_head is None
    assert by["sub/new_name.txt"].status == "renamed" and by["sub/new_name.txt"].old_path == "old_name.txt"
    assert by["blob.bin"].binary and not by["blob.bin"].hunks
    n = by["notes.txt"]
    assert n.hunks == [Hunk(5, 1, 5, 1), Hunk(10, 1, 9, 0), Hunk(20, 0, 20, 1)]
    assert n.lines("old") == {5, 10} and n.lines("new") == {5, 20}
    # zero-length sides touch their neighbours: the deletion sits between new lines 9 and 10,
    # the insertion between old lines 20 and 21
    assert n.neighbour_lines("new") == {9, 10} and n.neighbour_lines("old") == {20, 21}
    assert cs.merge_base == repo.git("merge-base", "main", "pr")


def test_diff_is_three_dot_against_the_merge_base(repo):
    repo.branch("pr")
    repo.write({"pkg/a.py": repo.read("pkg/a.py").replace("x * 2", "x * 3")})
    repo.commit("pr changes g")
    repo.checkout("main")
    repo.write({"pkg/a.py": repo.read("pkg/a.py").replace("x + 1", "x + 10")})
    main_sha = repo.commit("main moves on: f changes")
    cs = collect_changes(repo.path, "main", "pr")
    assert cs.base_sha == main_sha and cs.merge_base != main_sha
    assert {s.symbol for s in cs.symbols if s.semantic} == {"pkg.a:g"}  # never main's own change to f


def test_python_symbols_docstring_format_and_real_changes(repo):
    repo.branch("pr")
    src = repo.read("pkg/a.py")
    src = src.replace('"""Doc."""', '"""Add one (documented better)."""')  # docstring only
    src = src.replace("def g(x):\n    return x * 2", "def g(x: float) -> float:  # typed\n    return (x\n            * 2)")
    src = src.replace("    scale = 2.0", "    scale = 3.0")  # class body
    repo.write({"pkg/a.py": src}, dedent=False)
    repo.commit("pr")
    syms = _syms(collect_changes(repo.path, "main", "pr"))
    assert syms["pkg.a:f"].change == "unchanged" and "docstring" in syms["pkg.a:f"].why
    assert syms["pkg.a:g"].change == "unchanged"
    assert syms["pkg.a:K"].change == "modified" and syms["pkg.a:K"].kind == "class"
    assert "pkg.a:K.m" not in syms  # the method itself was not touched


def test_inserted_function_touches_neighbours_which_are_cleared(repo):
    repo.branch("pr")
    src = repo.read("pkg/a.py").replace("def g(x):", "def h(x):\n    return x - 1\n\n\ndef g(x):")
    repo.write({"pkg/a.py": src}, dedent=False)
    repo.commit("pr")
    cs = collect_changes(repo.path, "main", "pr")
    syms = _syms(cs)
    assert syms["pkg.a:h"].change == "added"
    semantic = {s.symbol for s in cs.symbols if s.semantic}
    assert semantic == {"pkg.a:h"}
    near = [s for s in cs.symbols if s.neighbour_only]
    assert near and all(s.change == "unchanged" for s in near)


def test_deleted_and_renamed_python_files(repo):
    repo.branch("pr")
    repo.move("pkg/a.py", "pkg/b.py")
    repo.commit("pure rename")
    cs = collect_changes(repo.path, "main", "pr")
    assert [(s.symbol, s.change) for s in cs.symbols] == [("pkg.b:<module>", "unchanged")]
    repo.remove("pkg/b.py")
    repo.commit("delete")
    cs = collect_changes(repo.path, "main", "pr")
    dels = {s.symbol: s for s in cs.symbols}
    assert dels["pkg.a:g"].change == "deleted" and dels["pkg.a:g"].side == "base"


def test_unparsable_python_is_noted_and_counts_as_changed(repo):
    repo.branch("pr")
    repo.write({"pkg/a.py": repo.read("pkg/a.py").replace("return x * 2", "return x *")})
    repo.commit("broken")
    cs = collect_changes(repo.path, "main", "pr")
    assert any("cannot parse" in n for n in cs.notes)
    assert {s.symbol for s in cs.symbols if s.semantic} >= {"pkg.a:f", "pkg.a:g", "pkg.a:K"}


def test_cpp_symbols_and_comment_only_changes(repo):
    repo.write({"k/kern.cc": """\
        #include "tensorflow/core/framework/op_kernel.h"
        namespace {
        static float helper(float x) { return x * 0.5f; }
        }
        // a comment
        float run(float x) {
          return helper(x);  // call
        }
        REGISTER_OP("Half").Input("x: float");
        """})
    repo.commit("add kernel")
    repo.branch("pr")
    src = repo.read("k/kern.cc").replace("// call", "// calls helper").replace("x * 0.5f", "x * 0.25f")
    repo.write({"k/kern.cc": src}, dedent=False)
    repo.commit("pr")
    syms = _syms(collect_changes(repo.path, "main", "pr"))
    assert syms["run"].change == "unchanged" and "comment" in syms["run"].why
    h = syms["helper"]
    assert h.change == "modified" and h.data["internal"] is True and h.data["framework"] == "tensorflow"


def test_parse_diff_of_git_output_directly(repo):
    repo.branch("pr")
    repo.write({"notes.txt": repo.read("notes.txt").replace("line 1\n", "")})
    repo.commit("pr")
    g = Git(repo.path)
    files = parse_diff(g.diff_u0(repo.git("rev-parse", "main"), repo.head()))
    assert [(f.path, f.status, f.hunks) for f in files] == [("notes.txt", "modified", [Hunk(1, 1, 0, 0)])]
    assert files[0].neighbour_lines("new") == {1}  # a deletion at the top touches line 1 only
    # an insertion at the top is "@@ -0,0 +1 @@": still a modified file, not a new one
    repo.write({"notes.txt": "line 0\n" + repo.read("notes.txt")})
    before = repo.head()
    repo.commit("insert at top")
    files = parse_diff(g.diff_u0(before, repo.head()))
    assert [(f.path, f.status, f.hunks) for f in files] == [("notes.txt", "modified", [Hunk(0, 0, 1, 1)])]


def test_git_errors_are_one_line(tmp_path, repo):
    with pytest.raises(GitError, match="not a git repository"):
        collect_changes(tmp_path, "main")
    with pytest.raises(GitError, match="unknown git ref 'no-such-branch'"):
        collect_changes(repo.path, "no-such-branch")
    with pytest.raises(GitError, match="bad git ref"):
        collect_changes(repo.path, "--output=/tmp/x")


def test_changeset_round_trips_through_json(repo):
    repo.branch("pr")
    repo.write({"pkg/a.py": repo.read("pkg/a.py").replace("x * 2", "x * 4")})
    repo.commit("pr")
    cs = collect_changes(repo.path, "main", "pr")
    again = ChangeSet.from_dict(cs.to_dict())
    assert again.to_dict() == cs.to_dict()
    assert [s.symbol for s in again.symbols if s.semantic] == ["pkg.a:g"]

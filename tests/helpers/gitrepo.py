"""A throw-away git repository for tests: init, write files, commit, branch, checkout.

    repo = GitRepo.init(tmp_path / "lib")
    repo.write({"pkg/ops.py": "def f(x):\n    return x\n"})
    base = repo.commit("base")
    repo.branch("feature")            # create and switch
    repo.write({"pkg/ops.py": "..."}); repo.remove("old.py"); repo.move("a.py", "b.py")
    head = repo.commit("change")

Every git call runs with a fixed identity and no user/system config, so tests behave the same
on any machine. Kept deliberately small and general: other areas reuse it.
"""
from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from typing import Dict, Iterable, Optional, Union

_ENV = {
    "GIT_AUTHOR_NAME": "dl-gate test",
    "GIT_AUTHOR_EMAIL": "test@dl-gate.invalid",
    "GIT_COMMITTER_NAME": "dl-gate test",
    "GIT_COMMITTER_EMAIL": "test@dl-gate.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
}


class GitRepo:
    def __init__(self, path: Union[str, Path]):
        self.path = Path(path)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def init(cls, path: Union[str, Path], branch: str = "main") -> "GitRepo":
        repo = cls(path)
        repo.path.mkdir(parents=True, exist_ok=True)
        repo.git("init", "-q", "-b", branch)
        repo.git("config", "commit.gpgsign", "false")
        return repo

    # -- plumbing ------------------------------------------------------------------------
    def git(self, *args: str, check: bool = True) -> str:
        env = {**os.environ, **_ENV}
        proc = subprocess.run(["git", *args], cwd=self.path, env=env, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip()

    # -- working tree --------------------------------------------------------------------
    def write(self, files: Dict[str, Union[str, bytes]], dedent: bool = True) -> None:
        """Write files (relative paths); ``str`` contents are dedented unless ``dedent=False``."""
        for rel, content in files.items():
            p = self.path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                p.write_bytes(content)
            else:
                p.write_text(textwrap.dedent(content) if dedent else content)

    def read(self, rel: str) -> str:
        return (self.path / rel).read_text()

    def remove(self, *paths: str) -> None:
        self.git("rm", "-q", "-r", "--", *paths)

    def move(self, src: str, dst: str) -> None:
        (self.path / dst).parent.mkdir(parents=True, exist_ok=True)
        self.git("mv", src, dst)

    # -- history -------------------------------------------------------------------------
    def commit(self, message: str = "commit", paths: Optional[Iterable[str]] = None) -> str:
        """Stage everything (or ``paths``) and commit; returns the new commit's SHA."""
        self.git("add", "-A", *(["--", *paths] if paths else []))
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def branch(self, name: str, start: Optional[str] = None, checkout: bool = True) -> None:
        self.git("branch", name, *([start] if start else []))
        if checkout:
            self.checkout(name)

    def checkout(self, ref: str) -> None:
        self.git("checkout", "-q", ref)

    def merge(self, ref: str, message: str = "merge") -> str:
        self.git("merge", "-q", "--no-ff", "-m", message, ref)
        return self.head()

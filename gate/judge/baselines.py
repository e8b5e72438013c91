"""Baselines: what the gate compares against, stored as human-diffable files in ``baselines/``.

Layout (one JSON file per operator, a replay corpus of small ``.npz`` inputs beside it)::

    baselines/
      <op>.json                       {"op", "framework", "rows": [BaselineRow, ...]}
      corpus/<op>/<variant>-<env>-<i>.npz

A row is keyed by operator, variant (dtype/device/mode[/layout][/oracle]) and environment
(framework + version, device and CPU/GPU capability, harness version): a row from another
environment is *not comparable*, never a failure. The gate reads baselines from the PR's base
ref through git (:class:`GitBaselineSource`), never from the PR's own tree; a refresh writes the
working tree atomically and never deletes rows it did not re-measure.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from .. import HARNESS_VERSION
from ..errors import GateError
from ..search.finding import Finding
from ..search.inputs import Candidate
from ..serial import from_json_safe, json_safe

ENV_KEYS = ("framework", "version", "device", "capability", "harness")


class BaselineError(GateError):
    pass


def env_key(env: Dict[str, str]) -> str:
    return "|".join(f"{k}={env.get(k, '')}" for k in ENV_KEYS)


def env_hash(env: Dict[str, str]) -> str:
    return hashlib.sha1(env_key(env).encode()).hexdigest()[:8]


def finding_env(finding: Finding) -> Dict[str, str]:
    env = {k: str(v) for k, v in finding.env.items() if k in ENV_KEYS}
    env["harness"] = HARNESS_VERSION
    return env


def safe_name(text: str) -> str:
    """A file-name-safe form of ``text``; long names (graph signatures) keep a readable prefix
    and a hash, within every file system's 255-byte limit."""
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", text)
    if len(name) > 120:
        name = f"{name[:100]}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    return name


@dataclass
class BaselineRow:
    op: str
    variant: str
    env: Dict[str, str]
    ulp: float = 0.0
    abs: float = 0.0
    rel: float = 0.0
    l1: float = 0.0
    nonfinite: int = 0
    int_mismatch: int = 0
    crash: Optional[str] = None
    status: str = "ok"  # ok | unsupported | no-valid-input
    evals: int = 0
    seconds: float = 0.0
    seed: int = 0
    strategy: str = "linf"
    date: str = ""
    corpus: List[str] = field(default_factory=list)  # paths relative to the baselines dir

    @property
    def key(self) -> Tuple[str, str]:
        return self.variant, env_key(self.env)

    def to_dict(self) -> dict:
        d = asdict(self)
        return json_safe(d)

    @classmethod
    def from_dict(cls, raw: dict) -> "BaselineRow":
        fields = cls.__dataclass_fields__
        unknown = set(raw) - set(fields)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**from_json_safe(dict(raw)))

    @classmethod
    def from_finding(cls, f: Finding, corpus: List[str]) -> "BaselineRow":
        """The row of a search's finding. Its errors are the largest the search saw, on its worst
        input or on its worst input with finite outputs (``finite_metrics``): where the worst
        input makes the output NaN (a scalar loss: nothing finite left to measure, 0 ulp), the
        base's error on finite outputs is the one a later run's head is held to when base cannot
        be replayed (MONAI's focal loss, before ec63e068fe: stored as 0 ulp, so the fix's 4.99 ulp
        failed as 'max(floor 4, 2 x baseline 0)')."""
        m = f.metrics
        both = [x for x in (m, f.finite_metrics) if x is not None]

        def most(name: str) -> float:
            vals = [float(getattr(x, name)) for x in both if getattr(x, name) == getattr(x, name)]  # NaN: not measured
            return max(vals, default=float(getattr(m, name)) if m else 0.0)

        return cls(
            op=f.op,
            variant=f.variant.key,
            env=finding_env(f),
            ulp=most("ulp"),
            abs=most("abs"),
            rel=most("rel"),
            l1=most("l1"),
            nonfinite=int(m.nonfinite) if m else 0,
            int_mismatch=int(m.int_mismatch) if m else 0,
            crash=f.crashes[0].signature if f.crashes else None,
            status=f.status,
            evals=f.evals,
            seconds=round(f.seconds, 3),
            seed=f.seed,
            strategy=f.strategy,
            date=_dt.date.today().isoformat(),
            corpus=corpus,
        )


# ---------------------------------------------------------------------------------------
# sources: where baselines are read from
# ---------------------------------------------------------------------------------------
class DirBaselineSource:
    """Baselines in a directory of the working tree (what a refresh writes)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def list(self) -> List[str]:
        if not self.root.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def describe(self, rel: str) -> str:
        return str(self.root / rel)


class GitBaselineSource:
    """Baselines as they are at a git ref (the PR's base): the PR cannot loosen its own gate."""

    def __init__(self, repo: Path, ref: str, subdir: str = "baselines"):
        self.repo, self.ref, self.subdir = Path(repo), ref, subdir.strip("/")

    def _git(self, *args: str) -> bytes:
        res = subprocess.run(["git", "-C", str(self.repo), *args], capture_output=True)
        if res.returncode != 0:
            raise BaselineError(f"git {' '.join(args[:2])} failed: {res.stderr.decode().strip().splitlines()[-1:]}")
        return res.stdout

    def list(self) -> List[str]:
        res = subprocess.run(["git", "-C", str(self.repo), "ls-tree", "-r", "--name-only", self.ref, "--", self.subdir + "/"],
                             capture_output=True, encoding="utf-8", errors="replace")
        if res.returncode != 0:
            raise BaselineError(f"cannot list baselines at {self.ref}: {res.stderr.strip()}")
        n = len(self.subdir) + 1
        return sorted(line[n:] for line in res.stdout.splitlines() if line.strip())

    def read(self, rel: str) -> bytes:
        return self._git("show", f"{self.ref}:{self.subdir}/{rel}")

    def describe(self, rel: str) -> str:
        return f"{self.subdir}/{rel}@{self.ref}"


# ---------------------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------------------
class BaselineStore:
    def __init__(self, source):
        self.source = source
        self.rows: Dict[str, List[BaselineRow]] = {}
        self.frameworks: Dict[str, str] = {}
        self._loaded = False
        self._files: Optional[set] = None  # the source's file list, read once for corpus()

    def load(self) -> "BaselineStore":
        """Parse every ``<op>.json``; a corrupt file is a one-line :class:`BaselineError`."""
        files = self.source.list()
        self._files = set(files)  # what corpus() checks its inputs against: listed once (git ls-tree)
        for rel in files:
            if not rel.endswith(".json") or "/" in rel:
                continue
            where = self.source.describe(rel)
            try:
                doc = json.loads(self.source.read(rel).decode())
            except UnicodeDecodeError as exc:
                raise BaselineError(f"corrupt baseline file {where}: not UTF-8 JSON (byte 0x{exc.object[exc.start]:02x} "
                                    f"at offset {exc.start}: a binary file?); restore it from git or run "
                                    "dl-gate baseline refresh") from None
            except json.JSONDecodeError as exc:
                raise BaselineError(f"corrupt baseline file {where}:{exc.lineno}: invalid JSON ({exc.msg}); restore it "
                                    "from git or run dl-gate baseline refresh") from None
            try:
                if not isinstance(doc, dict) or "op" not in doc or not isinstance(doc.get("rows"), list):
                    raise ValueError("expected an object with 'op' and a list 'rows'")
                rows = [BaselineRow.from_dict(r) for r in doc["rows"]]
            except (TypeError, ValueError) as exc:
                raise BaselineError(f"corrupt baseline file {where}: {exc}") from None
            self.rows[doc["op"]] = rows
            self.frameworks[doc["op"]] = doc.get("framework", "")
        self._loaded = True
        return self

    def lookup(self, op: str, variant: str, env: Dict[str, str]) -> Tuple[Optional[BaselineRow], str]:
        """(row, status): status is ``ok``, ``missing`` (no row for op x variant) or
        ``not-comparable`` (rows only from other environments)."""
        rows = [r for r in self.rows.get(op, []) if r.variant == variant]
        if not rows:
            return None, "missing"
        want = env_key({**env, "harness": HARNESS_VERSION})
        for r in rows:
            if env_key(r.env) == want:
                return r, "ok"
        return rows[0], "not-comparable"

    def corpus(self, row: BaselineRow) -> List[Candidate]:
        out = []
        for rel in row.corpus:
            if not self._has(rel):  # a row committed without its inputs (a .gitignore pattern caught them)
                raise BaselineError(f"baseline corpus file {self.source.describe(rel)} is missing (not committed: "
                                    "ignored by a .gitignore pattern?); run dl-gate baseline refresh and commit "
                                    "everything it writes")
            try:
                out.append(Candidate.load(self.source.read(rel)))
            except Exception as exc:  # noqa: BLE001 - numpy's own words (allow_pickle advice...) do not help here
                why = "missing" if isinstance(exc, (FileNotFoundError, KeyError)) and "__meta__" not in str(exc) else \
                    f"not a dl-gate corpus file (an .npz of arrays with __meta__; {type(exc).__name__})"
                raise BaselineError(f"corrupt baseline corpus file {self.source.describe(rel)}: {why}; restore it from "
                                    "git or run dl-gate baseline refresh") from None
        return out

    def _has(self, rel: str) -> bool:
        if self._files is None:
            try:
                self._files = set(self.source.list())
            except BaselineError:
                self._files = set()
        return not self._files or rel in self._files


# ---------------------------------------------------------------------------------------
# writing (refresh / merge)
# ---------------------------------------------------------------------------------------
@dataclass
class RowChange:
    op: str
    variant: str
    old: Optional[float]
    new: float
    kind: str  # added | changed | unchanged
    nonfinite: int = 0  # NaN/Inf outputs of the new row's worst input
    old_nonfinite: int = 0

    def line(self) -> str:
        nf = f", NaN/Inf on {self.nonfinite} element(s)" if self.nonfinite else ""
        if self.kind == "added":
            return f"+ {self.op}[{self.variant}]: {self.new:.4g} ulp{nf} (new row)"
        if self.kind == "unchanged":
            return f"= {self.op}[{self.variant}]: {self.new:.4g} ulp{nf}"
        if self.old == self.new:  # only the NaN/Inf count moved
            return (f"~ {self.op}[{self.variant}]: {self.new:.4g} ulp, NaN/Inf on {self.old_nonfinite} -> "
                    f"{self.nonfinite} element(s)")
        ratio = f"x{self.new / self.old:.3g}" if self.old else "from 0"
        return f"~ {self.op}[{self.variant}]: {self.old:.4g} -> {self.new:.4g} ulp ({ratio}){nf}"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes the file 0600: give it the mode an ordinary write would (the existing
        # file's, else 0666 less the umask), so a committed baseline is readable by everyone
        if path.exists():
            mode = path.stat().st_mode & 0o777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def corpus_for(finding: Finding, top: Iterable[Candidate] = ()) -> List[Candidate]:
    # an exhaustive set (every value of the dtype) is regenerated by every run, never stored;
    # its one-value witnesses are
    small = [c for c in finding.inputs if not (c.origin.startswith("exhaustive") and c.size > 1)]
    return [*small, *top][:4]


def read_rows(path: Path) -> Tuple[List[BaselineRow], str]:
    """The rows and framework of one baseline file (none if it does not exist yet)."""
    if not path.exists():
        return [], ""
    try:
        doc = json.loads(path.read_text())
        return [BaselineRow.from_dict(r) for r in doc.get("rows", [])], doc.get("framework", "")
    except (json.JSONDecodeError, TypeError, ValueError, AttributeError, KeyError) as exc:
        raise BaselineError(f"corrupt baseline file {path}: {exc}") from None


def check_writable(root: Path, ops: Iterable[str]) -> None:
    """Refuse up front (before any measuring) to refresh into a corrupt baseline file."""
    for op in ops:
        read_rows(Path(root) / f"{safe_name(op)}.json")


def _merge_into(root: Path, op: str, framework: str, new_rows: List[BaselineRow]) -> List[RowChange]:
    """Replace ``new_rows`` (by variant x environment) in ``root/<op>.json``, keep every other
    row, drop corpus files only the replaced rows used, and write the file atomically."""
    path = root / f"{safe_name(op)}.json"
    existing, stored_fw = read_rows(path)
    framework = framework or stored_fw
    index = {r.key: r for r in existing}
    changes: List[RowChange] = []
    replaced: set = set()
    for row in new_rows:
        old = index.get(row.key)
        if old is None:
            changes.append(RowChange(op, row.variant, None, row.ulp, "added", row.nonfinite))
        else:
            kind = "unchanged" if old.ulp == row.ulp and old.nonfinite == row.nonfinite else "changed"
            changes.append(RowChange(op, row.variant, old.ulp, row.ulp, kind, row.nonfinite, old.nonfinite))
            replaced |= set(old.corpus)
        index[row.key] = row
    rows = sorted(index.values(), key=lambda r: (r.variant, env_key(r.env)))
    doc = {"op": op, "framework": framework, "rows": [r.to_dict() for r in rows]}
    # the new rows' corpus files are already on disk under names of their own: swapping the JSON
    # is the one step that changes what the baseline says; old files go only after it, so a
    # kill at any point leaves every row pointing at the data it was measured with
    _atomic_write(path, (json.dumps(doc, indent=1) + "\n").encode())
    in_use = {rel for r in rows for rel in r.corpus}
    for stale in sorted(replaced - in_use):
        if (root / stale).exists():
            (root / stale).unlink()
    return changes


def _digest(cand: Candidate) -> str:
    """A short name for a corpus input's content (so a refresh never rewrites a file a row uses)."""
    h = hashlib.sha256(json.dumps({"dims": cand.dims, "params": repr(sorted(cand.params.items())),
                                   "origin": cand.origin}, sort_keys=True, default=str).encode())
    for k in sorted(cand.arrays):
        a = np.ascontiguousarray(cand.arrays[k])
        h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()[:12]


#: the baselines folder's own .gitignore: a library's patterns must not keep a baseline out of
#: the commit (vector-quantize-pytorch ignores ``*.log``, and its operator
#: ``...lookup_free_quantization.log`` names a corpus folder: the rows were committed, their
#: inputs not, and every run on the PR failed to read them)
KEEP_ALL = "# dl-gate: every file here is committed, whatever the repository's own patterns say\n!*\n"


def keep_tracked(root: Path) -> None:
    """Write ``root/.gitignore`` (:data:`KEEP_ALL`) unless the folder has one."""
    gi = Path(root) / ".gitignore"
    if not gi.exists():
        _atomic_write(gi, KEEP_ALL.encode())


def ignored_by_git(root: Path, sample: int = 5) -> Optional[str]:
    """A one-line warning when git would leave files under ``root`` out of a commit (ignored in
    spite of :func:`keep_tracked`: the folder itself is ignored by a parent pattern), else None;
    None outside a git repository."""
    root = Path(root)
    files = [str(p) for p in root.rglob("*") if p.is_file()]
    if not files:
        return None
    try:
        res = subprocess.run(["git", "-C", str(root), "check-ignore", "--stdin", "--no-index"], input="\n".join(files),
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    ignored = [line for line in res.stdout.splitlines() if line.strip()] if res.returncode == 0 else []
    if not ignored:
        return None
    why = subprocess.run(["git", "-C", str(root), "check-ignore", "-v", "--no-index", ignored[0]], capture_output=True,
                         text=True).stdout.split("\t")[0].strip()
    return (f"{len(ignored)} of {len(files)} baseline file(s) under {root} are ignored by git (e.g. {ignored[0]}"
            + (f", by {why}" if why else "") + "): they would not be committed and the gate could not read them "
            "at the PR's base; un-ignore the folder (or git add -f it)")


def write_rows(root: Path, findings: Iterable[Finding], frameworks: Dict[str, str],
               extra_corpus: Optional[Dict[str, List[Candidate]]] = None) -> List[RowChange]:
    """Merge rows for ``findings`` into ``root`` (atomic per file); rows of other variants and
    environments are kept untouched. Returns what changed."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    keep_tracked(root)
    by_op: Dict[str, List[Finding]] = {}
    for f in findings:
        by_op.setdefault(f.op, []).append(f)
    changes: List[RowChange] = []
    for op, fs in sorted(by_op.items()):
        rows = []
        for f in fs:
            stem = f"corpus/{safe_name(op)}/{safe_name(f.variant.key)}-{env_hash(finding_env(f))}"
            files = []
            for i, cand in enumerate(corpus_for(f, (extra_corpus or {}).get(f.id, []))):
                rel = f"{stem}-{i}-{_digest(cand)}.npz"  # new data, new name: see _merge_into
                if not (root / rel).exists():
                    _atomic_write(root / rel, cand.to_bytes())
                files.append(rel)
            rows.append(BaselineRow.from_finding(f, files))
        changes += _merge_into(root, op, frameworks.get(op, ""), rows)
    return changes


def merge_dirs(target: Path, sources: Iterable[Path]) -> List[RowChange]:
    """Merge shard outputs (each a baselines dir written by ``refresh --shard``) into ``target``."""
    changes: List[RowChange] = []
    target = Path(target)
    for src in sources:
        src = Path(src)
        store = BaselineStore(DirBaselineSource(src)).load()
        for op, rows in sorted(store.rows.items()):
            for r in rows:
                for rel in r.corpus:
                    if not (target / rel).exists() or (target / rel).read_bytes() != (src / rel).read_bytes():
                        _atomic_write(target / rel, (src / rel).read_bytes())
            changes += _merge_into(target, op, store.frameworks.get(op, ""), rows)
    return changes

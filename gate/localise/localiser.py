"""One finding, start to end: shrink, vary, compare, trace, rank changed code, write the repro."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..search.inputs import Candidate, project
from ..oracles.runner import OK
from ..judge.decide import BEHAVIOUR_TOLERANCE_ULP
from ..judge.replay import UNAVAILABLE, ReplayResult
from ..judge.verdict import BEHAVIOUR_CHANGE, REGRESSION
from .evaluate import Check, Session
from .model import Deadline, Diagnosis, fmt, jsonable, safe_id
from .target import (BEHAVIOUR, CRASH_KIND, PRECISION, RowLimit, Target, classify, element_ulps,
                     focus_element, signature)

SMALL = 16  # inputs/outputs up to this many elements are shown in full


class Localiser:
    def __init__(self, w: dict, ctx: dict, report, session: Session, deadline: Deadline, out: Path, shared: dict):
        self.w, self.ctx, self.report, self.session = w, ctx, report, session
        self.deadline, self.out, self.shared = deadline, out, shared
        self.spec, self.task, self.vv = w["spec"], w["task"], w["verdict"]
        self.variant = self.task.variant
        self.settings = ctx["settings"]
        base = w.get("base")
        self.use_base = (base is not None and session.base is not None
                         and any(r.status != UNAVAILABLE for r in base))
        self.details: Dict[str, Any] = {"id": self.vv.id}

    # -- the deciding input ---------------------------------------------------------------
    def deciding_index(self) -> int:
        i = self.vv.details.get("input_index")
        cands, head = self.w["cands"], self.w["head"]
        if isinstance(i, int) and 0 <= i < len(cands):
            return i
        # no base replay: the judge held head's worst against the baseline row
        best, key = 0, (-1.0,)
        for j, h in enumerate(head):
            if h.status != OK:
                k = (math.inf, 2.0)
            elif h.metrics is not None and h.metrics.nonfinite:
                k = (math.inf, 1.0)
            else:
                k = (h.metrics.ulp if h.metrics else 0.0, 0.0)
            if k > key:
                best, key = j, k
        return best

    def _row_limit(self):
        """Baseline-row limits per variant (no base replay: built-in operators)."""
        cache: Dict[str, Optional[RowLimit]] = {}
        vv, settings, spec = self.vv, self.settings, self.spec

        def limit(variant):
            if variant == self.variant:
                return RowLimit(threshold=vv.threshold if vv.threshold is not None else settings.floor(spec, variant),
                                nonfinite=vv.base_nonfinite or 0, crash=vv.base_crash)
            if variant.key not in cache:
                cache[variant.key] = None
                try:
                    store = self.shared.get("store")
                    if store is None:
                        from ..judge.baselines import BaselineStore, GitBaselineSource

                        cfg = self.ctx["config"]
                        store = BaselineStore(GitBaselineSource(Path(self.ctx["repo"]), self.report.base_sha,
                                                                cfg.raw.get("baselines", "baselines"))).load()
                        self.shared["store"] = store
                    from ..backends import get_backend

                    env = get_backend(spec.framework).environment(variant.device)
                    row, status = store.lookup(spec.name, variant.key, env)
                    if row is not None and status == "ok":
                        cache[variant.key] = RowLimit(max(settings.floor(spec, variant), settings.m(variant) * row.ulp),
                                                      row.nonfinite, row.crash)
                except Exception:
                    pass
            return cache[variant.key]

        return limit

    def check(self, pairs, deadline: Optional[Deadline] = None) -> List[Check]:
        return self.session.check(self.spec, self.target, pairs, self.use_base, deadline or self.deadline)

    # -- main ---------------------------------------------------------------------------
    def run(self) -> Diagnosis:
        spec, variant, vv = self.spec, self.variant, self.vv
        i = self.deciding_index()
        found = self.w["cands"][i]
        h0 = self.w["head"][i]
        b0 = self.w["base"][i] if self.use_base else None
        kind = classify(h0, b0, vv.outcome, variant.dtype)
        self.target = Target(spec, self.settings, kind, crash_signature=signature(h0) if kind == CRASH_KIND else None,
                             row_limit=self._row_limit(), oracle=variant.oracle)
        diag = Diagnosis(variant={k: v for k, v in variant.to_dict().items() if k != "oracle" or v != "precision"},
                         kind=kind)
        q0 = self.session.head.quantize(spec, variant, found)
        diag.found_input_elements = int(q0.size)
        holds0 = self.target.holds(h0, b0, variant)
        start = Check(q0, variant, holds0, h0, b0, self.target.severity(h0, b0, variant.dtype) if holds0 else 0.0)
        if not self.use_base and self.w.get("base") is not None:
            diag.notes.append("base could not run this operator: judged against the baseline row instead")
        # a hang: every probe of it costs the evaluation timeout, and a smaller input or another
        # parameter rarely tells more than where it hung (the signature's frame): not shrunk
        hang = kind == CRASH_KIND and str(self.target.crash_signature or "").startswith("timeout after")
        if hang:
            diag.notes.append("a hang: the input as found, parameters not varied (each probe would cost the "
                              "evaluation timeout); where it hung is in the crash signature")
        if holds0 is not True and not hang:
            # the judge saw it on this input: re-ask both sides once (a flaky answer or a rule detail)
            again = self.check([(variant, q0)])[0]
            if again.holds:
                start = again
            else:
                diag.notes.append("the deciding input does not reproduce under the localisation predicate on a fresh run; "
                                  "kept as found")

        # 1-2. minimal input -----------------------------------------------------------------
        minimal = start
        if start.holds and not hang:
            if self.deadline.expired():
                diag.truncated = True
                diag.notes.append("budget spent before shrinking: the input as found")
            else:
                minimal = self._shrink(start, diag)
        cand = minimal.cand
        diag.minimal_input_elements = int(cand.size)
        diag.minimal_input = self._describe_input(cand, diag.found_input_elements)

        # 1. variant and parameter ----------------------------------------------------------
        if hang:
            pass
        elif self.deadline.expired():
            diag.truncated = True
            diag.notes.append("budget spent before varying parameters")
        else:
            self._vary([cand] + ([q0] if minimal is not start else []), diag)

        # 2-3. worst element, base vs head ---------------------------------------------------
        self._compare(minimal, diag)

        # 4. sub-operation ------------------------------------------------------------------
        stack: List[str] = []
        if self.deadline.expired():
            diag.truncated = True
            diag.notes.append("budget spent before tracing sub-operations")
        else:
            stack = self._trace(cand, diag)

        # 5. changed code --------------------------------------------------------------------
        self._changed_code(stack, diag)

        # 6. repro ----------------------------------------------------------------------------
        self._repro(minimal, diag)
        if self.use_base and self.session.base is not None and self.session.base.dead:
            diag.notes.append(f"base worker: {self.session.base.dead}")
        self._save(diag)
        return diag

    # -- 2. shrinking -------------------------------------------------------------------------
    def _shrink(self, start: Check, diag: Diagnosis) -> Check:
        from .shrink import Shrinker

        budget = self.deadline.sub(0.6)
        variant = self.variant

        def locate(chk: Check):
            loc = focus_element(self.target, chk.head, chk.base, variant.dtype)
            if loc is None or chk.head.outputs is None:
                return None
            k, idx = loc
            return k, idx, tuple(np.asarray(chk.head.outputs[k]).shape)

        sh = Shrinker(self.spec, lambda cs: self.check([(variant, c) for c in cs], budget), budget, locate=locate)
        res = sh.run(start.cand, start)
        if res.truncated or budget.expired():
            diag.truncated = True
            diag.notes.append(f"shrinking stopped at its share of the budget ({budget.end - budget.start:.1f}s)")
        self.details["shrink"] = {"log": res.log, "rounds": res.rounds, "evaluated": res.evaluated,
                                  "from": diag.found_input_elements, "to": int(res.cand.size)}
        return res.check if res.check is not None else start

    def _describe_input(self, cand: Candidate, found: Optional[int]) -> str:
        parts = []
        for name, a in cand.arrays.items():
            if a.size <= SMALL:
                parts.append(f"{name}{list(a.shape)} = {_values(a)}")
            else:
                parts.append(Candidate(dims={}, params={}, arrays={name: a}).summary())
        if cand.params:
            parts.append(", ".join(f"{k}={v!r}" for k, v in cand.params.items()))
        lay = self.spec.layout(self.variant.layout)
        if lay is not None:
            how = f"memory format {lay.memory_format}" if lay.memory_format else "permuted"
            if lay.memory_format == "transposed":
                how = "non-contiguous (transposed strides)"
            parts.append(f"passed in layout {lay.name}: {how}")
        s = "; ".join(parts)
        s += f" ({cand.size} element{'s' if cand.size != 1 else ''}"
        if found:
            s += f"; found input: {found}, {found / max(cand.size, 1):.0f}x larger" if found > cand.size else "; as found"
        return s + ")"

    # -- 1. parameters --------------------------------------------------------------------------
    def _vary(self, cands: List[Candidate], diag: Diagnosis) -> None:
        """Every one-axis change of the failing configuration, asked on the minimal input and on
        the input as found (a minimal input can be too specific to one dtype), in one batch."""
        from .vary import conclude, describe, variations

        runner = self.session.head.runner(self.spec, self.variant)
        devs = runner.backend.devices() if runner is not None else [self.variant.device]
        rows = variations(self.spec, self.variant, cands, devs)
        if len(rows) <= 1:
            diag.parameter = "nothing to vary: one dtype, mode, layout and no parameter choices"
            return
        pairs, where = [], []
        for ri, r in enumerate(rows):
            for ci, c in enumerate(r.cands):
                if c is not None:
                    pairs.append((r.variant, c))
                    where.append((ri, ci))
        checks = self.check(pairs)
        for r in rows:
            r.results = [None] * len(r.cands)
        firsts: Dict[int, Check] = {}
        for (ri, ci), c in zip(where, checks):
            rows[ri].results[ci] = c.holds
            if ri not in firsts or (c.holds and not firsts[ri].holds):
                firsts[ri] = c
        for ri, r in enumerate(rows):
            if ri in firsts:
                r.head, r.base = describe(firsts[ri], self.target.kind)
                if not self.use_base and r.holds is None:
                    r.base = "no baseline row"
        failed = [v.key for v in self.report.verdicts
                  if v.op == self.spec.name and v.outcome in (REGRESSION, BEHAVIOUR_CHANGE) and not v.reported_only
                  and v is not self.vv]
        diag.parameter, diag.parameter_evidence = conclude(rows, self.variant, cands[0].params, failed)
        self.details["variations"] = [r.to_dict() for r in rows]

    # -- 2-3. worst element and base vs head ------------------------------------------------------
    def _compare(self, chk: Check, diag: Diagnosis) -> None:
        h, b, dtype = chk.head, chk.base, self.variant.dtype
        rows: List[Dict[str, str]] = []

        def st(r: Optional[ReplayResult]) -> str:
            if r is None:
                return "not run (no base version)" if not self.use_base else "-"
            if r.status == OK:
                return "ok"
            return f"{r.status}: {r.error or ''}"[:300]

        rows.append({"name": "status", "base": st(b), "head": st(h)})
        if h.metrics is not None or (b is not None and b.metrics is not None):
            hm, bm = h.metrics, (b.metrics if b is not None else None)
            rows.append({"name": f"max error ({dtype} ulp)", "base": fmt(bm.ulp) if bm else "-", "head": fmt(hm.ulp) if hm else "-"})
            rows.append({"name": "max abs error", "base": fmt(bm.abs) if bm else "-", "head": fmt(hm.abs) if hm else "-"})
            rows.append({"name": "NaN/Inf outputs where float64 is finite", "base": str(bm.nonfinite) if bm else "-", "head": str(hm.nonfinite) if hm else "-"})
        if self.target.kind == BEHAVIOUR and b is not None:
            from .target import divergence

            dv = divergence(h, b, dtype, self.spec.ulp_floor)
            rows.append({"name": f"float64 output vs base's ({dtype} ulp)", "base": "0",
                         "head": f"{fmt(dv)} (tolerance {fmt(BEHAVIOUR_TOLERANCE_ULP)})"})
        if self.target.kind == PRECISION and h.metrics is not None:
            thr = self.target.threshold(b, dtype, self.target.row_limit(self.variant) if not self.use_base else None)
            how = (f"max(floor {fmt(self.target.floor(dtype))}, {self.target.m(dtype):g} x base)" if self.use_base
                   else "the baseline row's limit")
            rows.append({"name": "threshold (ulp)", "base": "", "head": f"{fmt(thr)} = {how}"})
        loc = focus_element(self.target, h, b, dtype)
        if loc is not None and h.outputs is not None:
            k, idx = loc
            o = np.asarray(h.outputs[k])
            r = np.asarray(h.reference[k]) if h.reference is not None else None
            bo = np.asarray(b.outputs[k]) if b is not None and b.outputs is not None and k < len(b.outputs) else None
            br = np.asarray(b.reference[k]) if b is not None and b.reference is not None and k < len(b.reference) else None
            he = element_ulps(o, r, dtype, self.spec.ulp_floor)[idx] if r is not None else None
            be = (element_ulps(bo, br, dtype, self.spec.ulp_floor)[idx]
                  if bo is not None and br is not None and bo.shape == o.shape else None)
            where = f"output[{k}][{', '.join(map(str, idx))}]" if idx else f"output[{k}]"
            text = f"{where}: head {_num(o[idx])}"
            if bo is not None and bo.shape == o.shape:
                text += f", base {_num(bo[idx])}"
            if r is not None:
                text += f", float64 {_num(r[idx])}"
            if self.target.kind == BEHAVIOUR and br is not None and br.shape == r.shape:
                text += f" (base's float64 {_num(br[idx])})"
            elif he is not None:
                text += f" (head error {fmt(float(he))} ulp" + (f", base {fmt(float(be))} ulp)" if be is not None else ")")
            feeds = self._feeding(chk.cand, k, idx, o.shape)
            if feeds:
                text += f"; fed by {feeds}"
            diag.worst_element = text
            rows.append({"name": f"{where} value", "base": _num(bo[idx]) if bo is not None and bo.shape == o.shape else "-",
                         "head": _num(o[idx])})
            rows.append({"name": f"{where} float64", "base": _num(br[idx]) if br is not None and br.shape == o.shape else "-",
                         "head": _num(r[idx]) if r is not None else "-"})
        elif self.target.kind == CRASH_KIND:
            diag.worst_element = (f"no output: head raises {h.error}" + (", base returns" if b is not None and b.status == OK else ""))
        if h.outputs is not None:
            for k, o in enumerate(h.outputs):
                o = np.asarray(o)
                if o.size <= SMALL:
                    bo = b.outputs[k] if b is not None and b.outputs is not None and k < len(b.outputs) else None
                    rows.append({"name": f"output[{k}]", "base": _values(np.asarray(bo)) if bo is not None else "-",
                                 "head": _values(o)})
        elif b is not None and b.outputs is not None:
            for k, bo in enumerate(b.outputs):
                bo = np.asarray(bo)
                if bo.size <= SMALL:
                    rows.append({"name": f"output[{k}]", "base": _values(bo), "head": "-"})
        diag.base_vs_head = rows

    def _feeding(self, cand: Candidate, k: int, idx: Tuple[int, ...], out_shape) -> str:
        """Input elements that feed output element ``idx``: each is nudged (by 1/16 of its
        magnitude) and the operator's output and float64 reference at ``idx`` are watched (small
        inputs); on large inputs, the same index when the shapes agree."""
        runner = self.session.head.runner(self.spec, self.variant)
        floats = [t for t in self.spec.inputs if t.kind == "float" and t.name in cand.arrays]
        total = sum(cand.arrays[t.name].size for t in floats)
        if runner is None or not floats:
            return ""
        if total > 64 or self.deadline.expired():
            same = [f"{t.name}[{', '.join(map(str, idx))}] = {_num(cand.arrays[t.name][idx])}" for t in floats
                    if cand.arrays[t.name].shape == tuple(out_shape)]
            return ", ".join(same)

        def at(c: Candidate):
            with np.errstate(all="ignore"):
                _, ev = runner.evaluate(c, keep_outputs=True)
            if ev.outputs is None or ev.reference is None:
                return None
            return float(ev.outputs[k].array[idx]), float(ev.reference[k].array[idx])

        def same(a, b):
            return all(x == y or (np.isnan(x) and np.isnan(y)) for x, y in zip(a, b))

        try:
            v0 = at(cand)
        except Exception:
            return ""
        if v0 is None:
            return ""
        def err(v):  # head's error at idx (a NaN/Inf on either side: infinite)
            d = abs(v[0] - v[1])
            return d if math.isfinite(d) else math.inf

        feeds = []  # (how much nudging it moved head's error at idx, its position text)
        for t in floats:
            a = cand.arrays[t.name]
            for j in range(a.size):
                if self.deadline.expired():
                    break
                c = cand.copy()
                flat = c.arrays[t.name].reshape(-1).copy()
                v = flat[j]
                with np.errstate(invalid="ignore", over="ignore"):  # inf + inf/16 or NaN: nudged to itself
                    # only this element moves: projecting the whole tensor into the domain would
                    # also lift every value near a bound (a subnormal probability to 1e-3)
                    flat[j] = project(np.array([v + max(abs(v), 1.0) / 16.0]), t.domain)[0]
                c.arrays[t.name] = flat.reshape(a.shape)
                try:
                    r = at(c)
                except Exception:
                    continue
                if r is not None and not same(r, v0):
                    pos = np.unravel_index(j, a.shape)
                    e0, e1 = err(v0), err(r)
                    moved = 0.0 if e0 == e1 else math.inf if math.inf in (e0, e1) else abs(e1 - e0)
                    feeds.append((moved, f"{t.name}[{', '.join(map(str, pos))}] = {_num(v)}"))
        # the elements the error hangs on first (a subnormal q among eight p = 0.5 of a KL row
        # was cut off behind them)
        feeds.sort(key=lambda f: -f[0])
        text = [f[1] for f in feeds]
        return ", ".join(text[:12]) + (f" (+{len(text) - 12} more)" if len(text) > 12 else "")

    # -- 4. sub-operation ----------------------------------------------------------------------------
    def _trace(self, cand: Candidate, diag: Diagnosis) -> List[str]:
        from .trace import culprit, trace_op

        spec, variant = self.spec, self.variant
        if (self.ctx.get("isolate") is not None and self.target.kind == CRASH_KIND
                and _ends_a_process(self.target.crash_signature)):
            # an input that killed or hung its worker is not traced again (a tracing worker would
            # die the same way; an exception it raised is traced: the view or index that raised
            # is the answer)
            diag.notes.append("sub-operations are not traced for a crash that ends its process when evaluations "
                              "are isolated")
            return []
        f64 = self.target.kind == BEHAVIOUR
        if self.session.head_worker is not None:  # isolated: in a worker, never in the gate's process
            head, err = self.session.head_worker.trace(spec, variant, cand, timeout=max(self.deadline.left, 0.5),
                                                       float64_run=f64)
            if head is None:
                diag.notes.append(f"tracing head failed: {err}")
                return []
        else:
            try:
                head = trace_op(spec, variant, cand, root=str(self.ctx["repo"]), float64_run=f64)
            except Exception as exc:
                diag.notes.append(f"tracing head failed: {type(exc).__name__}: {exc}")
                return []
        if head.note:
            diag.notes.append(head.note)
            return []
        base = None
        if self.use_base and self.session.base is not None and not self.deadline.expired():
            base, err = self.session.base.trace(spec, variant, cand, timeout=max(self.deadline.left, 0.5),
                                                float64_run=self.target.kind == BEHAVIOUR)
            if base is None:
                diag.notes.append(f"base could not be traced ({err}): head's change rate alone")
        floor = self.settings.floor(spec, variant)
        m = self.settings.m(variant)
        sub, table = culprit(head, base, self.target.kind, floor, m, spec.ulp_floor, BEHAVIOUR_TOLERANCE_ULP)
        self.details["trace"] = {"head_calls": len(head.low.calls) if head.low else 0,
                                 "base_calls": len(base.low.calls) if base is not None and base.low else None,
                                 "table": table[:400]}
        if sub is None:
            diag.notes.append("no sub-operation stands out in the trace")
            return []
        diag.suboperation = jsonable(sub)
        return list(sub.get("stack") or ([f"{sub['file']}:{sub['line']} {sub.get('function') or ''}"] if sub.get("file") else []))

    # -- 5. changed code ---------------------------------------------------------------------------------
    def _changed_code(self, stack: List[str], diag: Diagnosis) -> None:
        from .code import changed_code, rank, source_lines

        repo, mb, hs = self.ctx.get("repo"), self.ctx.get("merge_base"), self.ctx.get("head_sha")
        if not (repo and mb and hs):
            return
        if "changes" not in self.shared:
            try:
                self.shared["changes"] = changed_code(Path(repo), mb, hs)
            except Exception as exc:
                self.shared["changes"] = []
                diag.notes.append(f"reading the diff failed: {exc}")
        reasons = []
        for s in self.ctx.get("selected") or []:
            if s.get("op") == self.spec.name:
                reasons = [r for r in (s.get("reasons") or []) if isinstance(r, dict)]
        if "sources" not in self.shared:
            self.shared["sources"] = source_lines(Path(repo), hs)
        rows = rank(self.shared["changes"], stack, reasons, self.shared["sources"])
        diag.changed_code = jsonable(rows[:20])

    # -- 6. repro ----------------------------------------------------------------------------------------------
    def _repro(self, chk: Check, diag: Diagnosis) -> None:
        from ..backends import get_backend
        from .repro import write_repro

        spec, variant = self.spec, self.variant
        kind = self.target.kind
        if kind == BEHAVIOUR:
            thr, why = BEHAVIOUR_TOLERANCE_ULP, "float64 outputs of base and head may differ by rounding only"
        elif kind == PRECISION:
            limit = self.target.row_limit(variant) if not self.use_base else None
            thr = self.target.threshold(chk.base, variant.dtype, limit)
            bu = chk.base.metrics.ulp if chk.base is not None and chk.base.metrics is not None else None
            why = (f"max(floor {fmt(self.target.floor(variant))}, {self.settings.m(variant):g} x base's "
                   f"{fmt(bu)} ulp on this input)" if bu is not None else "the baseline row's limit")
        else:
            thr, why = self.target.floor(variant), "any NaN/Inf or exception reproduces"
        # results below the smallest normal number are judged as the finding was: not in a search,
        # in subnormal ulps in an exhaustive sweep (unless the framework flushes them by design)
        ftz = True
        if self.vv.details.get("search") == "exhaustive":
            try:
                ftz = get_backend(spec.framework).flush_subnormals
            except Exception:
                ftz = False
        stem = safe_id(f"{spec.name}_{variant.key}")
        paths = write_repro(self.out / "repro", stem, spec, variant, chk.cand, kind=kind, threshold=thr, threshold_why=why,
                            repo=Path(self.ctx["repo"]), python_path=self.shared.get("head_python_path") or ["."],
                            reason=self.vv.reason, ftz=ftz, summary=diag.minimal_input,
                            base_reference=chk.base.reference if kind == BEHAVIOUR and chk.base is not None else None,
                            base_outputs=chk.base.outputs if chk.base is not None and chk.base.status == "ok" else None,
                            hang_after=_hang_seconds(chk.head.signature or chk.head.error) if kind == CRASH_KIND else None)
        diag.repro_script, diag.repro_data, diag.repro_command = paths["script"], paths["data"], paths["command"]

    def _save(self, diag: Diagnosis) -> None:
        folder = self.out / "findings"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{safe_id(self.vv.id)}.json"
        diag.details_file = str(path)
        doc = {**self.details, "diagnosis": diag.to_dict(), "verdict": self.vv.to_dict()}
        path.write_text(json.dumps(jsonable(doc), indent=1, default=str))


def _num(x) -> str:
    v = float(x)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return repr(v) if abs(v) >= 1e-4 or v == 0 else f"{v:.6g}"


def _values(a: np.ndarray) -> str:
    """One line: nested lists of the values (floats as their shortest exact repr)."""
    a = np.asarray(a)
    if a.ndim == 0:
        return _num(a)
    return "[" + ", ".join(_values(x) for x in a) + "]"


def _hang_seconds(sig) -> Optional[float]:
    """The evaluation timeout a hang's signature names ("timeout after 1s in ops.py:3 f")."""
    import re

    m = re.match(r"timeout after ([0-9.]+)s", str(sig or ""))
    return float(m.group(1)) if m else None


def _ends_a_process(sig) -> bool:
    """A crash signature of a worker that died or hung (not an exception the operator raised)."""
    import re

    if sig is None or re.match(r"(backward: )?(SIG[A-Z]+|exit code|timeout after|signal #|worker lost)", str(sig)):
        return True
    # an allocation that failed under the worker's memory limit would not fail in this process:
    # it would grow until the machine's OOM killer ends the run
    return bool(re.search(r"MemoryError|out of memory|can't allocate|bad_alloc", str(sig), re.I))

"""Which oracles apply to which operators: the rules table ``catalog/oracles.yaml`` as data.

A rule names an oracle and the operators it applies to (frameworks, kinds, explicit names,
documented exclusions, facts the row must declare) plus the runner's default arguments.
:func:`applicable` answers, for one operator, "which oracles, with which arguments"; the plan
stage turns that into variants, the fuzz stage hands the arguments to the oracle's runner.
A rule with ``schedule: nightly`` names an oracle whose rows come from the nightly campaign
(:mod:`gate.graphs.nightly`) instead: it is kept apart (:attr:`Rules.nightly`), never planned
per operator. Nothing here imports a framework.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Dict, List, Mapping, Optional

from ..backends import FRAMEWORKS
from ..errors import ConfigError
from ..serial import load_yaml
from .spec import FLOAT_DTYPES, OpSpec

REQUIREMENTS = ("grad", "batch_dim", "layouts", "xfw")
#: when an oracle runs: ``pr`` (planned per operator, run by the fuzz stage through its runner)
#: or ``nightly`` (its rows come from the nightly campaign; the rule carries a description only)
SCHEDULES = ("pr", "nightly")


@dataclass(frozen=True)
class OracleRule:
    name: str
    description: str = ""
    frameworks: tuple = FRAMEWORKS
    kinds: Optional[tuple] = None  # None: every kind
    ops: tuple = ()
    exclude: Mapping[str, str] = field(default_factory=dict)
    requires: tuple = ()
    dtypes: Optional[tuple] = None
    dtype: Optional[str] = None
    per_layout: bool = False
    args: Mapping[str, Any] = field(default_factory=dict)
    runner: str = ""  # "module:Class" of the oracle's runner (gate.oracles.registry imports it)
    schedule: str = "pr"  # one of SCHEDULES

    @classmethod
    def from_dict(cls, name: str, raw: Mapping) -> "OracleRule":
        raw = dict(raw or {})
        unknown = set(raw) - {"description", "frameworks", "kinds", "ops", "exclude", "requires", "dtypes",
                              "dtype", "per_layout", "args", "runner", "schedule"}
        if unknown:
            raise ConfigError(f"oracle rule {name}: unknown key(s) {', '.join(sorted(unknown))}")
        schedule = str(raw.get("schedule") or "pr")
        if schedule not in SCHEDULES:
            raise ConfigError(f"oracle rule {name}: unknown schedule {schedule!r} (use {', '.join(SCHEDULES)})")
        if schedule == "nightly" and set(raw) - {"description", "schedule"}:
            raise ConfigError(f"oracle rule {name}: a nightly oracle's rows come from the nightly campaign; its rule "
                              f"takes a description only (not {', '.join(sorted(set(raw) - {'description', 'schedule'}))})")
        for req in raw.get("requires") or ():
            if req not in REQUIREMENTS and not str(req).startswith("args:"):
                raise ConfigError(f"oracle rule {name}: unknown requirement {req!r}")
        for dt in list(raw.get("dtypes") or ()) + ([raw["dtype"]] if raw.get("dtype") else []):
            if dt not in FLOAT_DTYPES:
                raise ConfigError(f"oracle rule {name}: unknown dtype {dt!r}")
        return cls(
            name=name,
            description=" ".join(str(raw.get("description", "")).split()),
            frameworks=tuple(raw.get("frameworks") or FRAMEWORKS),
            kinds=tuple(raw["kinds"]) if raw.get("kinds") else None,
            ops=tuple(raw.get("ops") or ()),
            exclude=dict(raw.get("exclude") or {}),
            requires=tuple(raw.get("requires") or ()),
            dtypes=tuple(raw["dtypes"]) if raw.get("dtypes") else None,
            dtype=raw.get("dtype"),
            per_layout=bool(raw.get("per_layout", False)),
            args=dict(raw.get("args") or {}),
            runner=str(raw.get("runner") or ""),
            schedule=schedule,
        )

    def args_for(self, spec: OpSpec) -> Dict[str, Any]:
        """The runner's arguments for ``spec``: rule defaults (per framework when keyed so),
        overridden by the row's ``oracle_args``."""
        base = dict(self.args)
        if set(base) and set(base) <= set(FRAMEWORKS):
            base = dict(base.get(spec.framework) or {})
        base.update(dict(spec.oracle_args.get(self.name) or {}))
        return base

    def missing(self, spec: OpSpec) -> Optional[str]:
        """Why ``spec`` does not meet this rule's requirements (``None`` when it does)."""
        if spec.framework not in self.frameworks:
            return f"oracle {self.name} is for {', '.join(self.frameworks)} operators"
        args = self.args_for(spec)
        for req in self.requires:
            if req == "grad" and not spec.grad:
                return f"oracle {self.name} needs a differentiable operator (grad: true)"
            if req == "batch_dim" and spec.batch_dim is None:
                return f"oracle {self.name} needs batch_dim"
            if req == "layouts" and not [lay for lay in spec.layouts if not lay.auto]:
                return f"oracle {self.name} needs declared layouts"
            if req == "xfw":
                from .xfw import load_table

                if load_table().pair_for(spec.name) is None:
                    return f"oracle {self.name} needs a torch/TensorFlow pair in xfw.yaml"
            if req.startswith("args:"):
                names = req[5:].split("|")
                if not any(args.get(n) for n in names):
                    return f"oracle {self.name} needs oracle_args.{self.name}.{' or '.join(names)}"
        return None

    def selects(self, spec: OpSpec) -> bool:
        """Whether the rule picks ``spec`` on its own (no explicit ``oracles:`` on the row)."""
        if spec.name in self.exclude:
            return False
        if self.kinds is not None and spec.kind not in self.kinds and spec.name not in self.ops:
            return False
        return self.missing(spec) is None


@dataclass(frozen=True)
class Rules:
    rules: Mapping[str, OracleRule]  # the oracles planned per operator (schedule: pr)
    nightly: Mapping[str, OracleRule] = field(default_factory=dict)  # rows from the nightly campaign

    def names(self) -> List[str]:
        return list(self.rules)

    def get(self, name: str) -> OracleRule:
        if name not in self.rules:
            raise ConfigError(f"unknown oracle {name!r} (known: {', '.join(self.rules)})")
        return self.rules[name]

    def applicable(self, spec: OpSpec) -> Dict[str, Dict[str, Any]]:
        """Oracle name -> runner arguments, for every oracle that applies to ``spec``."""
        out: Dict[str, Dict[str, Any]] = {}
        if spec.oracles is not None:
            for name in ["precision", *spec.oracles]:
                rule = self.get(name)
                why = rule.missing(spec)
                if why:
                    raise ConfigError(f"operator {spec.name} lists {why}")
                out[name] = rule.args_for(spec)
            return out
        for name, rule in self.rules.items():
            if rule.selects(spec):
                out[name] = rule.args_for(spec)
        return out


def parse_rules(text: str) -> Rules:
    doc = load_yaml(text) or {}
    raw = doc.get("rules") or {}
    rules = [OracleRule.from_dict(str(k), v) for k, v in raw.items()]
    return Rules({r.name: r for r in rules if r.schedule == "pr"}, {r.name: r for r in rules if r.schedule == "nightly"})


_RULES: Optional[Rules] = None


def load_rules() -> Rules:
    global _RULES
    if _RULES is None:
        _RULES = parse_rules(resources.files("gate.ops").joinpath("catalog", "oracles.yaml").read_text())
    return _RULES


def applicable(spec: OpSpec) -> Dict[str, Dict[str, Any]]:
    return load_rules().applicable(spec)


def oracle_args(spec: OpSpec, oracle: str) -> Dict[str, Any]:
    return load_rules().get(oracle).args_for(spec)

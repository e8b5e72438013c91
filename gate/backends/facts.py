"""What the judging process needs to know of a framework (its devices, the environment that keys
its baselines, whether it flushes subnormals), without importing the framework: asked of an
isolation worker forked from the warm zygote (:func:`gate.backends.isolate.backend_facts`), or,
without isolation (trusted code, ``--no-isolate``), of the backend in this process."""
from __future__ import annotations

from typing import Any, Dict, List, Optional


class BackendFacts:
    def __init__(self, isolate: Optional[Any] = None):
        self.isolate = isolate
        self._facts: Dict[str, Dict[str, Any]] = {}

    def _get(self, framework: str) -> Dict[str, Any]:
        if framework not in self._facts:
            facts = None
            if self.isolate is not None and framework in ("torch", "tensorflow"):
                from ..errors import GateError
                from .isolate import backend_facts

                try:
                    facts = backend_facts(framework, self.isolate)
                except (GateError, OSError):  # the framework itself does not start in a worker: ask here, where
                    facts = None               # the error names what is missing
            if facts is None:
                from . import get_backend

                backend = get_backend(framework)
                devices = backend.devices()
                facts = {"devices": devices, "env": {d: backend.environment(d) for d in devices},
                         "flush_subnormals": bool(getattr(backend, "flush_subnormals", False))}
            self._facts[framework] = facts
        return self._facts[framework]

    def devices(self, framework: str) -> List[str]:
        return list(self._get(framework)["devices"])

    def environment(self, framework: str, device: str) -> dict:
        env = self._get(framework)["env"]
        return dict(env.get(device) or env.get("cpu") or {})

    def flush_subnormals(self, framework: str) -> bool:
        return bool(self._get(framework)["flush_subnormals"])

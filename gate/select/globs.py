"""Repository-relative path globs as ``.dl-gate.yml`` and catalogue ``sources`` write them:
``*`` and ``?`` stay inside one path segment, ``**`` spans segments, ``[...]`` is a class, and a
pattern without wildcards also matches everything under it as a directory.

Hand-written (a dozen lines) because the standard library has no such matcher before Python 3.13
(``fnmatch`` lets ``*`` cross ``/``) and it is not worth a dependency."""
from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str) -> "re.Pattern[str]":
    pat = pattern.strip().lstrip("./") if pattern.strip().startswith("./") else pattern.strip().lstrip("/")
    out, i = [], 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pat.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pat[i + 1:j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    rx = "".join(out)
    if not any(ch in pat for ch in "*?["):
        rx = rx.rstrip("/") + "(?:/.*)?"  # a plain path: the file itself or a directory
    return re.compile(rx + r"\Z")


def match(path: str, pattern: str) -> bool:
    return bool(_compile(pattern).match(path))


def first_match(path: str, patterns) -> str:
    for p in patterns or ():
        if match(path, p):
            return p
    return ""

"""The sticky PR comment, through GitHub's REST API with requests.

* One comment per PR (and per ``key``, so a CPU and a GPU job can each keep their own), found by
  a hidden marker **and** its author, across every page of the PR's comments.
* Updated in place; created only when there is something to say.
* Stamped with the head SHA and the run (id, attempt): a run for a commit that is no longer
  the PR's head, or an older run of the same commit, never overwrites a newer result.
* Transient failures are retried: 5xx with exponential backoff by urllib3's
  :class:`~urllib3.util.retry.Retry` on an :class:`~requests.adapters.HTTPAdapter` for the
  idempotent methods (GET, PATCH); rate limits (403/429 with ``Retry-After`` or
  ``X-RateLimit-Remaining: 0``) by waiting as the headers say, up to ``max_wait`` seconds;
  a create (POST, not idempotent) that fails with a 5xx is retried only after listing the
  comments again, so a create that did land is not duplicated.
* Nothing here fails the gate: a read-only token (a fork PR) or any other API failure comes
  back as a :class:`CommentResult` with a warning, never as an exception out of
  :func:`upsert_sticky_comment`."""
from __future__ import annotations

import email.utils
import json
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, List, Optional
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from .. import __version__

DEFAULT_API = "https://api.github.com"
DEFAULT_AUTHOR = "github-actions[bot]"
MARKER_PREFIX = "<!-- dl-gate:sticky"
STAMP_RE = re.compile(r"<!-- dl-gate:stamp (\{[^<>]{0,500}\}) -->")


class GitHubAPIError(Exception):
    def __init__(self, status: int, message: str, response: Optional[requests.Response] = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.response = response


class _Retry(Retry):
    """urllib3 Retry for transient server errors: 5xx with exponential backoff, ``Retry-After``
    on a 503 honoured but capped (a huge value must not hang CI). Rate limits (403/429) are left
    to :meth:`GitHubClient.request`, which reads GitHub's rate-limit headers."""

    RETRY_AFTER_MAX = 60.0
    RETRY_AFTER_STATUS_CODES = frozenset({503})

    def get_retry_after(self, response) -> Optional[float]:
        after = super().get_retry_after(response)
        return None if after is None else min(after, self.RETRY_AFTER_MAX)


def marker(key: str = "default") -> str:
    key = re.sub(r"[^A-Za-z0-9_.-]", "-", key or "default")[:60]
    return f"{MARKER_PREFIX}:{key} -->"


@dataclass(frozen=True)
class Stamp:
    """Which result a comment shows: the PR head commit and the run that produced it."""

    sha: str
    run_id: int = 0
    run_attempt: int = 0

    @property
    def order(self) -> tuple:
        return (self.run_id, self.run_attempt)

    def render(self) -> str:
        return f"<!-- dl-gate:stamp {json.dumps(asdict(self), sort_keys=True)} -->"

    @classmethod
    def parse(cls, body: str) -> Optional["Stamp"]:
        m = STAMP_RE.search(body or "")
        if not m:
            return None
        try:
            raw = json.loads(m.group(1))
            return cls(sha=str(raw["sha"]), run_id=int(raw.get("run_id", 0)),
                       run_attempt=int(raw.get("run_attempt", 0)))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass
class CommentResult:
    action: str  # created | updated | unchanged | skipped-nothing-to-say | skipped-stale | skipped-no-pr
    #              | skipped-readonly | skipped-setup-error | failed
    url: Optional[str] = None
    id: Optional[int] = None
    message: str = ""

    @property
    def warning(self) -> bool:
        return self.action in ("skipped-readonly", "failed")

    def to_dict(self) -> dict:
        return asdict(self)


class GitHubClient:
    """A small REST client: token auth, API version header, retries and rate-limit waits."""

    def __init__(self, token: Optional[str], api_url: str = DEFAULT_API, *, timeout: float = 20.0,
                 retries: int = 4, backoff_factor: float = 0.5, max_wait: float = 60.0,
                 rate_limit_retries: int = 3, sleep: Callable[[float], None] = time.sleep):
        self.api_url = (api_url or DEFAULT_API).rstrip("/")
        self.timeout = timeout
        self.max_wait = max_wait
        self.rate_limit_retries = rate_limit_retries
        self.sleep = sleep
        retry = type("_CappedRetry", (_Retry,), {"RETRY_AFTER_MAX": max_wait})(
            total=retries, connect=retries, read=retries, status=retries, other=0,
            backoff_factor=backoff_factor, backoff_max=max_wait,
            status_forcelist=(500, 502, 503, 504),
            allowed_methods=frozenset({"GET", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"}),
            respect_retry_after_header=True, raise_on_status=False, raise_on_redirect=False,
        )
        self.session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers.update({
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": f"dl-gate/{__version__}",
        })
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    # -- transport ---------------------------------------------------------------------------
    def _url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            a, b = urlsplit(path_or_url), urlsplit(self.api_url)
            if (a.scheme, a.netloc) != (b.scheme, b.netloc):  # never send the token elsewhere
                raise GitHubAPIError(0, f"refusing to follow a link off the API host: {a.netloc}")
            return path_or_url
        return f"{self.api_url}/{path_or_url.lstrip('/')}"

    @staticmethod
    def rate_limit_wait(resp: requests.Response, now: Optional[float] = None) -> Optional[float]:
        """Seconds to wait when ``resp`` is a rate-limit answer (primary: ``X-RateLimit-
        Remaining: 0`` until ``X-RateLimit-Reset``; secondary: ``Retry-After``), else None."""
        if resp.status_code not in (403, 429):
            return None
        after = resp.headers.get("Retry-After")
        if after is not None:
            try:
                return max(0.0, float(after))
            except ValueError:
                when = email.utils.parsedate_to_datetime(after)
                if when is not None:
                    return max(0.0, when.timestamp() - (now or time.time()))
        if resp.headers.get("X-RateLimit-Remaining") == "0":
            reset = resp.headers.get("X-RateLimit-Reset")
            try:
                return max(0.0, float(reset) - (now or time.time())) + 1.0
            except (TypeError, ValueError):
                return 60.0
        if resp.status_code == 429:
            return 60.0
        return None

    def request(self, method: str, path_or_url: str, **kw) -> requests.Response:
        url = self._url(path_or_url)
        kw.setdefault("timeout", self.timeout)
        for attempt in range(self.rate_limit_retries + 1):
            resp = self.session.request(method, url, **kw)
            wait = self.rate_limit_wait(resp)
            if wait is None or attempt == self.rate_limit_retries or wait > self.max_wait:
                return resp
            self.sleep(wait)
        return resp  # pragma: no cover - loop always returns

    def _check(self, resp: requests.Response) -> None:
        if resp.status_code < 400:
            return
        try:
            msg = str((resp.json() or {}).get("message", ""))
        except (ValueError, AttributeError):
            msg = resp.text[:200]
        if resp.status_code in (403, 429) and self.rate_limit_wait(resp) is not None:
            msg = f"rate limited ({msg})"
        raise GitHubAPIError(resp.status_code, msg or resp.reason or "error", resp)

    def json(self, method: str, path_or_url: str, **kw) -> Any:
        resp = self.request(method, path_or_url, **kw)
        self._check(resp)
        return resp.json() if resp.content else None

    def paginate(self, path: str, params: Optional[dict] = None, max_pages: int = 100) -> Iterator[dict]:
        url: Optional[str] = path
        params = dict(params or {}, per_page=100)
        for _ in range(max_pages):
            if url is None:
                return
            resp = self.request("GET", url, params=params)
            self._check(resp)
            items = resp.json()
            if not isinstance(items, list):
                raise GitHubAPIError(resp.status_code, "expected a list")
            yield from items
            nxt = resp.links.get("next", {}).get("url")
            url, params = (nxt, None) if nxt else (None, None)

    # -- endpoints ---------------------------------------------------------------------------
    def list_issue_comments(self, repo: str, number: int) -> Iterator[dict]:
        return self.paginate(f"repos/{repo}/issues/{int(number)}/comments")

    def create_issue_comment(self, repo: str, number: int, body: str) -> dict:
        return self.json("POST", f"repos/{repo}/issues/{int(number)}/comments", json={"body": body})

    def update_issue_comment(self, repo: str, comment_id: int, body: str) -> dict:
        return self.json("PATCH", f"repos/{repo}/issues/comments/{int(comment_id)}", json={"body": body})

    def pull_head_sha(self, repo: str, number: int) -> Optional[str]:
        """The PR's current head commit, or None when it cannot be read."""
        try:
            pr = self.json("GET", f"repos/{repo}/pulls/{int(number)}")
        except (GitHubAPIError, requests.RequestException, ValueError):
            return None
        sha = ((pr or {}).get("head") or {}).get("sha")
        return sha if isinstance(sha, str) else None

    def find_pull(self, repo: str, head_owner: str, head_branch: str, head_sha: str) -> Optional[int]:
        """The open PR whose head is ``head_owner:head_branch`` at ``head_sha`` (how a
        ``workflow_run`` job finds a fork PR: GitHub leaves ``pull_requests`` empty for forks)."""
        for pr in self.paginate(f"repos/{repo}/pulls", {"state": "open", "head": f"{head_owner}:{head_branch}"},
                                max_pages=5):
            if ((pr.get("head") or {}).get("sha")) == head_sha and isinstance(pr.get("number"), int):
                return pr["number"]
        return None


def find_sticky(client: GitHubClient, repo: str, number: int, key: str = "default",
                author: str = DEFAULT_AUTHOR) -> List[dict]:
    """Comments written by ``author`` whose *first line* is our marker (oldest first). Only the
    first line counts: report text quoted further down (from an untrusted fork run) may contain
    another key's marker, and must not make this key update that comment."""
    mark = marker(key)
    return [c for c in client.list_issue_comments(repo, number)
            if (c.get("body") or "").split("\n", 1)[0].strip() == mark
            and ((c.get("user") or {}).get("login") == author)]


def is_stale(ours: Stamp, existing: Optional[Stamp], current_head: Optional[str]) -> bool:
    """Whether writing ``ours`` would replace a newer result.

    * If the PR's current head is known, only a run for that commit may write.
    * A newer run (larger run id / attempt) of the same commit wins over an older one.
    * Without the current head, a run with a smaller run id than the comment's never writes.
    """
    if current_head and ours.sha != current_head:
        return True
    if existing is None:
        return False
    if existing.order > ours.order and (not current_head or existing.sha == ours.sha):
        return True
    return False


def upsert_sticky_comment(client: GitHubClient, repo: str, number: int, body: str, stamp: Stamp, *,
                          key: str = "default", author: str = DEFAULT_AUTHOR, has_news: bool = True,
                          check_head: bool = True, create_attempts: int = 3) -> CommentResult:
    """Create or update the sticky comment; never raises (see the module doc)."""
    full = f"{marker(key)}\n{stamp.render()}\n{body}"
    try:
        current = client.pull_head_sha(repo, number) if check_head else None
        existing = find_sticky(client, repo, number, key, author)
        first = existing[0] if existing else None
        shown = Stamp.parse(first["body"]) if first else None
        if is_stale(stamp, shown, current):
            if current and stamp.sha != current:
                why = f"the PR's head is now {current[:12]}, this run is for {stamp.sha[:12]}"
            else:
                later = f"run {shown.run_id} attempt {shown.run_attempt}" if shown else "a later run"
                why = (f"the comment shows {later} for {shown.sha[:12] if shown else '?'}; this is run "
                       f"{stamp.run_id} attempt {stamp.run_attempt}")
            return CommentResult("skipped-stale", first.get("html_url") if first else None,
                                 first.get("id") if first else None, f"not written: {why}")
        if first is not None:
            if first.get("body") == full:
                return CommentResult("unchanged", first.get("html_url"), first.get("id"))
            c = client.update_issue_comment(repo, first["id"], full)
            return CommentResult("updated", c.get("html_url"), c.get("id"))
        if not has_news:
            return CommentResult("skipped-nothing-to-say", message="all operators pass: no comment needed")
        last_exc: Optional[Exception] = None
        for _ in range(create_attempts):
            try:
                c = client.create_issue_comment(repo, number, full)
                return CommentResult("created", c.get("html_url"), c.get("id"))
            except GitHubAPIError as exc:
                if exc.status < 500:
                    raise
                last_exc = exc
            except requests.ConnectionError as exc:
                last_exc = exc
            # the create may have landed before the error: look again before retrying
            again = find_sticky(client, repo, number, key, author)
            if again:
                return CommentResult("created", again[0].get("html_url"), again[0].get("id"))
        raise last_exc  # type: ignore[misc]
    except GitHubAPIError as exc:
        if exc.status in (401, 403, 404) and "rate limited" not in str(exc):
            return CommentResult("skipped-readonly", message=(
                f"cannot write the PR comment ({exc}); a pull_request run from a fork gets a read-only "
                "token: post it from a workflow_run job (see docs/action.md)"))
        return CommentResult("failed", message=f"PR comment not written: {exc}")
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        return CommentResult("failed", message=f"PR comment not written: {type(exc).__name__}: {exc}")

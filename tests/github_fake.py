"""A real HTTP server on 127.0.0.1 that implements the GitHub REST endpoints dl-gate uses:

* GET/POST ``/repos/{o}/{r}/issues/{n}/comments`` (paginated: ``per_page``/``page`` and a
  ``Link`` header, page size capped by ``max_per_page`` like GitHub's 100)
* PATCH ``/repos/{o}/{r}/issues/comments/{id}``
* GET ``/repos/{o}/{r}/pulls/{n}`` and GET ``/repos/{o}/{r}/pulls?head=owner:branch``

with switches for a read-only token (403 on writes), transient 5xx, and rate limits. Every
request is logged as (method, path, status) for the tests to check."""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional
from urllib.parse import parse_qs, urlsplit


class FakeGitHub:
    def __init__(self, tokens: Optional[Dict[str, str]] = None, max_per_page: int = 100):
        self.tokens = tokens or {"tok-bot": "github-actions[bot]", "tok-user": "octocat"}
        self.max_per_page = max_per_page
        self.comments: Dict[int, List[dict]] = {}
        self.pulls: Dict[int, dict] = {}
        self.next_id = 1000
        self.lock = threading.Lock()
        self.log: List[tuple] = []
        # switches
        self.read_only = False  # 403 "Resource not accessible by integration" on POST/PATCH
        self.fail: Dict[str, int] = {}  # method -> number of 502s still to return
        self.fail_after_write: Dict[str, int] = {}  # method -> 502s returned *after* the write happened
        self.rate_limit_next: Optional[dict] = None  # headers of one 403/429 rate-limit answer
        self.rate_limit_status = 403
        self.pulls_missing = False  # GET /pulls/{n} -> 404
        self.server: Optional[ThreadingHTTPServer] = None

    # -- setup helpers -------------------------------------------------------------------
    def add_pull(self, number: int, head_sha: str, owner: str = "forker", branch: str = "feature") -> None:
        self.pulls[number] = {"number": number, "state": "open",
                              "head": {"sha": head_sha, "ref": branch, "label": f"{owner}:{branch}",
                                       "repo": {"owner": {"login": owner}}}}

    def add_comment(self, number: int, body: str, login: str) -> dict:
        with self.lock:
            self.next_id += 1
            c = {"id": self.next_id, "body": body, "user": {"login": login},
                 "html_url": f"https://github.example/pr/{number}#issuecomment-{self.next_id}"}
            self.comments.setdefault(number, []).append(c)
            return c

    def requests(self, method: Optional[str] = None) -> List[tuple]:
        return [r for r in self.log if method is None or r[0] == method]

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeGitHub":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                fake._handle(self, "GET")

            def do_POST(self):
                fake._handle(self, "POST")

            def do_PATCH(self):
                fake._handle(self, "PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    # -- request handling ----------------------------------------------------------------
    def _send(self, h, status: int, payload=None, headers: Optional[dict] = None, method: str = "") -> None:
        body = json.dumps(payload).encode() if payload is not None else b""
        # log before answering: the client may read the answer and the test inspect the log
        # before this server thread gets to run again
        self.log.append((method, urlsplit(h.path).path, status))
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h, method: str) -> None:
        parts = urlsplit(h.path)
        path, query = parts.path, parse_qs(parts.query)
        length = int(h.headers.get("Content-Length") or 0)
        data = json.loads(h.rfile.read(length) or b"null") if length else None
        auth = h.headers.get("Authorization", "")
        login = self.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None
        if login is None:
            return self._send(h, 401, {"message": "Bad credentials"}, method=method)
        if self.rate_limit_next is not None:
            headers, self.rate_limit_next = self.rate_limit_next, None
            return self._send(h, self.rate_limit_status, {"message": "API rate limit exceeded"}, headers, method)
        if self.fail.get(method, 0) > 0:
            self.fail[method] -= 1
            return self._send(h, 502, {"message": "Server Error"}, method=method)
        if method in ("POST", "PATCH") and self.read_only:
            return self._send(h, 403, {"message": "Resource not accessible by integration"}, method=method)

        m = re.fullmatch(r"/repos/([^/]+)/([^/]+)/issues/(\d+)/comments", path)
        if m and method == "GET":
            number = int(m.group(3))
            per_page = min(int(query.get("per_page", ["30"])[0]), self.max_per_page)
            page = int(query.get("page", ["1"])[0])
            items = self.comments.get(number, [])
            chunk = items[(page - 1) * per_page: page * per_page]
            last = max(1, -(-len(items) // per_page))
            links = []
            base = f"{self.url}{path}?per_page={per_page}"
            if page < last:
                links.append(f'<{base}&page={page + 1}>; rel="next"')
                links.append(f'<{base}&page={last}>; rel="last"')
            if page > 1:
                links.append(f'<{base}&page={page - 1}>; rel="prev"')
            return self._send(h, 200, chunk, {"Link": ", ".join(links)} if links else None, method)
        if m and method == "POST":
            number = int(m.group(3))
            c = self.add_comment(number, data["body"], login)
            if self.fail_after_write.get("POST", 0) > 0:
                self.fail_after_write["POST"] -= 1
                return self._send(h, 502, {"message": "Server Error"}, method=method)
            return self._send(h, 201, c, method=method)
        m = re.fullmatch(r"/repos/([^/]+)/([^/]+)/issues/comments/(\d+)", path)
        if m and method == "PATCH":
            cid = int(m.group(3))
            for items in self.comments.values():
                for c in items:
                    if c["id"] == cid:
                        if c["user"]["login"] != login:
                            return self._send(h, 403, {"message": "Forbidden"}, method=method)
                        c["body"] = data["body"]
                        return self._send(h, 200, c, method=method)
            return self._send(h, 404, {"message": "Not Found"}, method=method)
        m = re.fullmatch(r"/repos/([^/]+)/([^/]+)/pulls/(\d+)", path)
        if m and method == "GET":
            pr = self.pulls.get(int(m.group(3)))
            if pr is None or self.pulls_missing:
                return self._send(h, 404, {"message": "Not Found"}, method=method)
            return self._send(h, 200, pr, method=method)
        m = re.fullmatch(r"/repos/([^/]+)/([^/]+)/pulls", path)
        if m and method == "GET":
            head = query.get("head", [""])[0]
            found = [p for p in self.pulls.values() if not head or p["head"]["label"] == head]
            return self._send(h, 200, found, method=method)
        return self._send(h, 404, {"message": "Not Found"}, method=method)


def rate_limit_headers(reset_in: float = 1.0) -> dict:
    return {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(time.time() + reset_in))}

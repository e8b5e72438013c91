"""The sticky PR comment against a real HTTP server on 127.0.0.1 (tests/github_fake.py)."""
from __future__ import annotations

import pytest
import requests

from gate.report.comment import (CommentResult, GitHubClient, Stamp, find_sticky, is_stale, marker,
                                 upsert_sticky_comment)
from tests.github_fake import FakeGitHub, rate_limit_headers

REPO = "acme/ops"
SHA1, SHA2 = "1" * 40, "2" * 40


@pytest.fixture
def gh():
    with FakeGitHub(max_per_page=2) as fake:
        fake.add_pull(7, SHA1)
        yield fake


def client(gh, token="tok-bot", sleeps=None, **kw):
    kw.setdefault("backoff_factor", 0.01)
    return GitHubClient(token, gh.url, sleep=(sleeps.append if sleeps is not None else (lambda s: None)), **kw)


def upsert(gh, body, stamp, **kw):
    return upsert_sticky_comment(client(gh), REPO, 7, body, stamp, **kw)


def test_a_marker_quoted_inside_another_comment_is_not_ours(gh):
    # a fork's report text quoted in the default comment carries the gpu key's marker
    gh.add_comment(7, f"{marker('default')}\nreport says: {marker('gpu')}", "github-actions[bot]")
    res = upsert(gh, "gpu results", Stamp(SHA1, 1, 1), key="gpu")
    assert res.action == "created" and len(gh.comments[7]) == 2
    assert gh.comments[7][0]["body"].endswith(marker("gpu"))  # the default comment was left alone


def test_first_run_creates_one_comment_then_rerun_updates_it_in_place(gh):
    r1 = upsert(gh, "regression in softplus", Stamp(SHA1, 100, 1))
    assert r1.action == "created" and r1.id
    assert len(gh.comments[7]) == 1
    body = gh.comments[7][0]["body"]
    assert body.startswith(marker()) and Stamp.parse(body) == Stamp(SHA1, 100, 1)
    r2 = upsert(gh, "regression fixed", Stamp(SHA1, 100, 2))
    assert r2.action == "updated" and r2.id == r1.id
    assert len(gh.comments[7]) == 1 and gh.comments[7][0]["body"].endswith("regression fixed")
    r3 = upsert(gh, "regression fixed", Stamp(SHA1, 100, 2))
    assert r3.action == "unchanged"
    assert len(gh.requests("PATCH")) == 1


def test_finds_the_comment_on_a_later_page_by_marker_and_author(gh):
    for i in range(5):
        gh.add_comment(7, f"review note {i}", "octocat")
    # someone else quoting our marker must not be taken for our comment
    gh.add_comment(7, f"{marker()}\nfake results", "octocat")
    mine = gh.add_comment(7, f"{marker()}\n{Stamp(SHA1, 1, 1).render()}\nold", "github-actions[bot]")
    found = find_sticky(client(gh), REPO, 7)
    assert [c["id"] for c in found] == [mine["id"]]
    assert len([r for r in gh.requests("GET") if r[1].endswith("/comments")]) == 4  # 7 comments, 2 a page
    res = upsert(gh, "new", Stamp(SHA1, 2, 1))
    assert res.action == "updated" and res.id == mine["id"]
    assert len(gh.comments[7]) == 7


def test_keys_keep_separate_comments(gh):
    upsert(gh, "cpu", Stamp(SHA1, 1, 1), key="cpu")
    upsert(gh, "gpu", Stamp(SHA1, 1, 1), key="gpu")
    upsert(gh, "cpu again", Stamp(SHA1, 2, 1), key="cpu")
    bodies = sorted(c["body"].splitlines()[-1] for c in gh.comments[7])
    assert bodies == ["cpu again", "gpu"]


def test_an_older_sha_does_not_overwrite_a_newer_one(gh):
    gh.add_pull(7, SHA2)  # the PR moved on to SHA2
    assert upsert(gh, "result for SHA2", Stamp(SHA2, 200, 1)).action == "created"
    late = upsert(gh, "result for SHA1", Stamp(SHA1, 100, 1))  # the older run finishes last
    assert late.action == "skipped-stale"
    assert late.message == f"not written: the PR's head is now {SHA2[:12]}, this run is for {SHA1[:12]}"
    assert gh.comments[7][0]["body"].endswith("result for SHA2")
    assert not gh.requests("PATCH")


def test_without_the_pulls_endpoint_run_order_decides(gh):
    gh.pulls_missing = True
    assert upsert(gh, "newer", Stamp(SHA2, 200, 1)).action == "created"
    older = upsert(gh, "older", Stamp(SHA1, 100, 1))
    assert older.action == "skipped-stale"
    assert older.message == f"not written: the comment shows run 200 attempt 1 for {SHA2[:12]}; this is run 100 attempt 1"
    assert upsert(gh, "newest", Stamp(SHA2, 200, 2)).action == "updated"
    assert gh.comments[7][0]["body"].endswith("newest")


def test_stale_rule():
    a, b = Stamp(SHA1, 100, 1), Stamp(SHA2, 200, 1)
    assert is_stale(a, b, None) and not is_stale(b, a, None)
    assert not is_stale(a, b, SHA1)  # the PR's head is SHA1 again (force-push back): SHA1 may write
    assert is_stale(a, None, SHA2)  # never create a comment for a commit that is not the head
    assert is_stale(Stamp(SHA1, 100, 1), Stamp(SHA1, 100, 2), SHA1)  # a later attempt already wrote


def test_nothing_to_say_creates_nothing_but_updates_an_existing_comment(gh):
    res = upsert(gh, "all pass", Stamp(SHA1, 1, 1), has_news=False)
    assert res.action == "skipped-nothing-to-say" and 7 not in gh.comments
    upsert(gh, "regression", Stamp(SHA1, 1, 1))
    res = upsert(gh, "all pass now", Stamp(SHA1, 2, 1), has_news=False)
    assert res.action == "updated" and gh.comments[7][0]["body"].endswith("all pass now")


def test_read_only_token_is_a_warning_not_an_exception(gh):
    gh.read_only = True
    res = upsert(gh, "regression", Stamp(SHA1, 1, 1))
    assert isinstance(res, CommentResult) and res.action == "skipped-readonly" and res.warning
    assert "fork" in res.message
    assert 7 not in gh.comments


def test_bad_token_and_unreachable_server_are_warnings(gh):
    res = upsert_sticky_comment(client(gh, token="nope"), REPO, 7, "x", Stamp(SHA1, 1, 1))
    assert res.action == "skipped-readonly"
    dead = GitHubClient("tok-bot", "http://127.0.0.1:9", retries=0, timeout=2)
    res = upsert_sticky_comment(dead, REPO, 7, "x", Stamp(SHA1, 1, 1), check_head=False)
    assert res.action == "failed" and res.warning


def test_transient_5xx_are_retried(gh):
    gh.fail = {"GET": 2, "PATCH": 1}
    upsert_res = upsert(gh, "first", Stamp(SHA1, 1, 1))
    assert upsert_res.action == "created"
    gh.fail = {"GET": 1, "PATCH": 2}
    assert upsert(gh, "second", Stamp(SHA1, 2, 1)).action == "updated"
    assert [r[2] for r in gh.requests("PATCH")] == [502, 502, 200]
    assert len(gh.comments[7]) == 1


def test_a_create_that_landed_before_a_5xx_is_not_duplicated(gh):
    gh.fail_after_write = {"POST": 1}
    res = upsert(gh, "regression", Stamp(SHA1, 1, 1))
    assert res.action == "created" and len(gh.comments[7]) == 1
    gh.comments.clear()
    gh.fail = {"POST": 1}  # failed before writing: retried after looking again
    res = upsert(gh, "regression", Stamp(SHA1, 1, 1))
    assert res.action == "created" and len(gh.comments[7]) == 1
    assert [r[2] for r in gh.requests("POST")][-2:] == [502, 201]


def test_rate_limit_waits_for_the_reset(gh):
    sleeps = []
    gh.rate_limit_next = rate_limit_headers(reset_in=3)
    c = client(gh, sleeps=sleeps)
    assert c.pull_head_sha(REPO, 7) == SHA1
    assert len(sleeps) == 1 and 1.0 <= sleeps[0] <= 5.0


def test_retry_after_is_honoured_and_capped(gh):
    sleeps = []
    gh.rate_limit_status = 429
    gh.rate_limit_next = {"Retry-After": "2"}
    res = upsert_sticky_comment(client(gh, sleeps=sleeps), REPO, 7, "x", Stamp(SHA1, 1, 1), check_head=False)
    assert res.action == "created" and sleeps == [2.0]
    # a wait longer than max_wait is not sat out: the comment is given up with a warning
    sleeps.clear()
    gh.rate_limit_status = 403
    gh.rate_limit_next = {"Retry-After": "3600"}
    res = upsert_sticky_comment(client(gh, sleeps=sleeps, max_wait=10), REPO, 7, "y", Stamp(SHA1, 2, 1),
                                check_head=False)
    assert res.action == "failed" and "rate limited" in res.message and sleeps == []


def test_links_off_the_api_host_are_not_followed(gh):
    c = client(gh)
    with pytest.raises(Exception, match="off the API host"):
        c.request("GET", "https://evil.example/steal")
    assert isinstance(c.session, requests.Session)

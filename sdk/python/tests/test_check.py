"""Checks and batches against a real api."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import quotaplane
from stack import Stack


def test_check_counts_and_a_denial_is_a_result(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 2}])
    with quotaplane.Client(stack.base_url, o.key) as c:
        first = c.check(o.id, team="eng", user="alice")
        assert first.allowed and not first.not_decided and first.mode == "enforce"
        assert [(lv.level, lv.window, lv.limit, lv.used, lv.remaining) for lv in first.levels] == [("org", "day", 2, 1, 1)]
        assert first.rate_limit.limit == 2 and first.rate_limit.remaining == 1 and first.rate_limit.reset > 0
        assert first.idempotency_key and first.idempotency_key.startswith("qpc_")
        c.check(o.id, team="eng", user="alice")
        denied = c.check(o.id, team="eng", user="alice")
        assert denied.allowed is False
        assert denied.blocked_at == quotaplane.LevelRef("org", o.id, "day", "requests") or denied.blocked_at == quotaplane.LevelRef("org", o.id, "day")
        assert denied.retry_after is not None and denied.retry_after > 0
        assert denied.rate_limit.remaining == 0
        assert [p.name for p in denied.policies] == ["org-day"]


def test_a_429_carries_retry_after_from_its_header(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "minute", "limit": 1}])
    seen: list[httpx.Response] = []
    hc = httpx.Client(event_hooks={"response": [seen.append]})
    with quotaplane.Client(stack.base_url, o.key, http_client=hc) as c:
        assert c.check(o.id, team="eng").allowed
        res = c.check(o.id, team="eng")
    hc.close()
    header = seen[-1].headers["Retry-After"]
    assert seen[-1].status_code == 429
    assert res.allowed is False and res.retry_after == float(header), (res.retry_after, header)
    assert 0 < res.retry_after <= 120  # a sliding minute: up to two buckets
    assert res.rate_limit.reset == float(seen[-1].headers["RateLimit-Reset"])
    assert res.violated_policies == ["org-minute"]


def test_the_same_idempotency_key_is_counted_once(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 5}])
    with quotaplane.Client(stack.base_url, o.key) as c:
        a = c.check(o.id, team="eng", idempotency_key="order-12345678")
        b = c.check(o.id, team="eng", idempotency_key="order-12345678")
        assert a.allowed and b.allowed and b.replayed and not a.replayed
        q = c.check(o.id, team="eng", cost=0)
        assert q.idempotency_key is None
        assert q.levels[0].used == 1


def test_several_metrics_are_decided_all_or_nothing(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 10}, {"metric": "tokens", "window": "day", "limit": 1000}])
    with quotaplane.Client(stack.base_url, o.key) as c:
        ok = c.check(o.id, team="eng", costs={"requests": 1, "tokens": 900})
        assert ok.allowed
        assert {lv.metric: lv.used for lv in ok.levels} == {"requests": 1, "tokens": 900}
        no = c.check(o.id, team="eng", costs={"requests": 1, "tokens": 200})
        assert not no.allowed and no.blocked_at is not None and no.blocked_at.metric == "tokens"
        after = c.check(o.id, team="eng", costs={"requests": 0, "tokens": 0})
        assert {lv.metric: lv.used for lv in after.levels} == {"requests": 1, "tokens": 900}, "a denial counts nothing"


def test_batch_decides_each_in_order_and_returns_refusals(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 1}])
    with quotaplane.Client(stack.base_url, o.key) as c:
        items = c.check_batch([
            {"org": o.id, "team": "eng", "user": "alice"},
            quotaplane.CheckRequest(o.id, team="eng", user="bob"),
            {"org": o.id, "team": "eng", "metric": "gpu-seconds"},
        ])
    assert len(items) == 3
    a, b, bad = items
    assert isinstance(a, quotaplane.CheckResult) and a.allowed
    assert isinstance(b, quotaplane.CheckResult) and not b.allowed and b.blocked_at is not None
    assert isinstance(bad, quotaplane.Unprocessable) and bad.status == 422
    assert bad.problem is not None and "gpu-seconds" in bad.problem.detail


def test_errors_are_named_in_the_apis_terms(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 1}])
    with quotaplane.Client(stack.base_url, "qpk_wrong") as c:
        with pytest.raises(quotaplane.Unauthorized) as e:
            c.check(o.id)
        assert e.value.status == 401 and e.value.problem is not None
    with quotaplane.Client(stack.base_url, o.key) as c:
        with pytest.raises(quotaplane.BadRequest) as bad:
            c.check(o.id, metric="requests", costs={"requests": 1})
        assert bad.value.status == 400
        with pytest.raises(quotaplane.Unprocessable):
            c.check(o.id, metric="nope")
        other = stack.org([{"metric": "requests", "window": "day", "limit": 1}])
        with pytest.raises(quotaplane.NotFound):  # another org's is not found
            c.check(other.id)
        with pytest.raises(quotaplane.NotFound):
            c.commit("r_doesnotexist", 1)
    billing = stack.api("POST", f"/v1/orgs/{o.id}/api-keys", {"name": "billing-only", "scopes": ["billing"]})["secret"]
    with quotaplane.Client(stack.base_url, billing) as c:
        with pytest.raises(quotaplane.Forbidden) as forbidden:
            c.check(o.id)
        assert forbidden.value.status == 403


async def test_fifty_concurrent_async_checks_on_a_limit_of_twenty_allow_exactly_twenty(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 20}])
    async with quotaplane.AsyncClient(stack.base_url, o.key, budget=20, fail_policy=None) as c:
        results = await asyncio.gather(*(c.check(o.id, team="eng", user=f"u{i}") for i in range(50)))
        assert sum(r.allowed for r in results) == 20
        assert not any(r.not_decided for r in results)
        denied = [r for r in results if not r.allowed]
        assert len(denied) == 30 and all(r.retry_after and r.retry_after > 0 for r in denied)
        q = await c.check(o.id, team="eng", cost=0)
        assert q.levels[0].used == 20


async def test_async_batch_and_several_metrics(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 10}, {"metric": "tokens", "window": "day", "limit": 100}])
    async with quotaplane.AsyncClient(stack.base_url, o.key) as c:
        items = await c.check_batch([{"org": o.id, "team": "eng", "costs": {"requests": 1, "tokens": 60}}] * 2)
        assert [isinstance(i, quotaplane.CheckResult) and i.allowed for i in items] == [True, False]

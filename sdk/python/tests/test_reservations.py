"""Reservations and their context manager against a real api."""

from __future__ import annotations

import asyncio
import time

import pytest

import quotaplane
from stack import Stack

TOKENS = [{"metric": "tokens", "window": "day", "limit": 10000}]


def used(c: quotaplane.Client, org: str, metric: str = "tokens") -> int:
    """The org's day level of metric now, held units included (a query counts nothing)."""
    res = c.check(org, team="eng", metric=metric, cost=0)
    return next(lv.used for lv in res.levels if lv.metric in (None, metric))


def test_reserve_commit_release_extend(stack: Stack) -> None:
    o = stack.org(TOKENS)
    with quotaplane.Client(stack.base_url, o.key) as c:
        r = c.reserve(o.id, team="eng", user="alice", metric="tokens", amount=4000, ttl=30)
        assert r.allowed and r.state == "held" and r.id and r.amount == 4000 and r.expires_at is not None
        assert used(c, o.id) == 4000, "held units count as used"
        before = r.expires_at
        time.sleep(1.1)
        ext = c.extend(r.id, 60)
        assert ext.state == "held" and ext.expires_at is not None and ext.expires_at > before
        done = c.commit(r.id, 1234)
        assert (done.state, done.used, done.released, done.over_reserved) == ("committed", 1234, 2766, 0)
        assert used(c, o.id) == 1234
        again = c.commit(r.id, 1234)
        assert again.state == "committed" and again.used == 1234, "a repeat answers the first commit"
        with pytest.raises(quotaplane.Conflict):
            c.extend(r.id, 10)

        r2 = c.reserve(o.id, team="eng", metric="tokens", amount=500)
        rel = c.release(r2.id)
        assert rel.state == "released" and rel.released == 500
        assert c.get_reservation(r2.id).state == "released"
        with pytest.raises(quotaplane.Conflict) as e:
            c.commit(r2.id, 1)
        assert "released" in (e.value.problem.detail if e.value.problem else "")
        assert used(c, o.id) == 1234

        over = c.reserve(o.id, team="eng", metric="tokens", amount=9000)
        assert over.allowed is False and over.id == "" and over.blocked_at is not None
        assert over.retry_after is not None and over.retry_after > 0


def test_the_block_commits_what_it_set(stack: Stack) -> None:
    o = stack.org(TOKENS)
    with quotaplane.Client(stack.base_url, o.key) as c:
        with c.reserve(o.id, team="eng", metric="tokens", amount=4000) as r:
            assert used(c, o.id) == 4000
            r.used = 1500
        assert (r.state, r.used, r.released) == ("committed", 1500, 2500)
        with c.reserve(o.id, team="eng", metric="tokens", amount=300) as r2:
            pass  # nothing set: what the block used is unknown, so all of it counts
        assert (r2.state, r2.used) == ("committed", 300)
        with c.reserve(o.id, team="eng", metric="tokens", amount=300) as r3:
            r3.commit(7)  # settled inside the block: its end does nothing more
        assert (r3.state, r3.used) == ("committed", 7)
        assert used(c, o.id) == 1500 + 300 + 7


def test_an_exception_in_the_block_releases_and_propagates(stack: Stack) -> None:
    o = stack.org(TOKENS)
    with quotaplane.Client(stack.base_url, o.key) as c:
        with pytest.raises(ValueError, match="the model failed"):
            with c.reserve(o.id, team="eng", metric="tokens", amount=4000) as r:
                r.used = 10
                raise ValueError("the model failed")
        assert r.state == "released" and c.get_reservation(r.id).state == "released"
        assert used(c, o.id) == 0


def test_a_denied_block_never_runs(stack: Stack) -> None:
    o = stack.org(TOKENS)
    ran = False
    with quotaplane.Client(stack.base_url, o.key) as c:
        with pytest.raises(quotaplane.QuotaExceeded) as e:
            with c.reserve(o.id, team="eng", metric="tokens", amount=20000):
                ran = True
    assert not ran
    assert e.value.reservation.allowed is False and e.value.reservation.id == ""
    assert e.value.reservation.blocked_at is not None and e.value.status == 429


def test_a_long_block_is_kept_alive_by_its_heartbeat(stack: Stack) -> None:
    o = stack.org(TOKENS)
    with quotaplane.Client(stack.base_url, o.key) as c:
        # Without a heartbeat a 1 s reservation is gone after 2.5 s.
        bare = c.reserve(o.id, team="eng", metric="tokens", amount=100, ttl=1)
        time.sleep(2.5)
        with pytest.raises(quotaplane.Conflict):
            c.commit(bare.id, 100)
        with c.reserve(o.id, team="eng", metric="tokens", amount=4000, ttl=1) as r:
            time.sleep(2.5)
            r.used = 42
        assert r.heartbeats >= 3, r.heartbeats
        assert (r.state, r.used) == ("committed", 42)
        n = r.heartbeats
        time.sleep(1.2)
        assert r.heartbeats == n, "the heartbeat stops with the block"


def test_several_metrics_in_one_reservation(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 10}, *TOKENS])
    with quotaplane.Client(stack.base_url, o.key) as c:
        with c.reserve(o.id, team="eng", amounts={"requests": 1, "tokens": 4000}) as r:
            assert r.amounts == {"requests": 1, "tokens": 4000}
            r.used = {"requests": 1, "tokens": 1234}
        assert r.state == "committed" and r.used == {"requests": 1, "tokens": 1234}
        assert {m.metric: m.released for m in r.metrics} == {"requests": 0, "tokens": 2766}
        assert used(c, o.id, "tokens") == 1234 and used(c, o.id, "requests") == 1
        r2 = c.reserve(o.id, team="eng", amounts={"requests": 1, "tokens": 100})
        done = c.commit(r2.id, {"tokens": 50})  # requests left out: used 0
        assert done.used == {"requests": 0, "tokens": 50}


def test_a_concurrency_slot_is_held_for_the_block(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "concurrent", "limit": 1}])
    with quotaplane.Client(stack.base_url, o.key) as c:
        with c.reserve(o.id, team="eng", amount=1, ttl=5):
            assert c.reserve(o.id, team="eng", amount=1).allowed is False
        with c.reserve(o.id, team="eng", amount=1) as again:
            assert again.allowed


async def test_async_reservations_and_their_block(stack: Stack) -> None:
    o = stack.org(TOKENS)
    async with quotaplane.AsyncClient(stack.base_url, o.key) as c:
        r = await c.reserve(o.id, team="eng", metric="tokens", amount=1000)
        assert isinstance(r, quotaplane.AsyncReservation) and r.state == "held"
        assert (await c.commit(r.id, 10)).used == 10
        r2 = await c.reserve(o.id, team="eng", metric="tokens", amount=1000)
        assert (await r2.release()).state == "released"
        assert (await c.get_reservation(r2.id)).state == "released"

        async with c.reserve(o.id, team="eng", metric="tokens", amount=4000, ttl=1) as held:
            await asyncio.sleep(1.6)
            held.used = 99
        assert held.heartbeats >= 2 and (held.state, held.used) == ("committed", 99)

        with pytest.raises(RuntimeError):
            async with c.reserve(o.id, team="eng", metric="tokens", amount=500) as failed:
                raise RuntimeError("stream cut")
        assert failed.state == "released"

        with pytest.raises(quotaplane.QuotaExceeded):
            async with c.reserve(o.id, team="eng", metric="tokens", amount=50000):
                pytest.fail("the block ran without its units")

        q = await c.check(o.id, team="eng", metric="tokens", cost=0)
        assert q.levels[0].used == 10 + 99

"""The test kit: a user's code tested without an api."""

from __future__ import annotations

import pytest

import quotaplane
from quotaplane.testing import Call, FakeQuotaplane, Verdict, noop_async_client, noop_client


def summarize(client: quotaplane.Client, user: str) -> str:
    """A user's function, as it would be wired in production: it reserves tokens for a
    "model call" and commits what it used."""
    with client.reserve("demo", team="eng", user=user, metric="tokens", amount=2000) as r:
        r.used = len("write a haiku") * 3
    return f"{user}: {r.used} tokens"


def test_a_users_code_with_the_fake() -> None:
    with FakeQuotaplane() as fake:
        fake.decide(lambda c: Verdict(deny=c.user == "bob", retry_after=30, limit=10))
        c = fake.client()
        assert summarize(c, "alice") == "alice: 39 tokens"
        with pytest.raises(quotaplane.QuotaExceeded) as e:
            summarize(c, "bob")
        assert e.value.retry_after == 30
        held = fake.reservation("r_1")
        assert held is not None and (held.state, held.used, held.user, held.amount) == ("committed", 39, "alice", 2000)
        assert [r.path for r in fake.requests] == ["/v1/reservations", "/v1/reservations/r_1/commit", "/v1/reservations"]
        assert fake.requests[2].json()["user"] == "bob"


def test_the_fake_scripts_checks_batches_and_warnings() -> None:
    with FakeQuotaplane() as fake:
        seen: list[Call] = []

        def verdict(c: Call) -> Verdict:
            seen.append(c)
            if c.metric == "tokens":
                return Verdict(status=422, detail="unknown metric")
            return Verdict(limit=10, remaining=7, warning="user over quota" if c.user == "carol" else "")

        fake.decide(verdict)
        fake.set_features({"sso": True})
        with fake.client() as c:
            ok = c.check("demo", user="alice")
            assert ok.allowed and ok.rate_limit == quotaplane.RateLimit(10, 7, 60.0, "user-minute")
            assert c.check("demo", user="carol").warning == "user over quota"
            items = c.check_batch([{"org": "demo", "user": "a"}, {"org": "demo", "metric": "tokens", "cost": 5}])
            assert isinstance(items[0], quotaplane.CheckResult) and isinstance(items[1], quotaplane.Unprocessable)
            assert c.entitled("demo", "sso")
        assert seen[-1].cost == 5
        fake.key = "another"
        with fake.client() as c2, quotaplane.Client(fake.url, "qpk_quotaplanetest") as old:
            assert c2.check("demo").allowed
            with pytest.raises(quotaplane.Unauthorized):
                old.check("demo")


def test_noop_clients_allow_and_hold_everything() -> None:
    with noop_client() as c:
        assert c.check("demo", user="alice").allowed
        with c.reserve("demo", amounts={"requests": 1, "tokens": 4000}) as r:
            r.used = {"requests": 1, "tokens": 12}
        assert r.state == "committed" and r.used == {"requests": 1, "tokens": 12}
        with pytest.raises(KeyError):
            with c.reserve("demo", amount=5) as r2:
                raise KeyError("boom")
        assert r2.state == "released"


async def test_noop_async_client() -> None:
    async with noop_async_client() as c:
        assert (await c.check("demo")).allowed
        async with c.reserve("demo", metric="tokens", amount=100) as r:
            r.used = 40
        assert (r.state, r.used, r.released) == ("committed", 40, 60)


async def test_the_fake_hangs_until_the_budget_ends() -> None:
    with FakeQuotaplane() as fake:
        fake.decide(lambda c: Verdict(hang=True))
        async with fake.async_client(budget=0.3, fail_policy=quotaplane.FAIL_OPEN) as c:
            res = await c.check("demo")
        assert res.allowed and res.not_decided

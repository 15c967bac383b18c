"""The budget, retries, Retry-After and the fail policy, against a hung api, a closed
port, a TLS mismatch and the test kit's scripted 503s."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Iterator

import pytest

import quotaplane
from quotaplane.testing import Call, FakeQuotaplane, Verdict


@pytest.fixture
def hung() -> Iterator[str]:
    """A local TCP server that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


@pytest.fixture
def closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("policy,allowed", [(quotaplane.FAIL_OPEN, True), (quotaplane.FAIL_CLOSED, False)])
def test_a_hung_api_is_answered_by_the_fail_policy_within_the_budget(hung: str, policy: quotaplane.FailPolicy, allowed: bool) -> None:
    with quotaplane.Client(hung, "k", budget=0.5, fail_policy=policy) as c:
        start = time.monotonic()
        res = c.check("acme", user="alice")
        took = time.monotonic() - start
    assert res.allowed is allowed and res.not_decided
    assert isinstance(res.cause, quotaplane.Unavailable) and "budget" in str(res.cause)
    assert 0.45 <= took < 0.85, f"took {took:.3f} s for a budget of 0.5 s"


async def test_a_hung_api_async_within_the_budget(hung: str) -> None:
    async with quotaplane.AsyncClient(hung, "k", budget=0.5, fail_policy=quotaplane.FAIL_OPEN) as c:
        start = time.monotonic()
        results = await asyncio.gather(*(c.check("acme", user=f"u{i}") for i in range(10)))
        took = time.monotonic() - start
        r = await c.reserve("acme", metric="tokens", amount=10)
    assert all(x.allowed and x.not_decided for x in results)
    assert 0.45 <= took < 0.85, f"took {took:.3f} s for a budget of 0.5 s"
    assert r.allowed and r.not_decided and r.id == ""
    async with r:  # the policy allowed it: the block runs, with nothing to settle
        r.used = 3
    assert r.state == ""


def test_a_policy_decides_by_the_request(hung: str) -> None:
    seen: list[tuple[quotaplane.CheckRequest, quotaplane.Unavailable]] = []

    def reads_open(req: quotaplane.CheckRequest, err: quotaplane.Unavailable) -> bool:
        seen.append((req, err))
        return req.metric != "tokens"

    with quotaplane.Client(hung, "k", budget=0.2, fail_policy=reads_open) as c:
        assert c.check("acme", user="alice").allowed
        assert not c.check("acme", user="alice", metric="tokens", cost=100).allowed
        r = c.reserve("acme", metric="tokens", amount=500, idempotency_key="job-00000001")
        assert not r.allowed and r.not_decided
        with pytest.raises(quotaplane.QuotaExceeded):
            with r:
                pass
    assert [(q.metric, q.cost) for q, _ in seen] == [(None, None), ("tokens", 100), ("tokens", 500)]
    assert seen[2][0].idempotency_key == "job-00000001"


def test_without_a_policy_no_decision_raises_unavailable(closed_port: str) -> None:
    with quotaplane.Client(closed_port, "k", budget=2, fail_policy=None, backoff=0.01) as c:
        with pytest.raises(quotaplane.Unavailable) as e:
            c.check("acme")
    assert e.value.attempts == 3 and e.value.status is None
    assert "could not connect" in str(e.value)


def test_a_closed_port_is_retried_with_backoff_then_the_policy_answers(closed_port: str) -> None:
    attempts: list[quotaplane.AttemptInfo] = []
    retries: list[quotaplane.RetryInfo] = []
    decisions: list[quotaplane.DecisionInfo] = []
    hooks = quotaplane.Hooks(on_attempt=attempts.append, on_retry=retries.append, on_decision=decisions.append)
    with quotaplane.Client(closed_port, "k", hooks=hooks, retries=2, backoff=0.05) as c:
        res = c.check("acme", user="alice")
    assert not res.allowed and res.not_decided
    assert [a.n for a in attempts] == [1, 2, 3] and all(a.status is None and a.error for a in attempts)
    assert [r.n for r in retries] == [1, 2] and all(0 <= r.wait <= 0.1 and not r.retry_after for r in retries)
    assert len(decisions) == 1 and decisions[0].not_decided and decisions[0].op == "check"


def test_retry_after_of_a_503_is_honoured_and_the_retry_counts_once() -> None:
    with FakeQuotaplane() as fake:
        calls: list[Call] = []

        def verdict(c: Call) -> Verdict:
            calls.append(c)
            return Verdict(status=503, retry_after=1, detail="too many checks in flight") if len(calls) == 1 else Verdict()

        fake.decide(verdict)
        retries: list[quotaplane.RetryInfo] = []
        with fake.client(budget=3, hooks=quotaplane.Hooks(on_retry=retries.append)) as c:
            start = time.monotonic()
            res = c.check("demo", user="alice")
            took = time.monotonic() - start
        assert res.allowed and not res.not_decided
        assert 1.0 <= took < 1.5, took
        assert len(retries) == 1 and retries[0].retry_after and retries[0].wait == 1.0
        assert calls[0].idempotency_key == calls[1].idempotency_key, "a retry is the same check"


def test_a_retry_after_past_the_budget_ends_the_call_at_once() -> None:
    with FakeQuotaplane() as fake:
        fake.decide(lambda c: Verdict(status=503, retry_after=5, detail="redis down"))
        with fake.client(fail_policy=quotaplane.FAIL_OPEN) as c:
            start = time.monotonic()
            res = c.check("demo", user="alice")
            took = time.monotonic() - start
        assert res.allowed and res.not_decided and took < 0.3
        assert len(fake.requests) == 1
        assert res.cause is not None and res.cause.status == 503 and res.cause.retry_after == 5
        assert res.cause.problem is not None and res.cause.problem.detail == "redis down"


def test_a_refusal_is_not_retried_nor_given_to_the_policy() -> None:
    with FakeQuotaplane() as fake:
        fake.decide(lambda c: Verdict(status=422, detail="unknown metric"))
        with fake.client(fail_policy=quotaplane.FAIL_OPEN) as c:
            with pytest.raises(quotaplane.Unprocessable):
                c.check("demo", metric="nope")
        assert len(fake.requests) == 1


def test_configuration_errors_are_raised_at_once() -> None:
    with pytest.raises(quotaplane.ConfigurationError):
        quotaplane.Client("ftp://quota.internal", "k")
    with FakeQuotaplane() as fake:  # TLS to a plain HTTP server: the handshake fails
        url = fake.url.replace("http://", "https://")
        with quotaplane.Client(url, "k", fail_policy=quotaplane.FAIL_OPEN) as c:
            start = time.monotonic()
            with pytest.raises(quotaplane.ConfigurationError):
                c.check("demo")
            assert time.monotonic() - start < 0.5


async def test_async_policy_may_be_a_coroutine(hung: str) -> None:
    async def policy(req: quotaplane.CheckRequest, err: quotaplane.Unavailable) -> bool:
        await asyncio.sleep(0)
        return True

    async with quotaplane.AsyncClient(hung, "k", budget=0.2, fail_policy=policy) as c:
        items = await c.check_batch([{"org": "acme"}, {"org": "acme", "cost": 3}])
    assert all(isinstance(i, quotaplane.CheckResult) and i.allowed and i.not_decided for i in items)


def test_every_request_says_who_sends_it() -> None:
    with FakeQuotaplane() as fake:
        with fake.client(headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}) as c:
            c.check("demo")
        h = {k.lower(): v for k, v in fake.requests[0].headers.items()}
    assert h["user-agent"] == quotaplane.USER_AGENT == f"quotaplane-python/{quotaplane.__version__}"
    assert h["traceparent"].startswith("00-") and h["authorization"] == "Bearer " + fake.key

"""The client's side of client leases against a scripted lease server in process
(httpx's MockTransport), and the clock rules on the bookkeeping itself: the rules every
client keeps (docs/ARCHITECTURE.md "Client leases"), each shown where the real api could
not make it happen on demand: a lease that ends by its clock, a 0-units answer, a
failed lease request, a settle failing for a while. tests/test_leases.py runs the same
client against the real api."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import httpx
import pytest

import quotaplane
from quotaplane import _core


def rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Held:
    units: int
    expires: float
    settled: dict[str, Any] | None = None


@dataclass
class Script:
    """A lease server: grants ``units`` for ``ttl_ms`` (or what ``grant`` answers),
    allows every check; ``settle_fails`` makes that many settles answer 503."""

    units: int = 100
    ttl_ms: int = 1000
    grant: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    take_status: int = 0
    settle_fails: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    log: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    held: dict[str, Held] = field(default_factory=dict)
    asked: list[float] = field(default_factory=list)
    n: int = 0

    def lease(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        custom = self.grant(body) if self.grant else None
        if custom is not None:
            return (201 if custom.get("units") else 200), custom
        self.n += 1
        id = f"l{self.n}"
        now = datetime.now(timezone.utc)
        exp = now + timedelta(milliseconds=self.ttl_ms)
        self.held[id] = Held(self.units, time.monotonic() + self.ttl_ms / 1000)
        return 201, {"id": id, "units": self.units, "ttl_ms": self.ttl_ms, "expires_at": rfc3339(exp),
                     "settle_by": rfc3339(exp + timedelta(seconds=5)),
                     "levels": [{"level": "user", "id": body.get("user", ""), "window": "month", "limit": 10**6,
                                 "used": self.units, "remaining": 10**6 - self.units, "reset_at": rfc3339(now + timedelta(days=1))}]}

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        with self.lock:
            self.log.append((path, body))
            if path == "/v1/check":
                return httpx.Response(200, json={"allowed": True, "mode": "enforce", "levels": []})
            if path == "/v1/check/batch":
                return httpx.Response(200, json={"results": [{"allowed": True, "mode": "enforce", "levels": []} for _ in body["checks"]]})
            if path == "/v1/leases":
                self.asked.append(time.monotonic())
                if self.take_status:
                    return httpx.Response(self.take_status, json={"title": "scripted", "status": self.take_status})
                status, doc = self.lease(body)
                return httpx.Response(status, json=doc)
            if path.startswith("/v1/leases/") and path.endswith("/settle"):
                id = path.split("/")[3]
                h = self.held.get(id)
                if h is None:
                    return httpx.Response(404, json={"title": "Not Found", "status": 404})
                if self.settle_fails > 0:
                    self.settle_fails -= 1
                    return httpx.Response(503, json={"title": "scripted", "status": 503})
                if h.settled is None:
                    h.settled = {"used": body["used"], "released": max(h.units - body["used"], 0), "at": time.monotonic()}
                nxt = None
                if body.get("renew"):
                    nxt = self.lease(body)[1]
                return httpx.Response(200, json={"settled": {"used": h.settled["used"], "released": h.settled["released"]}, "next": nxt})
            return httpx.Response(404, json={"title": "Not Found", "status": 404})

    def paths(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [b for p, b in self.log if p == path]

    def settles(self) -> list[dict[str, Any]]:
        with self.lock:
            return [b for p, b in self.log if p.endswith("/settle")]


def client(s: Script, **kw: Any) -> quotaplane.Client:
    return quotaplane.Client("http://quotaplane.test", "k", http_client=httpx.Client(transport=httpx.MockTransport(s.handle)), **kw)


def hammer(c: quotaplane.Client, n: int, **check: Any) -> list[quotaplane.CheckResult]:
    return [c.check("acme", team="eng", user="alice", **check) for _ in range(n)]


def test_a_hot_path_is_leased_and_every_lease_settles_what_it_admitted() -> None:
    s = Script(units=40, ttl_ms=1000)
    with client(s, leases=True) as c:
        results = hammer(c, 2000)
    leased = sum(r.leased for r in results)
    sent = len(s.paths("/v1/check"))
    assert leased + sent == 2000 and leased > 1500, (leased, sent)
    assert all(r.allowed for r in results)
    settles = s.settles()
    # Every lease granted is settled once, closing included, with what it admitted, never more than its units.
    assert len(settles) == s.n, (len(settles), s.n)
    assert sum(b["used"] for b in settles) == leased
    assert all(0 <= b["used"] <= 40 for b in settles)
    # Renewed ahead at 75 % of its units: 30 admitted, then closed (the last settle, at close, renews nothing).
    assert [b["used"] for b in settles[:-1]] == [30] * (len(settles) - 1)
    assert all(b.get("renew") for b in settles[:-1]) and not settles[-1].get("renew")
    takes = s.paths("/v1/leases")
    assert takes[0]["rate"] > 50 and takes[0] == {"org": "acme", "team": "eng", "user": "alice", "rate": takes[0]["rate"]}
    assert len(takes) + len(settles) + sent < 2000 / 10


def test_below_the_threshold_nothing_is_leased() -> None:
    s = Script()
    with client(s, leases=True, lease_threshold=1000) as c:
        results = hammer(c, 300)
    assert not any(r.leased for r in results) and s.paths("/v1/leases") == []


def test_several_metrics_queries_and_idempotency_keys_are_never_leased() -> None:
    s = Script(units=10**6)
    with client(s, leases=True) as c:
        hammer(c, 200)
        assert c.check("acme", team="eng", user="alice").leased
        assert not c.check("acme", team="eng", user="alice", cost=0).leased
        assert not c.check("acme", team="eng", user="alice", costs={"requests": 1}).leased
        assert not c.check("acme", team="eng", user="alice", idempotency_key="order-12345678").leased
        assert not c.check("acme", team="eng", user="bob").leased, "another path"
        # A cost above what is left goes to the server, the lease stays.
        assert not c.check("acme", team="eng", user="alice", cost=10**7).leased
        assert c.check("acme", team="eng", user="alice").leased


def granted(book: _core.Leases, sent: float, units: int, ttl_ms: int) -> _core.PathState:
    """book with a lease of alice's path taken at ``sent`` (the core's clock is the caller's)."""
    req = quotaplane.CheckRequest("acme", user="alice")
    asked: list[tuple[int, _core.LeaseJob]] = []
    for i in range(60):
        res, jobs = book.admit(req, sent - 0.5 + i / 1000)
        assert res is None
        asked += [(i, j) for j in jobs]
    # Past 50 units a second (a check a ms; the first ones decay a little): asked once.
    assert [i for i, _ in asked] == [51] and asked[0][1].lease is None
    job = asked[0][1]
    exp = datetime.now(timezone.utc) + timedelta(milliseconds=ttl_ms)
    reply = _core.Reply(201, httpx.Headers(), json.dumps({
        "id": "l1", "units": units, "ttl_ms": ttl_ms, "expires_at": rfc3339(exp),
        "settle_by": rfc3339(exp + timedelta(seconds=5)), "levels": []}).encode())
    assert book.answer(job, sent, reply, None, sent + 0.002) == []
    return job.path


def test_a_lease_admits_before_its_local_deadline_only_and_never_past_its_units() -> None:
    book = _core.Leases(_core.Options.make("http://x", "k"), threading.Lock())
    req = quotaplane.CheckRequest("acme", user="alice")
    granted(book, 100.0, 1000, 300)
    # A check a ms: each admitted until 75 % of the lease's life, when the check that
    # finds it so closes it (renew: the path is hot), sending what it admitted.
    ms = [100.003 + i / 1000 for i in range(400)]
    out = [book.admit(req, t) for t in ms]
    closed = [i for i, (_, jobs) in enumerate(out) if jobs]
    assert closed == [222] and ms[222] >= 100.225 > ms[221]
    job = out[222][1][0]
    assert job.renew and job.body() == {"used": 223, "renew": True, "rate": round(job.rate, 3)}
    assert all(r is not None and r.leased for r, _ in out[:223]) and all(r is None for r, _ in out[223:])

    book = _core.Leases(_core.Options.make("http://x", "k"), threading.Lock())
    p = granted(book, 100.0, 1000, 300)
    assert p.lease is not None
    p.lease.renew_at = 1e9  # only its deadline left to stop it
    out = [book.admit(req, t) for t in ms]
    assert all(r is not None for r, _ in out[:297]) and ms[296] < 100.3 <= ms[297]
    assert out[297][0] is None and out[297][1][0].body()["used"] == 297, "nothing admitted from 100.3 s on"

    book = _core.Leases(_core.Options.make("http://x", "k"), threading.Lock())
    granted(book, 100.0, 8, 300)
    admitted = [book.admit(quotaplane.CheckRequest("acme", user="alice", cost=3), 100.01) for _ in range(3)]
    assert [r is not None for r, _ in admitted] == [True, True, False]
    assert admitted[1][1][0].body()["used"] == 6, "6 of 8 is past 75 %: closed with what it admitted"


def test_the_clock_settles_a_quiet_lease_within_a_second_of_its_end() -> None:
    s = Script(units=10**6, ttl_ms=300)
    with client(s, leases=True) as c:
        hammer(c, 100)
        assert c.check("acme", team="eng", user="alice").leased
        time.sleep(1.5)
        with s.lock:
            ends = [(h.expires, h.settled) for h in s.held.values()]
    assert len(ends) == 1 and ends[0][1] is not None and ends[0][1]["at"] - ends[0][0] < 1.0, ends
    assert not s.settles()[0].get("renew"), "a quiet path is not renewed"


def test_a_zero_answer_sends_checks_one_by_one_for_its_ttl() -> None:
    s = Script(grant=lambda b: {"units": 0, "reason": "near_limit", "ttl_ms": 1500})
    with client(s, leases=True) as c:
        results = hammer(c, 100)
        assert len(s.asked) == 1
        while time.monotonic() < s.asked[0] + 1.2:
            results += hammer(c, 10)
        assert len(s.asked) == 1, "not asked again within ttl_ms"
        time.sleep(max(s.asked[0] + 1.6 - time.monotonic(), 0))
        results += hammer(c, 100)
        assert len(s.asked) == 2 and s.asked[1] >= s.asked[0] + 1.5, "asked again after ttl_ms"
    assert not any(r.leased for r in results)


@pytest.mark.parametrize("status", [503, 403])
def test_a_failed_lease_request_falls_back_to_the_server(status: int) -> None:
    s = Script(take_status=status)
    with client(s, leases=True, retries=0) as c:
        results = hammer(c, 300)
    assert all(r.allowed and not r.leased for r in results)
    assert len(s.paths("/v1/check")) == 300
    assert len(s.paths("/v1/leases")) == 1, "quiet after the error"


def test_a_failed_settle_is_retried_until_it_lands() -> None:
    s = Script(units=40, settle_fails=4)
    with client(s, leases=True, retries=0) as c:
        results = hammer(c, 200)
        time.sleep(1.0)  # the retries after 0.1, 0.2, 0.4 s...
    leased = sum(r.leased for r in results)
    with s.lock:
        used = sum(h.settled["used"] for h in s.held.values() if h.settled)
        unsettled = [id for id, h in s.held.items() if h.settled is None]
    assert unsettled == [] and used == leased
    with s.lock:
        tries = [(path, b) for path, b in s.log if path.endswith("/settle")]
    again = [b for i, (path, b) in enumerate(tries) if any(q == path for q, _ in tries[:i])]
    assert again and not any(b.get("renew") for b in again), "tried again without renew"


def test_close_settles_every_lease_and_admits_nothing_after() -> None:
    s = Script(units=10**6, ttl_ms=60_000)
    c = client(s, leases=True)
    for user in ("alice", "bob", "carol"):
        for _ in range(200):
            c.check("acme", team="eng", user=user)
    assert c.check("acme", team="eng", user="carol").leased
    c.close()
    with s.lock:
        assert len(s.held) == 3 and all(h.settled is not None for h in s.held.values())
    assert all(not b.get("renew") for b in s.settles())


def test_the_interpreters_exit_settles_an_unclosed_clients_leases(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "exit.py"
    script.write_text(f"""
import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parent.parent)!r}]
from test_leases_rules import Script, client
import atexit
s = Script(units=10**6, ttl_ms=60_000)
atexit.register(lambda: print(n, [b["used"] for b in s.settles()]))  # runs last: registered first
c = client(s, leases=True)
n = sum(c.check("acme", user="alice").leased for _ in range(300))
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    n, used = out.stdout.split(" ", 1)
    assert int(n) > 0 and json.loads(used) == [int(n)], out.stdout


async def test_async_leases_follow_the_same_rules() -> None:
    s = Script(units=40, ttl_ms=1000)
    async with quotaplane.AsyncClient("http://quotaplane.test", "k", leases=True,
                                      http_client=httpx.AsyncClient(transport=httpx.MockTransport(s.handle))) as c:
        results = [await c.check("acme", team="eng", user="alice") for _ in range(2000)]
        # Concurrent checks of a leased path: none admitted past the lease's units.
        more = await asyncio.gather(*(c.check("acme", team="eng", user="alice") for _ in range(500)))
    results += more
    leased = sum(r.leased for r in results)
    settles = s.settles()
    assert leased > 1500 and len(settles) == s.n
    assert sum(b["used"] for b in settles) == leased and all(b["used"] <= 40 for b in settles)
    assert leased + len(s.paths("/v1/check")) == 2500


async def test_async_coalescing_sends_concurrent_checks_as_batches() -> None:
    s = Script()
    async with quotaplane.AsyncClient("http://quotaplane.test", "k", batch_wait=0.005,
                                      http_client=httpx.AsyncClient(transport=httpx.MockTransport(s.handle))) as c:
        results = await asyncio.gather(*(c.check("acme", user=f"u{i}") for i in range(1000)))
        alone = await c.check("acme", user="solo")
    assert all(r.allowed for r in results) and alone.allowed
    batches = s.paths("/v1/check/batch")
    assert len(batches) == 10 and all(len(b["checks"]) == 100 for b in batches)
    assert [c["user"] for b in batches for c in b["checks"]] == [f"u{i}" for i in range(1000)]
    assert [b["user"] for b in s.paths("/v1/check")] == ["solo"], "a batch of one goes as a check"


def test_sync_coalescing_gathers_checks_of_several_threads() -> None:
    s = Script()
    results: list[quotaplane.CheckResult] = []
    with client(s, batch_wait=0.05) as c:
        ts = [threading.Thread(target=lambda i=i: results.append(c.check("acme", user=f"u{i}"))) for i in range(50)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert len(results) == 50 and all(r.allowed for r in results)
    sent = len(s.paths("/v1/check/batch")) + len(s.paths("/v1/check"))
    assert sent <= 5, sent


def test_options_are_checked() -> None:
    with pytest.raises(quotaplane.ConfigurationError):
        quotaplane.Client("http://x", "k", lease_threshold=-1)
    with pytest.raises(quotaplane.ConfigurationError):
        quotaplane.Client("http://x", "k", batch_wait=5)
    assert _core.leasable(quotaplane.CheckRequest("acme", cost=2))

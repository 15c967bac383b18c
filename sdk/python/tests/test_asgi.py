"""quotaplane.asgi in front of a Starlette app served by a real uvicorn on a free port,
against the real api: a check per request, and a slot held per request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

import quotaplane
from quotaplane.asgi import (
    CheckMiddleware,
    ConcurrencyMiddleware,
    ReserveMiddleware,
    Settlement,
    decision_of,
    header,
    report_usage,
    reservation_id,
)

from stack import free_port


class Server:
    """A uvicorn serving app in a thread of its own, on a free loopback port."""

    def boom(self) -> httpx.Response:
        """GET /boom on a connection of its own: uvicorn closes the connection of a
        request whose app raised, so a kept-alive one could be reset under the next."""
        return httpx.get(self.url + "/boom", timeout=10)

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="auto")
        self.server = uvicorn.Server(cfg)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)


def closing(client: Any) -> Any:
    """A Starlette lifespan that closes client as the server shuts down, on its loop."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return lifespan


class Gate:
    """Holds a streaming response open until opened (from the test's thread)."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.streaming = threading.Event()

    async def wait(self) -> None:
        self.streaming.set()
        while not self.opened.is_set():
            await asyncio.sleep(0.01)


def routes(gate: Gate) -> list[Route]:
    async def hello(request: Request) -> PlainTextResponse:
        d = decision_of(request)
        return PlainTextResponse(f"hello {d.operation if d else 'unchecked'}")

    async def stream(request: Request) -> StreamingResponse:
        async def body() -> Any:
            yield b"first\n"
            await gate.wait()
            yield b"last\n"

        return StreamingResponse(body(), media_type="text/plain")

    async def endless(request: Request) -> StreamingResponse:
        async def body() -> Any:
            while True:
                yield b"tick\n"
                await asyncio.sleep(0.02)

        return StreamingResponse(body(), media_type="text/plain")

    async def boom(request: Request) -> PlainTextResponse:
        raise RuntimeError("the app failed")

    async def used(request: Request) -> JSONResponse:
        report_usage(request, int(request.query_params["n"]))
        return JSONResponse({"reservation": reservation_id(request)})

    return [
        Route("/hello", hello),
        Route("/health", hello),
        Route("/stream", stream),
        Route("/endless", endless),
        Route("/boom", boom),
        Route("/used", used),
    ]


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def serve(gate: Gate) -> Iterator[Any]:
    servers: list[Server] = []

    def start(middleware: type, **options: Any) -> Server:
        # The middleware's client is closed on the server's loop, as it shuts down.
        app = Starlette(routes=routes(gate), lifespan=closing(options["client"]))
        app.add_middleware(middleware, **options)
        s = Server(app)
        servers.append(s)
        return s

    yield start
    gate.opened.set()
    for s in servers:
        s.stop()


def problem(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"] == "application/problem+json", r.headers
    return json.loads(r.content)


def test_check_answers_429_with_the_ratelimit_fields(stack, serve):
    org = stack.org([{"metric": "requests", "window": "minute", "limit": 3}])
    client = quotaplane.AsyncClient(stack.base_url, org.key)
    s = serve(
        CheckMiddleware,
        client=client,
        check=lambda scope: {"org": org.id, "user": header(scope, "x-user", "anyone")} if header(scope, "x-user") else {"org": org.id},
        skip=lambda scope: scope["path"] == "/health",
    )
    for remaining in (2, 1, 0):
        r = s.http.get("/hello")
        assert (r.status_code, r.text) == (200, "hello check")
        assert r.headers["ratelimit-limit"] == "3"
        assert r.headers["ratelimit-remaining"] == str(remaining)
        assert 0 < int(r.headers["ratelimit-reset"]) <= 60
        assert r.headers["ratelimit"] == f'"org-minute";r={remaining};t={r.headers["ratelimit-reset"]}'
        assert r.headers["ratelimit-policy"] == '"org-minute";q=3;w=60'
        assert "retry-after" not in r.headers

    r = s.http.get("/hello")
    assert r.status_code == 429
    p = problem(r)
    retry = int(r.headers["retry-after"])
    assert retry >= 1
    assert r.headers["ratelimit-limit"] == "3"
    assert r.headers["ratelimit-remaining"] == "0"
    assert r.headers["ratelimit-reset"] == str(retry)
    assert r.headers["ratelimit"] == f'"org-minute";r=0;t={retry}'
    assert r.headers["ratelimit-policy"] == '"org-minute";q=3;w=60'
    assert p == {
        "type": "https://quotaplane.dev/problems/too-many-requests",
        "title": "Too Many Requests",
        "status": 429,
        "detail": f'over quota at org "{org.id}" (minute window); retry in {retry} s',
        "retry_after_seconds": retry,
        "blocked_at": {"level": "org", "id": org.id, "window": "minute"},
        "violated-policies": ["org-minute"],
    }

    # Skipped: through unchecked, nothing counted.
    r = s.http.get("/health")
    assert (r.status_code, r.text) == (200, "hello unchecked")
    assert "ratelimit-limit" not in r.headers

    # The API refused what the request named (a user not registered, no team): 403 with its detail.
    r = s.http.get("/hello", headers={"x-user": "stranger"})
    assert r.status_code == 403, r.text
    assert problem(r)["detail"].startswith("the quota service refused this request's check: ")


def test_check_without_retry_after_when_the_cost_never_fits(stack, serve):
    org = stack.org([{"metric": "requests", "window": "minute", "limit": 10, "burst": 2}])
    s = serve(CheckMiddleware, client=quotaplane.AsyncClient(stack.base_url, org.key),
              check=lambda scope: quotaplane.CheckRequest(org.id, cost=int(header(scope, "x-cost", ""))))
    assert s.http.get("/hello", headers={"x-cost": "1"}).status_code == 200
    r = s.http.get("/hello", headers={"x-cost": "3"})
    assert r.status_code == 429
    assert "retry-after" not in r.headers
    p = problem(r)
    assert p["detail"] == f'over quota at org "{org.id}" (minute window); the cost can never fit'
    assert "retry_after_seconds" not in p
    assert p["blocked_at"]["level"] == "org"
    assert r.headers["ratelimit-limit"] == "10"

    # A request that does not name its cost: 400, counting nothing.
    r = s.http.get("/hello")
    assert r.status_code == 400
    assert problem(r)["detail"].startswith("the request does not name its quota: ")


def test_check_errors_and_fail_policy(stack, serve):
    org = stack.org([{"metric": "requests", "window": "minute", "limit": 5}])
    # The service's own key refused: 500, no detail for the caller.
    s = serve(CheckMiddleware, client=quotaplane.AsyncClient(stack.base_url, "qp_not-a-key"), check=lambda scope: {"org": org.id})
    r = s.http.get("/hello")
    assert r.status_code == 500
    assert problem(r)["detail"] == "the quota service refused this service's credentials"
    # An unknown metric: 403 with the API's detail.
    s = serve(CheckMiddleware, client=quotaplane.AsyncClient(stack.base_url, org.key), check=lambda scope: {"org": org.id, "metric": "nope"})
    r = s.http.get("/hello")
    assert r.status_code == 403
    assert "nope" in problem(r)["detail"]

    # Quotaplane unreachable: the fail policy decides, within the budget.
    down = f"http://127.0.0.1:{free_port()}"
    s = serve(CheckMiddleware, client=quotaplane.AsyncClient(down, org.key, budget=0.3, fail_policy=quotaplane.FAIL_CLOSED),
              check=lambda scope: {"org": org.id})
    t = time.monotonic()
    r = s.http.get("/hello")
    assert time.monotonic() - t < 2
    assert (r.status_code, r.headers["retry-after"]) == (503, "1")
    assert problem(r)["status"] == 503
    s = serve(CheckMiddleware, client=quotaplane.AsyncClient(down, org.key, budget=0.3, fail_policy=quotaplane.FAIL_OPEN),
              check=lambda scope: {"org": org.id})
    r = s.http.get("/hello")
    assert (r.status_code, r.text) == (200, "hello check")
    assert "ratelimit-limit" not in r.headers


class Settled:
    """Collects the settlements of a middleware, for a test to wait on."""

    def __init__(self) -> None:
        self.all: list[Settlement] = []
        self.cond = threading.Condition()

    def __call__(self, scope: Any, s: Settlement) -> None:
        with self.cond:
            self.all.append(s)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 10) -> list[Settlement]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.all) >= n, timeout), f"{len(self.all)} settlements, want {n}"
            return list(self.all)


def test_concurrency_holds_a_slot_per_request(stack, serve, gate):
    org = stack.org([{"metric": "requests", "window": "concurrent", "limit": 1}])
    settled = Settled()
    s = serve(ConcurrencyMiddleware, client=quotaplane.AsyncClient(stack.base_url, org.key),
              reserve=lambda scope: {"org": org.id, "metric": "requests", "amount": 1}, on_settled=settled)

    # One after another: the slot is back before each response ends.
    for _ in range(4):
        r = s.http.get("/hello")
        assert (r.status_code, r.text) == (200, "hello reserve"), r.text
        assert r.headers["ratelimit-limit"] == "1"
    assert [x.how for x in settled.wait(4)] == ["release"] * 4

    # A stream holds the slot while it streams: a second request is refused.
    with s.http.stream("GET", "/stream") as held:
        assert held.status_code == 200
        assert gate.streaming.wait(5)
        r = s.http.get("/hello")
        assert r.status_code == 429
        assert r.headers["ratelimit-limit"] == "1"
        assert r.headers["ratelimit-remaining"] == "0"
        assert r.headers["ratelimit-policy"] == '"org-concurrent";q=1;qu="concurrent-requests"'
        p = problem(r)
        assert p["blocked_at"] == {"level": "org", "id": org.id, "window": "concurrent"}
        assert r.headers["retry-after"] == r.headers["ratelimit-reset"] == str(p["retry_after_seconds"])
        assert r.headers["ratelimit"] == f'"org-concurrent";r=0;t={r.headers["retry-after"]}'
        gate.opened.set()
        assert held.read() == b"first\nlast\n"
    assert s.http.get("/hello").status_code == 200

    # The app raises: 500, and the slot comes back.
    n = len(settled.wait(6))
    r = s.boom()
    assert r.status_code == 500
    last = settled.wait(n + 1)[-1]
    assert (last.how, last.failed, last.error) == ("release", True, None)
    assert s.http.get("/hello").status_code == 200

    # What the app reports is committed, which gives the slot back all the same.
    r = s.http.get("/used", params={"n": 1})
    rid = r.json()["reservation"]
    assert rid
    last = settled.wait(n + 3)[-1]
    assert (last.reservation_id, last.how, last.used) == (rid, "commit", 1)
    assert s.http.get("/hello").status_code == 200


def test_concurrency_gives_the_slot_back_when_the_client_goes_away(stack, serve):
    org = stack.org([{"metric": "requests", "window": "concurrent", "limit": 1}])
    settled = Settled()
    s = serve(ConcurrencyMiddleware, client=quotaplane.AsyncClient(stack.base_url, org.key),
              reserve=lambda scope: {"org": org.id, "metric": "requests", "amount": 1}, on_settled=settled)
    with socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.sendall(b"GET /endless HTTP/1.1\r\nHost: test\r\n\r\n")
        got = b""
        while b"tick" not in got:
            got += sock.recv(4096)
        assert got.startswith(b"HTTP/1.1 200")
        assert s.http.get("/hello").status_code == 429
    # The connection is gone: Starlette stops the stream, the middleware gives the slot back.
    (st,) = settled.wait(1)
    assert (st.how, st.failed, st.disconnected) == ("release", False, True)
    assert s.http.get("/hello").status_code == 200


def test_concurrency_extends_a_long_stream(stack, serve, gate):
    org = stack.org([{"metric": "requests", "window": "concurrent", "limit": 1}])
    s = serve(ConcurrencyMiddleware, client=quotaplane.AsyncClient(stack.base_url, org.key),
              reserve=lambda scope: {"org": org.id, "metric": "requests", "amount": 1, "ttl": 1}, heartbeat=0.3)
    with s.http.stream("GET", "/stream") as held:
        assert gate.streaming.wait(5)
        time.sleep(2.2)  # past two ttls: only the heartbeat keeps the slot
        assert s.http.get("/hello").status_code == 429
        gate.opened.set()
        held.read()
    assert s.http.get("/hello").status_code == 200


def test_reserve_commits_what_the_app_reported(stack, serve):
    org = stack.org([{"metric": "tokens", "window": "month", "limit": 100}])
    settled = Settled()
    s = serve(ReserveMiddleware, client=quotaplane.AsyncClient(stack.base_url, org.key),
              reserve=lambda scope: {"org": org.id, "metric": "tokens", "amount": 40}, on_settled=settled)
    assert s.http.get("/used", params={"n": 7}).status_code == 200
    assert s.http.get("/hello").status_code == 200  # reported nothing: the whole amount
    assert s.boom().status_code == 500  # failed, reported nothing: released
    got = settled.wait(3)
    assert [(x.how, x.used, x.failed) for x in got] == [("commit", 7, False), ("commit", 40, False), ("release", None, True)]
    # 7 + 40 used of 100: 53 left, so 40 more fit and 60 do not.
    r = s.http.get("/hello")
    assert r.headers["ratelimit-remaining"] == str(100 - 47 - 40)
    settled.wait(4)
    s2 = serve(ReserveMiddleware, client=quotaplane.AsyncClient(stack.base_url, org.key),
               reserve=lambda scope: {"org": org.id, "metric": "tokens", "amount": 60})
    r = s2.http.get("/hello")
    assert r.status_code == 429
    assert problem(r)["blocked_at"]["window"] == "month"

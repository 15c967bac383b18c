"""Test a service that uses the Quotaplane client without a Quotaplane.

- :class:`FakeQuotaplane` is a fake Quotaplane API on a local port, speaking the real
  client's protocol: the test scripts its decisions (:meth:`FakeQuotaplane.decide`:
  allow, deny with a Retry-After, a problem status, a 503, a hang) and reads back the
  requests it got and the reservations it holds. ``fake.client()`` and
  ``fake.async_client()`` are real clients of it.
- :func:`noop_client` and :func:`noop_async_client` are real clients whose requests are
  answered in memory, never leaving the process: every check allowed, every
  reservation held (and committed, released, extended as asked), counting nothing.

Neither decides as Quotaplane does (no windows, no levels beyond the one the verdict
names); the client's behaviour against the real API is tested in sdk/python/tests.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs, unquote, urlsplit

import httpx

from .aio import AsyncClient
from .client import Client

__all__ = ["KEY", "Call", "Verdict", "Request", "FakeQuotaplane", "noop_client", "noop_async_client"]

#: The API key the fake accepts unless its ``key`` is changed; any other answers 401.
KEY = "qpk_quotaplanetest"


@dataclass(frozen=True)
class Call:
    """A check, an item of a batch, or a reservation, as ``decide``'s function sees it.
    ``cost`` is the units asked (a reservation's amount; several metrics: their sum)."""

    org: str
    team: str
    user: str
    metric: str
    cost: int
    reservation: bool
    idempotency_key: str
    costs: Mapping[str, int] | None = None


@dataclass(frozen=True)
class Verdict:
    """How the fake answers a :class:`Call`. The default Verdict allows it.

    ``deny``: 429, blocked at the user's minute (the org's without a user), with
    ``retry_after`` seconds. ``limit`` and ``remaining``: the user's minute in the
    levels and RateLimit fields (100 and 99 when both are 0). ``warning``: warn mode.
    ``status``: a problem document with this status instead of a decision (400, 403,
    422: refused; 503: no decision, with ``retry_after`` as its Retry-After).
    ``hang``: never answer (until the client gives up or the fake closes)."""

    deny: bool = False
    retry_after: float = 0
    limit: int = 0
    remaining: int = 0
    warning: str = ""
    status: int = 0
    detail: str = ""
    hang: bool = False


@dataclass(frozen=True)
class Request:
    """One request the fake received."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: str

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class HeldReservation:
    """A reservation as the fake holds it."""

    id: str
    state: str
    org: str
    team: str
    user: str
    metric: str
    amount: int
    amounts: dict[str, int] | None
    expires_at: datetime
    on_expiry: str
    used: int | dict[str, int] | None = None
    released: int = 0
    extensions: int = 0


_HANG = object()


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _problem(status: int, detail: str) -> tuple[int, dict[str, str], bytes]:
    titles = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
              422: "Unprocessable Entity", 429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}
    title = titles.get(status, "Error")
    doc = {"type": "https://quotaplane.dev/problems/" + title.lower().replace(" ", "-"), "title": title, "status": status, "detail": detail}
    return status, {"Content-Type": "application/problem+json"}, json.dumps(doc).encode()


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    h = {"Content-Type": "application/json", **(headers or {})}
    return status, h, json.dumps(body).encode()


def _secs(s: float) -> int:
    return max(int(-(-s // 1)), 1)


class _API:
    """The fake API's logic, shared by the local server and the in-memory transport."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.lock = threading.Lock()
        self.decider: Callable[[Call], Verdict] | None = None
        self.reqs: list[Request] = []
        self.res: dict[str, HeldReservation] = {}
        self.next = 0
        self.features: dict[str, bool | int | str] = {}

    def verdict(self, c: Call) -> Verdict:
        with self.lock:
            f = self.decider
        return f(c) if f is not None else Verdict()

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        u = urlsplit(target)
        text = body.decode("utf-8", "replace")
        with self.lock:
            self.reqs.append(Request(method, u.path, dict(headers), text))
            key = self.key
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        if auth != "Bearer " + key:
            return _problem(401, "invalid API key")
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            return _problem(400, "the body is not valid JSON")
        path = u.path.removeprefix("/v1/")
        if method == "POST" and path == "check":
            return self.check(doc)
        if method == "POST" and path == "check/batch":
            return self.batch(doc)
        if method == "POST" and path == "reservations":
            return self.reserve(doc)
        if path.startswith("reservations/"):
            return self.reservation(method, path.removeprefix("reservations/"), doc)
        if method == "GET" and path == "entitlements":
            q = {k: v[0] for k, v in parse_qs(u.query).items()}
            with self.lock:
                feats = dict(self.features)
            return _json(200, {"org": q.get("org", ""), "team": q.get("team", ""), "user": q.get("user", ""),
                               "features": feats, "sources": {k: "plan" for k in feats}})
        return _problem(404, "no such operation in quotaplane.testing")

    @staticmethod
    def call(d: Mapping[str, Any], reservation: bool) -> Call:
        costs = d.get("costs") if not reservation else d.get("amounts")
        one = d.get("amount") if reservation else d.get("cost")
        cost = int(one) if isinstance(one, int) else (0 if costs else 1)
        if isinstance(costs, dict):
            cost += sum(int(v) for v in costs.values())
        return Call(org=str(d.get("org", "")), team=str(d.get("team", "")), user=str(d.get("user", "")),
                    metric=str(d.get("metric") or "requests"), cost=cost, reservation=reservation,
                    idempotency_key=str(d.get("idempotency_key", "")), costs=costs if isinstance(costs, dict) else None)

    @staticmethod
    def answer(c: Call, v: Verdict) -> tuple[int, dict[str, Any], dict[str, str]]:
        limit, remaining = (v.limit, v.remaining) if (v.limit or v.remaining) else (100, 99)
        level, id_ = ("user", c.user) if c.user else ("org", c.org)
        reset = _rfc3339(datetime.now(timezone.utc) + timedelta(minutes=1))
        body: dict[str, Any] = {"allowed": not v.deny, "mode": "enforce", "levels": [
            {"level": level, "id": id_, "window": "minute", "limit": limit, "used": limit - remaining, "remaining": remaining, "reset_at": reset}]}
        policy = f"{level}-minute"
        h = {"RateLimit-Policy": f'"{policy}";q={limit};w=60'}
        reset_secs, status = 60, 200
        if v.deny:
            secs = _secs(v.retry_after)
            reset_secs = secs
            body["blocked_at"] = {"level": level, "id": id_, "window": "minute"}
            body["retry_after_seconds"] = secs
            body["violated-policies"] = [policy]
            h["Retry-After"] = str(secs)
            status = 429
        if v.warning:
            body["mode"], body["warning"] = "warn", v.warning
            h["Quotaplane-Warning"] = v.warning
        h.update({"RateLimit-Limit": str(limit), "RateLimit-Remaining": str(remaining), "RateLimit-Reset": str(reset_secs),
                  "RateLimit": f'"{policy}";r={remaining};t={reset_secs}'})
        return status, body, h

    @staticmethod
    def refused(v: Verdict) -> Any:
        if v.hang:
            return _HANG
        if v.status:
            st, h, b = _problem(v.status, v.detail)
            if v.retry_after > 0:
                h["Retry-After"] = str(_secs(v.retry_after))
            return st, h, b
        return None

    def check(self, d: Mapping[str, Any]) -> Any:
        c = self.call(d, False)
        v = self.verdict(c)
        r = self.refused(v)
        if r is not None:
            return r
        status, body, h = self.answer(c, v)
        return _json(status, body, h)

    def batch(self, d: Mapping[str, Any]) -> Any:
        checks = d.get("checks")
        if not isinstance(checks, list) or not checks:
            return _problem(400, "checks: must be a list of 1 to 100 checks")
        results: list[Any] = []
        for cb in checks:
            c = self.call(cb if isinstance(cb, dict) else {}, False)
            v = self.verdict(c)
            if v.hang:
                return _HANG
            if v.status:
                results.append(json.loads(_problem(v.status, v.detail)[2]))
                continue
            results.append(self.answer(c, v)[1])
        return _json(200, {"results": results})

    def reserve(self, d: Mapping[str, Any]) -> Any:
        c = self.call(d, True)
        v = self.verdict(c)
        r = self.refused(v)
        if r is not None:
            return r
        status, body, h = self.answer(c, v)
        if status == 429:
            return _json(429, body, h)
        ttl = int(d.get("ttl_seconds") or 60)
        amounts = d.get("amounts") if isinstance(d.get("amounts"), dict) else None
        with self.lock:
            self.next += 1
            res = HeldReservation(id=f"r_{self.next}", state="held", org=c.org, team=c.team, user=c.user, metric=c.metric,
                                  amount=c.cost, amounts=dict(amounts) if amounts else None,
                                  expires_at=datetime.now(timezone.utc) + timedelta(seconds=ttl),
                                  on_expiry=str(d.get("on_expiry") or "commit"))
            self.res[res.id] = res
            body.update(self.view(res))
        return _json(201, body, h)

    @staticmethod
    def view(res: HeldReservation) -> dict[str, Any]:
        out: dict[str, Any] = {"id": res.id, "state": res.state, "org": res.org, "team": res.team, "user": res.user,
                               "metric": res.metric, "amount": res.amount, "expires_at": _rfc3339(res.expires_at),
                               "on_expiry": res.on_expiry}
        if res.amounts:
            out["metrics"] = [{"metric": m, "amount": a} for m, a in res.amounts.items()]
        if res.state != "held":
            used = res.used if res.used is not None else 0
            if res.amounts:
                per = used if isinstance(used, dict) else {next(iter(res.amounts)): used}
                out["metrics"] = [{"metric": m, "amount": a, "used": per.get(m, 0), "released": max(a - per.get(m, 0), 0) if res.state == "committed" else a}
                                  for m, a in res.amounts.items()]
            out["used"] = sum(used.values()) if isinstance(used, dict) else used
            out["released"] = res.released
            out["settled_at"] = _rfc3339(datetime.now(timezone.utc))
        return out

    def reservation(self, method: str, rest: str, d: Mapping[str, Any]) -> Any:
        id_, _, op = rest.partition("/")
        id_ = unquote(id_)
        with self.lock:
            res = self.res.get(id_)
            if res is None:
                return _problem(404, f"reservation {id_} not found")
            held = res.state == "held"
            if method == "GET" and op == "":
                pass
            elif not held and (method == "DELETE" or op in ("commit", "extend")):
                return _problem(409, f"reservation {id_} is {res.state}")
            elif method == "DELETE" and op == "":
                res.state, res.used, res.released = "released", 0, res.amount
            elif method == "POST" and op == "commit":
                used = d.get("used")
                res.used = {str(k): int(v) for k, v in used.items()} if isinstance(used, dict) else int(used or 0)
                total = sum(res.used.values()) if isinstance(res.used, dict) else res.used
                res.state, res.released = "committed", max(res.amount - total, 0)
            elif method == "POST" and op == "extend":
                res.expires_at = datetime.now(timezone.utc) + timedelta(seconds=int(d.get("ttl_seconds") or 60))
                res.extensions += 1
            else:
                return _problem(404, "no such operation in quotaplane.testing")
            return _json(200, self.view(res))


class FakeQuotaplane:
    """A fake Quotaplane API on a local port (``url``), accepting ``key``. It allows
    everything until :meth:`decide` says otherwise. Close it (or use ``with``)."""

    def __init__(self, key: str = KEY) -> None:
        self._api = _API(key)
        self._stop = threading.Event()
        api, stop = self._api, self._stop

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                out = api.handle(self.command, self.path, dict(self.headers.items()), body)
                if out is _HANG:
                    stop.wait()
                    self.close_connection = True
                    return
                status, headers, payload = out
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._srv.daemon_threads = True
        self._thread = threading.Thread(target=self._srv.serve_forever, args=(0.05,), name="quotaplane-fake", daemon=True)
        self._thread.start()
        host, port = self._srv.server_address[:2]
        self.url = f"http://{host}:{port}"

    @property
    def key(self) -> str:
        return self._api.key

    @key.setter
    def key(self, v: str) -> None:
        with self._api.lock:
            self._api.key = v

    def close(self) -> None:
        """Stops the server, and lets go the requests it hangs."""
        self._stop.set()
        self._srv.shutdown()
        self._srv.server_close()

    def __enter__(self) -> "FakeQuotaplane":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client(self, **options: Any) -> Client:
        """A :class:`~quotaplane.Client` of the fake with its key, and options."""
        return Client(self.url, self.key, **options)

    def async_client(self, **options: Any) -> AsyncClient:
        """An :class:`~quotaplane.AsyncClient` of the fake with its key, and options."""
        return AsyncClient(self.url, self.key, **options)

    def decide(self, f: Callable[[Call], Verdict] | None) -> None:
        """Sets how every later check, batch item and reservation is answered (None: allow)."""
        with self._api.lock:
            self._api.decider = f

    def set_features(self, features: Mapping[str, bool | int | str]) -> None:
        """Sets what GET /v1/entitlements answers, for any org."""
        with self._api.lock:
            self._api.features = dict(features)

    @property
    def requests(self) -> list[Request]:
        """The requests the fake received, in order."""
        with self._api.lock:
            return list(self._api.reqs)

    def reservation(self, id: str) -> HeldReservation | None:
        """Reservation ``id`` as the fake holds it (a copy), None when unknown."""
        with self._api.lock:
            r = self._api.res.get(id)
            return None if r is None else HeldReservation(**{k: getattr(r, k) for k in r.__dataclass_fields__})


def _transport(api: _API) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode()
        out = api.handle(request.method, target, dict(request.headers.items()), request.read())
        if out is _HANG:  # in memory, a hang is an attempt that timed out at once
            raise httpx.ReadTimeout("no answer", request=request)
        status, headers, payload = out
        return httpx.Response(status, headers=headers, content=payload)

    return httpx.MockTransport(handle)


def noop_client(**options: Any) -> Client:
    """A :class:`~quotaplane.Client` answered in memory: every check allowed, every
    reservation held (committed, released and extended as asked), counting nothing."""
    return Client("http://quotaplane.noop", KEY, http_client=httpx.Client(transport=_transport(_API(KEY))), **options)


def noop_async_client(**options: Any) -> AsyncClient:
    """The asyncio twin of :func:`noop_client`."""
    return AsyncClient("http://quotaplane.noop", KEY, http_client=httpx.AsyncClient(transport=_transport(_API(KEY))), **options)



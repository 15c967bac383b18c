"""What the sync and async clients share: options, the attempt loop's decisions, and
the requests and answers of each call. Neither does I/O here."""

from __future__ import annotations

import json
import logging
import random
import socket
import ssl
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Awaitable, Callable, Mapping, Sequence, Union
from urllib.parse import quote, urlencode, urlsplit

import httpx

from . import ratelimit
from ._version import USER_AGENT
from .errors import (
    ConfigurationError,
    Problem,
    QuotaplaneError,
    Unavailable,
    error_of,
)
from .models import (
    AttemptInfo,
    CheckRequest,
    CheckResult,
    DecisionInfo,
    Entitlements,
    Hooks,
    ReservationData,
    RetryInfo,
    Units,
    new_idempotency_key,
    tightest,
    ttl_seconds,
    with_key,
)

log = logging.getLogger("quotaplane")

#: A fail policy: given the request Quotaplane could not decide and why, True allows it.
FailPolicy = Callable[[CheckRequest, Unavailable], Union[bool, Awaitable[bool]]]


def FAIL_OPEN(request: CheckRequest, error: Unavailable) -> bool:
    """Allows every check and reservation Quotaplane could not decide."""
    return True


def FAIL_CLOSED(request: CheckRequest, error: Unavailable) -> bool:
    """Denies every check and reservation Quotaplane could not decide."""
    return False


DEFAULT_BUDGET = 1.0
DEFAULT_SETTLE_BUDGET = 10.0
DEFAULT_TIMEOUT = 2.0
DEFAULT_RETRIES = 2
DEFAULT_BACKOFF = 0.1
DEFAULT_MAX_BACKOFF = 1.0


@dataclass
class Options:
    """A client's settings (times in seconds)."""

    base: str
    key: str
    budget: float | None = DEFAULT_BUDGET
    settle_budget: float | None = DEFAULT_SETTLE_BUDGET
    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES
    backoff: float = DEFAULT_BACKOFF
    max_backoff: float = DEFAULT_MAX_BACKOFF
    fail_policy: FailPolicy | None = FAIL_CLOSED
    hooks: Hooks = field(default_factory=Hooks)
    headers: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def make(base_url: str, key: str, **kw: Any) -> "Options":
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ConfigurationError(f"quotaplane: base URL {base_url!r}: want http(s)://host[:port]")
        if kw.get("hooks") is None:
            kw["hooks"] = Hooks()
        kw["headers"] = dict(kw.get("headers") or {})
        kw["retries"] = max(int(kw.get("retries", DEFAULT_RETRIES)), 0)
        return Options(base=base_url.rstrip("/"), key=key, **kw)

    def request_headers(self, has_body: bool) -> dict[str, str]:
        h = {"User-Agent": USER_AGENT}
        h.update(self.headers)
        h["Authorization"] = "Bearer " + self.key
        h["Accept"] = "application/json, application/problem+json"
        if has_body:
            h["Content-Type"] = "application/json"
        return h


@dataclass
class Reply:
    """One answer of the API, read in full."""

    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise QuotaplaneError(f"quotaplane: a {self.status} answer is not JSON: {e}", status=self.status) from None


def retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds: delay-seconds or an HTTP date (None when absent or malformed)."""
    if value is None:
        return None
    v = value.strip()
    if v.isdigit():
        return float(int(v))
    try:
        d = parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if d is None:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return max((d - datetime.now(timezone.utc)).total_seconds(), 0.0)


def error_of_reply(r: Reply) -> QuotaplaneError:
    """The exception of an answer that decided nothing."""
    try:
        doc = json.loads(r.body)
    except ValueError:
        doc = None
    return error_of(r.status, Problem.from_json(doc, r.status, r.body), retry_after(r.headers.get("Retry-After")))


def is_config_error(err: BaseException) -> bool:
    """Whether a transport error is one no retry mends."""
    if isinstance(err, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return True
    seen = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            return True
        if isinstance(e, ssl.SSLError) and not isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError)):
            return True
        if isinstance(e, socket.gaierror) and e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)):
            return True
        e = e.__cause__ or e.__context__
    return False


def describe(err: BaseException) -> str:
    """A transport error in words, without the HTTP library's type names."""
    if isinstance(err, httpx.TimeoutException) or isinstance(err, TimeoutError):
        what = "timed out"
    elif isinstance(err, httpx.ConnectError):
        what = "could not connect"
    elif isinstance(err, httpx.RemoteProtocolError):
        what = "the connection broke"
    else:
        what = "transport error"
    msg = str(err).strip()
    return f"{what}: {msg}" if msg and msg != what else what


class Attempts:
    """The attempts of one call: their timeouts within the call's budget, and after
    each, whether to return its answer, to wait and retry, or to give up."""

    def __init__(self, opts: Options, method: str, path: str, budget: float | None) -> None:
        self.opts, self.method, self.path = opts, method, path
        self.budget = budget if budget and budget > 0 else None
        self.deadline = time.monotonic() + self.budget if self.budget else None
        self.n = 0
        self.started = 0.0
        self.last: str = ""
        self.last_error: QuotaplaneError | None = None

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def begin(self) -> float:
        """Starts an attempt and returns its timeout; raises Unavailable when the budget is spent."""
        left = self.remaining()
        if left is not None and left <= 0:
            raise self.unavailable(f"the budget of {self.budget:g} s is spent")
        self.n += 1
        self.started = time.monotonic()
        return self.opts.timeout if left is None else max(min(self.opts.timeout, left), 0.001)

    def unavailable(self, why: str) -> Unavailable:
        last = f": {self.last}" if self.last else ""
        e = self.last_error
        return Unavailable(
            f"quotaplane unavailable: {self.method} {self.path}{last} ({why}; {self.n} attempt(s))",
            status=e.status if e else None,
            problem=e.problem if e else None,
            retry_after=e.retry_after if e else None,
            attempts=self.n,
        )

    def after(self, reply: Reply | None, err: BaseException | None) -> Reply | float:
        """Decides after an attempt: its answer, or the wait before the next; raises
        ConfigurationError or Unavailable when the call ends without a decision."""
        duration = time.monotonic() - self.started
        status = reply.status if reply is not None else None
        desc = describe(err) if err is not None else None
        hooks = self.opts.hooks
        if hooks.on_attempt:
            hooks.on_attempt(AttemptInfo(self.method, self.path, self.n, status, desc, duration))
        log.debug("quotaplane: attempt %d %s %s: %s (%.3f s)", self.n, self.method, self.path, status or desc, duration)
        if reply is not None and reply.status < 500:
            return reply
        from_header = False
        wait = 0.0
        if err is not None:
            if is_config_error(err):
                log.error("quotaplane: configuration error: %s %s: %s", self.method, self.path, desc)
                raise ConfigurationError(f"quotaplane: {self.method} {self.path}: {desc}") from None
            self.last, self.last_error = desc or "", None
            left = self.remaining()
            if left is not None and left <= 0.001:
                raise self.unavailable(f"the budget of {self.budget:g} s is spent")
        else:
            assert reply is not None
            e = error_of_reply(reply)
            self.last, self.last_error = str(e).removeprefix("quotaplane: "), e
            ra = reply.headers.get("Retry-After")
            if e.retry_after is not None:
                wait, from_header = e.retry_after, True
            elif ra is not None and ra.strip() == "0":
                from_header = True
        if self.n > self.opts.retries:
            raise self.unavailable("no retries left")
        if not from_header:
            wait = self.jitter()
        left = self.remaining()
        if left is not None and wait >= left:
            raise self.unavailable(f"a retry in {wait:.3f} s would pass the budget of {self.budget:g} s")
        if hooks.on_retry:
            hooks.on_retry(RetryInfo(self.method, self.path, self.n, wait, from_header, self.last))
        log.info("quotaplane: retry %s %s in %.3f s after attempt %d: %s", self.method, self.path, wait, self.n, self.last)
        return wait

    def jitter(self) -> float:
        """Random in [0, min(max_backoff, backoff * 2^(n-1))]: full jitter."""
        d = min(self.opts.backoff * (2 ** (self.n - 1)), self.opts.max_backoff)
        return random.uniform(0, d) if d > 0 else 0.0


def decided(opts: Options, d: DecisionInfo) -> None:
    if opts.hooks.on_decision:
        opts.hooks.on_decision(d)
    if d.not_decided:
        log.warning(
            "quotaplane: not decided; the fail policy answered %s for %s/%s/%s (%s)",
            "allow" if d.allowed else "deny", d.request.org, d.request.team, d.request.user, d.cause,
        )


# The calls: their requests, and their answers decoded.


def check_request(
    org: str,
    team: str | None,
    user: str | None,
    metric: str | None,
    cost: int | None,
    costs: Mapping[str, int] | None,
    idempotency_key: str | None,
) -> CheckRequest:
    return with_key(CheckRequest(org, team, user, metric, cost, dict(costs) if costs is not None else None, idempotency_key))


def check_answer(opts: Options, req: CheckRequest, r: Reply, op: str = "check") -> CheckResult:
    if r.status not in (200, 429):
        raise error_of_reply(r)
    d = r.json()
    if not isinstance(d, dict):
        raise QuotaplaneError(f"quotaplane: a {r.status} answer is not a decision", status=r.status)
    res = CheckResult.from_json(d, req.idempotency_key, datetime.now(timezone.utc))
    rl, policies = ratelimit.from_headers(r.headers.get_list)
    if rl is not None:
        res.rate_limit = rl
    res.policies = policies
    ra = r.headers.get("Retry-After")
    if ra is not None and not res.allowed:
        res.retry_after = retry_after(ra)
    w = r.headers.get("Quotaplane-Warning")
    if w and not res.warning:
        res.warning = w
    decided(opts, DecisionInfo(op, req, res.allowed, mode=res.mode, warning=res.warning))
    return res


def undecided_check(op: str, req: CheckRequest, err: Unavailable, allowed: bool, opts: Options) -> CheckResult:
    decided(opts, DecisionInfo(op, req, allowed, not_decided=True, cause=err))
    return CheckResult(allowed=allowed, idempotency_key=req.idempotency_key, not_decided=True, cause=err)


def batch_body(checks: Sequence[CheckRequest]) -> dict[str, Any]:
    return {"checks": [c.body() for c in checks]}


def batch_answer(
    opts: Options, reqs: Sequence[CheckRequest], r: Reply
) -> list[CheckResult | QuotaplaneError | Unavailable]:
    """The items of a batch: a result, or the error of an item the API refused (an
    Unavailable for an item it could not decide, which the caller gives to its policy)."""
    if r.status != 200:
        raise error_of_reply(r)
    d = r.json()
    results = d.get("results") if isinstance(d, dict) else None
    if not isinstance(results, list) or len(results) != len(reqs):
        raise QuotaplaneError(f"quotaplane: {len(results or [])} results for {len(reqs)} checks", status=r.status)
    now = datetime.now(timezone.utc)
    out: list[CheckResult | QuotaplaneError | Unavailable] = []
    for i, (req, item) in enumerate(zip(reqs, results)):
        if isinstance(item, dict) and isinstance(item.get("status"), int) and item["status"]:
            st = int(item["status"])
            p = Problem.from_json(item, st)
            e = error_of(st, p, None)
            if st >= 500:
                out.append(Unavailable(f"quotaplane unavailable: check {i} of the batch: {e}", status=st, problem=p, attempts=1))
            else:
                out.append(e)
            continue
        res = CheckResult.from_json(item if isinstance(item, dict) else {}, req.idempotency_key, now)
        decided(opts, DecisionInfo("batch", req, res.allowed, mode=res.mode, warning=res.warning))
        out.append(res)
    return out


def reserve_body(
    org: str,
    team: str | None,
    user: str | None,
    metric: str | None,
    amount: int | None,
    amounts: Mapping[str, int] | None,
    ttl: float | None,
    on_expiry: str | None,
    idempotency_key: str | None,
) -> tuple[dict[str, Any], CheckRequest]:
    """The body of a reservation, and the reservation as a check of its amount (for the fail policy)."""
    key = idempotency_key or new_idempotency_key()
    b: dict[str, Any] = {"org": org}
    for k, v in (("team", team), ("user", user), ("metric", metric), ("amount", amount)):
        if v is not None:
            b[k] = v
    if amounts is not None:
        b["amounts"] = dict(amounts)
    secs = ttl_seconds(ttl)
    if secs is not None:
        b["ttl_seconds"] = secs
    if on_expiry is not None:
        b["on_expiry"] = on_expiry
    b["idempotency_key"] = key
    check = CheckRequest(org, team, user, metric, amount, dict(amounts) if amounts is not None else None, key)
    return b, check


def reserve_answer(opts: Options, r: Reply, res: ReservationData, check: CheckRequest) -> None:
    """Fills res from a reservation's answer (201, or 429: nothing held)."""
    if r.status not in (200, 201, 429):
        raise error_of_reply(r)
    d = r.json()
    if not isinstance(d, dict):
        raise QuotaplaneError(f"quotaplane: a {r.status} answer is not a reservation", status=r.status)
    res._update(d)
    res.allowed = r.status != 429
    res.blocked_at = CheckResult.from_json(d, None, datetime.now(timezone.utc)).blocked_at
    res.violated_policies = [str(v) for v in d.get("violated-policies") or ()]
    ras = d.get("retry_after_seconds")
    if isinstance(ras, int) and not isinstance(ras, bool):
        res.retry_after = float(ras)
    ra = r.headers.get("Retry-After")
    if ra is not None and not res.allowed:
        res.retry_after = retry_after(ra)
    res.rate_limit = tightest(res.levels, res.allowed, res.blocked_at, res.retry_after, datetime.now(timezone.utc))
    rl, policies = ratelimit.from_headers(r.headers.get_list)
    if rl is not None:
        res.rate_limit = rl
    res.policies = policies
    decided(opts, DecisionInfo("reserve", check, res.allowed))


def undecided_reservation(res: ReservationData, check: CheckRequest, err: Unavailable, allowed: bool, opts: Options) -> None:
    res.allowed, res.not_decided, res.cause = allowed, True, err
    decided(opts, DecisionInfo("reserve", check, allowed, not_decided=True, cause=err))


def settle_answer(r: Reply, res: ReservationData) -> None:
    """Fills res from the answer of a commit, release, extend or read."""
    if r.status != 200:
        raise error_of_reply(r)
    d = r.json()
    if not isinstance(d, dict):
        raise QuotaplaneError(f"quotaplane: a {r.status} answer is not a reservation", status=r.status)
    res._update(d)
    res.allowed = True


def reservation_path(id: str, op: str = "") -> str:
    p = "/v1/reservations/" + quote(id, safe="")
    return p + "/" + op if op else p


def commit_body(used: Units) -> dict[str, Any]:
    if isinstance(used, Mapping):
        return {"used": {str(k): int(v) for k, v in used.items()}}
    return {"used": int(used)}


def whole(res: ReservationData) -> Units:
    """What a reservation holds: its amounts, or its amount."""
    if res.amounts:
        return dict(res.amounts)
    return res.amount


def entitlements_path(org: str, team: str | None, user: str | None) -> str:
    q = {"org": org}
    if team:
        q["team"] = team
    if user:
        q["user"] = user
    return "/v1/entitlements?" + urlencode(q)


def entitlements_answer(r: Reply) -> Entitlements:
    if r.status != 200:
        raise error_of_reply(r)
    d = r.json()
    if not isinstance(d, dict):
        raise QuotaplaneError(f"quotaplane: a {r.status} answer is not entitlements", status=r.status)
    return Entitlements(
        org=str(d.get("org") or ""),
        team=str(d.get("team") or ""),
        user=str(d.get("user") or ""),
        features=dict(d.get("features") or {}),
        sources=dict(d.get("sources") or {}),
    )


def encode(body: Any) -> bytes | None:
    return None if body is None else json.dumps(body, separators=(",", ":")).encode()

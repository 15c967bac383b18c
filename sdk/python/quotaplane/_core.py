"""What the sync and async clients share: options, the attempt loop's decisions, and
the requests and answers of each call. Neither does I/O here."""

from __future__ import annotations

import json
import logging
import math
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
from .ratelimit import RateLimit
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
    Level,
    ReservationData,
    RetryInfo,
    Units,
    new_idempotency_key,
    parse_time,
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
DEFAULT_LEASE_THRESHOLD = 50.0


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
    leases: bool = False
    lease_threshold: float = DEFAULT_LEASE_THRESHOLD
    batch_wait: float | None = None

    @staticmethod
    def make(base_url: str, key: str, **kw: Any) -> "Options":
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ConfigurationError(f"quotaplane: base URL {base_url!r}: want http(s)://host[:port]")
        if kw.get("hooks") is None:
            kw["hooks"] = Hooks()
        kw["headers"] = dict(kw.get("headers") or {})
        kw["retries"] = max(int(kw.get("retries", DEFAULT_RETRIES)), 0)
        th = kw.get("lease_threshold", DEFAULT_LEASE_THRESHOLD)
        if not isinstance(th, (int, float)) or isinstance(th, bool) or not th >= 0:
            raise ConfigurationError(f"quotaplane: lease_threshold {th!r}: want units a second, a number >= 0")
        wait = kw.get("batch_wait")
        if wait is not None and (not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 1):
            raise ConfigurationError(f"quotaplane: batch_wait {wait!r}: want None or seconds from 0 to 1")
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


def reply_of(r: httpx.Response) -> Reply:
    """The answer r, read in full. Its connection is set to send without delay
    (TCP_NODELAY): httpcore before 0.17 leaves Nagle's algorithm on, and as it writes a
    request's headers and body apart, every POST then waits out the server's delayed
    ACK, about 40 ms. Later httpcore sets it itself."""
    stream = r.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    return Reply(r.status_code, r.headers, r.content)


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
    """A check as the caller made it: without a generated idempotency key (with_key
    adds one before it is sent), so that leasable can tell the caller's own."""
    return CheckRequest(org, team, user, metric, cost, dict(costs) if costs is not None else None, idempotency_key)


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
    opts: Options, reqs: Sequence[CheckRequest], r: Reply, op: str = "batch"
) -> list[CheckResult | QuotaplaneError | Unavailable]:
    """The items of a batch: a result, or the error of an item the API refused (an
    Unavailable for an item it could not decide, which the caller gives to its policy).
    ``op`` names the decisions to the hooks: ``check`` for coalesced checks."""
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
        decided(opts, DecisionInfo(op, req, res.allowed, mode=res.mode, warning=res.warning))
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


# Client leases (leases=True): a hot path is decided in process from units the server
# took for this client, and settled with what it admitted. The bookkeeping is here,
# once, under the client's lock (the sync client's is a threading.Lock; the async
# client's is none: nothing awaits between a test and a take); the clients only send
# the requests it asks for (LeaseJob) and hand back the answers.

#: A lease is closed and renewed once this share of its life or of its units is spent.
RENEW_AT = 0.75
#: The time constant of a path's rate, an exponentially weighted average (seconds).
RATE_TAU = 1.0
#: How often the clients look for leases past their end to settle (seconds).
LEASE_TICK = 0.1
#: After a lease request failed, its path goes one by one this long (seconds): when
#: Quotaplane could not answer, and when it refused (an error no retry mends soon).
QUIET_UNAVAILABLE = 1.0
QUIET_REFUSED = 30.0
#: A failed settle is retried after this, doubling up to a second, until its settle_by.
SETTLE_RETRY = 0.1
#: A path with no lease, not seen this long, is forgotten (seconds).
FORGET_AFTER = 10.0
#: The most checks one POST /v1/check/batch carries (API.md "Check").
MAX_BATCH = 100
#: The most batches a client has in flight at once: the api refuses the checks of an
#: org past its bound in flight (QUOTA_MAX_INFLIGHT_PER_ORG, 256 by default) with
#: 503s, so a client's coalesced checks stay below it; a batch not yet sent keeps
#: taking checks while it waits for a slot.
BATCHES_IN_FLIGHT = 2


def leasable(req: CheckRequest) -> bool:
    """Whether a check (as the caller made it) may be decided from a lease: one
    metric, a cost of at least 1, no idempotency key of the caller's."""
    return req.costs is None and req.idempotency_key is None and (req.cost is None or req.cost > 0)


@dataclass(eq=False)
class Lease:
    """A lease the client holds on a path. It admits while ``open``, before
    ``deadline`` (the client's monotonic clock when it sent the request that took
    the lease, plus the lease's ttl_ms: never later than the server's expires_at) and
    within ``units``; ``admitted`` is what it decided in process, what its settle
    reports."""

    id: str
    units: int
    deadline: float
    renew_at: float
    settle_by: float
    levels: list[Level]
    rate_limit: RateLimit
    admitted: int = 0
    open: bool = True


@dataclass(eq=False)
class PathState:
    """One path (org, team, user, metric) of a client with leases: its rate, its
    lease (open, or closed and not yet settled: at most one at a time), and whether a
    request for it is in flight (``busy``)."""

    org: str
    team: str | None
    user: str | None
    metric: str | None
    rate: float = 0.0
    seen: float = 0.0
    lease: Lease | None = None
    busy: bool = False
    quiet_until: float = 0.0
    reason: str = ""
    retry: "LeaseJob | None" = None
    retry_at: float = 0.0

    def rate_at(self, now: float) -> float:
        dt = now - self.seen
        return self.rate * math.exp(-dt / RATE_TAU) if dt > 0 else self.rate

    def bump(self, cost: int, now: float) -> float:
        self.rate = self.rate_at(now) + cost / RATE_TAU
        self.seen = max(now, self.seen)
        return self.rate


@dataclass(eq=False)
class LeaseJob:
    """A request the client sends for its leases: take one (``lease`` None), or
    settle ``lease`` with what it admitted (and take the next when ``renew``).
    ``tries`` counts the failed sends of a settle."""

    path: PathState
    lease: Lease | None
    renew: bool
    rate: float
    tries: int = 0

    @property
    def url(self) -> str:
        if self.lease is None:
            return "/v1/leases"
        return "/v1/leases/" + quote(self.lease.id, safe="") + "/settle"

    def body(self) -> dict[str, Any]:
        rate = round(self.rate, 3)
        if self.lease is not None:
            b: dict[str, Any] = {"used": self.lease.admitted}
            if self.renew:
                b["renew"] = True
                b["rate"] = rate
            return b
        p = self.path
        b = {"org": p.org}
        for k, v in (("team", p.team), ("user", p.user), ("metric", p.metric)):
            if v is not None:
                b[k] = v
        b["rate"] = rate
        return b

    def start(self, opts: Options, cap: float | None) -> tuple[float, float | None]:
        """When the job is sent (the client's monotonic clock: a lease it brings is
        timed from then) and its budget: a lease request's is a check's, a settle's
        lasts until its settle_by (within settle_budget); ``cap`` bounds it on a
        caller's thread or task."""
        now = sent = time.monotonic()
        if self.lease is None:
            b = opts.budget
        else:
            left = max(self.lease.settle_by - now, 0.05)
            b = min(opts.settle_budget, left) if opts.settle_budget else left
        if cap is not None and (b is None or cap < b):
            b = cap
        return sent, b


class Leases:
    """A client's leases: the rate of each path, its lease, the admissions from it,
    and the requests to take, renew and settle leases (see the contract in API.md
    "Client leases")."""

    def __init__(self, opts: Options, lock: Any) -> None:
        self.opts = opts
        self.lock = lock
        self.threshold = float(opts.lease_threshold)
        self.paths: dict[tuple[str, str, str, str], PathState] = {}
        self.closing = False
        self.next_scan = 0.0

    def admit(self, req: CheckRequest, now: float, again: bool = False) -> tuple[CheckResult | None, list[LeaseJob]]:
        """Decides a leasable check from its path's lease when it can (a result with
        ``leased`` set), else None: the check goes to the server. Also the requests to
        send now: a lease for a path gone hot, or the settle of one closed. ``again``:
        the same check once those are answered (its units already in the rate)."""
        cost = 1 if req.cost is None else int(req.cost)
        key = (req.org, req.team or "", req.user or "", req.metric or "requests")
        with self.lock:
            p = self.paths.get(key)
            if p is None:
                if self.closing:
                    return None, []
                p = self.paths[key] = PathState(req.org, req.team, req.user, req.metric)
            hot = (p.rate_at(now) if again else p.bump(cost, now)) > self.threshold
            lease = p.lease
            if lease is None:
                if again or not hot or p.busy or self.closing or now < p.quiet_until:
                    return None, []
                p.busy = True
                return None, [LeaseJob(p, None, False, p.rate)]
            if not lease.open:
                return None, []  # its settle (and renewal) is in flight: one by one meanwhile
            if now < lease.deadline and lease.units - lease.admitted >= cost:
                lease.admitted += cost
                res = CheckResult(allowed=True, mode="enforce", levels=list(lease.levels), rate_limit=lease.rate_limit, leased=True)
                jobs = []
                if lease.admitted >= RENEW_AT * lease.units or now >= lease.renew_at:
                    jobs.append(self._close(p, hot))
            elif now >= lease.deadline or now >= lease.renew_at or lease.admitted >= RENEW_AT * lease.units:
                return None, [self._close(p, hot)]
            else:
                return None, []  # a cost above what is left: this one goes to the server
        decided(self.opts, DecisionInfo("check", req, True, mode="enforce", leased=True))
        return res, jobs

    def _close(self, p: PathState, renew: bool) -> LeaseJob:
        """Closes p's lease (no admission from it after this) and returns its settle."""
        assert p.lease is not None
        p.lease.open = False
        p.busy = True
        return LeaseJob(p, p.lease, renew and not self.closing, p.rate)

    def due(self, now: float) -> list[LeaseJob]:
        """The settles due by the clock: of leases past their deadline, and of failed
        settles to try again. Forgets idle paths. Scans at most once a LEASE_TICK."""
        with self.lock:
            if now < self.next_scan:
                return []
            self.next_scan = now + LEASE_TICK / 2
            jobs: list[LeaseJob] = []
            for key, p in list(self.paths.items()):
                lease = p.lease
                if lease is None:
                    if not p.busy and now - p.seen > FORGET_AFTER and now >= p.quiet_until:
                        del self.paths[key]
                elif lease.open:
                    # No check came since the lease's renew_at (one would have closed
                    # and renewed it): the path has cooled, the next check takes anew.
                    if now >= lease.deadline:
                        jobs.append(self._close(p, False))
                elif not p.busy and p.retry is not None and now >= p.retry_at:
                    job, p.retry = p.retry, None
                    if now >= lease.settle_by:
                        self._abandon(p, "its settle_by passed")
                        continue
                    p.busy = True
                    jobs.append(job)
            return jobs

    def answer(self, job: LeaseJob, sent: float, reply: Reply | None, err: BaseException | None, now: float) -> list[LeaseJob]:
        """Takes the answer of job (sent at ``sent``, the client's monotonic clock), or
        the error that ended it (any but a QuotaplaneError counts as Quotaplane
        unavailable: a closed http client, say); returns the requests to send next."""
        if err is not None and not isinstance(err, QuotaplaneError):
            err = Unavailable(f"quotaplane unavailable: POST {job.url}: {err}")
        doc: Any = None
        if reply is not None:
            if reply.status in (200, 201):
                try:
                    doc = reply.json()
                except QuotaplaneError as e:
                    err = e
            else:
                err = error_of_reply(reply)
            if doc is not None and not isinstance(doc, dict):
                err, doc = QuotaplaneError(f"quotaplane: a {reply.status} answer is not a lease", status=reply.status), None
        p = job.path
        with self.lock:
            p.busy = False
            if job.lease is None:
                if doc is None:
                    quiet = QUIET_UNAVAILABLE if isinstance(err, Unavailable) or err is None else QUIET_REFUSED
                    p.quiet_until = now + quiet
                    log.info("quotaplane: lease for %s/%s/%s/%s: %s; checking one by one for %g s",
                             p.org, p.team or "", p.user or "", p.metric or "requests", err, quiet)
                    return []
                return self._grant(p, doc, sent, now)
            if doc is not None:
                p.lease = None
                nxt = doc.get("next")
                if job.renew and isinstance(nxt, dict):
                    return self._grant(p, nxt, sent, now)
                return []
            if isinstance(err, Unavailable) or err is None:
                # Tried again without renew: the api answers a repeated settle's
                # renew with another lease, and one the lost answer brought is
                # counted whole at its expiry; the path's next hot check takes anew.
                job.tries += 1
                job.renew = False
                wait = min(SETTLE_RETRY * 2 ** (job.tries - 1), 1.0)
                if now + wait < job.lease.settle_by:
                    p.retry, p.retry_at = job, now + wait
                    return []
            self._abandon(p, str(err))
            return []

    def _abandon(self, p: PathState, why: str) -> None:
        lease = p.lease
        p.lease = None
        if lease is not None:
            log.warning("quotaplane: lease %s (%d units, %d admitted) not settled: %s; Quotaplane counts it whole at its expiry",
                        lease.id, lease.units, lease.admitted, why)

    def _grant(self, p: PathState, d: Mapping[str, Any], sent: float, now: float) -> list[LeaseJob]:
        """Takes a lease-or-zero answer for p."""
        units, ttl_ms, id = d.get("units"), d.get("ttl_ms"), d.get("id")
        ttl = ttl_ms / 1000 if isinstance(ttl_ms, (int, float)) and not isinstance(ttl_ms, bool) and ttl_ms > 0 else 0.0
        if not isinstance(units, int) or isinstance(units, bool) or units <= 0 or not isinstance(id, str) or not id:
            p.reason = str(d.get("reason") or "")
            p.quiet_until = now + (ttl or QUIET_UNAVAILABLE)
            return []
        expires, settle_by = parse_time(d.get("expires_at")), parse_time(d.get("settle_by"))
        grace = (settle_by - expires).total_seconds() if expires and settle_by else 0.0
        levels = [Level.from_json(lv) for lv in d.get("levels") or () if isinstance(lv, dict)]
        deadline = sent + ttl
        p.lease = Lease(
            id=id, units=units, deadline=deadline, renew_at=sent + RENEW_AT * ttl, settle_by=deadline + max(grace, 0.0),
            levels=levels, rate_limit=tightest(levels, True, None, None, datetime.now(timezone.utc)),
        )
        p.reason = ""
        if self.closing or now >= deadline:
            return [self._close(p, False)]
        return []

    def close(self) -> list[LeaseJob]:
        """Closes every lease: no admission after this, no lease taken; returns the
        settles to send (renew false). A request in flight settles what it brings."""
        with self.lock:
            self.closing = True
            jobs = []
            for p in self.paths.values():
                if p.lease is None or p.busy:
                    continue
                if p.lease.open:
                    jobs.append(self._close(p, False))
                elif p.retry is not None:
                    job, p.retry = p.retry, None
                    p.busy = True
                    jobs.append(job)
            return jobs

    def outstanding(self) -> bool:
        """Whether a lease is held or a request for one is in flight."""
        with self.lock:
            return any(p.busy or p.lease is not None for p in self.paths.values())


# Coalescing (batch_wait): checks not decided from a lease, arriving within the wait,
# go out together as one POST /v1/check/batch.


class Batch:
    """Checks going out as one batch: ``full`` is set when it holds MAX_BATCH, ``done``
    when its answer (``items``) or the error that ended it (``error``) is in."""

    def __init__(self, full: Any, done: Any) -> None:
        self.reqs: list[CheckRequest] = []
        self.items: list[CheckResult | QuotaplaneError | Unavailable] | None = None
        self.error: BaseException | None = None
        self.full, self.done = full, done


class Coalescer:
    """Gathers checks into batches; ``event`` makes the client's kind of event."""

    def __init__(self, lock: Any, event: Callable[[], Any]) -> None:
        self.lock, self.event = lock, event
        self.open: Batch | None = None

    def join(self, req: CheckRequest) -> tuple[Batch, int, bool]:
        """Adds req to the open batch (a new one, when there is none, whose first
        check is its leader: True); returns the batch and req's place in it."""
        with self.lock:
            b = self.open
            first = b is None
            if b is None:
                b = self.open = Batch(self.event(), self.event())
            b.reqs.append(req)
            i = len(b.reqs) - 1
            if len(b.reqs) >= MAX_BATCH:
                self.open = None
                b.full.set()
            return b, i, first

    def seal(self, b: Batch) -> None:
        """Takes no more checks into b: it is about to be sent."""
        with self.lock:
            if self.open is b:
                self.open = None


ALONE = "alone"


def batch_item(b: Batch, i: int, req: CheckRequest) -> CheckResult | Unavailable | str:
    """A coalesced check's own outcome: its result; an Unavailable for the fail policy
    (the batch could not be sent); ALONE for an item the API could not decide, which is
    sent again on its own as a single check would be retried (its idempotency key
    keeps it from counting twice). Raises the error of an item (or of the batch) that
    the API refused."""
    if b.error is not None:
        if isinstance(b.error, Unavailable):
            return b.error
        raise b.error
    assert b.items is not None
    item = b.items[i]
    if isinstance(item, CheckResult):
        return item
    if isinstance(item, Unavailable):
        return ALONE
    raise item

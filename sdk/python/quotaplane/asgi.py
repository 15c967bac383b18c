"""ASGI middleware that puts a Quotaplane check in front of any ASGI app (Starlette,
FastAPI, or a bare ASGI callable), as the Go client's ``client/middleware`` does for
net/http and the TypeScript SDK's for Express.

- :class:`CheckMiddleware` checks each request before the app: an allowed check
  passes the RateLimit fields on to the response and calls the app; a denied one is
  answered 429 with ``Retry-After`` (none when the cost can never fit),
  ``RateLimit-Limit``, ``RateLimit-Remaining``, ``RateLimit-Reset``, the draft
  ``RateLimit`` and ``RateLimit-Policy`` fields, and a problem document
  (``application/problem+json``) naming the level that refused (``blocked_at``); the
  app never runs.
- :class:`ConcurrencyMiddleware` holds a slot (a reservation, typically against a
  ``concurrent`` limit) while the app answers: it reserves before the app, extends
  the reservation while the response streams, and gives it back once, when the
  response ends (before its last byte is sent, so a caller's next request finds the
  slot free), when the app raises or is cancelled (a client that went away stops a
  Starlette streaming response). Given back means released, unless the app reported
  usage (:func:`report_usage`): then that is committed.
- :class:`ReserveMiddleware` is for work whose cost is known only after it: it
  reserves the most a request may cost and, once the app returned, commits what the
  app reported (the whole amount when it reported nothing; a failed app, one that
  raised or answered 5xx, commits what it reported and releases when it reported
  nothing).

Each takes the app, an :class:`~quotaplane.AsyncClient` (or any object with its
coroutine methods ``check``, ``reserve``, ``commit``, ``release``, ``extend``) and a
function of the request's ASGI scope to the check's keywords (``org``, ``team``,
``user``, ``metric`` and ``cost``, or ``costs``) or the reservation's (``amount`` or
``amounts``, ``ttl``, ``on_expiry``); it may be a coroutine function, and returns None
to let the request through unchecked. Options, as the Go and Express middlewares':
``skip`` (requests let through unchecked), ``on_denied`` (answers a denial instead of
the 429), ``on_error`` (answers a request that could not be checked instead of
:func:`error_response`), ``logger``. The app reads the decision with
:func:`decision_of` (``request.state.quotaplane`` in Starlette). Only ``http``
scopes are checked; ``websocket`` and ``lifespan`` pass through.

With Starlette or FastAPI::

    app.add_middleware(CheckMiddleware, client=client,
                       check=lambda scope: {"org": "acme", "user": header(scope, "x-user")})
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, Mapping, MutableMapping, Sequence, Union

from .errors import QuotaplaneError, Unavailable
from .models import CheckRequest, Level, LevelRef
from .ratelimit import Policy, RateLimit, format_policies

__all__ = [
    "CheckMiddleware",
    "ConcurrencyMiddleware",
    "DEFAULT_SLOT_TTL",
    "Decision",
    "NotDecided",
    "PROBLEM_TYPE",
    "RequestError",
    "ReserveMiddleware",
    "Settlement",
    "decision_of",
    "denied_response",
    "error_response",
    "header",
    "rate_limit_headers",
    "report_usage",
    "reported_usage",
    "reservation_id",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: What a mapping function returns: the keywords of the client's call, or None to skip.
Named = Union[Mapping[str, Any], None]

PROBLEM_TYPE = "https://quotaplane.dev/problems/"
"""The type URI prefix of the problem documents the middleware writes, as the API's
own: ``https://quotaplane.dev/problems/<status in kebab case>``."""

DEFAULT_SLOT_TTL = 30.0
"""The ttl, in seconds, of the reservation :class:`ConcurrencyMiddleware` holds when
its function sets none; it is extended every third of it while the app runs, so a
holder that dies gives its slot back within a ttl."""

DEFAULT_SETTLE_TIMEOUT = 10.0
"""How long a commit or release after the app may take, all its attempts together."""

_SCOPE_KEY = "quotaplane"
_USAGE_KEY = "quotaplane.usage"

log = logging.getLogger("quotaplane.asgi")


class RequestError(Exception):
    """The request does not name its quota: the mapping function raised ``ValueError``
    or ``LookupError`` (a missing header, say), which is this error's ``__cause__``.
    :func:`error_response` answers it 400 with that error's message."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the request does not name its quota: {cause}")
        self.__cause__ = cause


class NotDecided(Exception):
    """Quotaplane could not decide and the client's fail policy denied: no quota was
    found exhausted, so :func:`error_response` answers 503, not 429. ``cause`` is the
    client's :class:`~quotaplane.Unavailable`."""

    def __init__(self, cause: BaseException | None) -> None:
        super().__init__(f"the quota service could not decide: {cause}")
        self.cause = cause


@dataclass
class Decision:
    """What the middleware decided about a request, as the app reads it with
    :func:`decision_of` and ``on_denied`` gets it. ``result`` is the check's result
    (:class:`CheckMiddleware`), ``reservation`` the reservation (the others; its
    ``id`` is empty when the fail policy let the request through holding nothing)."""

    operation: Literal["check", "reserve"]
    allowed: bool
    #: Quotaplane could not decide and the client's fail policy did; ``cause`` says why.
    not_decided: bool = False
    cause: BaseException | None = None
    #: The org's mode (enforce, shadow or warn), of a check.
    mode: str = ""
    #: Warn mode: passed on to the response as Quotaplane-Warning.
    warning: str = ""
    would_block: LevelRef | None = None
    blocked_at: LevelRef | None = None
    #: Seconds until the same request may pass; None when it never can (or was allowed).
    retry_after: float | None = None
    rate_limit: RateLimit = field(default_factory=RateLimit)
    policies: list[Policy] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)
    result: Any = None
    reservation: Any = None

    @classmethod
    def of_check(cls, r: Any) -> "Decision":
        return cls("check", bool(r.allowed), r.not_decided, r.cause, r.mode, r.warning, r.would_block, r.blocked_at,
                   r.retry_after, r.rate_limit, list(r.policies), list(r.levels), result=r)

    @classmethod
    def of_reservation(cls, r: Any) -> "Decision":
        return cls("reserve", bool(r.allowed), r.not_decided, r.cause, blocked_at=r.blocked_at, retry_after=r.retry_after,
                   rate_limit=r.rate_limit, policies=list(r.policies), levels=list(r.levels), reservation=r)


@dataclass
class Settlement:
    """How the reservation of a request was given back (``on_settled``): ``how`` is
    ``"commit"`` (``used``: what was committed) or ``"release"``; ``failed`` when the
    app raised, was cancelled, answered 5xx or no response at all; ``disconnected``
    when the client went away before the response ended; ``error`` when the commit
    or release itself failed (the reservation's ``on_expiry`` settles it then)."""

    reservation_id: str
    how: Literal["commit", "release"]
    used: int | dict[str, int] | None = None
    failed: bool = False
    disconnected: bool = False
    error: BaseException | None = None


def _scope_of(obj: Any) -> Scope:
    s = getattr(obj, "scope", obj)
    if not isinstance(s, MutableMapping):
        raise TypeError("quotaplane: expected an ASGI scope or a request with a .scope")
    return s


def decision_of(request: Any) -> Decision | None:
    """The decision the middleware made about ``request`` (an ASGI scope, or a
    Starlette request); None outside the middleware, or for a skipped request."""
    return _scope_of(request).get(_SCOPE_KEY)


def header(scope: Any, name: str, default: str | None = None) -> str | None:
    """The value of header ``name`` (any case) of an ASGI scope, decoded as Latin-1;
    ``default`` when the request has none. Several are joined with ``", "``."""
    want = name.lower().encode("latin-1")
    vals = [v.decode("latin-1") for k, v in _scope_of(scope).get("headers") or () if k.lower() == want]
    return ", ".join(vals) if vals else default


class _Usage:
    """What the app reported for its request's reservation."""

    def __init__(self, reservation_id: str) -> None:
        self.id = reservation_id
        self.used: int | dict[str, int] | None = None

    def add(self, used: int | Mapping[str, int]) -> None:
        def whole(n: Any, what: str) -> int:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"quotaplane: {what} must be a whole number >= 0, not {n!r}")
            return n

        if isinstance(used, Mapping):
            add = {str(m): whole(n, f"the usage of {m}") for m, n in used.items()}
            if isinstance(self.used, int):
                raise TypeError("quotaplane: a number and units per metric cannot be added: report one kind per request")
            sums = dict(self.used or {})
            for m, n in add.items():
                sums[m] = sums.get(m, 0) + n
            self.used = sums
        else:
            n = whole(used, "usage")
            if isinstance(self.used, dict):
                raise TypeError("quotaplane: a number and units per metric cannot be added: report one kind per request")
            self.used = (self.used or 0) + n


def report_usage(request: Any, used: int | Mapping[str, int]) -> bool:
    """Adds ``used`` to what ``request`` (an ASGI scope or a Starlette request) used,
    for :class:`ReserveMiddleware` or :class:`ConcurrencyMiddleware` to commit when the
    response ends: call it as the cost becomes known (once, or per chunk of a
    stream). A number for a reservation of one metric; units per metric
    (``{"requests": 1, "tokens": 1234}``: a metric left out used 0) for one of
    several. Returns whether the request holds a reservation of the middleware."""
    u = _scope_of(request).get(_USAGE_KEY)
    if u is None:
        return False
    u.add(used)
    return True


def reported_usage(request: Any) -> int | dict[str, int] | None:
    """What the app reported for ``request`` so far (:func:`report_usage`), None when nothing."""
    u = _scope_of(request).get(_USAGE_KEY)
    if u is None or u.used is None:
        return None
    return dict(u.used) if isinstance(u.used, dict) else u.used


def reservation_id(request: Any) -> str | None:
    """The id of the reservation the middleware holds for ``request`` (None outside
    :class:`ReserveMiddleware` and :class:`ConcurrencyMiddleware`, or when the fail
    policy let the request through holding nothing)."""
    u = _scope_of(request).get(_USAGE_KEY)
    return u.id if u is not None else None


# Responses.


def _ceil_seconds(s: float | None) -> int:
    return int(math.ceil(s or 0))


def _plain(s: str) -> bool:
    return all(0x20 <= ord(c) <= 0x7E and c not in '"\\' for c in s)


def rate_limit_headers(rate_limit: RateLimit, policies: Sequence[Policy] = ()) -> list[tuple[str, str]]:
    """The RateLimit fields of ``rate_limit`` as a service passes them on to its
    caller, as the Go middleware's SetRateLimitHeaders writes them: ``RateLimit-Policy``
    (every policy, when Quotaplane sent them), ``RateLimit-Limit``,
    ``RateLimit-Remaining``, ``RateLimit-Reset`` (whole seconds, rounded up) and, when
    the limit names its policy, the draft's ``RateLimit``:
    ``"<policy>";r=<remaining>;t=<reset>``."""
    out: list[tuple[str, str]] = []
    if policies:
        out.append(("RateLimit-Policy", format_policies(policies)))
    reset = str(_ceil_seconds(rate_limit.reset))
    out += [
        ("RateLimit-Limit", str(rate_limit.limit)),
        ("RateLimit-Remaining", str(rate_limit.remaining)),
        ("RateLimit-Reset", reset),
    ]
    if rate_limit.policy and _plain(rate_limit.policy):
        out.append(("RateLimit", f'"{rate_limit.policy}";r={max(rate_limit.remaining, 0)};t={reset}'))
    return out


_STATUS_TEXT = {
    400: "Bad Request",
    403: "Forbidden",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _problem(status: int, detail: str) -> dict[str, Any]:
    title = _STATUS_TEXT[status]
    return {"type": PROBLEM_TYPE + title.lower().replace(" ", "-"), "title": title, "status": status, "detail": detail}


class _Answer:
    """An ASGI app that answers a problem document (what on_denied and on_error return)."""

    def __init__(self, status: int, doc: Mapping[str, Any], headers: Sequence[tuple[str, str]] = ()) -> None:
        self.status, self.doc, self.headers = status, doc, list(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = (json.dumps(self.doc, separators=(",", ":")) + "\n").encode()
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]
        headers += [
            (b"content-type", b"application/problem+json"),
            (b"cache-control", b"no-store"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _ref(b: LevelRef) -> dict[str, str]:
    d = {"level": b.level, "id": b.id}
    if b.metric:
        d["metric"] = b.metric
    d["window"] = b.window
    return d


def denied_response(decision: Decision) -> ASGIApp:
    """The default ``on_denied``: an ASGI app answering 429 with ``Retry-After``, the
    RateLimit fields and a problem document naming the level and window that refused
    (``blocked_at``) and when to retry (``retry_after_seconds``), as the Go
    middleware's Deny. A refusal by a level with no wait (a cost above a token
    bucket's burst can never fit) has no Retry-After and says so; without a level
    either, the wait is at least 1 s. A custom ``on_denied`` may return it after its
    own logging."""
    b, rl = decision.blocked_at, decision.rate_limit
    policies = decision.policies
    if b is not None and not (decision.retry_after or 0) > 0:
        p = _problem(429, f'over quota at {b.level} "{b.id}" ({b.window} window); the cost can never fit')
        p["blocked_at"] = _ref(b)
        if rl.policy:
            p["violated-policies"] = [rl.policy]
        return _Answer(429, p, rate_limit_headers(rl, policies))
    secs = max(_ceil_seconds(decision.retry_after), 1)
    # On a denial RateLimit-Reset is the Retry-After, as the API's.
    rl = RateLimit(limit=rl.limit, remaining=rl.remaining, reset=float(secs), policy=rl.policy)
    if b is not None:
        detail = f'over quota at {b.level} "{b.id}" ({b.window} window); retry in {secs} s'
    else:
        detail = f"over quota; retry in {secs} s"
    p = _problem(429, detail)
    p["retry_after_seconds"] = secs
    if b is not None:
        p["blocked_at"] = _ref(b)
    if rl.policy:
        p["violated-policies"] = [rl.policy]
    return _Answer(429, p, [("Retry-After", str(secs)), *rate_limit_headers(rl, policies)])


def error_response(error: BaseException) -> ASGIApp | None:
    """The default ``on_error``: an ASGI app answering a request that could not be
    checked with a problem document, as the Go middleware's DefaultErrorHandler:

    - :class:`RequestError` (the mapping function could not name the quota): 400;
    - Quotaplane refused the service's own key (401, 403): 500, without the detail
      (the caller cannot fix it; the log says it);
    - Quotaplane refused what the request named (any other 4xx: a user that is not
      registered and no team, an unknown metric): 403, never a 500, with the API's
      detail for a 400, 404, 409 or 422;
    - :class:`NotDecided` (the fail policy denied) or :class:`~quotaplane.Unavailable`
      (no fail policy): 503 with ``Retry-After: 1``;
    - anything else (:class:`~quotaplane.ConfigurationError`): 500.
    """
    status = getattr(error, "status", None)
    if isinstance(error, RequestError):
        return _Answer(400, _problem(400, str(error)))
    if isinstance(error, (NotDecided, Unavailable)):
        return _Answer(503, _problem(503, "the quota of this request cannot be checked now; retry shortly"), [("Retry-After", "1")])
    if isinstance(error, QuotaplaneError) and status in (401, 403):
        return _Answer(500, _problem(500, "the quota service refused this service's credentials"))
    if isinstance(error, QuotaplaneError) and status is not None and status < 500:
        detail = "the quota service refused this request's check"
        pd = error.problem.detail if error.problem is not None else ""
        if status in (400, 404, 409, 422) and pd:
            detail += ": " + pd
        return _Answer(403, _problem(403, detail))
    return _Answer(500, _problem(500, "the quota of this request cannot be checked"))


# The middlewares.


async def _maybe(v: Any) -> Any:
    return await v if inspect.isawaitable(v) else v


def _with_headers(send: Send, extra: list[tuple[str, str]]) -> Send:
    """send, with extra headers added to the response's start, unless the app set them."""
    if not extra:
        return send

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers") or ())
            have = {bytes(k).lower() for k, _ in headers}
            for k, v in extra:
                kb = k.lower().encode("latin-1")
                if kb not in have:
                    headers.append((kb, v.encode("latin-1")))
            message = {**message, "headers": headers}
        await send(message)

    return wrapped


def _pass_headers(d: Decision) -> list[tuple[str, str]]:
    out = rate_limit_headers(d.rate_limit, d.policies) if d.levels else []
    if d.warning:
        out.append(("Quotaplane-Warning", d.warning))
    return out


class _Base:
    operation = "check"

    def __init__(
        self,
        app: ASGIApp,
        client: Any,
        named: Callable[[Scope], Named | Awaitable[Named]],
        *,
        skip: Callable[[Scope], bool | Awaitable[bool]] | None = None,
        on_denied: Callable[[Scope, Decision], ASGIApp | Awaitable[ASGIApp]] | None = None,
        on_error: Callable[[Scope, BaseException], ASGIApp | None | Awaitable[ASGIApp | None]] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.app = app
        self.client = client
        self._named = named
        self._skip = skip
        self._on_denied = on_denied
        self._on_error = on_error
        self._log = logger or log

    async def _name(self, scope: Scope) -> tuple[bool, dict[str, Any] | None, BaseException | None]:
        """Whether to check, the keywords, or the error that answers the request."""
        if self._skip is not None and await _maybe(self._skip(scope)):
            return False, None, None
        try:
            kw = await _maybe(self._named(scope))
        except (ValueError, LookupError) as e:
            return False, None, RequestError(e)
        if kw is None:
            return False, None, None
        if isinstance(kw, CheckRequest) and self.operation == "check":
            kw = {k: v for k, v in vars(kw).items() if v is not None}
        if not isinstance(kw, Mapping):
            raise TypeError(f"quotaplane: the {self.operation} function returns a mapping of keywords or None, not {type(kw).__name__}")
        return True, dict(kw), None

    async def _fail(self, scope: Scope, receive: Receive, send: Send, err: BaseException) -> None:
        """Logs err, then answers it with on_error."""
        status = getattr(err, "status", None)
        level = logging.ERROR
        if isinstance(err, RequestError):
            level = logging.DEBUG
        elif isinstance(err, QuotaplaneError) and status in (401, 403):
            level = logging.ERROR  # the service's own key: an error for its operator
        elif isinstance(err, (NotDecided, Unavailable)) or (isinstance(err, QuotaplaneError) and status is not None and status < 500):
            level = logging.WARNING
        self._log.log(level, "quotaplane: the request's quota could not be checked: %s %s: %s",
                      scope.get("method"), scope.get("path"), err)
        answer = await _maybe(self._on_error(scope, err)) if self._on_error is not None else error_response(err)
        if answer is not None:
            await answer(scope, receive, send)

    async def _decided(self, scope: Scope, receive: Receive, send: Send, d: Decision) -> bool:
        """Answers a request d does not let through, and reports whether it does."""
        scope[_SCOPE_KEY] = d
        state = scope.setdefault("state", {})
        if isinstance(state, MutableMapping):
            state[_SCOPE_KEY] = d
        if d.not_decided and not d.allowed:
            await self._fail(scope, receive, send, NotDecided(d.cause))
            return False
        if not d.allowed:
            answer = await _maybe(self._on_denied(scope, d)) if self._on_denied is not None else denied_response(d)
            await answer(scope, receive, send)
            return False
        return True


class CheckMiddleware(_Base):
    """Checks each HTTP request with ``client`` before ``app``.

    ``check(scope)`` (a function or coroutine function) returns the keywords of
    ``client.check`` (``{"org": "acme", "user": "alice", "cost": 1}``, or ``costs``;
    or a :class:`~quotaplane.CheckRequest`), or None to let the request through unchecked; a ``ValueError`` or ``LookupError``
    it raises answers 400 (:class:`RequestError`). ``skip(scope)`` true lets the
    request through too.

    - Allowed: the app runs, its response carrying the RateLimit fields of the check
      (those the app sets itself are kept) and warn mode's Quotaplane-Warning.
    - Denied: ``on_denied(scope, decision)`` returns the ASGI app that answers
      (default :func:`denied_response`: 429, Retry-After, RateLimit fields, a problem
      document naming ``blocked_at``).
    - Quotaplane could not decide: the client's fail policy decides; a refusal is
      answered 503 (:class:`NotDecided`), as is Quotaplane unreachable without a fail
      policy.
    - The check itself failed (a bad key, an unknown metric): ``on_error(scope,
      error)`` returns the ASGI app that answers (default :func:`error_response`), or
      None when it answered nothing.
    """

    operation = "check"

    def __init__(
        self,
        app: ASGIApp,
        client: Any,
        check: Callable[[Scope], Named | Awaitable[Named]],
        *,
        skip: Callable[[Scope], bool | Awaitable[bool]] | None = None,
        on_denied: Callable[[Scope, Decision], ASGIApp | Awaitable[ASGIApp]] | None = None,
        on_error: Callable[[Scope, BaseException], ASGIApp | None | Awaitable[ASGIApp | None]] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__(app, client, check, skip=skip, on_denied=on_denied, on_error=on_error, logger=logger)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        go, kw, err = await self._name(scope)
        if err is not None:
            await self._fail(scope, receive, send, err)
            return
        if not go:
            await self.app(scope, receive, send)
            return
        assert kw is not None
        try:
            res = await self.client.check(**kw)
        except QuotaplaneError as e:
            await self._fail(scope, receive, send, e)
            return
        d = Decision.of_check(res)
        if await self._decided(scope, receive, send, d):
            await self.app(scope, receive, _with_headers(send, _pass_headers(d)))


class _Hold(_Base):
    """What ReserveMiddleware and ConcurrencyMiddleware share."""

    operation = "reserve"

    def __init__(
        self,
        app: ASGIApp,
        client: Any,
        reserve: Callable[[Scope], Named | Awaitable[Named]],
        *,
        skip: Callable[[Scope], bool | Awaitable[bool]] | None = None,
        on_denied: Callable[[Scope, Decision], ASGIApp | Awaitable[ASGIApp]] | None = None,
        on_error: Callable[[Scope, BaseException], ASGIApp | None | Awaitable[ASGIApp | None]] | None = None,
        on_settled: Callable[[Scope, Settlement], Any] | None = None,
        settle_timeout: float = DEFAULT_SETTLE_TIMEOUT,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__(app, client, reserve, skip=skip, on_denied=on_denied, on_error=on_error, logger=logger)
        self._on_settled = on_settled
        self._settle_timeout = settle_timeout

    def _defaults(self, kw: dict[str, Any]) -> dict[str, Any]:
        return kw

    async def _hold(self, scope: Scope, receive: Receive, send: Send) -> tuple[Any, Decision] | None:
        """Reserves for the request: the reservation and its decision when one is held;
        None when the request has been dealt with (answered, or served holding nothing)."""
        go, kw, err = await self._name(scope)
        if err is not None:
            await self._fail(scope, receive, send, err)
            return None
        if not go:
            await self.app(scope, receive, send)
            return None
        assert kw is not None
        try:
            res = await self.client.reserve(**self._defaults(kw))
        except QuotaplaneError as e:
            await self._fail(scope, receive, send, e)
            return None
        d = Decision.of_reservation(res)
        if not await self._decided(scope, receive, send, d):
            return None
        if not res.id:  # decided by the fail policy: nothing is held
            await self.app(scope, receive, _with_headers(send, _pass_headers(d)))
            return None
        return res, d

    async def _settle(self, scope: Scope, res: Any, u: _Usage, whole: bool, failed: bool, disconnected: bool) -> None:
        """Commits what the app reported (or, when it reported nothing, the whole
        amount if whole, else releases), bounded by settle_timeout, and shielded: a
        cancelled request still gives its reservation back."""
        used = u.used
        s = Settlement(res.id, "commit", failed=failed, disconnected=disconnected)
        if used is not None:
            s.used = dict(used) if isinstance(used, dict) else used
            call = self.client.commit(res.id, s.used)
        elif whole:
            s.used = dict(res.amounts) if res.amounts else res.amount
            call = self.client.commit(res.id, s.used)
        else:
            s.how = "release"
            call = self.client.release(res.id)

        async def run() -> None:
            try:
                await asyncio.wait_for(call, self._settle_timeout)
            except Exception as e:  # noqa: BLE001 - reported to on_settled and the log
                s.error = e
                self._log.warning("quotaplane: %s of reservation %s failed; its on_expiry settles it: %s", s.how, res.id, e)
            if self._on_settled is not None:
                try:
                    self._on_settled(scope, s)
                except Exception:  # noqa: BLE001
                    self._log.exception("quotaplane: on_settled raised")

        # A task of its own, awaited through a shield: a cancellation of this request
        # stops the wait, not the settlement.
        await asyncio.shield(asyncio.ensure_future(run()))


class ReserveMiddleware(_Hold):
    """Reserves with ``client`` before ``app`` and settles once the app returned.

    ``reserve(scope)`` returns the keywords of ``client.reserve``: the most the
    request may cost (``{"org": "acme", "user": "alice", "metric": "tokens",
    "amount": 4000}``, or ``amounts``), or None to let it through. The app reports
    what it used with :func:`report_usage` (they add); then:

    - the app returned under 500: what it reported is committed, the whole amount
      when it reported nothing (``unreported="release"`` releases instead);
    - the app raised, was cancelled or answered 5xx: what it reported so far is
      committed, everything released when it reported nothing.

    The settlement runs after the app's last message, so the response never waits for
    it; ``on_settled(scope, settlement)`` tells when it is done. A denied reservation is
    answered as a denied check; one the fail policy allowed (Quotaplane did not
    decide) holds nothing, and the app runs uncounted.
    """

    def __init__(
        self,
        app: ASGIApp,
        client: Any,
        reserve: Callable[[Scope], Named | Awaitable[Named]],
        *,
        unreported: Literal["commit", "release"] = "commit",
        skip: Callable[[Scope], bool | Awaitable[bool]] | None = None,
        on_denied: Callable[[Scope, Decision], ASGIApp | Awaitable[ASGIApp]] | None = None,
        on_error: Callable[[Scope, BaseException], ASGIApp | None | Awaitable[ASGIApp | None]] | None = None,
        on_settled: Callable[[Scope, Settlement], Any] | None = None,
        settle_timeout: float = DEFAULT_SETTLE_TIMEOUT,
        logger: logging.Logger | None = None,
    ) -> None:
        if unreported not in ("commit", "release"):
            raise ValueError(f'quotaplane: unreported is "commit" or "release", not {unreported!r}')
        super().__init__(app, client, reserve, skip=skip, on_denied=on_denied, on_error=on_error,
                         on_settled=on_settled, settle_timeout=settle_timeout, logger=logger)
        self._unreported = unreported

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        held = await self._hold(scope, receive, send)
        if held is None:
            return
        res, d = held
        u = _Usage(res.id)
        scope[_USAGE_KEY] = u
        status = 0
        ended = gone = False
        inner = _with_headers(send, _pass_headers(d))

        async def receive_() -> Message:
            nonlocal gone
            message = await receive()
            if message.get("type") == "http.disconnect" and not ended:
                gone = True
            return message

        async def send_(message: Message) -> None:
            nonlocal status, ended
            t = message.get("type")
            if t == "http.response.start":
                status = int(message.get("status", 0))
            elif t == "http.response.body" and not message.get("more_body", False):
                ended = True
            await inner(message)

        failed = True
        try:
            await self.app(scope, receive_, send_)
            failed = status == 0 or status >= 500
        finally:
            await self._settle(scope, res, u, whole=not failed and self._unreported == "commit", failed=failed, disconnected=gone)


class ConcurrencyMiddleware(_Hold):
    """Holds a slot for each HTTP request while ``app`` answers it.

    ``reserve(scope)`` returns the keywords of ``client.reserve`` for the slot, e.g.
    ``{"org": "acme", "user": "alice", "metric": "requests", "amount": 1}`` (or
    ``amounts`` of requests and tokens at once), against the org's, team's and
    user's ``concurrent`` limits and all their other limits; ``ttl`` defaults to
    :data:`DEFAULT_SLOT_TTL` and ``on_expiry`` to ``"release"``. None lets the request
    through holding nothing.

    - Denied (every slot taken): 429 with Retry-After and the RateLimit fields, as
      :class:`CheckMiddleware` answers. Quotaplane unreachable: the client's fail
      policy decides (allowed: the app runs holding nothing; refused: 503).
    - While the app runs the reservation is extended every ``heartbeat`` seconds (a
      third of the ttl by default) by its ttl, so a stream longer than the ttl keeps
      its slot and a process that dies loses it within a ttl. The beats stop when the
      client goes away (the app's ``receive`` says ``http.disconnect``): an app deaf
      to it keeps the slot until it returns, a ttl at most.
    - The slot is given back once: when the response ends (before its last message
      is passed on, so the caller's next request finds it free), or when the app
      raises (the exception goes on), is cancelled, or returns without ending the
      response. Given back means released (the request counts nowhere) unless the app
      reported usage (:func:`report_usage`): then that is committed, which gives the
      slot back all the same. To count every request in its other windows, report it:
      ``report_usage(request, {"requests": 1})``.
    """

    def __init__(
        self,
        app: ASGIApp,
        client: Any,
        reserve: Callable[[Scope], Named | Awaitable[Named]],
        *,
        heartbeat: float | None = None,
        skip: Callable[[Scope], bool | Awaitable[bool]] | None = None,
        on_denied: Callable[[Scope, Decision], ASGIApp | Awaitable[ASGIApp]] | None = None,
        on_error: Callable[[Scope, BaseException], ASGIApp | None | Awaitable[ASGIApp | None]] | None = None,
        on_settled: Callable[[Scope, Settlement], Any] | None = None,
        settle_timeout: float = DEFAULT_SETTLE_TIMEOUT,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__(app, client, reserve, skip=skip, on_denied=on_denied, on_error=on_error,
                         on_settled=on_settled, settle_timeout=settle_timeout, logger=logger)
        self._heartbeat = heartbeat

    def _defaults(self, kw: dict[str, Any]) -> dict[str, Any]:
        if kw.get("ttl") is None:
            kw["ttl"] = DEFAULT_SLOT_TTL
        if kw.get("on_expiry") is None:
            kw["on_expiry"] = "release"
        return kw

    async def _beat(self, res: Any, ttl: float, every: float) -> None:
        """Extends res by ttl every `every` seconds until cancelled, or until the slot is lost."""
        while True:
            await asyncio.sleep(every)
            try:
                # Bounded by the heartbeat: a slow Quotaplane delays no later beat.
                await asyncio.wait_for(self.client.extend(res.id, ttl), every)
            except QuotaplaneError as e:
                if getattr(e, "status", None) in (404, 409):
                    # settled, expired or unknown: nothing left to keep
                    self._log.warning("quotaplane: the slot %s was lost while the app ran: %s", res.id, e)
                    return
                self._log.warning("quotaplane: extending slot %s failed; retried at the next beat: %s", res.id, e)
            except asyncio.TimeoutError:
                self._log.warning("quotaplane: extending slot %s took over %.3g s; retried at the next beat", res.id, every)
            except Exception:  # noqa: BLE001 - a beat's failure is the next beat's to mend
                self._log.exception("quotaplane: extending slot %s failed; retried at the next beat", res.id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        held = await self._hold(scope, receive, send)
        if held is None:
            return
        res, d = held
        u = _Usage(res.id)
        scope[_USAGE_KEY] = u
        ttl = float(res.ttl or DEFAULT_SLOT_TTL)
        every = self._heartbeat if self._heartbeat and self._heartbeat > 0 else max(ttl / 3, 0.1)
        beat = asyncio.ensure_future(self._beat(res, ttl, every))
        settled = gone = False
        status = 0

        async def give_back(failed: bool) -> None:
            nonlocal settled
            if settled:
                return
            settled = True
            beat.cancel()
            await self._settle(scope, res, u, whole=False, failed=failed, disconnected=gone)

        async def receive_() -> Message:
            nonlocal gone
            message = await receive()
            if message.get("type") == "http.disconnect" and not settled:
                gone = True
                beat.cancel()  # the client went away: hold the slot no longer than a ttl
            return message

        inner = _with_headers(send, _pass_headers(d))

        async def send_(message: Message) -> None:
            nonlocal status
            t = message.get("type")
            if t == "http.response.start":
                status = int(message.get("status", 0))
            elif t == "http.response.body" and not message.get("more_body", False):
                # The response's last message: the slot is back before the caller sees its end.
                await give_back(status >= 500)
            await inner(message)

        returned = False
        try:
            await self.app(scope, receive_, send_)
            returned = True
        finally:
            beat.cancel()
            await give_back(not returned or status == 0 or status >= 500)

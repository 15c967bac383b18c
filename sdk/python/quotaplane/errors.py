"""Errors of the Quotaplane client, named in the API's terms.

A denial is never an error: ``check`` and ``reserve`` return a result whose
``allowed`` is False. An error is an answer that decided nothing (a problem document
of the API: :class:`BadRequest`, :class:`Unauthorized`, ...), a Quotaplane that gave no
decision within the call's budget (:class:`Unavailable`, what a fail policy decides
on), or a configuration no retry mends (:class:`ConfigurationError`). No exception of
the HTTP library underneath escapes the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from .models import Reservation


@dataclass(frozen=True)
class FieldError:
    """A field of the request, by its path (``checks[3].cost``), and what is wrong with it."""

    field: str
    message: str


@dataclass(frozen=True)
class Problem:
    """An RFC 9457 problem document, as the API answers every error."""

    type: str = "about:blank"
    title: str = ""
    status: int = 0
    detail: str = ""
    errors: tuple[FieldError, ...] = ()
    #: On a 429 of the admin rate limit, the exceeded RateLimit-Policy item.
    violated_policies: tuple[str, ...] = ()
    #: Every member of the document, as sent (extensions included).
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, doc: Any, status: int, body: bytes = b"") -> "Problem":
        """The problem of an answer's body, or one made of the status and the body's start."""
        if isinstance(doc, dict) and isinstance(doc.get("status"), int) and doc.get("status"):
            errs = tuple(
                FieldError(str(e.get("field", "")), str(e.get("message", "")))
                for e in doc.get("errors") or ()
                if isinstance(e, dict)
            )
            vp = doc.get("violated-policies") or ()
            return cls(
                type=str(doc.get("type") or "about:blank"),
                title=str(doc.get("title") or ""),
                status=int(doc["status"]),
                detail=str(doc.get("detail") or ""),
                errors=errs,
                violated_policies=tuple(str(v) for v in vp),
                raw=doc,
            )
        detail = body.decode("utf-8", "replace").strip()
        if len(detail) > 200:
            detail = detail[:200] + "..."
        return cls(title=_REASONS.get(status, ""), status=status, detail=detail)


_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class QuotaplaneError(Exception):
    """The base of every error of the client.

    ``status`` is the HTTP status of the answer (None when there was none),
    ``problem`` its problem document, ``retry_after`` its Retry-After in seconds.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        problem: Problem | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem
        self.retry_after = retry_after


class BadRequest(QuotaplaneError):
    """400: the request is malformed or invalid; ``problem.errors`` names the fields."""


class Unauthorized(QuotaplaneError):
    """401: the key is missing, unknown or revoked."""


class Forbidden(QuotaplaneError):
    """403: the key lacks the scope, or belongs to another org."""


class NotFound(QuotaplaneError):
    """404: no such object (including any object of another org)."""


class Conflict(QuotaplaneError):
    """409: the object exists already, or a reservation is settled or expired."""


class Unprocessable(QuotaplaneError):
    """422: a valid request that breaks a rule (an unknown metric, a reused idempotency key)."""


class TooManyRequests(QuotaplaneError):
    """429 of a call that is not a decision (the admin rate limit); a check's 429 is a result."""


class ServerError(QuotaplaneError):
    """A 5xx answer. The client retries these; :class:`Unavailable` carries the last one."""


class Unavailable(QuotaplaneError):
    """No decision: Quotaplane could not be reached, or answered 5xx, on every attempt,
    or the call's budget ran out (a Retry-After past it ends the call at once).

    This is what a fail policy decides on. ``status`` and ``problem`` are the last
    answer's when there was one (a 503: Redis down under a plan that fails closed);
    ``attempts`` is how many were made.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        problem: Problem | None = None,
        retry_after: float | None = None,
        attempts: int = 0,
    ) -> None:
        super().__init__(message, status=status, problem=problem, retry_after=retry_after)
        self.attempts = attempts


class ConfigurationError(QuotaplaneError):
    """An error no retry mends and no fail policy should hide: a base URL that is not
    http(s), a certificate that does not verify, a TLS handshake refused, a host name
    that does not exist. Such a call is tried once."""


class QuotaExceeded(QuotaplaneError):
    """Raised on entering a ``with client.reserve(...)`` block whose reservation was
    denied, so the block never runs without its units. ``reservation`` is the denied
    result (``blocked_at``, ``retry_after``). A plain ``reserve()`` call never raises
    it: it returns that result."""

    def __init__(self, reservation: "Reservation | Any") -> None:
        ref = reservation.blocked_at
        where = f" at {ref.level} {ref.id} ({ref.window})" if ref is not None else ""
        wait = f"; retry after {reservation.retry_after:g} s" if reservation.retry_after else ""
        super().__init__(
            f"quotaplane: reservation denied{where}{wait}",
            status=429 if not reservation.not_decided else None,
            retry_after=reservation.retry_after,
        )
        self.reservation = reservation


_BY_STATUS: dict[int, type[QuotaplaneError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Unprocessable,
    429: TooManyRequests,
}


def error_of(status: int, problem: Problem, retry_after: float | None) -> QuotaplaneError:
    """The exception of an answer that decided nothing."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else QuotaplaneError)
    msg = f"quotaplane: {status} {problem.title}".rstrip()
    if problem.detail:
        msg += ": " + problem.detail
    return cls(msg, status=status, problem=problem, retry_after=retry_after)


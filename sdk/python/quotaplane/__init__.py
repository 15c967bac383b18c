"""Quotaplane's Python client: checks, batches, reservations and entitlements over
httpx, sync (:class:`Client`) and async (:class:`AsyncClient`), with a budget per
call, retries that never count twice, Retry-After honoured and a fail policy for when
Quotaplane cannot decide. A refusal is a result (``allowed`` False), never an
exception; errors are named in the API's terms (:mod:`quotaplane.errors`).
"""

from ._core import FAIL_CLOSED, FAIL_OPEN, FailPolicy
from ._version import USER_AGENT, __version__
from .aio import AsyncClient, AsyncReservation
from .client import Client, Reservation
from .errors import (
    BadRequest,
    ConfigurationError,
    Conflict,
    FieldError,
    Forbidden,
    NotFound,
    Problem,
    QuotaExceeded,
    QuotaplaneError,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    Unprocessable,
)
from .models import (
    AttemptInfo,
    CheckRequest,
    CheckResult,
    DecisionInfo,
    Entitlements,
    Hooks,
    Level,
    LevelRef,
    ReservationData,
    ReservationMetric,
    RetryInfo,
    new_idempotency_key,
)
from .ratelimit import Policy, RateLimit, format_policies

__all__ = [
    "AsyncClient",
    "AsyncReservation",
    "AttemptInfo",
    "BadRequest",
    "CheckRequest",
    "CheckResult",
    "Client",
    "ConfigurationError",
    "Conflict",
    "DecisionInfo",
    "Entitlements",
    "FAIL_CLOSED",
    "FAIL_OPEN",
    "FailPolicy",
    "FieldError",
    "Forbidden",
    "Hooks",
    "Level",
    "LevelRef",
    "NotFound",
    "Policy",
    "Problem",
    "QuotaExceeded",
    "QuotaplaneError",
    "RateLimit",
    "Reservation",
    "ReservationData",
    "ReservationMetric",
    "RetryInfo",
    "ServerError",
    "TooManyRequests",
    "USER_AGENT",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "__version__",
    "format_policies",
    "new_idempotency_key",
]

# The integrations, as submodules: quotaplane.asgi (middleware), quotaplane.llm (model
# calls) and quotaplane.webhook (signature verification).
from . import asgi, llm, webhook  # noqa: E402

__all__ += ["asgi", "llm", "webhook"]

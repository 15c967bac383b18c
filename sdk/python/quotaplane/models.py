"""The requests and results of the client: checks, levels, reservations, entitlements."""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

from .ratelimit import Policy, RateLimit

if TYPE_CHECKING:
    from .errors import Unavailable

#: Units: one number for a one-metric reservation, or units per metric.
Units = Union[int, Mapping[str, int]]

#: The states of a reservation.
HELD, COMMITTED, RELEASED, EXPIRED = "held", "committed", "released", "expired"


def new_idempotency_key() -> str:
    """A fresh random idempotency key (``qpc_`` and 32 hex digits), as the client
    generates for a check or reservation that has none."""
    return "qpc_" + secrets.token_hex(16)


_FRACTION = re.compile(r"\.(\d+)")


def parse_time(s: Any) -> datetime | None:
    """An RFC 3339 time of the API (``Z`` or an offset, up to nanoseconds), aware; None when absent."""
    if not isinstance(s, str) or not s:
        return None
    t = s.strip().replace("z", "Z")
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    t = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], t, count=1)
    try:
        d = datetime.fromisoformat(t)
    except ValueError:
        return None
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class CheckRequest:
    """A check (POST /v1/check), as ``check`` takes it by keywords and ``check_batch``
    in a list; also what a fail policy is given (a reservation's as a check of its
    amount). ``cost`` None is the API's default (1), 0 only queries; ``costs`` names
    several metrics decided all or nothing and replaces ``metric`` and ``cost``."""

    org: str
    team: str | None = None
    user: str | None = None
    metric: str | None = None
    cost: int | None = None
    costs: Mapping[str, int] | None = None
    idempotency_key: str | None = None

    @property
    def query(self) -> bool:
        """Whether the check counts nothing (cost 0, or every cost 0)."""
        if self.costs is not None:
            return all(v == 0 for v in self.costs.values())
        return self.cost == 0

    def body(self) -> dict[str, Any]:
        """The request as the API reads it, without an idempotency key of its own."""
        b: dict[str, Any] = {"org": self.org}
        for k in ("team", "user", "metric", "cost"):
            v = getattr(self, k)
            if v is not None:
                b[k] = v
        if self.costs is not None:
            b["costs"] = dict(self.costs)
        if self.idempotency_key is not None:
            b["idempotency_key"] = self.idempotency_key
        return b


def as_check_request(c: "CheckRequest | Mapping[str, Any]") -> CheckRequest:
    """A batch's item as a CheckRequest (a mapping takes check's keyword names)."""
    if isinstance(c, CheckRequest):
        return c
    return CheckRequest(**dict(c))


def with_key(req: CheckRequest) -> CheckRequest:
    """req with an idempotency key: its own, or a fresh one unless it only queries."""
    if req.idempotency_key is not None or req.query:
        return req
    return CheckRequest(req.org, req.team, req.user, req.metric, req.cost, req.costs, new_idempotency_key())


@dataclass(frozen=True)
class Level:
    """The state of one level and window of a check, after it. ``burst`` is a token
    bucket's size (``limit`` is then its rate per ``window``, ``remaining`` the whole
    tokens in it now and ``reset_at`` when it is full again), None for any other limit."""

    level: str
    id: str
    window: str
    limit: int
    used: int
    remaining: int
    reset_at: datetime
    metric: str | None = None
    burst: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Level":
        return cls(
            level=str(d.get("level", "")),
            id=str(d.get("id", "")),
            window=str(d.get("window", "")),
            limit=int(d.get("limit") or 0),
            used=int(d.get("used") or 0),
            remaining=int(d.get("remaining") or 0),
            reset_at=parse_time(d.get("reset_at")) or datetime.fromtimestamp(0, timezone.utc),
            metric=d.get("metric") or None,
            burst=int(d["burst"]) if d.get("burst") else None,
        )


@dataclass(frozen=True)
class LevelRef:
    """Names a level and window, and the metric of its limit (``blocked_at``, ``would_block``)."""

    level: str
    id: str
    window: str
    metric: str | None = None

    @classmethod
    def from_json(cls, d: Any) -> "LevelRef | None":
        if not isinstance(d, dict):
            return None
        return cls(str(d.get("level", "")), str(d.get("id", "")), str(d.get("window", "")), d.get("metric") or None)

    def matches(self, lv: Level) -> bool:
        """Whether lv is the level and window this names (and its metric, when both name one)."""
        return (
            lv.level == self.level
            and lv.id == self.id
            and lv.window == self.window
            and (self.metric is None or lv.metric is None or lv.metric == self.metric)
        )


def tightest(levels: list[Level], allowed: bool, blocked: LevelRef | None, retry_after: float | None, now: datetime) -> RateLimit:
    """The RateLimit of levels as the API computes its headers: of an allowed check,
    the level and window with the least remaining, then the soonest reset; of a denied
    one, the level and window that refused it, with its retry-after as reset."""
    if not levels:
        return RateLimit()
    t = levels[0]
    for lv in levels[1:]:
        if lv.remaining < t.remaining or (lv.remaining == t.remaining and lv.reset_at < t.reset_at):
            t = lv
    reset = float(math.ceil((t.reset_at - now).total_seconds()))
    if not allowed and blocked is not None:
        t = next((lv for lv in levels if blocked.matches(lv)), t)
        reset = retry_after or 0.0
    return RateLimit(limit=t.limit, remaining=max(t.remaining, 0), reset=max(reset, 0.0))


@dataclass
class CheckResult:
    """Quotaplane's decision of a check, or the fail policy's (``not_decided``).

    A denial is a result: ``allowed`` False, with ``blocked_at`` (the level and
    window that refused) and ``retry_after`` (seconds until the same check may pass;
    None when it never can: a cost above a token bucket's burst). ``rate_limit`` is
    the tightest level and window, as the answer's RateLimit fields say, for a
    service's own headers; ``policies`` its RateLimit-Policy items.
    """

    allowed: bool
    mode: str = ""
    levels: list[Level] = field(default_factory=list)
    blocked_at: LevelRef | None = None
    retry_after: float | None = None
    rate_limit: RateLimit = field(default_factory=RateLimit)
    policies: list[Policy] = field(default_factory=list)
    violated_policies: list[str] = field(default_factory=list)
    #: The first decision of this idempotency key, counted then.
    replayed: bool = False
    #: Decided without Redis, under the plan's fail mode.
    degraded: bool = False
    #: Shadow and warn modes: the level that would have denied.
    would_block: LevelRef | None = None
    #: Warn mode: what would have denied.
    warning: str = ""
    #: The region that decided, when the api runs in several.
    region: str | None = None
    #: The key the check was sent with (the caller's or one generated for the call).
    idempotency_key: str | None = None
    #: Quotaplane did not decide: the client's fail policy did, ``cause`` says why.
    not_decided: bool = False
    cause: "Unavailable | None" = None
    #: Decided in this process from a client lease (``leases=True``), nothing sent:
    #: ``levels`` are then those of the lease's answer, its units counted as used.
    leased: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any], key: str | None, now: datetime) -> "CheckResult":
        ras = d.get("retry_after_seconds")
        res = cls(
            allowed=bool(d.get("allowed")),
            mode=str(d.get("mode") or ""),
            levels=[Level.from_json(lv) for lv in d.get("levels") or () if isinstance(lv, dict)],
            blocked_at=LevelRef.from_json(d.get("blocked_at")),
            retry_after=float(ras) if isinstance(ras, (int, float)) and not isinstance(ras, bool) else None,
            violated_policies=[str(v) for v in d.get("violated-policies") or ()],
            replayed=bool(d.get("replayed")),
            degraded=bool(d.get("degraded")),
            would_block=LevelRef.from_json(d.get("would_block")),
            warning=str(d.get("warning") or ""),
            region=d.get("region") or None,
            idempotency_key=key,
        )
        res.rate_limit = tightest(res.levels, res.allowed, res.blocked_at, res.retry_after, now)
        return res


@dataclass
class ReservationMetric:
    """One metric of a reservation of several (once settled: used, released, over_reserved)."""

    metric: str
    amount: int
    used: int = 0
    released: int = 0
    over_reserved: int = 0


@dataclass
class ReservationData:
    """A reservation's state, as reserve, commit, release, extend and get answer it.

    ``allowed`` is False when the units could not be held (a 429, as a denied check:
    nothing held), with ``blocked_at`` and ``retry_after``. ``not_decided`` is set
    when Quotaplane did not answer and the fail policy decided: such a reservation has
    no id, nothing to commit or release. Of a reservation of several metrics,
    ``amounts`` maps each to its units and ``metrics`` lists each one's figures.

    ``used`` is what the work used: set it inside a ``with`` block (a number, or units
    per metric) and the block's end commits it; once committed it is what was counted.
    """

    id: str = ""
    state: str = ""
    allowed: bool = True
    org: str = ""
    team: str = ""
    user: str = ""
    metric: str = ""
    amount: int = 0
    amounts: dict[str, int] | None = None
    expires_at: datetime | None = None
    on_expiry: str = ""
    ttl: float | None = None
    used: Units | None = None
    released: int = 0
    over_reserved: int = 0
    metrics: list[ReservationMetric] = field(default_factory=list)
    settled_at: datetime | None = None
    levels: list[Level] = field(default_factory=list)
    replayed: bool = False
    blocked_at: LevelRef | None = None
    retry_after: float | None = None
    rate_limit: RateLimit = field(default_factory=RateLimit)
    policies: list[Policy] = field(default_factory=list)
    violated_policies: list[str] = field(default_factory=list)
    idempotency_key: str | None = None
    not_decided: bool = False
    cause: "Unavailable | None" = None

    def _update(self, d: Mapping[str, Any]) -> None:
        """Takes the fields of an answer of the API."""
        self.id = str(d.get("id") or self.id)
        state = str(d.get("state") or self.state)
        if self.settled and state == HELD:
            return  # a heartbeat's answer that crossed the settlement: the settlement holds
        self.state = state
        for k in ("org", "team", "user", "metric", "on_expiry"):
            if d.get(k):
                setattr(self, k, str(d[k]))
        if isinstance(d.get("amount"), int):
            self.amount = d["amount"]
        self.expires_at = parse_time(d.get("expires_at")) or self.expires_at
        self.settled_at = parse_time(d.get("settled_at")) or self.settled_at
        if d.get("levels"):
            self.levels = [Level.from_json(lv) for lv in d["levels"] if isinstance(lv, dict)]
        self.replayed = bool(d.get("replayed")) or self.replayed
        ms = d.get("metrics")
        if isinstance(ms, list) and ms:
            self.metrics = [
                ReservationMetric(
                    metric=str(m.get("metric", "")),
                    amount=int(m.get("amount") or 0),
                    used=int(m.get("used") or 0),
                    released=int(m.get("released") or 0),
                    over_reserved=int(m.get("over_reserved") or 0),
                )
                for m in ms
                if isinstance(m, dict)
            ]
            self.amounts = {m.metric: m.amount for m in self.metrics}
        if self.state in (COMMITTED, RELEASED, EXPIRED):
            if self.metrics:
                self.used = {m.metric: m.used for m in self.metrics}
                self.released = sum(m.released for m in self.metrics)
                self.over_reserved = sum(m.over_reserved for m in self.metrics)
            elif self.amounts and isinstance(d.get("used"), int):
                self.used = {self.metric or next(iter(self.amounts)): int(d["used"])}
            else:
                self.used = _units(d.get("used"))
                self.released = _total(d.get("released"))
                self.over_reserved = _total(d.get("over_reserved"))

    @property
    def settled(self) -> bool:
        """Whether the reservation is committed, released or expired."""
        return self.state in (COMMITTED, RELEASED, EXPIRED)


def _units(v: Any) -> Units:
    if isinstance(v, dict):
        return {str(k): int(n) for k, n in v.items()}
    return int(v or 0)


def _total(v: Any) -> int:
    if isinstance(v, dict):
        return sum(int(n) for n in v.values())
    return int(v or 0)


@dataclass(frozen=True)
class Entitlements:
    """An org's resolved features (GET /v1/entitlements): its plan's, with the
    operator's overrides for the org applied. ``features`` maps a name to a bool, an
    int or a str; ``sources`` says where each comes from (``plan`` or ``org``)."""

    org: str
    team: str = ""
    user: str = ""
    features: Mapping[str, bool | int | str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def feature(self, name: str) -> bool | int | str | None:
        """The value of feature name, None when the org does not have it."""
        return self.features.get(name)

    def entitled(self, name: str) -> bool:
        """Whether the org has feature name: present and not False, 0 or ""."""
        v = self.features.get(name)
        return bool(v) if isinstance(v, (bool, int, str)) else False


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt of a call (``on_attempt``): ``n`` is 1 for the first; ``status``
    the answer's (None when there was none, ``error`` then says why)."""

    method: str
    path: str
    n: int
    status: int | None
    error: str | None
    duration: float


@dataclass(frozen=True)
class RetryInfo:
    """A retry about to happen (``on_retry``): attempt ``n`` failed (``error``), the
    next comes after ``wait`` seconds, the answer's Retry-After when ``retry_after``."""

    method: str
    path: str
    n: int
    wait: float
    retry_after: bool
    error: str


@dataclass(frozen=True)
class DecisionInfo:
    """The decision of a check, an item of a batch or a reservation (``on_decision``):
    Quotaplane's, or the fail policy's (``not_decided``, ``cause``)."""

    op: str
    request: CheckRequest
    allowed: bool
    not_decided: bool = False
    cause: "Unavailable | None" = None
    mode: str = ""
    warning: str = ""
    #: Decided in this process from a client lease.
    leased: bool = False


@dataclass(frozen=True)
class Hooks:
    """Functions the client calls as a call goes, for metrics and tracing. They run
    on the caller's thread (or task), so they must be quick and must not block."""

    on_attempt: Callable[[AttemptInfo], None] | None = None
    on_retry: Callable[[RetryInfo], None] | None = None
    on_decision: Callable[[DecisionInfo], None] | None = None


def ttl_seconds(ttl: float | timedelta | None) -> int | None:
    """A TTL in whole seconds, rounded up (None: the API's default)."""
    if ttl is None:
        return None
    s = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    return max(int(math.ceil(s)), 1)

"""The synchronous client, and its reservations."""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import Any, Mapping, Sequence

import httpx

from . import _core
from ._core import FAIL_CLOSED, FailPolicy, Options, Reply
from .errors import Conflict, NotFound, QuotaExceeded, QuotaplaneError, Unavailable
from .models import (
    CheckRequest,
    CheckResult,
    Entitlements,
    Hooks,
    ReservationData,
    Units,
    as_check_request,
    with_key,
)

__all__ = ["Client", "Reservation"]


class Client:
    """A client of one Quotaplane API with one API key (an org key with the ``check``
    scope). Safe to share between threads; close it (or use it as a context manager)
    to close its connections.

    Every call has a budget, all its attempts together, waits included: ``budget``
    (seconds) for a check, a batch, a reservation and entitlements, ``settle_budget``
    for a commit, release, extend or read; each attempt ``timeout`` within it. A call
    is retried after a transport error or a 5xx answer (``retries`` times), after the
    answer's Retry-After when it has one, else after a random wait in [0, ``backoff``
    x 2^n] capped by ``max_backoff``; when the wait would pass the budget the call
    ends at once. A check or reservation is sent with an idempotency key (the caller's
    or one generated for the call), the same on every attempt, so a retry never counts
    twice.

    A check or reservation Quotaplane could not decide (unreachable, 5xx on every
    attempt, the budget spent) is decided by ``fail_policy``: :data:`FAIL_CLOSED`
    (the default), :data:`FAIL_OPEN`, or a function of the request and the
    :class:`~quotaplane.Unavailable` error; its result has ``not_decided`` set. With
    ``fail_policy=None`` such a call raises :class:`~quotaplane.Unavailable`.

    With ``leases=True``, a path (org, team, user, metric) whose checks in this
    process pass ``lease_threshold`` units a second is decided here from a lease the
    server sized: such a result has ``leased`` set and costs no request. A check of
    several metrics, a query (cost 0) or one with an idempotency key is never leased.
    The check that finds its path hot takes the lease, the one that closes a lease
    settles and renews it (a request each, as a check unleased would cost); a daemon
    thread settles each lease at its end, with what it admitted. :meth:`close` (and the ``with``
    block's end, and the interpreter's normal exit) settles every lease; a process
    that dies leaves its leases to expire, counted whole.

    With ``batch_wait`` (seconds), checks not decided from a lease that arrive within
    that wait of each other (from several threads) go out as one batch request of up
    to 100; each caller gets its own check's result or error, as alone (but no
    ``policies``: a batch has no RateLimit fields per item).
    """

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        budget: float | None = _core.DEFAULT_BUDGET,
        settle_budget: float | None = _core.DEFAULT_SETTLE_BUDGET,
        timeout: float = _core.DEFAULT_TIMEOUT,
        retries: int = _core.DEFAULT_RETRIES,
        backoff: float = _core.DEFAULT_BACKOFF,
        max_backoff: float = _core.DEFAULT_MAX_BACKOFF,
        fail_policy: FailPolicy | None = FAIL_CLOSED,
        hooks: Hooks | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.Client | None = None,
        leases: bool = False,
        lease_threshold: float = _core.DEFAULT_LEASE_THRESHOLD,
        batch_wait: float | None = None,
    ) -> None:
        self._opts = Options.make(
            base_url, key, budget=budget, settle_budget=settle_budget, timeout=timeout, retries=retries,
            backoff=backoff, max_backoff=max_backoff, fail_policy=fail_policy, hooks=hooks, headers=headers,
            leases=leases, lease_threshold=lease_threshold, batch_wait=batch_wait,
        )
        self._own = http_client is None
        self._http = http_client or httpx.Client()
        self._leases = _core.Leases(self._opts, threading.Lock()) if leases else None
        self._batches = _core.Coalescer(threading.Lock(), threading.Event) if batch_wait is not None else None
        self._batch_slots = threading.BoundedSemaphore(_core.BATCHES_IN_FLIGHT)
        self._keeper: threading.Thread | None = None
        self._keeper_lock = threading.Lock()
        self._stop = threading.Event()
        self._at_exit: Any = None
        if self._leases is not None:
            self._at_exit = _close_at_exit(weakref.ref(self))
            atexit.register(self._at_exit)

    @property
    def base_url(self) -> str:
        return self._opts.base

    def close(self) -> None:
        """Settles every lease (waiting for it up to ``settle_budget``) and closes the
        client's connections (not those of an ``http_client`` passed in)."""
        if self._leases is not None:
            self._settle_leases()
        if self._own:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _settle_leases(self) -> None:
        assert self._leases is not None
        if self._at_exit is not None:
            atexit.unregister(self._at_exit)
            self._at_exit = None
        bound = self._opts.settle_budget or _core.DEFAULT_SETTLE_BUDGET
        deadline = time.monotonic() + bound
        for job in self._leases.close():
            self._run(job)
        # A renewal in flight on another thread settles what it brings; a failed
        # settle is tried again by the clock: this thread does it, bounded.
        while self._leases.outstanding() and time.monotonic() < deadline:
            time.sleep(_core.LEASE_TICK / 10)
            for job in self._leases.due(time.monotonic()):
                self._run(job)
        self._stop.set()
        if self._leases.outstanding():
            _core.log.warning("quotaplane: leases still unsettled after %g s; Quotaplane counts them whole at their expiry", bound)

    # Leases: the check that finds its path hot takes the lease, and the one that closes
    # a lease settles (and renews) it, on the caller's thread; a daemon thread settles
    # leases at their end by the clock and tries failed settles again.

    def _leased(self, req: CheckRequest) -> CheckResult | None:
        assert self._leases is not None
        res, jobs = self._leases.admit(req, time.monotonic())
        if not jobs:
            return res
        self._keep()
        for job in jobs:
            self._run(job, self._opts.budget)
        if res is None:
            res, jobs = self._leases.admit(req, time.monotonic(), again=True)
            for job in jobs:
                self._run(job, self._opts.budget)
        return res

    def _keep(self) -> None:
        if self._keeper is not None:
            return
        with self._keeper_lock:
            if self._keeper is None and not self._stop.is_set():
                self._keeper = threading.Thread(target=_keeper, args=(weakref.ref(self), self._stop), name="quotaplane-leases", daemon=True)
                self._keeper.start()

    def _run(self, job: _core.LeaseJob, budget: float | None = None) -> None:
        """Sends job, and what its answer asks for next. A caller's thread sends within
        the check's budget; a failed settle is tried again by the clock."""
        assert self._leases is not None
        todo = [job]
        while todo:
            job = todo.pop()
            sent, b = job.start(self._opts, budget)
            reply: Reply | None = None
            err: BaseException | None = None
            try:
                reply = self._send("POST", job.url, job.body(), b)
            except Exception as e:  # the answer says what it means for the lease
                err = e
            todo.extend(self._leases.answer(job, sent, reply, err, time.monotonic()))

    def _send(self, method: str, path: str, body: Any, budget: float | None) -> Reply:
        att = _core.Attempts(self._opts, method, path, budget)
        content = _core.encode(body)
        headers = self._opts.request_headers(content is not None)
        while True:
            timeout = att.begin()
            reply: Reply | None = None
            err: BaseException | None = None
            try:
                r = self._http.request(method, self._opts.base + path, content=content, headers=headers, timeout=timeout)
                reply = _core.reply_of(r)
            except httpx.HTTPError as e:
                err = e
            step = att.after(reply, err)
            if isinstance(step, Reply):
                return step
            time.sleep(step)

    def _policy(self, req: CheckRequest, err: Unavailable) -> bool:
        p = self._opts.fail_policy
        if p is None:
            raise err
        out = p(req, err)
        if not isinstance(out, bool):
            raise TypeError("a fail policy of the sync Client returns a bool")
        return out

    def check(
        self,
        org: str,
        *,
        team: str | None = None,
        user: str | None = None,
        metric: str | None = None,
        cost: int | None = None,
        costs: Mapping[str, int] | None = None,
        idempotency_key: str | None = None,
    ) -> CheckResult:
        """Asks whether ``cost`` units of ``metric`` (or every metric of ``costs``, all
        or nothing) may be spent now by org, team and user, and counts them if so.

        A denial is a result (``allowed`` False, with ``retry_after`` and
        ``blocked_at``), never an exception. Raises a
        :class:`~quotaplane.QuotaplaneError` for an answer that decided nothing (400,
        401, 403, 404, 422), :class:`~quotaplane.ConfigurationError`, or
        :class:`~quotaplane.Unavailable` when nothing decided and ``fail_policy`` is None.
        """
        req = _core.check_request(org, team, user, metric, cost, costs, idempotency_key)
        if self._leases is not None and _core.leasable(req):
            res = self._leased(req)
            if res is not None:
                return res
        req = with_key(req)
        if self._batches is not None:
            return self._coalesced(req)
        return self._check_one(req)

    def _check_one(self, req: CheckRequest) -> CheckResult:
        try:
            r = self._send("POST", "/v1/check", req.body(), self._opts.budget)
        except Unavailable as e:
            return _core.undecided_check("check", req, e, self._policy(req, e), self._opts)
        return _core.check_answer(self._opts, req, r)

    def _coalesced(self, req: CheckRequest) -> CheckResult:
        """req in the open batch; its first check waits batch_wait (or until the batch
        is full) and a free batch slot, sends it and wakes the others."""
        assert self._batches is not None
        b, i, first = self._batches.join(req)
        if not first:
            b.done.wait()
        else:
            try:
                b.full.wait(self._opts.batch_wait)
                with self._batch_slots:
                    self._batches.seal(b)
                    if len(b.reqs) > 1:
                        try:
                            r = self._send("POST", "/v1/check/batch", _core.batch_body(b.reqs), self._opts.budget)
                            b.items = _core.batch_answer(self._opts, b.reqs, r, op="check")
                        except QuotaplaneError as e:
                            b.error = e
                if len(b.reqs) == 1:
                    return self._check_one(req)
            except BaseException as e:
                b.error = b.error or Unavailable(f"quotaplane unavailable: the batch was not sent: {e!r}")
                raise
            finally:
                b.done.set()
        out = _core.batch_item(b, i, req)
        if isinstance(out, CheckResult):
            return out
        if isinstance(out, Unavailable):
            return _core.undecided_check("check", req, out, self._policy(req, out), self._opts)
        return self._check_one(req)

    def check_batch(self, checks: Sequence[CheckRequest | Mapping[str, Any]]) -> list[CheckResult | QuotaplaneError]:
        """Decides up to 100 checks in one call, each on its own, in order. An item is
        a :class:`~quotaplane.CheckResult`, or the :class:`~quotaplane.QuotaplaneError`
        of an item the API refused (returned, not raised); an item it could not decide
        (5xx), or the whole batch when Quotaplane cannot be reached, goes to the fail
        policy. ``checks`` are :class:`~quotaplane.CheckRequest` or mappings of
        ``check``'s keyword names (and ``org``)."""
        reqs = [with_key(as_check_request(c)) for c in checks]
        try:
            r = self._send("POST", "/v1/check/batch", _core.batch_body(reqs), self._opts.budget)
        except Unavailable as e:
            return [_core.undecided_check("batch", q, e, self._policy(q, e), self._opts) for q in reqs]
        out: list[CheckResult | QuotaplaneError] = []
        for q, item in zip(reqs, _core.batch_answer(self._opts, reqs, r)):
            if isinstance(item, Unavailable) and self._opts.fail_policy is not None:
                out.append(_core.undecided_check("batch", q, item, self._policy(q, item), self._opts))
            else:
                out.append(item)
        return out

    def reserve(
        self,
        org: str,
        *,
        team: str | None = None,
        user: str | None = None,
        metric: str | None = None,
        amount: int | None = None,
        amounts: Mapping[str, int] | None = None,
        ttl: float | timedelta | None = None,
        on_expiry: str | None = None,
        idempotency_key: str | None = None,
    ) -> "Reservation":
        """Holds ``amount`` units of ``metric`` (or ``amounts``, units per metric, all
        or nothing) against every limit of every level until commit, release or the
        ``ttl`` (seconds; the API's default 60 s, 1 s to 1 h), when ``on_expiry``
        (``commit``, the API's default, or ``release``) settles it.

        Returns a :class:`Reservation`; one over quota has ``allowed`` False (nothing
        held), never an exception. It is also a context manager: see
        :class:`Reservation`. Errors as :meth:`check`'s."""
        body, check = _core.reserve_body(org, team, user, metric, amount, amounts, ttl, on_expiry, idempotency_key)
        res = Reservation(org=org, team=team or "", user=user or "", metric=metric or "", amount=amount or 0,
                          amounts=dict(amounts) if amounts is not None else None,
                          ttl=float(body.get("ttl_seconds", 60)), idempotency_key=check.idempotency_key)
        res._client = self
        try:
            r = self._send("POST", "/v1/reservations", body, self._opts.budget)
        except Unavailable as e:
            _core.undecided_reservation(res, check, e, self._policy(check, e), self._opts)
            return res
        _core.reserve_answer(self._opts, r, res, check)
        return res

    def _settle(self, method: str, path: str, body: Any, res: "Reservation | None" = None) -> "Reservation":
        r = self._send(method, path, body, self._opts.settle_budget)
        out = res if res is not None else Reservation()
        out._client = self
        _core.settle_answer(r, out)
        return out

    def commit(self, id: str, used: Units) -> "Reservation":
        """Counts ``used`` units of the held reservation ``id`` (a number, or units per
        metric of a reservation of several: a metric left out used 0) and gives back
        the rest; used over the amount is counted in full (``over_reserved``). A repeat
        answers the first commit again. Raises :class:`~quotaplane.Conflict` when the
        reservation was released or expired, :class:`~quotaplane.NotFound` when it is
        unknown (or another org's)."""
        return self._settle("POST", _core.reservation_path(id, "commit"), _core.commit_body(used))

    def release(self, id: str) -> "Reservation":
        """Gives back every unit of the held reservation ``id``."""
        return self._settle("DELETE", _core.reservation_path(id), None)

    def extend(self, id: str, ttl: float | timedelta) -> "Reservation":
        """Keeps the held reservation ``id`` for ``ttl`` seconds more from now (rounded
        up, 1 s to 1 h): a heartbeat of long work. Raises :class:`~quotaplane.Conflict`
        once it is settled or expired."""
        from .models import ttl_seconds

        return self._settle("POST", _core.reservation_path(id, "extend"), {"ttl_seconds": ttl_seconds(ttl)})

    def get_reservation(self, id: str) -> "Reservation":
        """The state of reservation ``id``: held, committed, released or expired."""
        return self._settle("GET", _core.reservation_path(id), None)

    def entitlements(self, org: str, team: str | None = None, user: str | None = None) -> Entitlements:
        """The resolved features of org for team and user (an unknown team is a
        :class:`~quotaplane.NotFound`). Quotaplane answers from its cache; the client
        does not cache."""
        return _core.entitlements_answer(self._send("GET", _core.entitlements_path(org, team, user), None, self._opts.budget))

    def feature(self, org: str, name: str, *, team: str | None = None, user: str | None = None) -> bool | int | str | None:
        """The value of feature ``name`` for org, team and user; None when the org does not have it."""
        return self.entitlements(org, team, user).feature(name)

    def entitled(self, org: str, name: str, *, team: str | None = None, user: str | None = None) -> bool:
        """Whether org (for team and user) has feature ``name``: present and not False, 0 or ""."""
        return self.entitlements(org, team, user).entitled(name)


def _keeper(ref: "weakref.ReferenceType[Client]", stop: threading.Event) -> None:
    """Settles a client's leases at their end and tries failed settles again, until
    the client is closed (or gone)."""
    while not stop.wait(_core.LEASE_TICK):
        c = ref()
        if c is None or c._leases is None:
            return
        for job in c._leases.due(time.monotonic()):
            c._run(job)
        del c


class _close_at_exit:
    """Settles a client's leases at the interpreter's normal exit, unless it is closed
    (or gone) before."""

    def __init__(self, ref: "weakref.ReferenceType[Client]") -> None:
        self.ref = ref

    def __call__(self) -> None:
        c = self.ref()
        if c is not None and c._leases is not None:
            c._settle_leases()


@dataclass
class Reservation(ReservationData):
    """A reservation of the sync :class:`Client` (see
    :class:`~quotaplane.models.ReservationData` for its fields).

    As a context manager (``with client.reserve(...) as r:``):

    - entering a denied reservation raises :class:`~quotaplane.QuotaExceeded` carrying
      it, so the block never runs without its units (a fail policy's allowed
      reservation runs the block, with nothing to settle);
    - the block sets ``r.used`` (a number, or units per metric) to what the work used;
      its end commits that, or the whole amount when it was not set (what the block
      used is unknown); ``r.commit(...)`` or ``r.release()`` inside the block settles
      at once instead;
    - an exception releases the reservation and propagates;
    - while the block runs, a thread extends the reservation every half of its TTL
      (``heartbeats`` counts the extensions), stopped before the block's end settles;
    - a commit at the block's end that fails raises (:class:`~quotaplane.Conflict` when
      the reservation expired meanwhile, :class:`~quotaplane.Unavailable` when
      Quotaplane could not be reached within ``settle_budget``); a release after an
      exception that fails is logged, and the block's exception propagates.
    """

    heartbeats: int = 0
    _client: Client | None = field(default=None, repr=False, compare=False)
    _stop: threading.Event | None = field(default=None, repr=False, compare=False)
    _beat: threading.Thread | None = field(default=None, repr=False, compare=False)

    def _bound(self) -> Client:
        if self._client is None:
            raise RuntimeError("quotaplane: this reservation belongs to no client")
        return self._client

    def commit(self, used: Units | None = None) -> "Reservation":
        """Commits ``used`` (else ``self.used`` when set, else the whole amount) and
        returns this reservation, settled. A reservation the fail policy allowed has
        nothing to commit: it is returned as it is."""
        if self.not_decided or not self.id:
            return self
        if used is None:
            used = self.used if self.used is not None else _core.whole(self)
        self.used = used
        return self._bound()._settle("POST", _core.reservation_path(self.id, "commit"), _core.commit_body(used), self)

    def release(self) -> "Reservation":
        """Gives back every unit held, and returns this reservation, released."""
        if self.not_decided or not self.id:
            return self
        return self._bound()._settle("DELETE", _core.reservation_path(self.id), None, self)

    def extend(self, ttl: float | timedelta | None = None) -> "Reservation":
        """Holds the reservation ``ttl`` seconds more from now (its own TTL by default)."""
        if self.not_decided or not self.id:
            return self
        from .models import ttl_seconds

        body = {"ttl_seconds": ttl_seconds(ttl if ttl is not None else self.ttl or 60)}
        return self._bound()._settle("POST", _core.reservation_path(self.id, "extend"), body, self)

    def _heartbeat(self, stop: threading.Event) -> None:
        interval = max((self.ttl or 60) / 2, 0.5)
        while not stop.wait(interval) and not self.settled:
            try:
                self.extend()
                self.heartbeats += 1
            except (Conflict, NotFound):
                return  # settled or gone: nothing left to keep
            except QuotaplaneError as e:
                _core.log.warning("quotaplane: heartbeat of reservation %s: %s", self.id, e)

    def __enter__(self) -> "Reservation":
        if not self.allowed:
            raise QuotaExceeded(self)
        if self.id and not self.not_decided and not self.settled:
            self._stop = threading.Event()
            self._beat = threading.Thread(target=self._heartbeat, args=(self._stop,), name=f"quotaplane-heartbeat-{self.id}", daemon=True)
            self._beat.start()
        return self

    def _stop_heartbeat(self) -> None:
        if self._stop is not None and self._beat is not None:
            self._stop.set()
            self._beat.join()
            self._stop = self._beat = None

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._stop_heartbeat()
        if self.settled or self.not_decided or not self.id:
            return
        if et is None:
            self.commit()
            return
        try:
            self.release()
        except QuotaplaneError as e:
            _core.log.warning("quotaplane: release of reservation %s after %s: %s", self.id, et.__name__, e)

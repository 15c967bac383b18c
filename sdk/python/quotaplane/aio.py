"""The asyncio client, and its reservations."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import Any, Awaitable, Callable, Generator, Mapping, Sequence

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
    ttl_seconds,
    with_key,
)

__all__ = ["AsyncClient", "AsyncReservation"]


class AsyncClient:
    """The asyncio twin of :class:`~quotaplane.Client`: the same options, the same
    calls as coroutines, the same behaviour (budget, retries, Retry-After, fail
    policy, errors). A fail policy may be a coroutine function too. Each attempt is
    bounded by what is left of the call's budget as a whole (connect, send and read
    together). Close it with ``await client.aclose()`` or ``async with``.

    ``leases`` and ``batch_wait`` as the sync client's: tasks of the event loop take,
    renew and settle the leases and send the batches; :meth:`aclose` settles every
    lease (a client never closed leaves its leases to expire, counted whole)."""

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
        http_client: httpx.AsyncClient | None = None,
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
        self._http = http_client or httpx.AsyncClient()
        # One event loop runs the client: nothing awaits between a lease's test and
        # its take, so the bookkeeping needs no lock.
        self._leases = _core.Leases(self._opts, contextlib.nullcontext()) if leases else None
        self._batches = _core.Coalescer(contextlib.nullcontext(), asyncio.Event) if batch_wait is not None else None
        self._batch_slots = asyncio.Semaphore(_core.BATCHES_IN_FLIGHT)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._keeper: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return self._opts.base

    async def aclose(self) -> None:
        """Settles every lease (waiting for it up to ``settle_budget``), waits for the
        batches in flight, and closes the client's connections (not those of an
        ``http_client`` passed in)."""
        if self._leases is not None:
            bound = self._opts.settle_budget or _core.DEFAULT_SETTLE_BUDGET
            deadline = time.monotonic() + bound
            await asyncio.gather(*(self._run(job) for job in self._leases.close()))
            # A renewal in flight in another task settles what it brings; a failed
            # settle is tried again by the clock: here, bounded.
            while self._leases.outstanding() and time.monotonic() < deadline:
                await asyncio.sleep(_core.LEASE_TICK / 10)
                await asyncio.gather(*(self._run(job) for job in self._leases.due(time.monotonic())))
            if self._leases.outstanding():
                _core.log.warning("quotaplane: leases still unsettled after %g s; Quotaplane counts them whole at their expiry", bound)
            if self._keeper is not None:
                self._keeper.cancel()
                await asyncio.gather(self._keeper, return_exceptions=True)
                self._keeper = None
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self._opts.settle_budget or _core.DEFAULT_SETTLE_BUDGET)
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # Leases: the check that finds its path hot takes the lease, and the one that closes
    # a lease settles (and renews) it, in the caller's task; a keeper task settles
    # leases at their end by the clock and tries failed settles again.

    async def _leased(self, req: CheckRequest) -> CheckResult | None:
        assert self._leases is not None
        res, jobs = self._leases.admit(req, time.monotonic())
        if not jobs:
            return res
        self._keep()
        for job in jobs:
            await self._run(job, self._opts.budget)
        if res is None:
            res, jobs = self._leases.admit(req, time.monotonic(), again=True)
            for job in jobs:
                await self._run(job, self._opts.budget)
        return res

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        t = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _keep(self) -> None:
        if self._keeper is None and self._leases is not None and not self._leases.closing:
            self._keeper = asyncio.get_running_loop().create_task(self._clock(), name="quotaplane-leases")

    async def _clock(self) -> None:
        assert self._leases is not None
        while True:
            await asyncio.sleep(_core.LEASE_TICK)
            for job in self._leases.due(time.monotonic()):
                self._spawn(self._run(job), "quotaplane-lease-settle")

    async def _run(self, job: _core.LeaseJob, budget: float | None = None) -> None:
        """Sends job, and what its answer asks for next. A caller's task sends within
        the check's budget; a failed settle is tried again by the clock."""
        assert self._leases is not None
        todo = [job]
        while todo:
            job = todo.pop()
            sent, b = job.start(self._opts, budget)
            reply: Reply | None = None
            err: BaseException | None = None
            try:
                reply = await self._send("POST", job.url, job.body(), b)
            except Exception as e:  # the answer says what it means for the lease
                err = e
            todo.extend(self._leases.answer(job, sent, reply, err, time.monotonic()))

    async def _send(self, method: str, path: str, body: Any, budget: float | None) -> Reply:
        att = _core.Attempts(self._opts, method, path, budget)
        content = _core.encode(body)
        headers = self._opts.request_headers(content is not None)
        while True:
            timeout = att.begin()
            reply: Reply | None = None
            err: BaseException | None = None
            try:
                r = await asyncio.wait_for(
                    self._http.request(method, self._opts.base + path, content=content, headers=headers, timeout=timeout),
                    timeout,
                )
                reply = _core.reply_of(r)
            except asyncio.TimeoutError as e:
                err = httpx.TimeoutException(f"no answer within {timeout:.3f} s")
                err.__cause__ = e
            except httpx.HTTPError as e:
                err = e
            step = att.after(reply, err)
            if isinstance(step, Reply):
                return step
            await asyncio.sleep(step)

    async def _policy(self, req: CheckRequest, err: Unavailable) -> bool:
        p = self._opts.fail_policy
        if p is None:
            raise err
        out = p(req, err)
        if inspect.isawaitable(out):
            out = await out
        return bool(out)

    async def check(
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
        """As :meth:`quotaplane.Client.check`."""
        req = _core.check_request(org, team, user, metric, cost, costs, idempotency_key)
        if self._leases is not None and _core.leasable(req):
            res = await self._leased(req)
            if res is not None:
                return res
        req = with_key(req)
        if self._batches is not None:
            return await self._coalesced(req)
        return await self._check_one(req)

    async def _check_one(self, req: CheckRequest) -> CheckResult:
        try:
            r = await self._send("POST", "/v1/check", req.body(), self._opts.budget)
        except Unavailable as e:
            return _core.undecided_check("check", req, e, await self._policy(req, e), self._opts)
        return _core.check_answer(self._opts, req, r)

    async def _coalesced(self, req: CheckRequest) -> CheckResult:
        """req in the open batch; a task of its own (not a caller, which may be
        cancelled) sends the batch after batch_wait or once it is full, when a batch
        slot is free."""
        assert self._batches is not None
        b, i, first = self._batches.join(req)
        if first:
            self._spawn(self._flush(b), "quotaplane-batch")
        await b.done.wait()
        if b.items is None and b.error is None:  # a batch of one: sent as a single check
            return await self._check_one(req)
        out = _core.batch_item(b, i, req)
        if isinstance(out, CheckResult):
            return out
        if isinstance(out, Unavailable):
            return _core.undecided_check("check", req, out, await self._policy(req, out), self._opts)
        return await self._check_one(req)

    async def _flush(self, b: _core.Batch) -> None:
        assert self._batches is not None
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(b.full.wait(), self._opts.batch_wait)
            async with self._batch_slots:
                self._batches.seal(b)
                if len(b.reqs) > 1:
                    try:
                        r = await self._send("POST", "/v1/check/batch", _core.batch_body(b.reqs), self._opts.budget)
                        b.items = _core.batch_answer(self._opts, b.reqs, r, op="check")
                    except QuotaplaneError as e:
                        b.error = e
        except BaseException as e:
            b.error = b.error or Unavailable(f"quotaplane unavailable: the batch was not sent: {e!r}")
            raise
        finally:
            b.done.set()

    async def check_batch(self, checks: Sequence[CheckRequest | Mapping[str, Any]]) -> list[CheckResult | QuotaplaneError]:
        """As :meth:`quotaplane.Client.check_batch`."""
        reqs = [with_key(as_check_request(c)) for c in checks]
        try:
            r = await self._send("POST", "/v1/check/batch", _core.batch_body(reqs), self._opts.budget)
        except Unavailable as e:
            return [_core.undecided_check("batch", q, e, await self._policy(q, e), self._opts) for q in reqs]
        out: list[CheckResult | QuotaplaneError] = []
        for q, item in zip(reqs, _core.batch_answer(self._opts, reqs, r)):
            if isinstance(item, Unavailable) and self._opts.fail_policy is not None:
                out.append(_core.undecided_check("batch", q, item, await self._policy(q, item), self._opts))
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
    ) -> "ReserveCall":
        """As :meth:`quotaplane.Client.reserve`: ``await client.reserve(...)`` returns an
        :class:`AsyncReservation`; ``async with client.reserve(...) as r:`` reserves and
        enters it (see :class:`AsyncReservation`)."""

        async def call() -> AsyncReservation:
            body, check = _core.reserve_body(org, team, user, metric, amount, amounts, ttl, on_expiry, idempotency_key)
            res = AsyncReservation(org=org, team=team or "", user=user or "", metric=metric or "", amount=amount or 0,
                                   amounts=dict(amounts) if amounts is not None else None,
                                   ttl=float(body.get("ttl_seconds", 60)), idempotency_key=check.idempotency_key)
            res._client = self
            try:
                r = await self._send("POST", "/v1/reservations", body, self._opts.budget)
            except Unavailable as e:
                _core.undecided_reservation(res, check, e, await self._policy(check, e), self._opts)
                return res
            _core.reserve_answer(self._opts, r, res, check)
            return res

        return ReserveCall(call)

    async def _settle(self, method: str, path: str, body: Any, res: "AsyncReservation | None" = None) -> "AsyncReservation":
        r = await self._send(method, path, body, self._opts.settle_budget)
        out = res if res is not None else AsyncReservation()
        out._client = self
        _core.settle_answer(r, out)
        return out

    async def commit(self, id: str, used: Units) -> "AsyncReservation":
        """As :meth:`quotaplane.Client.commit`."""
        return await self._settle("POST", _core.reservation_path(id, "commit"), _core.commit_body(used))

    async def release(self, id: str) -> "AsyncReservation":
        """As :meth:`quotaplane.Client.release`."""
        return await self._settle("DELETE", _core.reservation_path(id), None)

    async def extend(self, id: str, ttl: float | timedelta) -> "AsyncReservation":
        """As :meth:`quotaplane.Client.extend`."""
        return await self._settle("POST", _core.reservation_path(id, "extend"), {"ttl_seconds": ttl_seconds(ttl)})

    async def get_reservation(self, id: str) -> "AsyncReservation":
        """As :meth:`quotaplane.Client.get_reservation`."""
        return await self._settle("GET", _core.reservation_path(id), None)

    async def entitlements(self, org: str, team: str | None = None, user: str | None = None) -> Entitlements:
        """As :meth:`quotaplane.Client.entitlements`."""
        r = await self._send("GET", _core.entitlements_path(org, team, user), None, self._opts.budget)
        return _core.entitlements_answer(r)

    async def feature(self, org: str, name: str, *, team: str | None = None, user: str | None = None) -> bool | int | str | None:
        """As :meth:`quotaplane.Client.feature`."""
        return (await self.entitlements(org, team, user)).feature(name)

    async def entitled(self, org: str, name: str, *, team: str | None = None, user: str | None = None) -> bool:
        """As :meth:`quotaplane.Client.entitled`."""
        return (await self.entitlements(org, team, user)).entitled(name)


class ReserveCall:
    """What :meth:`AsyncClient.reserve` returns: awaitable (the reservation) and an
    async context manager (reserves, then enters the reservation)."""

    def __init__(self, call: Callable[[], Awaitable["AsyncReservation"]]) -> None:
        self._call = call
        self._res: AsyncReservation | None = None

    def __await__(self) -> Generator[Any, None, "AsyncReservation"]:
        return self._call().__await__()

    async def __aenter__(self) -> "AsyncReservation":
        self._res = await self._call()
        return await self._res.__aenter__()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._res is not None:
            await self._res.__aexit__(et, ev, tb)


@dataclass
class AsyncReservation(ReservationData):
    """A reservation of the :class:`AsyncClient`: as :class:`quotaplane.Reservation`,
    with coroutine methods, and ``async with`` for the context manager (its heartbeat
    is an asyncio task)."""

    heartbeats: int = 0
    _client: AsyncClient | None = field(default=None, repr=False, compare=False)
    _beat: "asyncio.Task[None] | None" = field(default=None, repr=False, compare=False)

    def _bound(self) -> AsyncClient:
        if self._client is None:
            raise RuntimeError("quotaplane: this reservation belongs to no client")
        return self._client

    async def commit(self, used: Units | None = None) -> "AsyncReservation":
        """As :meth:`quotaplane.Reservation.commit`."""
        if self.not_decided or not self.id:
            return self
        if used is None:
            used = self.used if self.used is not None else _core.whole(self)
        self.used = used
        return await self._bound()._settle("POST", _core.reservation_path(self.id, "commit"), _core.commit_body(used), self)

    async def release(self) -> "AsyncReservation":
        """As :meth:`quotaplane.Reservation.release`."""
        if self.not_decided or not self.id:
            return self
        return await self._bound()._settle("DELETE", _core.reservation_path(self.id), None, self)

    async def extend(self, ttl: float | timedelta | None = None) -> "AsyncReservation":
        """As :meth:`quotaplane.Reservation.extend`."""
        if self.not_decided or not self.id:
            return self
        body = {"ttl_seconds": ttl_seconds(ttl if ttl is not None else self.ttl or 60)}
        return await self._bound()._settle("POST", _core.reservation_path(self.id, "extend"), body, self)

    async def _heartbeat(self) -> None:
        interval = max((self.ttl or 60) / 2, 0.5)
        while True:
            await asyncio.sleep(interval)
            if self.settled:
                return
            try:
                await self.extend()
                self.heartbeats += 1
            except (Conflict, NotFound):
                return
            except QuotaplaneError as e:
                _core.log.warning("quotaplane: heartbeat of reservation %s: %s", self.id, e)

    async def __aenter__(self) -> "AsyncReservation":
        if not self.allowed:
            raise QuotaExceeded(self)
        if self.id and not self.not_decided and not self.settled:
            self._beat = asyncio.get_running_loop().create_task(self._heartbeat(), name=f"quotaplane-heartbeat-{self.id}")
        return self

    async def _stop_heartbeat(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            # gather returns the heartbeat's CancelledError; a cancellation of this task
            # itself still propagates.
            await asyncio.gather(self._beat, return_exceptions=True)
            self._beat = None

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        await self._stop_heartbeat()
        if self.settled or self.not_decided or not self.id:
            return
        if et is None:
            await self.commit()
            return
        try:
            await self.release()
        except QuotaplaneError as e:
            _core.log.warning("quotaplane: release of reservation %s after %s: %s", self.id, et.__name__, e)

"""Reserve tokens before a model call, commit the real usage after.

:func:`metered` wraps a function that calls a model (the OpenAI or Anthropic SDK's
``create``, an HTTP call of your own, a LiteLLM completion) so that every call:

1. reserves an estimate of its tokens (by default the prompt's estimate plus the
   call's ``max_tokens``), and, with ``slot``, one unit of a request metric (a slot
   under a ``concurrent`` limit), all or nothing; a denied reservation raises
   :class:`~quotaplane.QuotaExceeded` (``retry_after``, ``blocked_at``) and the model
   is never called;
2. calls the function, while the reservation is extended in the background (a long
   call keeps it);
3. commits what the response's ``usage`` says (OpenAI's ``prompt_tokens`` and
   ``completion_tokens``, Anthropic's ``input_tokens`` and ``output_tokens``), which
   gives the rest of the estimate back; a call that raises releases everything.

A streamed response (the function returns an iterator, or an async iterator, of
chunks) is handed back wrapped: it yields the same chunks and counts them, and
commits once, when the stream ends, raises, or the consumer stops early (``close()``
or ``aclose()``, leaving a ``with`` block, a ``break`` whose stream is then dropped):
the final chunk's usage when the stream got that far (OpenAI's
``stream_options={"include_usage": True}``, Anthropic's ``message_delta``), else the
prompt (its usage when a chunk said it, its estimate otherwise) plus what the chunks
streamed so far (``count_chunk``). The reservation is never leaked: one whose process
dies is settled by its ``on_expiry`` at the end of its ttl.

Sync functions take a :class:`~quotaplane.Client`, coroutine functions an
:class:`~quotaplane.AsyncClient`::

    ask = metered(qp, org="acme", user=lambda **kw: kw["user"], slot="requests")(
        openai.chat.completions.create)
    reply = ask(model="gpt-4o-mini", messages=[...], max_tokens=256, user="alice")
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, TypeVar, Union

from .errors import QuotaplaneError

__all__ = [
    "AsyncMeteredStream",
    "MeteredStream",
    "Settled",
    "TokenUsage",
    "approx_tokens",
    "chunk_tokens",
    "estimate_prompt_tokens",
    "max_output_tokens",
    "metered",
    "usage_of",
]

log = logging.getLogger("quotaplane.llm")

F = TypeVar("F", bound=Callable[..., Any])
Units = Union[int, Mapping[str, int]]


@dataclass(frozen=True)
class TokenUsage:
    """The tokens of a model call, as its ``usage`` says them: ``input_tokens``
    (OpenAI's ``prompt_tokens``), ``output_tokens`` (``completion_tokens``) and
    ``total_tokens`` when the response gives it; None for what it does not say."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None

    @property
    def total(self) -> int:
        """``total_tokens`` when given, else input plus output."""
        if self.total_tokens is not None:
            return self.total_tokens
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    def merged(self, later: "TokenUsage") -> "TokenUsage":
        """This usage with what a later chunk of the same stream says instead (a stream
        tells its usage in parts: Anthropic's input in ``message_start``, its output,
        growing, in ``message_delta``)."""
        return TokenUsage(
            later.input_tokens if later.input_tokens is not None else self.input_tokens,
            later.output_tokens if later.output_tokens is not None else self.output_tokens,
            later.total_tokens if later.total_tokens is not None else self.total_tokens,
        )


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def usage_of(obj: Any) -> TokenUsage | None:
    """The default ``usage``: the token usage of a response or a streamed chunk (an
    object or a dict), None when it says none. It reads ``usage`` (OpenAI's
    ``prompt_tokens``, ``completion_tokens``, ``total_tokens``; Anthropic's
    ``input_tokens``, ``output_tokens``), or the ``message.usage`` of Anthropic's
    ``message_start`` event."""
    u = _get(obj, "usage")
    if u is None:
        u = _get(_get(obj, "message"), "usage")
    if u is None:
        return None
    inp = _int(_get(u, "prompt_tokens"))
    if inp is None:
        inp = _int(_get(u, "input_tokens"))
    out = _int(_get(u, "completion_tokens"))
    if out is None:
        out = _int(_get(u, "output_tokens"))
    total = _int(_get(u, "total_tokens"))
    if inp is None and out is None and total is None:
        return None
    return TokenUsage(inp, out, total)


def approx_tokens(text: str) -> int:
    """A rough token count of text: one per four characters, rounded up (the usual
    rule of thumb for English with OpenAI's and Anthropic's tokenizers)."""
    return math.ceil(len(text) / 4) if text else 0


def _texts(obj: Any) -> list[str]:
    """The text a chunk carries: OpenAI's choices[].delta (content, tool call
    arguments), Anthropic's content_block_delta (text, partial_json, thinking)."""
    out: list[str] = []
    for choice in _get(obj, "choices") or ():
        delta = _get(choice, "delta")
        for name in ("content", "refusal", "reasoning_content"):
            v = _get(delta, name)
            if isinstance(v, str):
                out.append(v)
        for call in _get(delta, "tool_calls") or ():
            v = _get(_get(call, "function"), "arguments")
            if isinstance(v, str):
                out.append(v)
    delta = _get(obj, "delta")
    if delta is not None and not _get(obj, "choices"):
        for name in ("text", "partial_json", "thinking"):
            v = _get(delta, name)
            if isinstance(v, str):
                out.append(v)
    return out


def chunk_tokens(chunk: Any) -> int:
    """The default ``count_chunk``: the output tokens of a streamed chunk, estimated
    from its text (:func:`approx_tokens`)."""
    return sum(approx_tokens(t) for t in _texts(chunk))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for p in content or ():
        t = _get(p, "text")
        if isinstance(t, str):
            parts.append(t)
        elif isinstance(p, str):
            parts.append(p)
    return "".join(parts)


def estimate_prompt_tokens(*args: Any, **kwargs: Any) -> int:
    """The default ``prompt``: an estimate of the prompt's tokens from the call's
    keywords: ``messages`` (each message's text, and 4 tokens of overhead),
    ``system`` (Anthropic's), ``prompt`` or ``input`` (:func:`approx_tokens`)."""
    n = 0
    messages = kwargs.get("messages")
    if isinstance(messages, (list, tuple)):
        for m in messages:
            n += 4 + approx_tokens(_content_text(_get(m, "content")))
        n += 3
    for name in ("system", "prompt", "input"):
        v = kwargs.get(name)
        if v is not None:
            n += approx_tokens(_content_text(v) if not isinstance(v, str) else v)
    return n


def max_output_tokens(*args: Any, **kwargs: Any) -> int:
    """The most tokens the call may generate, from its keywords ``max_tokens``,
    ``max_completion_tokens`` or ``max_output_tokens``; a call with none of them
    needs an ``estimate`` of its own (TypeError)."""
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = _int(kwargs.get(name))
        if v is not None:
            return v
    raise TypeError("quotaplane: the call names no max_tokens (or max_completion_tokens, max_output_tokens): pass metered(..., estimate=...)")


@dataclass
class Settled:
    """How a call's reservation was settled (``on_settled``).

    ``how`` is ``"commit"`` (``used``: the units committed), ``"release"`` (the call
    raised before any response) or ``"none"`` (the fail policy let the call through
    holding nothing). ``usage`` is what the response or stream said, None when it
    said nothing; ``streamed`` tells a stream, ``ended`` how it ended (``"complete"``,
    ``"error"`` or ``"stopped"``: the consumer closed or dropped it); ``error`` is
    the commit's own failure (the reservation's ``on_expiry`` settles it then)."""

    reservation_id: str
    how: Literal["commit", "release", "none"]
    used: Units | None = None
    usage: TokenUsage | None = None
    streamed: bool = False
    ended: Literal["complete", "error", "stopped"] | None = None
    chunks: int = 0
    error: BaseException | None = None


class _Tally:
    """What a call used: the usage a response or a stream's chunks said, and the
    output tokens the chunks carried."""

    def __init__(self, meter: "_Meter", args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.meter, self.args, self.kwargs = meter, args, kwargs
        self.usage: TokenUsage | None = None
        self.counted = 0
        self.chunks = 0

    def chunk(self, chunk: Any) -> None:
        self.chunks += 1
        # A reader that fails on a chunk it does not know loses that chunk's count,
        # not the consumer's stream.
        try:
            u = self.meter.usage(chunk)
            if u is not None:
                self.usage = u if self.usage is None else self.usage.merged(u)
        except Exception:  # noqa: BLE001
            log.exception("quotaplane: usage of a streamed chunk")
        try:
            self.counted += int(self.meter.count_chunk(chunk))
        except Exception:  # noqa: BLE001
            log.exception("quotaplane: count_chunk of a streamed chunk")

    def used(self, complete: bool) -> TokenUsage:
        """The usage to commit: the stream's own, when it got to its end and said it;
        otherwise its input (as said, or the prompt's estimate) and the larger of the
        output it said and the output its chunks carried."""
        u = self.usage
        if complete and u is not None and (u.total_tokens is not None or u.output_tokens is not None):
            return u
        inp = u.input_tokens if u is not None and u.input_tokens is not None else self.meter.prompt(*self.args, **self.kwargs)
        said = (u.output_tokens or 0) if u is not None else 0
        out = max(said, self.counted)
        return TokenUsage(inp, out)


class _Meter:
    def __init__(
        self,
        client: Any,
        org: str | Callable[..., str],
        team: str | Callable[..., str | None] | None,
        user: str | Callable[..., str | None] | None,
        metric: str,
        slot: str | None,
        estimate: Callable[..., Units] | None,
        prompt: Callable[..., int],
        usage: Callable[[Any], TokenUsage | None],
        count_chunk: Callable[[Any], int],
        units: Callable[[TokenUsage], Units] | None,
        ttl: float | None,
        on_expiry: str | None,
        on_settled: Callable[[Settled], Any] | None,
    ) -> None:
        self.client = client
        self.org, self.team, self.user = org, team, user
        self.metric, self.slot = metric, slot
        self.estimate = estimate
        self.prompt = prompt
        self.usage = usage
        self.count_chunk = count_chunk
        self.units = units
        self.ttl, self.on_expiry = ttl, on_expiry
        self.on_settled = on_settled

    def _who(self, v: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return v(*args, **kwargs) if callable(v) else v

    def _with_slot(self, units: Units) -> Units:
        if self.slot is None:
            return units
        out = dict(units) if isinstance(units, Mapping) else {self.metric: int(units)}
        out[self.slot] = out.get(self.slot, 0) + 1
        return out

    def request(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keywords of the call's reservation."""
        if self.estimate is not None:
            est = self.estimate(*args, **kwargs)
        else:
            est = self.prompt(*args, **kwargs) + max_output_tokens(*args, **kwargs)
        kw: dict[str, Any] = {"team": self._who(self.team, args, kwargs), "user": self._who(self.user, args, kwargs)}
        amounts = self._with_slot(est)
        if isinstance(amounts, Mapping):
            kw["amounts"] = dict(amounts)
        else:
            kw["metric"], kw["amount"] = self.metric, int(amounts)
        if self.ttl is not None:
            kw["ttl"] = self.ttl
        if self.on_expiry is not None:
            kw["on_expiry"] = self.on_expiry
        return {"org": self._who(self.org, args, kwargs), **kw}

    def to_units(self, u: TokenUsage) -> Units:
        return self._with_slot(self.units(u) if self.units is not None else u.total)

    def settled(self, s: Settled) -> None:
        if s.error is not None:
            log.warning("quotaplane: commit of reservation %s failed; its on_expiry settles it: %s", s.reservation_id, s.error)
        if self.on_settled is not None:
            try:
                self.on_settled(s)
            except Exception:  # noqa: BLE001 - a callback's failure is not the call's
                log.exception("quotaplane: on_settled raised")


def _held(res: Any) -> bool:
    return bool(res.id) and not res.not_decided


class MeteredStream:
    """A model's stream of chunks, metered: iterate it as the stream itself (its other
    attributes are the stream's). It commits once, when the stream ends, raises, or is
    closed (:meth:`close`, the end of a ``with`` block, or garbage collection of a
    stream dropped unfinished)."""

    def __init__(self, stream: Any, res: Any, meter: _Meter, tally: _Tally) -> None:
        self._stream = stream
        self._it = iter(stream)
        self._res, self._meter, self._tally = res, meter, tally
        self._done = False

    @property
    def reservation(self) -> Any:
        """The call's reservation."""
        return self._res

    def __iter__(self) -> "MeteredStream":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            chunk = next(self._it)
        except StopIteration:
            self._finish("complete")
            raise
        except BaseException as e:
            self._finish(_ending(e))
            raise
        self._tally.chunk(chunk)
        return chunk

    def close(self) -> None:
        """Stops the stream (closing the model's, when it can be) and commits what it streamed."""
        if self._done:
            return
        try:
            closer = getattr(self._stream, "close", None)
            if callable(closer):
                closer()
        finally:
            self._finish("stopped")

    def __enter__(self) -> "MeteredStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            try:
                self._finish("stopped")
            except Exception:  # noqa: BLE001 - nothing can be raised from a finalizer
                pass

    def _finish(self, ended: Literal["complete", "error", "stopped"]) -> None:
        if self._done:
            return
        self._done = True
        _commit_sync(self._res, self._meter, self._tally, ended == "complete", streamed=True, ended=ended)


class AsyncMeteredStream:
    """The async twin of :class:`MeteredStream`: ``async for`` it; it commits once,
    when the stream ends, raises, or is closed (:meth:`aclose`, the end of an
    ``async with`` block; a stream dropped unfinished is committed by a task on the
    running loop)."""

    def __init__(self, stream: Any, res: Any, meter: _Meter, tally: _Tally) -> None:
        self._stream = stream
        self._it = stream.__aiter__()
        self._res, self._meter, self._tally = res, meter, tally
        self._done = False

    @property
    def reservation(self) -> Any:
        """The call's reservation."""
        return self._res

    def __aiter__(self) -> "AsyncMeteredStream":
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            await self._finish("complete")
            raise
        except BaseException as e:
            await self._finish(_ending(e))
            raise
        self._tally.chunk(chunk)
        return chunk

    async def aclose(self) -> None:
        """Stops the stream (closing the model's, when it can be) and commits what it streamed."""
        if self._done:
            return
        try:
            closer = getattr(self._stream, "aclose", None) or getattr(self._stream, "close", None)
            if callable(closer):
                out = closer()
                if inspect.isawaitable(out):
                    await out
        finally:
            await self._finish("stopped")

    async def __aenter__(self) -> "AsyncMeteredStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __del__(self) -> None:
        if getattr(self, "_done", True):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            log.warning("quotaplane: a metered stream was dropped unfinished with no loop running; "
                        "reservation %s is settled by its on_expiry", getattr(self._res, "id", ""))
            return
        task = loop.create_task(self._finish("stopped"))
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    async def _finish(self, ended: Literal["complete", "error", "stopped"]) -> None:
        if self._done:
            return
        self._done = True
        # A task of its own, awaited through a shield: a cancelled consumer (a client
        # that went away) stops the wait, not the commit.
        task = asyncio.ensure_future(_commit_async(self._res, self._meter, self._tally, ended == "complete", streamed=True, ended=ended))
        _pending.add(task)
        task.add_done_callback(_pending.discard)
        await asyncio.shield(task)


def _ending(e: BaseException) -> Literal["error", "stopped"]:
    """How a stream that raised e ended: stopped when its consumer was (a cancelled
    task, a closed generator), else an error of the model's stream."""
    return "stopped" if isinstance(e, (asyncio.CancelledError, GeneratorExit, KeyboardInterrupt)) else "error"


# Settlements under way, kept from garbage collection until done.
_pending: set[asyncio.Future[Any]] = set()


def _settled_of(res: Any, tally: _Tally, streamed: bool, ended: Any) -> Settled:
    return Settled(res.id, "commit", usage=tally.usage, streamed=streamed, ended=ended, chunks=tally.chunks)


def _used(res: Any, meter: _Meter, tally: _Tally, complete: bool, whole: bool, s: Settled) -> None:
    """Sets what the commit counts: what the call used, or (whole, or when a caller's
    function fails on it) the whole reservation."""
    if not whole:
        try:
            s.used = meter.to_units(tally.used(complete))
            res.used = s.used
            return
        except Exception:  # noqa: BLE001 - the reservation is settled all the same
            log.exception("quotaplane: the usage of reservation %s cannot be read; all of it is committed", res.id)
    s.used = dict(res.amounts) if res.amounts else res.amount
    res.used = None  # the reservation's commit of nothing set: all of it


def _commit_sync(res: Any, meter: _Meter, tally: _Tally, complete: bool, *, streamed: bool, ended: Any = None, whole: bool = False) -> None:
    s = _settled_of(res, tally, streamed, ended)
    if not _held(res):
        s.how = "none"
        meter.settled(s)
        return
    _used(res, meter, tally, complete, whole, s)
    try:
        res.__exit__(None, None, None)  # commits res.used, after stopping the heartbeat
    except QuotaplaneError as e:
        s.error = e
    meter.settled(s)


async def _commit_async(res: Any, meter: _Meter, tally: _Tally, complete: bool, *, streamed: bool, ended: Any = None, whole: bool = False) -> None:
    s = _settled_of(res, tally, streamed, ended)
    if not _held(res):
        s.how = "none"
        meter.settled(s)
        return
    _used(res, meter, tally, complete, whole, s)
    try:
        await res.__aexit__(None, None, None)
    except QuotaplaneError as e:
        s.error = e
    meter.settled(s)


def _read_usage(meter: _Meter, out: Any) -> TokenUsage | None:
    """The usage of a whole response; None (so all of the reservation is committed)
    when the reader fails on it."""
    try:
        return meter.usage(out)
    except Exception:  # noqa: BLE001
        log.exception("quotaplane: usage of a model response")
        return None


def _released(res: Any, meter: _Meter) -> None:
    meter.settled(Settled(res.id, "release" if _held(res) else "none"))


def metered(
    client: Any,
    *,
    org: str | Callable[..., str],
    team: str | Callable[..., str | None] | None = None,
    user: str | Callable[..., str | None] | None = None,
    metric: str = "tokens",
    slot: str | None = None,
    estimate: Callable[..., Units] | None = None,
    prompt: Callable[..., int] = estimate_prompt_tokens,
    usage: Callable[[Any], TokenUsage | None] = usage_of,
    count_chunk: Callable[[Any], int] = chunk_tokens,
    units: Callable[[TokenUsage], Units] | None = None,
    ttl: float | None = None,
    on_expiry: str | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
) -> Callable[[F], F]:
    """A decorator that meters each call of a model function with ``client``: see the
    module's documentation.

    - ``org``, ``team``, ``user``: whose quota; each a value or a function of the
      call's arguments (``user=lambda *a, **kw: kw["user"]``).
    - ``metric``: the metric of the tokens (``"tokens"``); ``slot``: a metric to hold
      one unit of as well (``"requests"``: a request slot under a concurrent limit,
      and one request in its rate windows).
    - ``estimate``: a function of the call's arguments to the tokens to reserve (a
      number, or units per metric); by default ``prompt`` (an estimate of the
      prompt's tokens, :func:`estimate_prompt_tokens`) plus :func:`max_output_tokens`.
    - ``usage``: reads a response's (or a chunk's) token usage (:func:`usage_of`:
      OpenAI's and Anthropic's shapes); ``count_chunk``: the output tokens of a
      streamed chunk, counted for a stream that ends without usage
      (:func:`chunk_tokens`); ``units``: a usage to the units committed (by default
      its total in ``metric``; return units per metric for, say, input and output
      tokens priced apart, with an ``estimate`` in the same metrics).
    - ``ttl``, ``on_expiry``: of the reservation (the API's defaults: 60 s, commit);
      it is extended while the call runs.
    - ``on_settled``: called with a :class:`Settled` once the reservation is settled.

    A response without usage commits the whole estimate (what it used is unknown).
    """

    meter = _Meter(client, org, team, user, metric, slot, estimate, prompt, usage, count_chunk, units, ttl, on_expiry, on_settled)

    def decorate(fn: F) -> F:
        is_async = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
        _check_client(client, is_async, fn)
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            def agen_call(*args: Any, **kwargs: Any) -> Any:
                return _LazyAsyncStream(meter, fn, args, kwargs)

            return agen_call  # type: ignore[return-value]

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def acall(*args: Any, **kwargs: Any) -> Any:
                res = await meter.client.reserve(**meter.request(args, kwargs))
                await res.__aenter__()  # raises QuotaExceeded when denied; starts the heartbeat
                try:
                    out = await fn(*args, **kwargs)
                except BaseException as e:
                    await res.__aexit__(type(e), e, e.__traceback__)  # releases
                    _released(res, meter)
                    raise
                tally = _Tally(meter, args, kwargs)
                if isinstance(out, AsyncIterator):
                    return AsyncMeteredStream(out, res, meter, tally)
                tally.usage = _read_usage(meter, out)
                await _commit_async(res, meter, tally, True, streamed=False, whole=tally.usage is None)
                return out

            return acall  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            res = meter.client.reserve(**meter.request(args, kwargs))
            res.__enter__()  # raises QuotaExceeded when denied; starts the heartbeat
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:
                res.__exit__(type(e), e, e.__traceback__)  # releases
                _released(res, meter)
                raise
            tally = _Tally(meter, args, kwargs)
            if isinstance(out, Iterator):
                return MeteredStream(out, res, meter, tally)
            tally.usage = _read_usage(meter, out)
            _commit_sync(res, meter, tally, True, streamed=False, whole=tally.usage is None)
            return out

        return call  # type: ignore[return-value]

    return decorate



def _check_client(client: Any, is_async: bool, fn: Any) -> None:
    from .aio import AsyncClient
    from .client import Client

    name = getattr(fn, "__qualname__", repr(fn))
    if is_async and isinstance(client, Client):
        raise TypeError(f"quotaplane: {name} is async: meter it with an AsyncClient, not a Client")
    if not is_async and isinstance(client, AsyncClient):
        raise TypeError(f"quotaplane: {name} is not async: meter it with a Client, not an AsyncClient")


class _LazyAsyncStream:
    """The stream of an async generator function, metered: its reservation is made
    when the stream is first iterated (an async generator's call cannot await), then
    it is an :class:`AsyncMeteredStream`. Closed before that, it holds nothing."""

    def __init__(self, meter: _Meter, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._meter, self._fn, self._args, self._kwargs = meter, fn, args, kwargs
        self._inner: AsyncMeteredStream | None = None
        self._closed = False

    @property
    def reservation(self) -> Any:
        """The call's reservation, once the stream started (None before)."""
        return self._inner.reservation if self._inner is not None else None

    async def _start(self) -> AsyncMeteredStream:
        if self._inner is None:
            meter = self._meter
            res = await meter.client.reserve(**meter.request(self._args, self._kwargs))
            await res.__aenter__()  # raises QuotaExceeded when denied
            try:
                agen = self._fn(*self._args, **self._kwargs)
            except BaseException as e:
                await res.__aexit__(type(e), e, e.__traceback__)
                _released(res, meter)
                raise
            self._inner = AsyncMeteredStream(agen, res, meter, _Tally(meter, self._args, self._kwargs))
        return self._inner

    def __aiter__(self) -> "_LazyAsyncStream":
        return self

    async def __anext__(self) -> Any:
        if self._closed:
            raise StopAsyncIteration
        inner = await self._start()
        return await inner.__anext__()

    async def aclose(self) -> None:
        """Stops the stream and commits what it streamed (nothing to do before it started)."""
        self._closed = True
        if self._inner is not None:
            await self._inner.aclose()

    async def __aenter__(self) -> "_LazyAsyncStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

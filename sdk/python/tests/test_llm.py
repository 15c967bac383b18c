"""quotaplane.llm around a fake model (local functions answering as OpenAI's and
Anthropic's APIs do, whole or streamed) against the real api: what is committed is
what the response said, a stream cut midway commits what it streamed, an exception
releases, and no path leaks the reservation."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any, AsyncIterator, Iterator

import pytest

import quotaplane
from quotaplane.llm import Settled, TokenUsage, estimate_prompt_tokens, metered

LIMIT = 100_000
MESSAGES = [{"role": "user", "content": "Say hello in five words, please."}]  # 32 chars: 8 + 4 + 3 = 15 tokens
PROMPT = 15


@pytest.fixture
def org(stack):
    return stack.org([
        {"metric": "tokens", "window": "month", "limit": LIMIT},
        {"metric": "requests", "window": "concurrent", "limit": 1},
    ])


@pytest.fixture
def qp(stack, org) -> Iterator[quotaplane.Client]:
    with quotaplane.Client(stack.base_url, org.key) as c:
        yield c


def used(qp: quotaplane.Client, org) -> tuple[int, int]:
    """Tokens used or held this month, and requests in flight, as a query (cost 0) sees them."""
    r = qp.check(org.id, costs={"tokens": 0, "requests": 0})
    by = {lv.metric: lv for lv in r.levels}
    return LIMIT - by["tokens"].remaining, by["requests"].used


def openai_response(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, how are you?"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def openai_chunks(n: int, usage: tuple[int, int] | None) -> Iterator[Any]:
    """An OpenAI stream: n chunks of one 4-character token each, then (include_usage) the usage chunk."""
    for i in range(n):
        yield SimpleNamespace(choices=[SimpleNamespace(index=0, delta=SimpleNamespace(content=f"tk{i:02d}"))], usage=None)
    if usage is not None:
        p, c = usage
        yield SimpleNamespace(choices=[], usage=SimpleNamespace(prompt_tokens=p, completion_tokens=c, total_tokens=p + c))


class Settlements(list):
    def __call__(self, s: Settled) -> None:
        self.append(s)


def test_a_response_commits_its_usage(qp, org):
    seen = Settlements()
    during: list[tuple[int, int]] = []

    @metered(qp, org=org.id, slot="requests", on_settled=seen)
    def create(**kw: Any) -> dict[str, Any]:
        during.append(used(qp, org))
        return openai_response(prompt=12, completion=30)

    out = create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=256)
    assert out["usage"]["total_tokens"] == 42
    assert during == [(PROMPT + 256, 1)], "the estimate and a request slot are held during the call"
    assert used(qp, org) == (42, 0)
    (s,) = seen
    assert (s.how, s.used, s.usage, s.streamed) == ("commit", {"tokens": 42, "requests": 1}, TokenUsage(12, 30, 42), False)

    # Anthropic's shape, as an object; no slot: one metric, a number.
    anthropic = metered(qp, org=org.id, on_settled=seen)(
        lambda **kw: SimpleNamespace(type="message", content=[], usage=SimpleNamespace(input_tokens=10, output_tokens=5)))
    anthropic(model="claude", system="Be brief.", messages=MESSAGES, max_tokens=100)
    assert seen[-1].used == 15
    assert used(qp, org) == (57, 0)

    # A response that says no usage: the whole estimate, as nothing tells what it used.
    metered(qp, org=org.id, estimate=lambda **kw: 500, on_settled=seen)(lambda **kw: {"choices": []})()
    assert seen[-1].used == 500
    assert used(qp, org) == (557, 0)


def test_an_exception_releases(qp, org):
    seen = Settlements()

    @metered(qp, org=org.id, slot="requests", on_settled=seen)
    def create(**kw: Any) -> Any:
        assert used(qp, org) == (PROMPT + 64, 1)
        raise TimeoutError("the model timed out")

    with pytest.raises(TimeoutError):
        create(messages=MESSAGES, max_tokens=64)
    assert used(qp, org) == (0, 0)
    assert seen[0].how == "release"


def test_a_denied_reservation_never_calls_the_model(qp, org):
    calls = []
    create = metered(qp, org=org.id)(lambda **kw: calls.append(kw))
    with pytest.raises(quotaplane.QuotaExceeded) as e:
        create(messages=MESSAGES, max_tokens=LIMIT)
    assert e.value.reservation.blocked_at.metric in (None, "tokens")
    assert calls == []
    assert used(qp, org) == (0, 0)
    with pytest.raises(TypeError, match="max_tokens"):
        create(messages=MESSAGES)


def test_a_stream_commits_its_final_usage(qp, org):
    seen = Settlements()
    create = metered(qp, org=org.id, slot="requests", on_settled=seen)(lambda **kw: openai_chunks(5, usage=(20, 5)))
    stream = create(messages=MESSAGES, max_tokens=300, stream=True)
    assert used(qp, org) == (PROMPT + 300, 1)
    with pytest.raises(quotaplane.QuotaExceeded):  # the slot is held while it streams
        create(messages=MESSAGES, max_tokens=1, stream=True)
    texts = [c.choices[0].delta.content for c in stream if c.choices]
    assert texts == ["tk00", "tk01", "tk02", "tk03", "tk04"]
    assert seen[-1].used == {"tokens": 25, "requests": 1}
    assert (seen[-1].ended, seen[-1].chunks) == ("complete", 6)
    assert used(qp, org) == (25, 0)


def test_a_stream_cut_midway_commits_what_it_streamed(qp, org):
    seen = Settlements()
    create = metered(qp, org=org.id, slot="requests", on_settled=seen)(lambda **kw: openai_chunks(50, usage=(20, 50)))

    # The consumer stops after 3 chunks and closes the stream.
    with create(messages=MESSAGES, max_tokens=300, stream=True) as stream:
        for i, _ in enumerate(stream):
            if i == 2:
                break
    assert (seen[-1].ended, seen[-1].used) == ("stopped", {"tokens": PROMPT + 3, "requests": 1})
    assert used(qp, org) == (PROMPT + 3, 0)

    # Dropped unfinished, without close: collected, it commits what it streamed.
    stream = create(messages=MESSAGES, max_tokens=300, stream=True)
    next(stream), next(stream)
    del stream
    gc.collect()
    assert (seen[-1].ended, seen[-1].used) == ("stopped", {"tokens": PROMPT + 2, "requests": 1})
    assert used(qp, org) == (2 * PROMPT + 5, 0)

    # The model's stream fails midway: what it streamed is committed, and the error goes on.
    def failing(**kw: Any) -> Iterator[Any]:
        yield from openai_chunks(4, usage=None)
        raise ConnectionError("the model hung up")

    create = metered(qp, org=org.id, slot="requests", on_settled=seen)(failing)
    with pytest.raises(ConnectionError):
        for _ in create(messages=MESSAGES, max_tokens=300, stream=True):
            pass
    assert (seen[-1].ended, seen[-1].used) == ("error", {"tokens": PROMPT + 4, "requests": 1})
    assert used(qp, org) == (3 * PROMPT + 9, 0)


def test_an_anthropic_stream_counts_its_events(qp, org):
    """Anthropic tells the input in message_start and the output, growing, in
    message_delta; a cut stream counts the input said and the text streamed."""

    def events(n: int) -> Iterator[dict[str, Any]]:
        yield {"type": "message_start", "message": {"usage": {"input_tokens": 40, "output_tokens": 1}}}
        for i in range(n):
            yield {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "eight ch"}}  # 2 tokens
        yield {"type": "message_delta", "usage": {"output_tokens": 2 * n + 1}}
        yield {"type": "message_stop"}

    seen = Settlements()
    create = metered(qp, org=org.id, on_settled=seen)(lambda **kw: events(10))
    for _ in create(messages=MESSAGES, max_tokens=300, stream=True):
        pass
    assert seen[-1].used == 40 + 21
    stream = create(messages=MESSAGES, max_tokens=300, stream=True)
    for _ in range(4):  # message_start and 3 deltas
        next(stream)
    stream.close()
    assert seen[-1].used == 40 + 6
    assert used(qp, org) == (61 + 46, 0)


async def test_async_calls_and_streams(stack, qp, org):
    seen = Settlements()
    async with quotaplane.AsyncClient(stack.base_url, org.key) as aqp:

        @metered(aqp, org=org.id, slot="requests", on_settled=seen)
        async def create(**kw: Any) -> Any:
            if kw.get("stream"):
                return achunks(kw["n"], kw.get("usage"))
            return openai_response(7, 8)

        async def achunks(n: int, usage: tuple[int, int] | None) -> AsyncIterator[Any]:
            for c in openai_chunks(n, usage):
                await asyncio.sleep(0.005)
                yield c

        await create(messages=MESSAGES, max_tokens=50)
        assert seen[-1].used == {"tokens": 15, "requests": 1}

        stream = await create(messages=MESSAGES, max_tokens=50, stream=True, n=5, usage=(9, 5))
        got = [c async for c in stream]
        assert len(got) == 6 and seen[-1].used == {"tokens": 14, "requests": 1}

        # Cut after 2 chunks with aclose.
        stream = await create(messages=MESSAGES, max_tokens=50, stream=True, n=20, usage=(9, 20))
        async with stream:
            async for i, _ in _enumerate(stream):
                if i == 1:
                    break
        assert (seen[-1].ended, seen[-1].used) == ("stopped", {"tokens": PROMPT + 2, "requests": 1})

        # The consumer's task is cancelled midway (a client that went away): it still commits.
        stream = await create(messages=MESSAGES, max_tokens=50, stream=True, n=1000, usage=None)
        first = asyncio.Event()

        async def consume() -> None:
            async for _ in stream:
                first.set()

        task = asyncio.create_task(consume())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if seen[-1].ended == "stopped":
                break
            await asyncio.sleep(0.01)
        assert seen[-1].ended == "stopped" and 1 <= seen[-1].chunks < 1000
        assert seen[-1].used == {"tokens": PROMPT + seen[-1].chunks, "requests": 1}
        n_cancelled = seen[-1].chunks

        # The model raises: released.
        @metered(aqp, org=org.id, slot="requests", on_settled=seen)
        async def broken(**kw: Any) -> Any:
            raise RuntimeError("no model")

        with pytest.raises(RuntimeError):
            await broken(messages=MESSAGES, max_tokens=50)
        assert seen[-1].how == "release"
    assert used(qp, org) == (15 + 14 + PROMPT + 2 + PROMPT + n_cancelled, 0)


async def _enumerate(it: AsyncIterator[Any]) -> AsyncIterator[tuple[int, Any]]:
    i = 0
    async for x in it:
        yield i, x
        i += 1


def test_the_prompt_estimate():
    assert estimate_prompt_tokens(messages=MESSAGES) == PROMPT
    assert estimate_prompt_tokens(messages=[{"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}]) == 4 + 2 + 3
    assert estimate_prompt_tokens(system="Be brief.", messages=[]) == 3 + 3
    assert estimate_prompt_tokens(prompt="x" * 40) == 10


def test_a_streamed_reply_whose_client_hangs_up(stack, qp, org):
    """A Starlette endpoint streams a metered model stream through a real uvicorn; the
    client reads a few chunks and hangs up: what was streamed is committed, the slot
    comes back."""
    import socket
    import threading

    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from test_asgi import Server, closing

    seen = Settlements()
    done = threading.Event()
    aqp = quotaplane.AsyncClient(stack.base_url, org.key)

    def settled(s: Settled) -> None:
        seen(s)
        done.set()

    async def endless(**kw: Any) -> AsyncIterator[Any]:
        async def chunks() -> AsyncIterator[Any]:
            i = 0
            while True:
                await asyncio.sleep(0.01)
                yield {"choices": [{"delta": {"content": f"tk{i % 100:02d}"}}]}
                i += 1

        return chunks()

    create = metered(aqp, org=org.id, slot="requests", on_settled=settled)(endless)

    async def chat(request: Any) -> StreamingResponse:
        stream = await create(messages=MESSAGES, max_tokens=5000, stream=True)

        async def body() -> AsyncIterator[bytes]:
            async with stream:
                async for chunk in stream:
                    yield chunk["choices"][0]["delta"]["content"].encode() + b"\n"

        return StreamingResponse(body(), media_type="text/plain")

    s = Server(Starlette(routes=[Route("/chat", chat)], lifespan=closing(aqp)))
    try:
        with socket.create_connection(("127.0.0.1", s.port)) as sock:
            sock.sendall(b"GET /chat HTTP/1.1\r\nHost: test\r\n\r\n")
            got = b""
            while got.count(b"tk") < 5:
                got += sock.recv(4096)
            assert got.startswith(b"HTTP/1.1 200")
            assert used(qp, org) == (PROMPT + 5000, 1)
        assert done.wait(10), "no commit after the client hung up"
        (st,) = seen
        assert st.ended == "stopped" and st.chunks >= 5
        assert st.used == {"tokens": PROMPT + st.chunks, "requests": 1}
        assert used(qp, org) == (PROMPT + st.chunks, 0)
    finally:
        s.stop()


async def test_an_async_generator_function_reserves_when_iterated(stack, qp, org):
    seen = Settlements()
    async with quotaplane.AsyncClient(stack.base_url, org.key) as aqp:

        @metered(aqp, org=org.id, slot="requests", on_settled=seen)
        async def model(**kw: Any) -> AsyncIterator[Any]:
            for c in openai_chunks(3, usage=(11, 3)):
                yield c

        stream = model(messages=MESSAGES, max_tokens=40)
        assert used(qp, org) == (0, 0), "nothing is held before the stream is iterated"
        chunks = []
        async for c in stream:
            chunks.append(c)
            if len(chunks) == 1:
                assert used(qp, org) == (PROMPT + 40, 1)
        assert len(chunks) == 4 and seen[-1].used == {"tokens": 14, "requests": 1}
        await model(messages=MESSAGES, max_tokens=40).aclose()  # never started: nothing held, nothing settled
        assert len(seen) == 1
    assert used(qp, org) == (14, 0)


def test_misuse_is_refused_and_a_failing_reader_leaks_nothing(stack, qp, org):
    async def acreate(**kw: Any) -> Any:
        return {}

    with pytest.raises(TypeError, match="AsyncClient"):
        metered(qp, org=org.id)(acreate)
    with pytest.raises(TypeError, match="Client"):
        metered(quotaplane.AsyncClient(stack.base_url, org.key), org=org.id)(lambda **kw: {})

    def broken(response: Any) -> TokenUsage:
        raise KeyError("usage")

    seen = Settlements()
    create = metered(qp, org=org.id, slot="requests", usage=broken, on_settled=seen)(lambda **kw: openai_response(1, 2))
    assert create(messages=MESSAGES, max_tokens=10)["usage"]["total_tokens"] == 3
    assert seen[-1].used == {"tokens": PROMPT + 10, "requests": 1}, "a usage it cannot read: all of the estimate"
    stream = metered(qp, org=org.id, slot="requests", usage=broken, on_settled=seen)(lambda **kw: openai_chunks(2, (1, 2)))
    chunks = list(stream(messages=MESSAGES, max_tokens=10))
    assert len(chunks) == 3
    assert seen[-1].used == {"tokens": PROMPT + 2, "requests": 1}, "the chunks counted, the prompt estimated"
    assert used(qp, org) == (2 * PROMPT + 12, 0)

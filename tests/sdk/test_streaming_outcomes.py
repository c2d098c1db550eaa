"""Streams that end early: cancelled stages and requests, undelivered items, and their wire form."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import inferwatch
from inferwatch import _core
from inferwatch.wire import (
    EV_REQUEST,
    EV_STAGE,
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    STAGE_CANCELLED,
    Decoder,
    Encoder,
)
from inferwatch.wire.spec import STAGE_STREAM, STAGE_STRUCT
from tests.sdk.conftest import FakeClock, Receiver, buffered

MS = 1_000_000


def _request(events: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    (req,) = [e for e in events if e[0] == EV_REQUEST]
    return req


def test_sync_generator_closed_early_is_a_cancelled_stream_and_cancels_its_request(
    sdk: Receiver, clock: FakeClock
) -> None:
    @inferwatch.stage("generate")
    def tokens() -> Iterator[int]:
        for i in range(50):
            clock.advance(MS)
            yield i

    with inferwatch.request():
        g = tokens()
        assert [next(g) for _ in range(3)] == [0, 1, 2]
        g.close()  # the consumer stopped: the client went away
    req = _request(buffered())
    assert req[4] == OUTCOME_CANCELLED and req[5] is None
    ((name, dur, stream),) = req[8]
    # No client disconnect was seen, so nothing counts as produced after it: 0 undelivered.
    assert (name, dur, stream) == ("generate", 3 * MS, (MS, 3, [1000, 1000], 0))


def test_async_generator_cancelled_mid_stream_is_cancelled(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("generate")
    async def tokens() -> AsyncIterator[int]:
        for i in range(50):
            clock.advance(2 * MS)
            yield i
            await asyncio.sleep(10)  # the next token never comes: the task is cancelled here

    async def consume(out: list[int]) -> None:
        async with inferwatch.request():
            async for t in tokens():
                out.append(t)

    async def main() -> list[int]:
        out: list[int] = []
        task = asyncio.create_task(consume(out))
        while not out:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return out

    assert asyncio.run(main()) == [0]
    req = _request(buffered())
    assert req[4] == OUTCOME_CANCELLED
    ((name, dur, stream),) = req[8]
    assert (name, dur, stream) == ("generate", 2 * MS, (2 * MS, 1, [], 0))


def test_a_completed_stream_stays_ok_and_keeps_the_three_field_form(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("generate")
    def tokens() -> Iterator[int]:
        for i in range(4):
            clock.advance(MS)
            yield i

    with inferwatch.request():
        assert list(tokens()) == [0, 1, 2, 3]
    req = _request(buffered())
    assert req[4] == OUTCOME_OK
    assert req[8] == [("generate", 4 * MS, (MS, 4, [1000, 1000, 1000]))]


def test_an_error_inside_the_generator_is_an_error_not_a_cancel(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("generate")
    def tokens() -> Iterator[int]:
        clock.advance(MS)
        yield 0
        raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError), inferwatch.request():
        list(tokens())
    req = _request(buffered())
    assert (req[4], req[5]) == (OUTCOME_ERROR, "RuntimeError")
    assert req[8] == [("generate", MS, (MS, 1, []))]


def test_items_after_the_client_left_are_undelivered(sdk: Receiver, clock: FakeClock) -> None:
    """The middleware sets ``gone``; a stream that runs on counts what it produced after that."""

    @inferwatch.stage("generate")
    def tokens() -> Iterator[int]:
        for i in range(10):
            clock.advance(MS)
            yield i

    with inferwatch.request() as req_scope:
        g = tokens()
        for _ in range(4):
            next(g)
        # The client leaves half-way between token 4 and token 5; the generator is never told.
        req_scope.gone = clock.now + MS // 2  # type: ignore[attr-defined]
        assert list(g) == [4, 5, 6, 7, 8, 9]
    req = _request(buffered())
    assert req[4] == OUTCOME_CANCELLED
    ((_, _, stream),) = req[8]
    assert stream == (MS, 10, [1000] * 9, 6)


def test_undelivered_count_is_exact_past_the_recorded_gaps() -> None:
    now = [0]
    timer = _core._StreamTimer(lambda: now[0])
    for _ in range(2000):  # one item every 1 ms; only 1,024 gaps are kept
        now[0] += MS
        timer.item()
    assert len(timer.gaps) == 1024
    assert timer.after(0) == 2000
    assert timer.after(1500 * MS) == 500  # past the recorded gaps: by time, in proportion
    assert timer.after(1000 * MS) == 1000  # inside them: exact
    assert timer.after(1000 * MS + MS // 2) == 1000
    assert timer.after(2000 * MS) == 0


def test_cancelled_stream_round_trips_on_the_wire_and_a_short_one_is_a_bad_record() -> None:
    ctx = ("svc", "m", "v1")
    stages = [("generate", 9 * MS, (MS, 5, [100, 200], 2)), ("post", MS, None), ("gen2", 4 * MS, (MS, 2, [7]))]
    ev = (EV_REQUEST, ctx, 1_700_000_000_000_000_000, 10 * MS, OUTCOME_CANCELLED, None, "r1", None, stages)
    st = (EV_STAGE, ctx, 1_700_000_000_000_000_000, "r1", ("generate", MS, (0, 0, [], 0)))
    (frame,) = Encoder(1, 2).encode([ev, st])
    got = Decoder().decode(frame).records
    assert got[0][8] == (("generate", 9 * MS, (MS, 5, (100, 200), 2)), ("post", MS, None),
                         ("gen2", 4 * MS, (MS, 2, (7,))))
    assert got[1][4] == ("generate", MS, (0, 0, (), 0))
    # A completed stream's record with the cancelled flag set lacks the undelivered count: a bad record.
    (frame,) = Encoder(1, 2).encode([(EV_STAGE, ctx, 1, "r1", ("generate", 5, (0, 0, [])))])
    head = STAGE_STRUCT.pack(3, 5, STAGE_STREAM)  # name ref 3: after the three ctx strings
    assert frame.count(head) == 1
    forged = frame.replace(head, STAGE_STRUCT.pack(3, 5, STAGE_STREAM | STAGE_CANCELLED))
    got_forged = Decoder().decode(forged)
    assert (got_forged.records, got_forged.errors) == ([], ["bad_record"])


def test_middleware_watcher_hands_held_messages_to_the_app_and_sees_the_disconnect(
    sdk: Receiver, clock: FakeClock
) -> None:
    """A raw streamer on a GET: the watcher reads the request's empty body first, the app still gets it."""
    got: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})  # the watcher starts
        await asyncio.sleep(0)
        got.append((await receive())["type"])  # held by the watcher, handed over
        clock.advance(MS)
        inbox.put_nowait({"type": "http.disconnect"})
        got.append((await receive())["type"])
        await send({"type": "http.response.body", "body": b"b", "more_body": True})

    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def main() -> None:
        inbox.put_nowait({"type": "http.request", "body": b"", "more_body": False})

        async def send(message: Any) -> None:
            return None

        await inferwatch.InferwatchMiddleware(app)({"type": "http", "headers": []}, inbox.get, send)

    asyncio.run(main())
    assert got == ["http.request", "http.disconnect"]
    req = _request(buffered())
    assert req[4] == OUTCOME_CANCELLED


def test_middleware_leaves_a_complete_response_ok_even_if_the_client_leaves_after(
    sdk: Receiver, clock: FakeClock
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        assert (await receive())["type"] == "http.request"
        assert (await receive())["type"] == "http.disconnect"  # after the response: not a cancel

    async def main() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        inbox.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        inbox.put_nowait({"type": "http.disconnect"})

        async def send(message: Any) -> None:
            return None

        await inferwatch.InferwatchMiddleware(app)({"type": "http", "headers": []}, inbox.get, send)

    asyncio.run(main())
    assert _request(buffered())[4] == OUTCOME_OK

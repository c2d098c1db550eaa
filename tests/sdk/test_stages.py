"""Stage timers: decorators and context managers on sync/async functions and generators."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import inferwatch
from inferwatch.wire import EV_REQUEST, EV_STAGE
from tests.sdk.conftest import FakeClock, Receiver, buffered

MS = 1_000_000


def _stage_events(evs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [e[4] for e in evs if e[0] == EV_STAGE]


def test_sync_function_stage_duration_and_result(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("inference")
    def infer(x: int, y: int = 2, *, z: int = 3) -> int:
        clock.advance(4 * MS)
        return x + y + z

    assert infer(1) == 6
    assert infer(1, 1, z=1) == 3
    assert _stage_events(buffered()) == [("inference", 4 * MS, None), ("inference", 4 * MS, None)]


def test_exception_propagates_and_the_stage_is_still_timed(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("inference")
    def boom() -> None:
        clock.advance(MS)
        raise KeyError("x")

    with pytest.raises(KeyError):
        boom()
    assert _stage_events(buffered()) == [("inference", MS, None)]


def test_async_function_stage(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("inference")
    async def infer(x: int) -> int:
        await asyncio.sleep(0)
        clock.advance(3 * MS)
        return x * 2

    assert inspect.iscoroutinefunction(infer)
    assert asyncio.run(infer(4)) == 8
    assert _stage_events(buffered()) == [("inference", 3 * MS, None)]


def test_context_manager_sync_and_async(sdk: Receiver, clock: FakeClock) -> None:
    with inferwatch.stage("pre"):
        clock.advance(2 * MS)

    async def main() -> None:
        async with inferwatch.stage("post"):
            clock.advance(5 * MS)

    asyncio.run(main())
    assert _stage_events(buffered()) == [("pre", 2 * MS, None), ("post", 5 * MS, None)]


def test_generator_stage_ttft_gaps_and_count(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("generate")
    def tokens(n: int) -> Iterator[int]:
        clock.advance(50 * MS)  # prefill: time to the first token
        for i in range(n):
            if i:
                clock.advance((i + 1) * MS)  # decode step
            yield i

    assert inspect.isgeneratorfunction(tokens)
    out = []
    for tok in tokens(4):
        out.append(tok)
        clock.advance(100_000)  # the consumer's own time between items counts too
    assert out == [0, 1, 2, 3]
    ((name, dur, stream),) = _stage_events(buffered())
    assert name == "generate"
    ttft, items, gaps = stream
    assert ttft == 50 * MS
    assert items == 4
    assert gaps == [2100, 3100, 4100]  # microseconds
    assert dur == 50 * MS + (2 + 3 + 4) * MS + 4 * 100_000


def test_generator_return_value_and_early_close(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("gen")
    def g() -> Iterator[int]:
        yield 1
        clock.advance(MS)
        yield 2
        return 99  # noqa: B901

    def consume() -> Any:
        return (yield from g())

    c = consume()
    assert next(c) == 1
    assert next(c) == 2
    with pytest.raises(StopIteration) as stop:
        next(c)
    assert stop.value.value == 99

    gen = g()
    assert next(gen) == 1
    gen.close()  # the client went away after one token
    evs = _stage_events(buffered())
    assert evs[0][2][1] == 2 and evs[0][2][2] == [1000]
    assert evs[1][2][1] == 1 and evs[1][2][2] == []


def test_generator_error_mid_stream_is_timed_and_propagates(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("gen")
    def g() -> Iterator[int]:
        yield 1
        clock.advance(MS)
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError):
        list(g())
    ((name, dur, (ttft, items, gaps)),) = _stage_events(buffered())
    assert (name, dur, ttft, items, gaps) == ("gen", MS, 0, 1, [])


def test_async_generator_stage_ttft_gaps_and_count(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("generate")
    async def tokens(n: int) -> AsyncIterator[str]:
        clock.advance(20 * MS)
        for i in range(n):
            if i:
                await asyncio.sleep(0)
                clock.advance(5 * MS)
            yield f"t{i}"

    assert inspect.isasyncgenfunction(tokens)

    async def main() -> list[str]:
        return [t async for t in tokens(3)]

    assert asyncio.run(main()) == ["t0", "t1", "t2"]
    ((name, dur, (ttft, items, gaps)),) = _stage_events(buffered())
    assert (name, dur, ttft, items, gaps) == ("generate", 30 * MS, 20 * MS, 3, [5000, 5000])


def test_generator_that_yields_nothing(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("gen")
    def g() -> Iterator[int]:
        clock.advance(MS)
        return
        yield  # pragma: no cover

    assert list(g()) == []
    ((_, dur, (ttft, items, gaps)),) = _stage_events(buffered())
    assert (dur, ttft, items, gaps) == (MS, MS, 0, [])


def test_gaps_are_capped_at_1024(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("gen")
    def g() -> Iterator[int]:
        for i in range(2000):
            clock.advance(1000)
            yield i

    assert sum(g()) == sum(range(2000))
    ((_, _, (_, items, gaps)),) = _stage_events(buffered())
    assert items == 2000 and len(gaps) == 1024


def test_stages_inside_a_request_are_attached_to_it(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("inference")
    def infer() -> None:
        clock.advance(10 * MS)

    @inferwatch.stage("stream")
    def stream() -> Iterator[int]:
        clock.advance(MS)
        yield 1

    with inferwatch.request("req-1"):
        clock.advance(MS)
        with inferwatch.stage("preprocess"):
            clock.advance(2 * MS)
        infer()
        list(stream())
    (ev,) = buffered()
    assert ev[0] == EV_REQUEST
    assert ev[3] == 14 * MS  # end-to-end
    assert ev[6] == "req-1"
    assert ev[8] == [("preprocess", 2 * MS, None), ("inference", 10 * MS, None), ("stream", MS, (MS, 1, []))]


def test_generator_that_outlives_its_request_is_sent_with_the_request_id(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("stream")
    def stream() -> Iterator[int]:
        yield 1
        yield 2

    with inferwatch.request("req-2"):
        it = stream()
        next(it)
    clock.advance(MS)
    assert list(it) == [2]
    evs = buffered()
    assert evs[0][0] == EV_REQUEST and evs[0][8] == []
    assert evs[1][0] == EV_STAGE and evs[1][3] == "req-2" and evs[1][4][2][1] == 2


def test_more_than_255_stages_spill_into_stage_events(sdk: Receiver) -> None:
    with inferwatch.request("many"):
        for _ in range(300):
            with inferwatch.stage("s"):
                pass
    evs = buffered()
    req = [e for e in evs if e[0] == EV_REQUEST]
    spilled = [e for e in evs if e[0] == EV_STAGE]
    assert len(req[0][8]) == 255 and len(spilled) == 45
    assert all(e[3] == "many" for e in spilled)


def test_wrapper_keeps_the_signature_and_metadata() -> None:
    def f(a: int, b: int = 1, /, c: int = 2, *args: int, d: int, e: int = 5, **kw: int) -> tuple[Any, ...]:
        """Doc."""
        return (a, b, c, args, d, e, kw)

    w = inferwatch.stage("s")(f)
    assert inspect.signature(w) == inspect.signature(f)
    assert w.__name__ == "f" and w.__doc__ == "Doc." and w.__wrapped__ is f  # type: ignore[attr-defined]
    assert w(1, d=4) == f(1, d=4)
    assert w(1, 2, 3, 4, 5, d=6, e=7, z=8) == f(1, 2, 3, 4, 5, d=6, e=7, z=8)
    with pytest.raises(TypeError):
        w(1)  # d is required, as in f


def test_methods_partials_and_callable_objects(sdk: Receiver, clock: FakeClock) -> None:
    class Model:
        def __init__(self) -> None:
            self.k = 3

        @inferwatch.stage("method")
        def predict(self, x: int) -> int:
            return x * self.k

        def plain(self, x: int) -> int:
            return x + self.k

    m = Model()
    assert m.predict(2) == 6
    assert inferwatch.stage("bound")(m.plain)(1) == 4

    def add(a: int, b: int) -> int:
        return a + b

    assert inferwatch.stage("partial")(functools.partial(add, 1))(2) == 3

    class Callable:
        def __call__(self, x: int) -> int:
            return -x

    assert inferwatch.stage("obj")(Callable())(5) == -5
    names = [e[0] for e in _stage_events(buffered())]
    assert names == ["method", "bound", "partial", "obj"]


def test_stage_above_staticmethod_and_classmethod_keeps_the_binding(sdk: Receiver, clock: FakeClock) -> None:
    class Model:
        k = 10

        @inferwatch.stage("static")
        @staticmethod
        def scale(x: int, factor: int = 2) -> int:
            clock.advance(MS)
            return x * factor

        @inferwatch.stage("cls")
        @classmethod
        def offset(cls, x: int) -> int:
            clock.advance(2 * MS)
            return x + cls.k

        @inferwatch.stage("astatic")
        @staticmethod
        async def ascale(x: int) -> int:
            clock.advance(3 * MS)
            return -x

        @inferwatch.stage("tokens")
        @classmethod
        def tokens(cls, n: int) -> Iterator[int]:
            for i in range(n):
                clock.advance(MS)
                yield i + cls.k

    m = Model()
    assert Model.scale(3) == 6 and m.scale(3, factor=3) == 9  # no self passed in either way
    assert Model.offset(1) == 11 and m.offset(2) == 12  # the class, from the class or an instance

    class Sub(Model):
        k = 100

    assert Sub.offset(1) == 101
    assert asyncio.run(m.ascale(4)) == -4
    assert list(Sub.tokens(3)) == [100, 101, 102]
    assert isinstance(Model.__dict__["scale"], staticmethod) and isinstance(Model.__dict__["offset"], classmethod)
    assert Model.scale.__name__ == "scale" and Model.offset.__wrapped__.__name__ == "offset"
    evs = _stage_events(buffered())
    assert [(n, d) for n, d, _ in evs] == [
        ("static", MS), ("static", MS), ("cls", 2 * MS), ("cls", 2 * MS), ("cls", 2 * MS), ("astatic", 3 * MS),
        ("tokens", 3 * MS),
    ]
    assert evs[-1][2] is not None and evs[-1][2][1] == 3  # the generator is timed as a stream of 3 items


def test_parameter_names_that_shadow_internals_still_work(sdk: Receiver) -> None:
    @inferwatch.stage("weird")
    def f(_rt: int, __iw_fn: int = 2) -> int:
        return _rt + __iw_fn

    assert f(1) == 3
    assert _stage_events(buffered())[0][0] == "weird"


def test_each_call_gets_fresh_state_under_concurrency(sdk: Receiver, clock: FakeClock) -> None:
    @inferwatch.stage("work")
    async def work(delay: int) -> int:
        start = clock.now
        await asyncio.sleep(0)
        clock.advance(delay)
        await asyncio.sleep(0)
        return clock.now - start

    async def main() -> list[int]:
        return await asyncio.gather(*(work(d) for d in (MS, 2 * MS, 3 * MS)))

    asyncio.run(main())
    durs = sorted(e[1] for e in _stage_events(buffered()))
    # Interleaved calls overlap in fake time, but each one measures from its own start.
    assert len(durs) == 3 and durs[0] >= MS


def test_disabled_generators_pass_through(clock: FakeClock) -> None:
    @inferwatch.stage("gen")
    def g() -> Iterator[int]:
        yield from range(3)
        return 7  # noqa: B901

    @inferwatch.stage("agen")
    async def ag() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    def consume() -> Any:
        return (yield from g())

    assert list(consume()) == [0, 1, 2]

    async def main() -> list[int]:
        return [x async for x in ag()]

    assert asyncio.run(main()) == [0, 1, 2]


def test_async_generator_closed_early_is_finalised_at_once(sdk: Receiver, clock: FakeClock) -> None:
    closed = []

    @inferwatch.stage("generate")
    async def tokens() -> AsyncIterator[int]:
        try:
            for i in range(100):
                clock.advance(MS)
                yield i
        finally:
            closed.append(True)

    async def main() -> None:
        agen = tokens()
        assert await agen.__anext__() == 0
        assert await agen.__anext__() == 1
        await agen.aclose()  # the client disconnected
        assert closed == [True]
        ((name, dur, (ttft, items, gaps, undelivered)),) = _stage_events(buffered())
        assert (name, items, gaps, undelivered) == ("generate", 2, [1000], 0)  # cancelled; no client had left

    asyncio.run(main())

"""Request scopes: IDs, outcomes and isolation across asyncio tasks and threads."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import inferwatch
from inferwatch.wire import EV_RECORD, EV_REQUEST, OUTCOME_CANCELLED, OUTCOME_ERROR, OUTCOME_OK
from tests.sdk.conftest import FakeClock, Receiver, buffered


def _requests(evs: list[tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    return {e[6]: e for e in evs if e[0] == EV_REQUEST}


def test_request_sets_and_restores_the_id(sdk: Receiver) -> None:
    assert inferwatch.current_request_id() is None
    with inferwatch.request("outer") as outer:
        assert outer.request_id == "outer" == inferwatch.current_request_id()
        with inferwatch.request("inner"):
            assert inferwatch.current_request_id() == "inner"
        assert inferwatch.current_request_id() == "outer"
    assert inferwatch.current_request_id() is None


def test_generated_ids_are_unique_and_bounded(sdk: Receiver) -> None:
    ids = set()
    for _ in range(1000):
        with inferwatch.request() as r:
            assert r.request_id is not None
            ids.add(r.request_id)
    assert len(ids) == 1000
    assert all(0 < len(i) <= 128 for i in ids)


@pytest.mark.parametrize("bad", ["has space", "x" * 200, "new\nline", "", 12345])
def test_bad_caller_ids_are_replaced_or_coerced(sdk: Receiver, bad: Any) -> None:
    with inferwatch.request(bad) as r:
        rid = r.request_id
    assert rid is not None and " " not in rid and "\n" not in rid and 0 < len(rid) <= 128
    if bad == 12345:
        assert rid == "12345"


def test_outcomes_ok_error_and_cancelled(sdk: Receiver, clock: FakeClock) -> None:
    with inferwatch.request("ok"):
        clock.advance(5)
    with pytest.raises(ValueError), inferwatch.request("err"):
        raise ValueError("bad input")

    async def cancelled() -> None:
        async with inferwatch.request("cancel"):
            await asyncio.sleep(10)

    async def main() -> None:
        t = asyncio.ensure_future(cancelled())
        await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())
    reqs = _requests(buffered())
    assert reqs["ok"][3] == 5 and reqs["ok"][4] == OUTCOME_OK and reqs["ok"][5] is None
    assert reqs["err"][4] == OUTCOME_ERROR and reqs["err"][5] == "ValueError"
    assert reqs["cancel"][4] == OUTCOME_CANCELLED


def test_error_type_is_bounded(sdk: Receiver) -> None:
    long_exc = type("E" * 300, (Exception,), {})
    with pytest.raises(long_exc), inferwatch.request("long"):
        raise long_exc()
    assert len(_requests(buffered())["long"][5]) == 64


def test_model_and_version_override_per_request(sdk: Receiver) -> None:
    with inferwatch.request("a", model="other", model_version="v9"):
        inferwatch.record(prediction=1)
    rec, req = buffered()
    assert rec[1] == req[1] == ("svc", "other", "v9")


def test_trace_id_is_carried(sdk: Receiver) -> None:
    tid = "4bf92f3577b34da6a3ce929d0e0e4736"
    with inferwatch.request("t", trace_id=tid):
        pass
    with inferwatch.request("bad-trace", trace_id="zz"):
        pass
    reqs = _requests(buffered())
    assert reqs["t"][7] == bytes.fromhex(tid)
    assert reqs["bad-trace"][7] is None


def test_isolation_across_concurrent_asyncio_requests(sdk: Receiver) -> None:
    n = 50

    async def handle(i: int) -> None:
        async with inferwatch.request(f"req-{i}"):
            for step in range(3):
                # Yield to the loop inside every stage so that all requests interleave.
                async with inferwatch.stage(f"s{step}"):
                    await asyncio.sleep(0)
                    assert inferwatch.current_request_id() == f"req-{i}"
            inferwatch.record(prediction=i)

    async def main() -> None:
        await asyncio.gather(*(handle(i) for i in range(n)))

    asyncio.run(main())
    evs = buffered()
    reqs = _requests(evs)
    assert len(reqs) == n
    for i in range(n):
        assert [s[0] for s in reqs[f"req-{i}"][8]] == ["s0", "s1", "s2"]
    recs = [e for e in evs if e[0] == EV_RECORD]
    assert sorted((e[3], e[4]) for e in recs) == sorted((f"req-{i}", i) for i in range(n))


def test_isolation_across_threads(sdk: Receiver) -> None:
    n = 40
    barrier = threading.Barrier(8)

    @inferwatch.stage("work")
    def work(i: int) -> str | None:
        return inferwatch.current_request_id()

    def handle(i: int) -> bool:
        with inferwatch.request(f"t-{i}"):
            if i < 8:
                barrier.wait(timeout=5)  # make the first eight overlap for sure
            ok = work(i) == f"t-{i}"
            inferwatch.record(prediction=i)
        return ok and inferwatch.current_request_id() is None

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(handle, range(n)))
    evs = buffered()
    reqs = _requests(evs)
    assert len(reqs) == n
    assert all(len(reqs[f"t-{i}"][8]) == 1 for i in range(n))
    assert sorted(e[3] for e in evs if e[0] == EV_RECORD) == sorted(f"t-{i}" for i in range(n))


def test_logging_filter_puts_the_request_id_on_records(sdk: Receiver) -> None:
    records: list[logging.LogRecord] = []

    class ListHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = ListHandler()
    handler.addFilter(inferwatch.RequestIdFilter())
    handler.setFormatter(logging.Formatter("%(request_id)s %(message)s"))
    log = logging.getLogger("tests.sdk.logfilter")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        log.info("outside")
        with inferwatch.request("abc-123"):
            log.info("inside")
    finally:
        log.removeHandler(handler)
    assert [handler.format(r) for r in records] == ["- outside", "abc-123 inside"]


def test_logging_filter_default_is_configurable() -> None:
    f = inferwatch.RequestIdFilter(default="none")
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    assert f.filter(rec) is True
    assert rec.request_id == "none"  # type: ignore[attr-defined]

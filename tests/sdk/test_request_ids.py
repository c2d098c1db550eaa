"""Request IDs and trace IDs: the client's X-Request-ID is kept, the trace ID recorded beside it.

Through a real FastAPI app (httpx ASGITransport) and a real uvicorn server whose
events travel over the Unix socket into the sidecar's aggregator, whose
OpenMetrics exemplars must carry both IDs.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.openmetrics.exposition import generate_latest as om_latest  # noqa: E402
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families  # noqa: E402

import inferwatch  # noqa: E402
from inferwatch.wire import EV_REQUEST  # noqa: E402
from inferwatch_sidecar.aggregate import aggregator  # noqa: E402
from inferwatch_sidecar.aggregate.aggregator import TRACED_EXEMPLAR_HOLD_NS, Aggregator  # noqa: E402
from inferwatch_sidecar.components.base import ComponentContext  # noqa: E402
from inferwatch_sidecar.metrics.families import CatalogCollector  # noqa: E402
from tests.helpers.net import free_port  # noqa: E402
from tests.sdk.conftest import Receiver, buffered, wait_for  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
BOTH = {"traceparent": TRACEPARENT, "x-request-id": "client-7"}


def make_app() -> Any:
    app = fastapi.FastAPI()
    inferwatch.instrument_fastapi(app)
    log = logging.getLogger("tests.sdk.request_ids")

    @app.get("/predict")
    async def predict() -> dict[str, Any]:
        with inferwatch.stage("inference"):
            log.warning("predicting")
        return {"rid": inferwatch.current_request_id()}

    return app


class _Lines(logging.Handler):
    def __init__(self, lines: list[str], flt: logging.Filter) -> None:
        super().__init__()
        self.lines = lines
        self.addFilter(flt)
        self.setFormatter(logging.Formatter("%(request_id)s %(trace_id)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _logged(flt: logging.Filter, headers: dict[str, str]) -> tuple[httpx.Response, list[str]]:
    lines: list[str] = []
    h = _Lines(lines, flt)
    log = logging.getLogger("tests.sdk.request_ids")
    log.addHandler(h)
    try:
        r = asyncio.run(_get(make_app(), headers))
    finally:
        log.removeHandler(h)
    return r, lines


async def _get(app: Any, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get("/predict", headers=headers)


def test_client_request_id_is_echoed_and_logged_and_the_trace_id_recorded_beside_it(sdk: Receiver) -> None:
    r, lines = _logged(inferwatch.RequestIdFilter(), BOTH)
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "client-7" and r.json() == {"rid": "client-7"}
    assert lines == [f"client-7 {TRACE} predicting"]
    (ev,) = [e for e in buffered() if e[0] == EV_REQUEST]
    assert ev[6] == "client-7" and ev[7] == bytes.fromhex(TRACE)


def test_log_setting_trace_id_shows_the_trace_id_and_falls_back_to_the_request_id(
    sdk: Receiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFERWATCH_LOG_REQUEST_ID", "trace_id")
    flt = inferwatch.RequestIdFilter()
    r, lines = _logged(flt, BOTH)
    assert r.headers["x-request-id"] == "client-7"  # the echo is the client's whatever the logs show
    assert lines == [f"{TRACE} {TRACE} predicting"]
    _, lines = _logged(flt, {"x-request-id": "untraced-1"})
    assert lines == ["untraced-1 - predicting"]
    _, lines = _logged(inferwatch.RequestIdFilter(show="request_id"), BOTH)  # the argument beats the variable
    assert lines == [f"client-7 {TRACE} predicting"]


def test_bad_log_setting_raises_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERWATCH_LOG_REQUEST_ID", "span_id")
    with pytest.raises(ValueError, match="INFERWATCH_LOG_REQUEST_ID='span_id': expected one of request_id, trace_id"):
        inferwatch.RequestIdFilter()
    with pytest.raises(ValueError, match="show='rid'"):
        inferwatch.RequestIdFilter(show="rid")


@pytest.fixture
def uvicorn_server(receiver: Receiver) -> Iterator[int]:
    inferwatch.configure(service="svc", model="m", model_version="v1", sidecar=receiver.path, flush_interval_ms=5)
    port = free_port()
    config = uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    assert wait_for(lambda: server.started, timeout=10)
    yield port
    server.should_exit = True
    t.join(10)
    inferwatch.shutdown(timeout=1.0)


def _exemplars(agg: Aggregator) -> dict[tuple[str, str | None, str], dict[str, str]]:
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, aggregator.METRICS))
    out = {}
    for fam in om_families(om_latest(reg).decode()):
        for s in fam.samples:
            if s.exemplar is not None:
                out[(s.name, s.labels.get("stage"), s.labels["le"])] = dict(s.exemplar.labels)
    return out


def test_uvicorn_request_with_both_ids_gives_exemplars_with_both(uvicorn_server: int, receiver: Receiver) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", uvicorn_server, timeout=5)
    conn.request("GET", "/predict", headers={"traceparent": TRACEPARENT, "X-Request-ID": "uv-both"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 200 and resp.getheader("x-request-id") == "uv-both"
    got: list[tuple[Any, ...]] = []

    def arrived() -> bool:
        got.extend(r for r in receiver.records(timeout=0.01) if r[0] == EV_REQUEST)
        return len(got) >= 1

    assert wait_for(arrived, timeout=5)
    (ev,) = got
    assert ev[6] == "uv-both" and ev[7] == bytes.fromhex(TRACE)
    agg = Aggregator(ComponentContext())
    agg.process(got, [0] * 16)
    ex = _exemplars(agg)
    request_ex = [v for (name, _, _), v in ex.items() if name == "inferwatch_request_duration_seconds_bucket"]
    stage_ex = {stage: v for (name, stage, _), v in ex.items() if name == "inferwatch_stage_duration_seconds_bucket"}
    assert request_ex == [{"trace_id": TRACE, "request_id": "uv-both"}]
    assert stage_ex == {s: {"trace_id": TRACE, "request_id": "uv-both"} for s in ("ingress", "inference")}


# -- the exemplar rule: a traced request's exemplar survives the untraced ones that follow --------

T0 = 1_700_000_000_000_000_000
CTX = ("svc", "m", "v1")


def _req(rid: str, trace: bytes | None, end_ns: int, dur_s: float = 0.003) -> tuple[Any, ...]:
    return (EV_REQUEST, CTX, end_ns, int(dur_s * 1e9), 0, None, rid, trace, [("inference", int(dur_s * 1e9), None)])


def _bucket_exemplar(agg: Aggregator) -> tuple[dict[str, str], dict[str, str]]:
    ex = _exemplars(agg)
    return (ex[("inferwatch_request_duration_seconds_bucket", None, "0.005")],
            ex[("inferwatch_stage_duration_seconds_bucket", "inference", "0.005")])


def test_untraced_requests_do_not_overwrite_a_traced_exemplar_until_it_is_old() -> None:
    agg = Aggregator(ComponentContext())
    t1 = bytes.fromhex(TRACE)
    agg.process([_req("traced-1", t1, T0)], [0] * 16)
    agg.process([_req(f"plain-{i}", None, T0 + (i + 1) * 10**9) for i in range(50)], [0] * 16)
    traced = {"trace_id": TRACE, "request_id": "traced-1"}
    assert _bucket_exemplar(agg) == (traced, traced)
    # Just inside the hold, still the traced one; at the hold, the newest untraced one.
    agg.process([_req("plain-late", None, T0 + TRACED_EXEMPLAR_HOLD_NS - 1)], [0] * 16)
    assert _bucket_exemplar(agg) == (traced, traced)
    agg.process([_req("plain-old", None, T0 + TRACED_EXEMPLAR_HOLD_NS)], [0] * 16)
    assert _bucket_exemplar(agg) == ({"request_id": "plain-old"}, {"request_id": "plain-old"})


def test_a_newer_traced_request_replaces_a_traced_exemplar_at_once() -> None:
    agg = Aggregator(ComponentContext())
    t2 = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    agg.process([_req("traced-1", bytes.fromhex(TRACE), T0), _req("plain", None, T0 + 1),
                 _req("traced-2", t2, T0 + 2)], [0] * 16)
    second = {"trace_id": t2.hex(), "request_id": "traced-2"}
    assert _bucket_exemplar(agg) == (second, second)


def test_untraced_exemplars_follow_the_latest_request_and_buckets_stay_separate() -> None:
    agg = Aggregator(ComponentContext())
    agg.process([_req("a", None, T0), _req("b", None, T0 + 1), _req("slow", bytes.fromhex(TRACE), T0 + 2, 0.3)],
                [0] * 16)
    assert _bucket_exemplar(agg) == ({"request_id": "b"}, {"request_id": "b"})
    ex = _exemplars(agg)
    assert ex[("inferwatch_request_duration_seconds_bucket", None, "0.5")] == {"trace_id": TRACE, "request_id": "slow"}

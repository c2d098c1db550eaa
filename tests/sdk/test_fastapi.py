"""The ASGI middleware through a real FastAPI app (httpx ASGITransport) and a real uvicorn server."""

from __future__ import annotations

import asyncio
import http.client
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

import inferwatch  # noqa: E402
from inferwatch import _core  # noqa: E402
from inferwatch._asgi import request_id_from_headers  # noqa: E402
from inferwatch.wire import EV_REQUEST, EV_STAGE, OUTCOME_ERROR, OUTCOME_OK, OUTCOME_SHED  # noqa: E402
from tests.helpers.net import free_port  # noqa: E402
from tests.sdk.conftest import Receiver, buffered, wait_for  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402


def make_app() -> Any:
    app = FastAPI()
    inferwatch.instrument_fastapi(app)

    @inferwatch.stage("inference")
    async def infer(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    @app.get("/predict")
    async def predict(request: Request, x: int = 1) -> dict[str, Any]:
        with inferwatch.stage("preprocess"):
            pass
        y = await infer(x)
        logging.getLogger("tests.sdk.app").info("predicted %s", y)
        return {"y": y, "rid": inferwatch.current_request_id(), "state_rid": getattr(request.state, "request_id", None)}

    @app.get("/fail")
    async def fail() -> None:
        raise KeyError("boom")

    @app.get("/unavailable")
    async def unavailable() -> JSONResponse:
        return JSONResponse({"error": "busy"}, status_code=503)

    @inferwatch.stage("generate")
    async def tokens(n: int) -> AsyncIterator[bytes]:
        for i in range(n):
            await asyncio.sleep(0)
            yield f"tok{i} ".encode()

    @app.get("/stream")
    async def stream(n: int = 3) -> StreamingResponse:
        return StreamingResponse(tokens(n), media_type="text/plain")

    return app


async def _get(app: Any, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get(path, headers=headers or {})


def _requests() -> list[tuple[Any, ...]]:
    return [e for e in buffered() if e[0] == EV_REQUEST]


def test_generated_request_id_is_echoed_and_visible_to_the_handler(sdk: Receiver) -> None:
    r = asyncio.run(_get(make_app(), "/predict?x=4"))
    assert r.status_code == 200
    body = r.json()
    rid = r.headers["x-request-id"]
    assert body == {"y": 8, "rid": rid, "state_rid": rid}
    (ev,) = _requests()
    assert ev[4] == OUTCOME_OK and ev[6] == rid
    assert [s[0] for s in ev[8]] == ["ingress", "preprocess", "inference"]


@pytest.mark.parametrize(
    ("headers", "expected", "traced"),
    [
        ({"traceparent": TRACEPARENT, "x-request-id": "client-1"}, "client-1", True),
        ({"traceparent": TRACEPARENT}, TRACE, True),
        ({"x-request-id": "client-1"}, "client-1", False),
        ({"traceparent": "garbage", "x-request-id": "client-2"}, "client-2", False),
        ({"traceparent": f"ff-{TRACE}-00f067aa0ba902b7-01", "x-request-id": "c3"}, "c3", False),
        ({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "x-request-id": "c4"}, "c4", False),
    ],
)
def test_request_id_precedence_header_then_traceparent(
    sdk: Receiver, headers: dict[str, str], expected: str, traced: bool,
) -> None:
    r = asyncio.run(_get(make_app(), "/predict", headers))
    assert r.headers["x-request-id"] == expected
    assert r.json()["rid"] == expected
    (ev,) = _requests()
    assert ev[6] == expected
    assert ev[7] == (bytes.fromhex(TRACE) if traced else None)


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "tab\there"])
def test_invalid_incoming_request_ids_are_replaced(sdk: Receiver, bad: str) -> None:
    r = asyncio.run(_get(make_app(), "/predict", {"x-request-id": bad}))
    rid = r.headers["x-request-id"]
    assert rid != bad and 0 < len(rid) <= 128 and " " not in rid


def test_request_id_from_headers_unit() -> None:
    assert request_id_from_headers([(b"x-request-id", b"abc")]) == ("abc", None)
    assert request_id_from_headers([(b"traceparent", TRACEPARENT.encode())]) == (TRACE, bytes.fromhex(TRACE))
    rid, trace = request_id_from_headers([])
    assert trace is None and rid


def test_exceptions_and_5xx_are_errors_and_503_is_shed(sdk: Receiver) -> None:
    app = make_app()
    r1 = asyncio.run(_get(app, "/fail"))
    r2 = asyncio.run(_get(app, "/unavailable"))
    assert r1.status_code == 500 and r2.status_code == 503
    assert r2.headers["x-request-id"]
    evs = _requests()
    # A 503 the server returns is load shed (issue 27), not an error of the model.
    assert [(e[4], e[5]) for e in evs] == [(OUTCOME_ERROR, "KeyError"), (OUTCOME_SHED, None)]


def test_more_than_255_stages_through_the_middleware_spill_and_the_scope_closes(sdk: Receiver) -> None:
    """The middleware's inline close hands a request with too many stages to request._close intact."""
    app = FastAPI()
    inferwatch.instrument_fastapi(app)

    @app.get("/many")
    async def many() -> dict[str, Any]:
        for _ in range(300):
            with inferwatch.stage("step"):
                pass
        return {"rid": inferwatch.current_request_id()}

    r = asyncio.run(_get(app, "/many"))
    assert r.status_code == 200 and r.json()["rid"] == r.headers["x-request-id"]
    evs = buffered()
    (req,) = [e for e in evs if e[0] == EV_REQUEST]
    spilled = [e for e in evs if e[0] == EV_STAGE]
    assert req[4] == OUTCOME_OK and req[6] == r.headers["x-request-id"]
    assert len(req[8]) == 255 and req[8][0][0] == "ingress" and len(spilled) == 301 - 255
    assert inferwatch.current_request_id() is None
    assert _core._rt is not None and _core._rt.internal_errors == 0


def test_an_app_that_sets_its_own_request_id_header_is_not_echoed_twice(sdk: Receiver) -> None:
    app = FastAPI()
    inferwatch.instrument_fastapi(app)

    @app.get("/own")
    async def own() -> JSONResponse:
        return JSONResponse({"ok": True}, headers={"X-Request-ID": "set-by-app"})

    r = asyncio.run(_get(app, "/own"))
    assert r.headers.get_list("x-request-id") == ["set-by-app"]


@pytest.mark.parametrize(
    ("start", "echoed"),
    [
        ({}, [(b"x-request-id", b"rid-1")]),  # no headers key: one is made
        ({"headers": ((b"content-length", b"0"),)}, [(b"content-length", b"0"), (b"x-request-id", b"rid-1")]),
        ({"headers": [[b"x-request-id", b"app"]]}, [[b"x-request-id", b"app"]]),  # the app's own wins
        ({"headers": ((b"x-request-id", b"app"),)}, ((b"x-request-id", b"app"),)),
    ],
)
def test_echo_handles_every_header_container_an_asgi_app_may_send(
    sdk: Receiver, start: dict[str, Any], echoed: Any
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, **start})
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "headers": [(b"x-request-id", b"rid-1")]}
    asyncio.run(inferwatch.InferwatchMiddleware(app)(scope, receive, send))
    assert sent[0]["headers"] == echoed
    (ev,) = _requests()
    assert ev[6] == "rid-1" and ev[4] == OUTCOME_OK


def test_streaming_endpoint_records_a_generator_stage(sdk: Receiver) -> None:
    r = asyncio.run(_get(make_app(), "/stream?n=5"))
    assert r.text == "tok0 tok1 tok2 tok3 tok4 "
    (ev,) = _requests()
    stages = {s[0]: s for s in ev[8]}
    assert stages["generate"][2][1] == 5
    assert len(stages["generate"][2][2]) == 4


def test_logging_inside_a_handler_carries_the_request_id(sdk: Receiver) -> None:
    seen: list[str] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.request_id)  # type: ignore[attr-defined]

    h = H()
    h.addFilter(inferwatch.RequestIdFilter())
    log = logging.getLogger("tests.sdk.app")
    log.addHandler(h)
    log.setLevel(logging.INFO)
    try:
        r = asyncio.run(_get(make_app(), "/predict", {"x-request-id": "log-me"}))
    finally:
        log.removeHandler(h)
    assert r.status_code == 200 and seen == ["log-me"]


def test_middleware_passes_through_before_configure() -> None:
    r = asyncio.run(_get(make_app(), "/predict"))
    assert r.status_code == 200
    assert "x-request-id" not in r.headers
    assert r.json()["rid"] is None


def test_non_http_scopes_pass_through(sdk: Receiver) -> None:
    calls = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["type"])

    mw = inferwatch.InferwatchMiddleware(app)
    asyncio.run(mw({"type": "lifespan"}, None, None))  # type: ignore[arg-type]
    assert calls == ["lifespan"] and _requests() == []


@pytest.mark.parametrize("bad", [{"model": ""}, {"model_version": 3}])
def test_a_middlewares_own_model_must_be_a_name(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be a non-empty string"):
        inferwatch.InferwatchMiddleware(lambda *a: None, **bad)  # type: ignore[arg-type,return-value]


def test_bad_ingress_stage_name_raises_at_definition() -> None:
    with pytest.raises(ValueError):
        inferwatch.InferwatchMiddleware(lambda *a: None, ingress_stage="bad name")  # type: ignore[arg-type,return-value]


@pytest.fixture
def uvicorn_server(receiver: Receiver) -> Iterator[int]:
    inferwatch.configure(service="svc", sidecar=receiver.path, flush_interval_ms=5)
    port = free_port()
    config = uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    assert wait_for(lambda: server.started, timeout=10)
    yield port
    server.should_exit = True
    t.join(10)


def test_real_uvicorn_server_echoes_ids_and_events_reach_the_sidecar(uvicorn_server: int, receiver: Receiver) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", uvicorn_server, timeout=5)
    rids = []
    for i in range(5):
        conn.request("GET", f"/predict?x={i}", headers={"X-Request-ID": f"uv-{i}"})
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read()
        rids.append(resp.getheader("x-request-id"))
    conn.request("GET", "/predict", headers={"traceparent": TRACEPARENT})
    resp = conn.getresponse()
    resp.read()
    assert resp.getheader("x-request-id") == TRACE
    conn.close()
    assert rids == [f"uv-{i}" for i in range(5)]
    got: list[tuple[Any, ...]] = []

    def arrived() -> bool:
        got.extend(r for r in receiver.records(timeout=0.01) if r[0] == EV_REQUEST)
        return len(got) >= 6

    assert wait_for(arrived, timeout=5)
    assert sorted(r[6] for r in got) == sorted([*rids, TRACE])
    assert all([s[0] for s in r[8]] == ["ingress", "preprocess", "inference"] for r in got)

"""Issue 27 in the SDK: status outcomes, route templates, exclusions and retry headers of the ASGI middleware."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi import FastAPI, Response  # noqa: E402

import inferwatch  # noqa: E402
from inferwatch._asgi import DEFAULT_EXCLUDED_PATHS, InferwatchMiddleware, scan_headers  # noqa: E402
from inferwatch.wire import (  # noqa: E402
    EV_HTTP,
    EV_REQUEST,
    OUTCOME_CLIENT_ERROR,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_SHED,
    outcome_of_status,
)
from tests.sdk.conftest import Receiver, buffered  # noqa: E402


def make_app(**options: Any) -> Any:
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"item": item_id}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/status/{code}")
    async def status(code: int) -> Response:
        return Response("x", status_code=code)

    return inferwatch.instrument_fastapi(app, **options)


async def _get(app: Any, paths: list[tuple[str, dict[str, str]]]) -> list[int]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return [(await client.get(p, headers=h)).status_code for p, h in paths]


def _events() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The buffered REQUEST and HTTP events (taken once: buffered() empties the buffer)."""
    evs = buffered()
    return [e for e in evs if e[0] == EV_REQUEST], [e for e in evs if e[0] == EV_HTTP]


@pytest.mark.parametrize(("status", "outcome"), [
    (200, OUTCOME_OK), (204, OUTCOME_OK), (302, OUTCOME_OK), (400, OUTCOME_CLIENT_ERROR), (404, OUTCOME_CLIENT_ERROR),
    (422, OUTCOME_CLIENT_ERROR), (429, OUTCOME_SHED), (503, OUTCOME_SHED), (500, OUTCOME_ERROR), (502, OUTCOME_ERROR),
])
def test_outcome_of_status(status: int, outcome: int) -> None:
    assert outcome_of_status(status) == outcome


def test_statuses_give_outcomes_and_route_templates(sdk: Receiver) -> None:
    codes = asyncio.run(_get(make_app(), [
        ("/items/7", {}), ("/items/seven", {}), ("/nope", {}), ("/status/429", {}), ("/status/503", {}),
        ("/status/500", {}), ("/healthz", {}), ("/docs", {}),
    ]))
    assert codes == [200, 422, 404, 429, 503, 500, 200, 200]
    reqs, https = _events()
    assert [(e[4], e[5]) for e in reqs] == [
        (OUTCOME_OK, None), (OUTCOME_CLIENT_ERROR, None), (OUTCOME_CLIENT_ERROR, None), (OUTCOME_SHED, None),
        (OUTCOME_SHED, None), (OUTCOME_ERROR, "http_500")]  # no REQUEST for /healthz and /docs
    http = [(e[3], e[4], e[5], e[8]) for e in https]
    assert http == [
        ("/items/{item_id}", 200, OUTCOME_OK, False), ("/items/{item_id}", 422, OUTCOME_CLIENT_ERROR, False),
        (None, 404, OUTCOME_CLIENT_ERROR, False), ("/status/{code}", 429, OUTCOME_SHED, False),
        ("/status/{code}", 503, OUTCOME_SHED, False), ("/status/{code}", 500, OUTCOME_ERROR, False),
        ("/healthz", 200, OUTCOME_OK, True), ("/docs", 200, OUTCOME_OK, True)]


def test_include_and_exclude_settings(sdk: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    # /healthz counted again; a route template excluded (its REQUEST dropped, its HTTP event marked).
    app = make_app(include_paths=["/healthz"], exclude_paths=[*DEFAULT_EXCLUDED_PATHS, "/status/{code}"])
    asyncio.run(_get(app, [("/healthz", {}), ("/status/204", {}), ("/items/1", {})]))
    reqs, https = _events()
    assert [e[4] for e in reqs] == [OUTCOME_OK, OUTCOME_OK]  # /healthz and /items/1
    assert [(e[3], e[8]) for e in https] == [
        ("/healthz", False), ("/status/{code}", True), ("/items/{item_id}", False)]
    monkeypatch.setenv("INFERWATCH_HTTP_EXCLUDE", "/items/{item_id}, /x")
    assert InferwatchMiddleware(lambda *a: None).excluded == {"/items/{item_id}", "/x"}
    monkeypatch.setenv("INFERWATCH_HTTP_INCLUDE", "/x")
    assert InferwatchMiddleware(lambda *a: None).excluded == {"/items/{item_id}"}
    with pytest.raises(ValueError, match="must be strings starting with '/'"):
        InferwatchMiddleware(lambda *a: None, exclude_paths=["healthz"])


def test_client_ids_and_retry_headers(sdk: Receiver) -> None:
    asyncio.run(_get(make_app(), [
        ("/items/1", {"X-Request-ID": "c-1"}), ("/items/1", {"X-Request-ID": "c-1", "X-Retry-Count": "2"}),
        ("/items/1", {"x-envoy-attempt-count": "1"}), ("/items/1", {"x-envoy-attempt-count": "3"}),
        ("/items/1", {"X-Stainless-Retry-Count": "1"}), ("/items/1", {"X-Retry-Count": "many"}),
        ("/items/1", {}),
    ]))
    # (resend_count, client-sent ID): generated IDs never travel as the client's.
    assert [(e[6], e[9]) for e in _events()[1]] == [
        (0, "c-1"), (2, "c-1"), (0, None), (2, None), (1, None), (0, None), (0, None)]


def test_scan_headers_unit() -> None:
    rid, trace, client, resend = scan_headers([(b"x-request-id", b"abc"), (b"x-envoy-attempt-count", b"2")])
    assert (rid, trace, client, resend) == ("abc", None, "abc", 1)
    rid, _, client, resend = scan_headers([(b"x-request-id", b"has space"), (b"x-retry-count", b"99999")])
    assert client is None and rid != "has space" and resend == 0  # invalid ID replaced; absurd count ignored

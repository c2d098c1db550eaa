"""A FastAPI app with the routes the overload test needs: a model route, shedding, a slow handler, a probe.

Configured from INFERWATCH_* environment variables; served by a real uvicorn in tests/e2e/test_overload.py.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Response

import inferwatch

inferwatch.configure()
app = inferwatch.instrument_fastapi(FastAPI())


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/items/{item_id}")
async def item(item_id: int) -> dict[str, int]:
    # A non-integer item_id is a 422 from FastAPI's validation, inside the matched route.
    return {"item": item_id}


@app.get("/shed")
async def shed() -> Response:
    return Response("slow down", status_code=429, headers={"Retry-After": "1"})


@app.get("/busy")
async def busy() -> Response:
    return Response("overloaded", status_code=503)


@app.get("/slow")
async def slow() -> dict[str, str]:
    # A plain handler that never calls receive: the client gives up long before it answers.
    await asyncio.sleep(3.0)
    return {"status": "late"}

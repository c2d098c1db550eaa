"""A small FastAPI model server instrumented with the real SDK, served by multi-worker uvicorn in the tests.

Configured from INFERWATCH_* environment variables (service, model, sidecar address).
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Response

import inferwatch

inferwatch.configure()
app = inferwatch.instrument_fastapi(FastAPI())


@inferwatch.stage("preprocess")
def preprocess(x: float) -> list[float]:
    return [x, x * 2]


@inferwatch.stage("inference")
async def infer(v: list[float]) -> float:
    await asyncio.sleep(0.002)
    return sum(v)


@app.get("/predict")
async def predict(x: float = 1.0) -> dict[str, float]:
    y = await infer(preprocess(x))
    inferwatch.record(prediction=y, confidence=0.75, features={"x": x, "kind": "a"})
    return {"y": y}


@app.get("/fail")
async def fail() -> Response:
    # A 5xx response counts as an error with error_type http_500 (a 503 would be load shed).
    return Response("broken", status_code=500)

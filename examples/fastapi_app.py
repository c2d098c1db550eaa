"""A small model server instrumented with the inferwatch SDK.

Run it (one or several workers; each worker configures the SDK from the
``INFERWATCH_*`` environment variables and sends to the sidecar)::

    INFERWATCH_SIDECAR=unix:///tmp/inferwatch/ingest.sock \\
        uvicorn examples.fastapi_app:app --host 127.0.0.1 --port 8000 --workers 2

    curl -s -X POST localhost:8000/predict -H 'content-type: application/json' \\
        -d '{"age": 31, "income": 52000, "country": "DE"}'
    curl -sN 'localhost:8000/generate?prompt=hello&max_tokens=8'

What it shows:

- the ASGI middleware opens a request scope per HTTP request, picks the request
  ID (``traceparent``, then ``X-Request-ID``, then a generated one), echoes it
  and times the ingress stage;
- the five serving stages: ingress, queue (waiting for a model slot),
  preprocess, inference and postprocess;
- ``record()`` of the prediction, its confidence and the input features, for
  the sidecar's drift tests;
- a streaming endpoint whose token generator is a stage, so the sidecar sees
  the time to the first token, the gaps between tokens and the token count;
  it is another model (``toy-llm``, ``EXAMPLE_LLM_MODEL``), so it is served by an app of its own
  whose middleware names that model: its requests, latency and records never mix with the
  classifier's;
- ``observe_batch`` and ``set_queue_depth`` for the serving queue;
- log lines that carry the request ID.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

import inferwatch

log = logging.getLogger("examples.fastapi_app")

# Arguments left as None fall back to INFERWATCH_* variables (see inferwatch._env);
# these are only the example's defaults when the variables are not set.
inferwatch.configure(
    service=os.environ.get("INFERWATCH_SERVICE") or "example-model-server",
    model=os.environ.get("INFERWATCH_MODEL") or "toy-classifier",
    model_version=os.environ.get("INFERWATCH_MODEL_VERSION") or "v1",
)

_handler = logging.StreamHandler()
_handler.addFilter(inferwatch.RequestIdFilter())
_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"))
log.addHandler(_handler)
log.setLevel(os.environ.get("EXAMPLE_LOG_LEVEL", "WARNING"))
log.propagate = False

#: Model slots: requests beyond this wait in the "queue" stage.
MODEL_SLOTS = int(os.environ.get("EXAMPLE_MODEL_SLOTS", "4"))
#: Simulated inference time, seconds.
INFERENCE_S = float(os.environ.get("EXAMPLE_INFERENCE_S", "0.002"))
#: Simulated time per generated token, seconds.
TOKEN_S = float(os.environ.get("EXAMPLE_TOKEN_S", "0.002"))

COUNTRIES = ("DE", "FR", "US", "JP", "BR")
WEIGHTS = {"age": 0.03, "income": 0.00002, "tenure": 0.1}
BIAS = -2.0

#: The generation endpoint's own model (its requests and records count under it, not the classifier's).
LLM_MODEL = os.environ.get("EXAMPLE_LLM_MODEL") or "toy-llm"

classifier = FastAPI(title="inferwatch example model server: the classifier")
inferwatch.instrument_fastapi(classifier)
llm = FastAPI(title="inferwatch example model server: the generator")
inferwatch.instrument_fastapi(llm, model=LLM_MODEL, model_version="v1")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The server: ``/generate`` goes to the generator's app, everything else (and lifespan) to the classifier's."""
    if scope["type"] == "http" and scope["path"] == "/generate":
        await llm(scope, receive, send)
    else:
        await classifier(scope, receive, send)

_slots: asyncio.Semaphore | None = None
_waiting = 0


def slots() -> asyncio.Semaphore:
    global _slots
    if _slots is None:  # created lazily, inside the worker's event loop
        _slots = asyncio.Semaphore(MODEL_SLOTS)
    return _slots


class Features(BaseModel):
    age: float = Field(ge=0, le=150)
    income: float = Field(ge=0)
    tenure: float = 0.0
    country: str = "DE"


@inferwatch.stage("preprocess")
def preprocess(f: Features) -> dict[str, Any]:
    """Turn the request into model features (numbers and one categorical)."""
    country = f.country.upper() if f.country.upper() in COUNTRIES else "other"
    return {"age": f.age, "income": f.income, "tenure": f.tenure, "income_log": math.log1p(f.income),
            "country": country}


@inferwatch.stage("inference")
async def infer(x: dict[str, Any]) -> float:
    """A toy logistic model; the sleep stands in for the accelerator."""
    await asyncio.sleep(INFERENCE_S)
    inferwatch.observe_batch(1)
    z = BIAS + sum(WEIGHTS[k] * x[k] for k in WEIGHTS)
    return 1.0 / (1.0 + math.exp(-z))


@inferwatch.stage("postprocess")
def postprocess(p: float) -> tuple[str, float]:
    label = "churn" if p >= 0.5 else "stay"
    return label, p if p >= 0.5 else 1.0 - p


@classifier.post("/predict")
async def predict(body: Features) -> dict[str, Any]:
    global _waiting
    x = preprocess(body)
    _waiting += 1
    inferwatch.set_queue_depth(_waiting)
    try:
        async with inferwatch.stage("queue"):
            await slots().acquire()
    finally:
        _waiting -= 1
    try:
        p = await infer(x)
    finally:
        slots().release()
    label, confidence = postprocess(p)
    inferwatch.record(prediction=label, confidence=confidence, features=x)
    log.info("predicted %s (%.2f)", label, confidence)
    return {"prediction": label, "confidence": round(confidence, 4), "request_id": inferwatch.current_request_id()}


@inferwatch.stage("generate")
async def tokens(prompt: str, max_tokens: int) -> AsyncIterator[bytes]:
    """A fake LLM: a slower first token (prefill), then one token per step."""
    await asyncio.sleep(TOKEN_S * 5)
    words = (prompt.split() or ["..."]) * max_tokens
    for i in range(max_tokens):
        if i:
            await asyncio.sleep(TOKEN_S)
        yield (words[i] + " ").encode()


@llm.get("/generate")
async def generate(prompt: str = "hello world", max_tokens: int = 16) -> StreamingResponse:
    if not 1 <= max_tokens <= 512:
        raise HTTPException(status_code=422, detail="max_tokens must be between 1 and 512")
    inferwatch.record(prediction="generate", features={"prompt_chars": len(prompt), "max_tokens": max_tokens})
    return StreamingResponse(tokens(prompt, max_tokens), media_type="text/plain")


@classifier.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {"ok": True, "inferwatch": inferwatch.stats()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the inferwatch example model server.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    import uvicorn

    uvicorn.run("examples.fastapi_app:app", host=args.host, port=args.port, workers=args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

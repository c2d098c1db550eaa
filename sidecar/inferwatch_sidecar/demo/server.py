"""The demo model server: FastAPI, instrumented with the inferwatch SDK, run under uvicorn.

Run it the way the scenario does (several workers need the import string)::

    INFERWATCH_SIDECAR=unix:///tmp/iw/ingest.sock INFERWATCH_MODEL=credit-risk INFERWATCH_MODEL_VERSION=v1 \\
        python -m uvicorn inferwatch_sidecar.demo.server:app --workers 2 --port 8000

Each worker trains the model at start-up (seeded, so every worker serves the
same model) and then serves:

- ``POST /predict`` ``{"features": {...}}``: five stages per request: ``ingress``
  (the SDK middleware), ``preprocess``, ``queue`` (waiting for the dynamic
  batcher), ``inference`` (the batch the request rode in) and ``postprocess``,
  which calls ``inferwatch.record(prediction, confidence, features)``. The
  batcher reports batch sizes and the queue depth.
- ``POST /generate`` ``{"prompt": ..., "max_tokens": n}``: a streamed token
  generator timed by a ``decode`` stage (time to first token, inter-token gaps,
  tokens).
- ``GET /healthz``; ``GET``/``PUT /admin/faults`` (Bearer token) to inject faults.

With no GPU, the simulated caching allocator of :mod:`.allocator` feeds the
SDK's allocator probe (``torch_stats_source``).

Environment (besides the SDK's ``INFERWATCH_*`` variables):

| variable | meaning |
| --- | --- |
| ``INFERWATCH_DEMO_STATE_DIR`` | directory of the fault file and the worker PID files |
| ``INFERWATCH_DEMO_ROLE`` | ``stable`` or ``canary`` (serves the canary model) |
| ``INFERWATCH_DEMO_SEED`` | dataset and model seed (default 0) |
| ``INFERWATCH_DEMO_ADMIN_TOKEN`` | token for ``/admin/faults``; unset disables the route |
| ``INFERWATCH_DEMO_WAIT_SOCKET_S`` | wait this long for the sidecar's socket before configuring the SDK (default 60) |
| ``INFERWATCH_DEMO_ERROR_SHARE`` | share of predictions that fail with 503 (default 0.003) |
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

import inferwatch
from inferwatch_sidecar.demo import allocator
from inferwatch_sidecar.demo import faults as fl
from inferwatch_sidecar.demo import model as mdl

try:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import StreamingResponse
    from pydantic import BaseModel, Field
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        f"the demo model server needs FastAPI and uvicorn ({e.name} is missing): pip install \"inferwatch[demo]\""
    ) from e

log = logging.getLogger("inferwatch.demo.server")

MAX_BATCH = 32
BATCH_WAIT_S = 0.002
TOKENS = ("the", "model", "says", "approve", "review", "decline", "because", "of", "income", "and", "debt", ".")


class PredictBody(BaseModel):
    features: dict[str, float | str | None] = Field(
        ..., description="Feature name -> value: the eight numeric features and 'region'."
    )


class GenerateBody(BaseModel):
    prompt: str = Field("", max_length=2000)
    max_tokens: int = Field(16, ge=1, le=256)


class _Item:
    __slots__ = ("numeric", "region", "started", "done")

    def __init__(self, numeric: list[float], region: str, loop: asyncio.AbstractEventLoop) -> None:
        self.numeric = numeric
        self.region = region
        self.started = asyncio.Event()
        self.done: asyncio.Future[tuple[str, float]] = loop.create_future()


class Batcher:
    """A dynamic batcher: collects requests for ``wait_s`` (up to ``max_batch``) and runs them together.

    Batches run as separate tasks, so a slow batch (the latency fault) does not
    hold up the queue behind it: the spike shows in ``inference`` only.
    """

    def __init__(self, state: State, max_batch: int = MAX_BATCH, wait_s: float = BATCH_WAIT_S) -> None:
        self.state = state
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass

    async def _loop(self) -> None:
        while True:
            items = [await self.queue.get()]
            await asyncio.sleep(self.wait_s)
            while len(items) < self.max_batch and not self.queue.empty():
                items.append(self.queue.get_nowait())
            inferwatch.set_queue_depth(self.queue.qsize())
            inferwatch.observe_batch(len(items))
            for it in items:
                it.started.set()
            t = asyncio.get_running_loop().create_task(self._run(items))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _run(self, items: list[_Item]) -> None:
        try:
            f = self.state.faults.get()
            numeric = np.array([it.numeric for it in items], dtype=np.float64)
            pred, conf = self.state.model.predict(numeric, [it.region for it in items], f.confidence_temperature)
            await self.state.maybe_delay("inference", f)
            for it, p, c in zip(items, pred, conf.tolist(), strict=True):
                if not it.done.done():
                    it.done.set_result((p, c))
        except Exception as e:  # a failed batch fails its requests, never the batcher
            for it in items:
                if not it.done.done():
                    it.done.set_exception(e)


class State:
    """Per-worker state: the model, the fault view, the batcher."""

    def __init__(self) -> None:
        self.role = os.environ.get("INFERWATCH_DEMO_ROLE", "stable")
        self.seed = int(os.environ.get("INFERWATCH_DEMO_SEED", "0"))
        self.state_dir = os.environ.get("INFERWATCH_DEMO_STATE_DIR")
        self.token = os.environ.get("INFERWATCH_DEMO_ADMIN_TOKEN") or None
        self.fault_path = os.path.join(self.state_dir, "faults.json") if self.state_dir else None
        self.faults = fl.FaultReader(self.fault_path)
        # The allocator probe runs on the SDK's sender thread: it gets its own reader.
        self.alloc_faults = fl.FaultReader(self.fault_path, check_s=0.5)
        model, _ = mdl.train(self.seed)
        self.model = model.canary() if self.role == "canary" else model
        self.batcher = Batcher(self)
        self.rng = random.Random(os.getpid())
        #: Share of predictions failing with 503 (a flaky feature store): the error panels are never empty,
        #: and the error-rate alert (5%) stays quiet.
        self.error_share = float(os.environ.get("INFERWATCH_DEMO_ERROR_SHARE", "0.003"))

    async def maybe_delay(self, stage: str, f: fl.Faults) -> None:
        if f.latency_stage == stage and f.latency_delay_s > 0 and self.rng.random() < f.latency_share:
            await asyncio.sleep(f.latency_delay_s)

    def allocator_stats(self) -> dict[int, dict[str, Any]]:
        """The simulated caching allocator of device 0 (what torch.cuda.memory_stats() would say)."""
        return allocator.memory_stats(self.alloc_faults.get(), os.getpid(), time.time())


def _write_pid_file(state: State) -> None:
    if not state.state_dir:
        return
    d = os.path.join(state.state_dir, "pids")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{state.role}-{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))


async def _wait_for_socket() -> None:
    """Wait for the sidecar's socket, so that no event is sent (and dropped) before it listens."""
    addr = os.environ.get("INFERWATCH_SIDECAR", "")
    path = addr[len("unix://"):] if addr.startswith("unix://") else addr if addr.startswith("/") else None
    if not path:
        return
    deadline = time.monotonic() + float(os.environ.get("INFERWATCH_DEMO_WAIT_SOCKET_S", "60"))
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            log.warning("sidecar socket %s did not appear; starting anyway (events are counted as dropped)", path)
            return
        await asyncio.sleep(0.05)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state = State()
    app.state.demo = state
    _write_pid_file(state)
    await _wait_for_socket()
    inferwatch.configure(torch_probe=True, torch_probe_interval_s=1.0, torch_stats_source=state.allocator_stats)
    state.batcher.start()
    try:
        yield
    finally:
        await state.batcher.stop()
        inferwatch.shutdown()


app = FastAPI(title="inferwatch demo model server", lifespan=lifespan)
inferwatch.instrument_fastapi(app)


def _state(request: Request) -> State:
    return request.app.state.demo  # type: ignore[no-any-return]


@app.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    st = _state(request)
    return {"ok": True, "pid": os.getpid(), "role": st.role, "model_version": st.model.version}


@app.post("/predict")
async def predict(body: PredictBody, request: Request) -> dict[str, Any]:
    st = _state(request)
    f = st.faults.get()
    with inferwatch.stage("preprocess"):
        feats = body.features
        numeric = []
        for name in mdl.NUMERIC_NAMES:
            v = feats.get(name)
            try:
                numeric.append(float(v) if v is not None else float("nan"))
            except (TypeError, ValueError):
                raise HTTPException(422, f"feature {name!r} must be a number, got {v!r}") from None
        region = str(feats.get(mdl.CATEGORICAL_NAME) or "")
        if st.rng.random() < st.error_share:
            raise HTTPException(503, "feature store timed out (simulated)")
        # A missing numeric value is imputed with the training mean (and recorded as missing).
        x = [m if v != v else v for v, m in zip(numeric, st.model.mean.tolist(), strict=True)]
        await st.maybe_delay("preprocess", f)
    item = _Item(x, region, asyncio.get_running_loop())
    with inferwatch.stage("queue"):
        st.batcher.queue.put_nowait(item)
        await item.started.wait()
    with inferwatch.stage("inference"):
        pred, conf = await item.done
    with inferwatch.stage("postprocess"):
        await st.maybe_delay("postprocess", f)
        recorded: dict[str, Any] = dict(zip(mdl.NUMERIC_NAMES, numeric, strict=True))
        recorded[mdl.CATEGORICAL_NAME] = region or None
        inferwatch.record(prediction=pred, confidence=conf, features=recorded)
        out = {"prediction": pred, "confidence": round(conf, 4), "model_version": st.model.version,
               "request_id": inferwatch.current_request_id()}
    return out


@inferwatch.stage("decode")
async def _decode(prompt: str, n: int) -> AsyncIterator[str]:
    rng = random.Random(hash(prompt) & 0xFFFF)
    await asyncio.sleep(0.01 + rng.random() * 0.01)  # prefill
    for _ in range(n):
        await asyncio.sleep(0.001 + rng.random() * 0.003)
        yield rng.choice(TOKENS) + " "


@app.post("/generate")
async def generate(body: GenerateBody) -> StreamingResponse:
    return StreamingResponse(_decode(body.prompt, body.max_tokens), media_type="text/plain")


def _check_token(st: State, request: Request) -> None:
    if st.token is None:
        raise HTTPException(404, "admin routes are disabled: set INFERWATCH_DEMO_ADMIN_TOKEN")
    got = request.headers.get("authorization", "")
    if not hmac.compare_digest(got.encode(), f"Bearer {st.token}".encode()):
        raise HTTPException(401, "missing or wrong bearer token")


@app.get("/admin/faults")
async def get_faults(request: Request) -> dict[str, Any]:
    st = _state(request)
    _check_token(st, request)
    return st.faults.get().to_json()


@app.put("/admin/faults")
async def put_faults(request: Request) -> dict[str, Any]:
    st = _state(request)
    _check_token(st, request)
    if st.fault_path is None:
        raise HTTPException(409, "no state directory: set INFERWATCH_DEMO_STATE_DIR")
    try:
        new = fl.Faults.from_json(await request.json())
    except (ValueError, TypeError) as e:
        raise HTTPException(422, str(e)) from None
    fl.write(st.fault_path, new)
    st.faults = fl.FaultReader(st.fault_path)  # this worker sees it at once; the others within 0.2 s
    return new.to_json()

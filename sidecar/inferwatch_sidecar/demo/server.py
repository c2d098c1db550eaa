"""The demo model server: FastAPI, instrumented with the inferwatch SDK, run under uvicorn.

Run it the way the scenario does (several workers need the import string)::

    INFERWATCH_SIDECAR=unix:///tmp/iw/ingest.sock INFERWATCH_MODEL=credit-risk INFERWATCH_MODEL_VERSION=v1 \\
        python -m uvicorn inferwatch_sidecar.demo.server:app --workers 2 --port 8000

Each worker trains the model at start-up (seeded, so every worker serves the
same model) and then serves:

- ``POST /predict`` ``{"features": {...}, "note": "..."}``: five stages per
  request: ``ingress`` (the SDK middleware), ``preprocess``, ``queue`` (waiting
  for the dynamic batcher, :class:`Batcher`), ``inference`` (the batch the
  request rode in) and ``postprocess``, which calls ``inferwatch.record(prediction,
  confidence, features)`` with the note's length as ``input_tokens``. The
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
| ``INFERWATCH_DEMO_ERROR_SHARE`` | share of predictions that fail with 504, spaced evenly (default 0.003) |
| ``INFERWATCH_DEMO_SHED_SHARE`` | share of predictions a simulated rate limiter answers with 429, spaced evenly (default 0.002) |
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import random
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

import inferwatch
from inferwatch_sidecar.demo import allocator, engine_sim
from inferwatch_sidecar.demo import faults as fl
from inferwatch_sidecar.demo import model as mdl

try:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import Response, StreamingResponse
    from pydantic import BaseModel, Field
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        f"the demo model server needs FastAPI and uvicorn ({e.name} is missing): pip install \"inferwatch[demo]\""
    ) from e

log = logging.getLogger("inferwatch.demo.server")

MAX_BATCH = 32
BATCH_WAIT_S = 0.002
#: Device time per padded token of a batch (a full batch of long notes takes about 0.15 s).
TOKEN_S = 10e-6
#: Notes longer than this many tokens go to the long-input bucket.
LONG_NOTE = 256
#: Padded tokens a batch holds at most (a long-input batch is full at about 7 notes of 2000 tokens).
TOKEN_BUDGET = 16384
#: The long-input bucket's max wait: its oldest request waits at most this long for the batch to fill.
LONG_WAIT_S = 0.8
TOKENS = ("the", "model", "says", "approve", "review", "decline", "because", "of", "income", "and", "debt", ".")


class PredictBody(BaseModel):
    features: dict[str, float | str | None] = Field(
        ..., description="Feature name -> value: the eight numeric features and 'region'."
    )
    note: str = Field("", max_length=100_000, description="The applicant's free-text note (padded in its batch).")


class GenerateBody(BaseModel):
    prompt: str = Field("", max_length=2000)
    max_tokens: int = Field(16, ge=1, le=256)


class _Item:
    __slots__ = ("numeric", "region", "tokens", "queued_at", "started", "done")

    def __init__(self, numeric: list[float], region: str, tokens: int, loop: asyncio.AbstractEventLoop) -> None:
        self.numeric = numeric
        self.region = region
        self.tokens = tokens
        self.queued_at = loop.time()
        self.started = asyncio.Event()
        self.done: asyncio.Future[tuple[str, float]] = loop.create_future()


def _batcher_ended(task: asyncio.Task[None]) -> None:
    """Log a batcher loop that ended other than by :meth:`Batcher.stop`: its requests would wait forever."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("the batcher stopped: requests will not be served", exc_info=exc)
    else:
        log.error("the batcher returned: requests will not be served")


class Batcher:
    """A dynamic batcher in front of one (simulated) device, with a bucket for long inputs.

    A batch is padded to its longest note, so its compute takes :data:`TOKEN_S` per padded token
    (``len(batch) * max(tokens)``), and the device runs one batch at a time: requests behind a long batch
    wait in the ``queue`` stage. To keep padding down, notes longer than :data:`LONG_NOTE` tokens go to
    their own bucket, which waits until a batch of them fills :data:`TOKEN_BUDGET` padded tokens or its
    oldest has waited :data:`LONG_WAIT_S` (no fast lane: the ``long_inputs`` fault shows what that costs).
    Short requests are collected for ``wait_s`` (up to ``max_batch``).

    The latency fault's sleep and the faulty canary's slowdown happen after the device is released, as
    separate tasks, so they show in ``inference`` only and do not hold up the queue.
    """

    def __init__(self, state: State, max_batch: int = MAX_BATCH, wait_s: float = BATCH_WAIT_S) -> None:
        self.state = state
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.short: deque[_Item] = deque()
        self.long: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    def put(self, item: _Item) -> None:
        (self.long if item.tokens > LONG_NOTE else self.short).append(item)
        self._wake.set()

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        self._loop_task.add_done_callback(_batcher_ended)

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass

    def _take_long(self, now: float) -> list[_Item]:
        """The long bucket's batch when it is full or its oldest waited LONG_WAIT_S, else nothing."""
        n, longest = 0, 0
        for it in self.long:
            if n == self.max_batch or (n + 1) * max(longest, it.tokens) > TOKEN_BUDGET:
                break
            n, longest = n + 1, max(longest, it.tokens)
        if not self.long:
            return []
        full = n < len(self.long) or n == self.max_batch
        if not full and now - self.long[0].queued_at < LONG_WAIT_S:
            return []
        return [self.long.popleft() for _ in range(max(n, 1))]

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.short and not self.long:
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(self.wait_s)
            items = self._take_long(loop.time())
            if not items and self.short:
                items = [self.short.popleft() for _ in range(min(self.max_batch, len(self.short)))]
            if not items:
                # Only long inputs, their batch not due yet: wait for its deadline or the next request.
                self._wake.clear()
                due = self.long[0].queued_at + LONG_WAIT_S - loop.time()
                try:
                    await asyncio.wait_for(self._wake.wait(), max(due, 0.0))
                except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                    pass
                continue
            inferwatch.set_queue_depth(len(self.short) + len(self.long))
            inferwatch.observe_batch(len(items))
            for it in items:
                it.started.set()
            await self._run(items)

    async def _run(self, items: list[_Item]) -> None:
        try:
            f = self.state.faults.get()
            model = self.state.model_for(f)
            numeric = np.array([it.numeric for it in items], dtype=np.float64)
            pred, conf = model.predict(numeric, [it.region for it in items], f.confidence_temperature)
            # The device is busy for the padded batch: the next batch waits (in the queue stage).
            await asyncio.sleep(TOKEN_S * len(items) * max(it.tokens for it in items))
        except Exception as e:  # a failed batch fails its requests, never the batcher
            _fail(items, e)
            return
        t = asyncio.get_running_loop().create_task(self._finish(items, f, pred, conf.tolist()))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _finish(self, items: list[_Item], f: fl.Faults, pred: list[str], conf: list[float]) -> None:
        try:
            await self.state.maybe_delay("inference", f)
            if f.canary_fault and self.state.role == "canary":
                await asyncio.sleep(fl.CANARY_SLOWDOWN_S)
            for it, p, c in zip(items, pred, conf, strict=True):
                if not it.done.done():
                    it.done.set_result((p, c))
        except Exception as e:
            _fail(items, e)


def _fail(items: list[_Item], e: Exception) -> None:
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
        self.model = model.healthy_canary() if self.role == "canary" else model
        #: What the canary serves once its fault is on (``canary_fault``).
        self.bad_model = model.canary()
        self.batcher = Batcher(self)
        #: The engine facts GET /engine/metrics reports (the saturation fault's KV cache and CPU).
        self.engine = engine_sim.EngineSim(self.state_dir)
        self.rng = random.Random(os.getpid())
        #: Share of predictions failing with 504 (a flaky feature store): the error panels are never empty,
        #: and the error-rate alert (5%) stays quiet.
        self.error_share = float(os.environ.get("INFERWATCH_DEMO_ERROR_SHARE", "0.003"))
        #: Share answered 429 by a simulated rate limiter: the shed panels are never empty either.
        self.shed_share = float(os.environ.get("INFERWATCH_DEMO_SHED_SHARE", "0.002"))
        #: Predictions this worker has begun: the simulated failures are spaced by it, not drawn, so that
        #: a short run has them for certain (the first of each within a worker's first few dozen).
        self.predictions = 0

    def simulated_failure(self) -> int | None:
        """504, 429 or None for this worker's next prediction: every ``1/share``-th one, from early on."""
        self.predictions += 1
        n = self.predictions
        for code, share, first in ((504, self.error_share, 10), (429, self.shed_share, 20)):
            if share > 0 and n >= first and (n - first) % max(1, round(1 / share)) == 0:
                return code
        return None

    def model_for(self, f: fl.Faults) -> mdl.Model:
        """The model this worker serves under the faults ``f``."""
        return self.bad_model if f.canary_fault and self.role == "canary" else self.model

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
    state.engine.start()
    try:
        yield
    finally:
        await state.engine.stop()
        await state.batcher.stop()
        inferwatch.shutdown()


app = FastAPI(title="inferwatch demo model server", lifespan=lifespan)
inferwatch.instrument_fastapi(app)


def _state(request: Request) -> State:
    return request.app.state.demo


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
        failure = st.simulated_failure()
        if failure == 504:
            raise HTTPException(504, "feature store timed out (simulated)")
        if failure == 429:
            raise HTTPException(429, "rate limited (simulated)", headers={"Retry-After": "1"})
        # A missing numeric value is imputed with the training mean (and recorded as missing).
        x = [m if v != v else v for v, m in zip(numeric, st.model.mean.tolist(), strict=True)]
        tokens = len(body.note.split())
        if f.cpu_burn_ms > 0:
            _tokenize_on_the_loop(body.note, f.cpu_burn_ms)
        await st.maybe_delay("preprocess", f)
    pred, conf = await _serve(st, f, x, region, tokens)
    with inferwatch.stage("postprocess"):
        await st.maybe_delay("postprocess", f)
        recorded: dict[str, Any] = dict(zip(mdl.NUMERIC_NAMES, numeric, strict=True))
        recorded[mdl.CATEGORICAL_NAME] = region or None
        # A request attribute, not a model input: the tail attribution finds it; drift leaves it out (the
        # reference has no such column).
        recorded["input_tokens"] = tokens
        inferwatch.record(prediction=pred, confidence=conf, features=recorded)
        out = {"prediction": pred, "confidence": round(conf, 4), "model_version": st.model.version,
               "request_id": inferwatch.current_request_id()}
    return out


def _tokenize_on_the_loop(note: str, cpu_ms: float) -> None:
    """The saturation fault's host-CPU phase: a slow tokenizer run on the event loop for ``cpu_ms`` of CPU."""
    end = time.thread_time() + cpu_ms / 1000
    words = note.split() or ["-"]
    while time.thread_time() < end:
        _ = [hash(w) for w in words]


async def _serve(st: State, f: fl.Faults, x: list[float], region: str, tokens: int) -> tuple[str, float]:
    """The queue and inference stages, counted as the engine counts them (:mod:`.engine_sim`)."""
    eng = st.engine
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    item = _Item(x, region, tokens, loop)
    held = 0
    with inferwatch.stage("queue"):
        eng.waiting += 1
        try:
            st.batcher.put(item)
            await item.started.wait()
        finally:
            eng.waiting -= 1
        # Waiting for KV blocks is queueing too (the saturation fault's KV phase).
        held = await eng.acquire_kv(tokens, f.kv_cache_tokens)
    t_queued = loop.time()
    eng.running += 1
    try:
        with inferwatch.stage("inference"):
            pred, conf = await item.done
            if held:
                await asyncio.sleep(engine_sim.KV_HOLD_S)  # generating, holding its blocks
    finally:
        eng.running -= 1
        await eng.release_kv(held)
        eng.finished(t_queued - t0, loop.time() - t0)
    return pred, conf


@app.get("/engine/metrics")
async def engine_metrics(request: Request) -> Response:
    """The engine's facts, vLLM's names, every worker summed (the sidecar's ``engines:`` target)."""
    st = _state(request)
    text = engine_sim.exposition(st.state_dir, mdl.NAME, st.engine.state())
    return Response(text, media_type="text/plain; version=0.0.4")


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

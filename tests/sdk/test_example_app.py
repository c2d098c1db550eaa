"""The example model server: in-process through httpx, and under uvicorn with two workers."""

from __future__ import annotations

import asyncio
import http.client
import importlib
import json
import os
import subprocess
import sys
import threading
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import inferwatch  # noqa: E402
from inferwatch.wire import EV_RECORD, EV_REQUEST  # noqa: E402
from tests.helpers.net import free_port  # noqa: E402
from tests.sdk.conftest import Receiver, wait_for  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGES = ["ingress", "preprocess", "queue", "inference", "postprocess"]


def _load_example(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> ModuleType:
    monkeypatch.setenv("INFERWATCH_SIDECAR", f"unix://{receiver.path}")
    monkeypatch.setenv("INFERWATCH_FLUSH_INTERVAL_MS", "5")
    monkeypatch.setenv("EXAMPLE_INFERENCE_S", "0")
    monkeypatch.setenv("EXAMPLE_TOKEN_S", "0")
    if "examples.fastapi_app" in sys.modules:
        return importlib.reload(sys.modules["examples.fastapi_app"])
    return importlib.import_module("examples.fastapi_app")


def _collect(receiver: Receiver, want_requests: int, timeout: float = 10) -> list[tuple[Any, ...]]:
    got: list[tuple[Any, ...]] = []

    def enough() -> bool:
        got.extend(receiver.records(timeout=0.01))
        return sum(1 for r in got if r[0] == EV_REQUEST) >= want_requests

    assert wait_for(enough, timeout=timeout)
    return got


def test_example_app_in_process(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    mod = _load_example(monkeypatch, receiver)
    assert inferwatch.is_configured()

    async def run() -> list[Any]:
        transport = httpx.ASGITransport(app=mod.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r1 = await c.post("/predict", json={"age": 31, "income": 52000, "country": "de"}, headers={"x-request-id": "ex-1"})
            r2 = await c.get("/generate", params={"prompt": "a b", "max_tokens": 5})
            r3 = await c.post("/predict", json={"age": -1, "income": 1})
            return [r1, r2, r3]

    r1, r2, r3 = asyncio.run(run())
    assert r1.status_code == 200 and r1.json()["request_id"] == "ex-1" and r1.headers["x-request-id"] == "ex-1"
    assert r2.text == "a b a b a " and r2.headers["x-request-id"]
    assert r3.status_code == 422
    recs = _collect(receiver, 3)
    reqs = {r[6]: r for r in recs if r[0] == EV_REQUEST}
    assert [s[0] for s in reqs["ex-1"][8]] == STAGES
    gen = reqs[r2.headers["x-request-id"]]
    assert [s[0] for s in gen[8]] == ["ingress", "generate"] and gen[8][1][2][1] == 5
    # Generation is its own model: its request and its record, never the classifier's.
    assert tuple(reqs["ex-1"][1]) == ("example-model-server", "toy-classifier", "v1")
    assert tuple(gen[1]) == ("example-model-server", "toy-llm", "v1")
    (gen_rec,) = [r for r in recs if r[0] == EV_RECORD and r[3] == r2.headers["x-request-id"]]
    assert tuple(gen_rec[1]) == ("example-model-server", "toy-llm", "v1") and gen_rec[4] == "generate"
    (pred,) = [r for r in recs if r[0] == EV_RECORD and r[3] == "ex-1"]
    schema, nums, cats = pred[7]
    assert pred[4] in ("churn", "stay") and 0.5 <= pred[5] <= 1
    assert dict(zip(schema.numeric, nums, strict=True))["age"] == 31.0
    assert cats == ("DE",)


@pytest.mark.slow
def test_example_app_under_uvicorn_with_two_workers(receiver: Receiver) -> None:
    port = free_port()
    env = {**os.environ, "INFERWATCH_SIDECAR": f"unix://{receiver.path}", "EXAMPLE_INFERENCE_S": "0",
           "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "2", "--log-level", "warning"],
        cwd=ROOT, env=env,
    )
    try:
        def up() -> bool:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            try:
                c.request("GET", "/healthz")
                r = c.getresponse()
                r.read()
                return r.status == 200
            except OSError:
                return False
            finally:
                c.close()

        assert wait_for(up, timeout=30, interval=0.1)
        # Read continuously, as the sidecar does: a Unix datagram queue holds only a few datagrams.
        frames: list[Any] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                frames.extend(receiver.poll(0.01))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        n = 20
        for i in range(n):  # a new connection each time, so both workers get some
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("POST", "/predict", body=json.dumps({"age": i, "income": 1000.0 * i}),
                      headers={"content-type": "application/json", "x-request-id": f"w-{i}"})
            r = c.getresponse()
            assert r.status == 200 and r.getheader("x-request-id") == f"w-{i}"
            r.read()
            c.close()
        reqs: dict[str, Any] = {}
        producers = set()

        def all_arrived() -> bool:
            for f in list(frames):
                producers.add((f.pid, f.producer_id))
                for r in f.records:
                    if r[0] == EV_REQUEST and r[6].startswith("w-"):
                        reqs[r[6]] = r
            return len(reqs) == n

        assert wait_for(all_arrived, timeout=10)
        stop.set()
        reader.join(5)
        assert sorted(reqs) == sorted(f"w-{i}" for i in range(n))
        assert all([s[0] for s in r[8]] == STAGES for r in reqs.values())
        assert len({pid for pid, _ in producers}) >= 1
    finally:
        proc.terminate()
        proc.wait(15)

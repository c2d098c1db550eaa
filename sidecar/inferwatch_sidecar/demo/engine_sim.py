"""The demo server's own engine state, exposed the way vLLM exposes its own (for the ``saturation`` fault).

The sidecar's ``engines:`` section scrapes an engine's Prometheus endpoint and its saturation component
judges what binds (docs/saturation.md). The demo's FastAPI server has no engine of its own, so each worker
keeps the few facts vLLM would report, from its real requests:

- ``running`` (requests in their ``inference`` stage) and ``waiting`` (in ``queue``, or waiting for KV
  blocks), and the seconds of both (``vllm:request_queue_time_seconds_sum`` / ``e2e_request_latency``);
- a KV cache of ``kv_cache_tokens`` tokens (the fault's; 0: unbounded, usage 0): each request holds its
  note's tokens plus :data:`GENERATED_TOKENS` for its inference, plus :data:`KV_HOLD_S` of generation; a
  request that does not fit waits for blocks and counts one preemption (vLLM preempts a running sequence
  when it runs out of blocks; here the newcomer waits, which is what the KV-cache rule reads either way);
- ``process_cpu_seconds_total``: the worker's real CPU time (``time.process_time``), which the
  ``cpu_burn_ms`` fault raises by tokenizing on the event loop.

uvicorn runs two workers, and a scrape reaches one of them, so each worker writes its state to
``<state dir>/engine/<pid>.json`` every :data:`WRITE_S` and ``GET /engine/metrics`` (on any worker) sums
them: one engine, as the sidecar expects of one endpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

#: Tokens a request generates (and holds KV blocks for) on top of its note.
GENERATED_TOKENS = 96
#: Seconds a request holds its KV blocks while it "generates" (the saturation fault's KV phase only).
KV_HOLD_S = 0.15
#: How often a worker writes its state for the others.
WRITE_S = 0.25


class EngineSim:
    """One worker's engine facts (see the module docstring). Not thread-safe: the event loop only."""

    def __init__(self, state_dir: str | None) -> None:
        self.dir = Path(state_dir) / "engine" if state_dir else None
        self.running = 0
        self.waiting = 0
        self.kv_used = 0
        self.kv_total = 0
        self.preemptions = 0
        self.queue_s = 0.0
        self.e2e_s = 0.0
        self.requests = 0
        self._freed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def acquire_kv(self, tokens: int, capacity: int) -> int:
        """Hold KV blocks for ``tokens`` (+ the generated ones) under ``capacity`` (0: no limit); returns the
        tokens held (pass them to :meth:`release_kv`)."""
        need = tokens + GENERATED_TOKENS
        self.kv_total = capacity
        if capacity <= 0:
            return 0
        need = min(need, capacity)
        if self.kv_used + need > capacity:
            self.preemptions += 1
            self.waiting += 1
            try:
                async with self._freed:
                    await self._freed.wait_for(lambda: self.kv_used + need <= capacity)
            finally:
                self.waiting -= 1
        self.kv_used += need
        return need

    async def release_kv(self, held: int) -> None:
        if held <= 0:
            return
        self.kv_used -= held
        async with self._freed:
            self._freed.notify_all()

    def finished(self, queue_s: float, e2e_s: float) -> None:
        self.requests += 1
        self.queue_s += queue_s
        self.e2e_s += e2e_s

    def state(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": self.waiting, "kv_used": self.kv_used, "kv_total": self.kv_total,
                "preemptions": self.preemptions, "queue_s": self.queue_s, "e2e_s": self.e2e_s,
                "requests": self.requests, "cpu_s": time.process_time()}

    def start(self) -> None:
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._task = asyncio.get_running_loop().create_task(self._write_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _write_loop(self) -> None:
        assert self.dir is not None
        path = self.dir / f"{os.getpid()}.json"
        tmp = self.dir / f".{os.getpid()}.tmp"
        while True:
            tmp.write_text(json.dumps(self.state()))
            os.replace(tmp, path)
            await asyncio.sleep(WRITE_S)


def exposition(state_dir: str | None, model: str, own: dict[str, Any]) -> str:
    """vLLM-style exposition of every worker's state summed (``own``: this worker's, fresher than its file)."""
    states = {os.getpid(): own}
    d = Path(state_dir) / "engine" if state_dir else None
    if d is not None and d.is_dir():
        for f in d.glob("*.json"):
            pid = int(f.stem) if f.stem.isdigit() else None
            if pid is None or pid in states:
                continue
            try:
                states[pid] = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
    tot = {k: sum(float(s.get(k, 0.0)) for s in states.values())
           for k in ("running", "waiting", "kv_used", "kv_total", "preemptions", "queue_s", "e2e_s", "requests",
                     "cpu_s")}
    lab = f'{{model_name="{model}"}}'
    usage = tot["kv_used"] / tot["kv_total"] if tot["kv_total"] > 0 else 0.0
    lines = [
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{lab} {tot['running']:g}",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{lab} {tot['waiting']:g}",
        "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{lab} {min(usage, 1.0):.6g}",
        "# TYPE vllm:num_preemptions_total counter", f"vllm:num_preemptions_total{lab} {tot['preemptions']:g}",
        "# TYPE vllm:request_queue_time_seconds summary",
        f"vllm:request_queue_time_seconds_sum{lab} {tot['queue_s']:.6f}",
        f"vllm:request_queue_time_seconds_count{lab} {tot['requests']:g}",
        "# TYPE vllm:e2e_request_latency_seconds summary",
        f"vllm:e2e_request_latency_seconds_sum{lab} {tot['e2e_s']:.6f}",
        f"vllm:e2e_request_latency_seconds_count{lab} {tot['requests']:g}",
        "# TYPE process_cpu_seconds_total counter", f"process_cpu_seconds_total {tot['cpu_s']:.6f}",
    ]
    return "\n".join(lines) + "\n"

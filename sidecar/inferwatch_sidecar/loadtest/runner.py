"""The load test's steps: closed-loop concurrency levels and open-loop fixed rates, and what each measured.

A closed-loop step keeps ``c`` requests in flight on ``c`` keep-alive connections for ``duration`` seconds
(or ``max_requests``): each answer sends the next request from the callback that received it, so the
generator adds one ``write`` and one parse per request and nothing else. An open-loop step sends requests
at scheduled arrival times (Poisson, or gamma with shape ``burstiness``: below 1 is burstier), measuring
each latency from its scheduled time so a slow server cannot hide queueing (no coordinated omission).
Throughput counts successful answers that completed inside the step's window.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferwatch_sidecar.loadtest.client import Connection, Result, clock, connect
from inferwatch_sidecar.loadtest.payloads import Prepared

#: Share of one core above which the generator warns that it may be the bottleneck.
CPU_WARN = 0.85
#: Most per-request samples kept per step (latencies beyond are counted, sampled by reservoir).
MAX_SAMPLES = 200_000
_OOM_MARKERS = (b"out of memory", b"outofmemory", b"oom")


class LoadTestError(RuntimeError):
    """The target cannot be load-tested (unreachable, or answers that are not what the API promises)."""


@dataclass
class Objectives:
    """Per-request objectives a good answer meets (None: not checked), in seconds."""

    ttft: float | None = None
    itl: float | None = None
    e2e: float | None = None

    @staticmethod
    def parse(text: str | None) -> Objectives:
        o = Objectives()
        if not text:
            return o
        for part in text.split(","):
            k, sep, v = part.partition("=")
            k = k.strip().lower()
            if not sep or k not in ("ttft", "itl", "tpot", "e2e"):
                raise ValueError(f"--slo {text!r}: expected ttft=S,itl=S,e2e=S (seconds; any of them)")
            try:
                val = float(v.rstrip("s"))
            except ValueError:
                raise ValueError(f"--slo {part!r}: {v!r} is not a number of seconds") from None
            if not val > 0:
                raise ValueError(f"--slo {part!r}: the objective must be above 0 seconds")
            setattr(o, "itl" if k == "tpot" else k, val)
        return o


@dataclass
class Step:
    """What one step measured. ``concurrency`` is the level set (closed loop) or the mean in flight (rate)."""

    concurrency: float
    rate: float | None
    duration_s: float
    requests: int = 0
    ok: int = 0
    good: int = 0
    throughput_rps: float = 0.0
    output_tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    itls: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_detail: str = ""
    cpu_share: float = 0.0
    client_limited: int = 0
    server: dict[str, Any] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def quantile(self, which: str, q: float) -> float | None:
        return quantile(sorted(getattr(self, which)), q)

    def mean_latency(self) -> float:
        return sum(self.latencies) / len(self.latencies) if self.latencies else math.nan

    def latency_cv(self) -> float:
        n = len(self.latencies)
        if n < 2:
            return 1.0
        m = self.mean_latency()
        var = sum((x - m) ** 2 for x in self.latencies) / (n - 1)
        return math.sqrt(var) / m if m > 0 else 1.0


def quantile(xs: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``xs`` (linear between order statistics), None when empty."""
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _token_choice(ch: Any) -> bool:
    """Whether a streamed choice carries a generated token.

    Text counts, and so does an empty text or content while the choice is not finishing: that is a token whose
    characters the server holds back (part of a multi-byte character; vLLM sends one chunk a step, and
    ``vllm bench serve`` counts it too). A chat delta that only announces the role (``"role": "assistant",
    "content": ""``, sent before any token) and a closing choice with nothing in it do not count.
    """
    if not isinstance(ch, dict):
        return False
    open_ = ch.get("finish_reason") is None
    text = ch.get("text")
    if text or (open_ and isinstance(text, str)):
        return True
    delta = ch.get("delta")
    if not isinstance(delta, dict):
        return False
    if delta.get("content") or delta.get("reasoning_content"):
        return True
    return open_ and "role" not in delta and isinstance(delta.get("content", delta.get("reasoning_content")), str)


def parse_sse(chunks: list[tuple[float, bytes]]) -> tuple[list[float], int | None]:
    """Arrival times of the SSE events in ``chunks`` that carry a generated token (:func:`_token_choice`), and
    the usage's completion tokens."""
    times: list[float] = []
    usage: int | None = None
    pending = b""
    for t, data in chunks:
        pending += data
        while True:
            i = pending.find(b"\n\n")
            if i < 0:
                break
            event, pending = pending[:i], pending[i + 2:]
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]" or not payload:
                    continue
                try:
                    obj = json.loads(payload)
                except ValueError:
                    continue
                u = obj.get("usage") if isinstance(obj, dict) else None
                if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
                    usage = u["completion_tokens"]
                choices = obj.get("choices") if isinstance(obj, dict) else None
                if isinstance(choices, list) and any(_token_choice(ch) for ch in choices):
                    times.append(t)
    return times, usage


class Measure:
    """Turns each answer into the step's figures (one instance per step)."""

    def __init__(self, step: Step, api: str, stream: bool, slo: Objectives, window_end: float, seed: int) -> None:
        self.step = step
        self.api = api
        self.stream = stream
        self.slo = slo
        self.window_end = window_end
        self.seen = 0
        self.rng = random.Random(seed)
        self.lat_sum = 0.0

    def add(self, r: Result, start: float, end: float) -> None:
        st = self.step
        st.requests += 1
        lat = end - start
        self.lat_sum += lat
        kind = self.classify(r)
        if kind is not None:
            st.errors[kind] += 1
            if not st.error_detail:
                st.error_detail = (r.detail or r.body[:200].decode("utf-8", "replace")).strip()
            return
        ttft: float | None = None
        itl_mean: float | None = None
        if self.stream and r.chunks is not None:
            times, usage = parse_sse(r.chunks)
            if times:
                ttft = times[0] - start
                gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
                if gaps:
                    itl_mean = sum(gaps) / len(gaps)
                self._keep(st.ttfts, ttft)
                for g in gaps[:64]:
                    self._keep(st.itls, g)
            st.output_tokens += usage if usage is not None else len(times)
        elif self.api != "json":
            try:
                st.output_tokens += int(json.loads(r.body)["usage"]["completion_tokens"])
            except (ValueError, KeyError, TypeError):
                pass
        st.ok += 1
        if end <= self.window_end:
            st.throughput_rps += 1  # a count until the step ends
        self.seen += 1
        if len(st.latencies) < MAX_SAMPLES:
            st.latencies.append(lat)
        else:
            j = self.rng.randrange(self.seen)
            if j < MAX_SAMPLES:
                st.latencies[j] = lat
        slo = self.slo
        if ((slo.ttft is None or (ttft is not None and ttft <= slo.ttft))
                and (slo.itl is None or itl_mean is None or itl_mean <= slo.itl)
                and (slo.e2e is None or lat <= slo.e2e)):
            st.good += 1

    def _keep(self, xs: list[float], v: float) -> None:
        if len(xs) < MAX_SAMPLES:
            xs.append(v)

    def classify(self, r: Result) -> str | None:
        if r.error is not None:
            return r.error
        s = r.status
        if s >= 400:
            low = r.body[:4096].lower()
            if any(m in low for m in _OOM_MARKERS):
                return "oom"
            return "http_429" if s == 429 else ("http_5xx" if s >= 500 else "http_4xx")
        if s < 200 or s >= 300:
            return f"http_{s}"
        if self.api != "json" and not self.stream:
            b = r.body.lstrip()
            if not b.startswith(b"{"):
                return "not_json"
        return None


@dataclass
class Target:
    host: str
    port: int
    api: str
    stream: bool
    payloads: list[Prepared]
    timeout: float


class _Sweeper:
    """Times out requests that have waited longer than the timeout (one timer for all connections)."""

    def __init__(self, conns: list[Connection], timeout: float) -> None:
        self.conns = conns
        self.timeout = timeout
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        period = min(0.1, self.timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = clock()
            for c in list(self.conns):
                if c.busy and now - c.sent_at > self.timeout:
                    c.timeout()

    def __enter__(self) -> _Sweeper:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.task.cancel()


async def _open(t: Target, n: int) -> list[Connection]:
    try:
        return list(await asyncio.wait_for(asyncio.gather(*(connect(t.host, t.port) for _ in range(n))),
                                           max(t.timeout, 10.0)))
    except (OSError, asyncio.TimeoutError) as e:
        raise LoadTestError(f"cannot open {n} connections to {t.host}:{t.port}: {e or type(e).__name__}") from None


async def closed_step(t: Target, c: int, duration: float, max_requests: int, slo: Objectives, seed: int = 0,
                      progress: Callable[[Step, float], None] | None = None) -> Step:
    """Keep ``c`` requests in flight for ``duration`` seconds (at most ``max_requests`` sent)."""
    loop = asyncio.get_running_loop()
    conns = await _open(t, c)
    step = Step(concurrency=float(c), rate=None, duration_s=duration)
    t0 = clock()
    deadline = t0 + duration
    m = Measure(step, t.api, t.stream, slo, deadline, seed)
    payloads = t.payloads
    n_pay = len(payloads)
    state = {"sent": 0, "active": c}
    finished: asyncio.Future[None] = loop.create_future()
    cpu0 = time.process_time()

    def retire() -> None:
        state["active"] -= 1
        if state["active"] == 0 and not finished.done():
            finished.set_result(None)

    def send(conn: Connection) -> None:
        i = state["sent"]
        state["sent"] = i + 1
        conn.send(payloads[i % n_pay].raw, on_done, t.stream)

    async def reconnect(old: Connection) -> None:
        try:
            conn = await connect(t.host, t.port)
        except OSError as e:
            step.errors["connect"] += 1
            step.error_detail = step.error_detail or str(e)
            await asyncio.sleep(0.05)
            if clock() < deadline:
                loop.create_task(reconnect(old))
            else:
                retire()
            return
        conns[conns.index(old)] = conn
        if clock() < deadline and state["sent"] < max_requests:
            send(conn)
        else:
            conn.abort()
            retire()

    def on_done(conn: Connection, r: Result) -> None:
        now = clock()
        m.add(r, conn.sent_at, now)
        if now >= deadline or state["sent"] >= max_requests:
            conn.abort()
            retire()
        elif conn.closed:
            loop.create_task(reconnect(conn))
        else:
            send(conn)

    ticker = loop.create_task(_tick(progress, step, t0)) if progress else None
    with _Sweeper(conns, t.timeout):
        for conn in conns:
            send(conn)
        await finished
    if ticker:
        ticker.cancel()
    wall = max(clock() - t0, 1e-9)
    step.cpu_share = (time.process_time() - cpu0) / wall
    window = min(duration, wall)
    step.duration_s = window
    step.throughput_rps = step.throughput_rps / window
    return step


async def open_step(t: Target, rate: float, duration: float, max_requests: int, slo: Objectives,
                    burstiness: float = 1.0, max_connections: int = 1024, seed: int = 0,
                    progress: Callable[[Step, float], None] | None = None) -> Step:
    """Send requests at ``rate`` per second (gamma arrivals of shape ``burstiness``) for ``duration`` seconds."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    step = Step(concurrency=0.0, rate=rate, duration_s=duration)
    t0 = clock()
    deadline = t0 + duration
    m = Measure(step, t.api, t.stream, slo, deadline, seed)
    idle: list[Connection] = []
    conns: list[Connection] = []
    starts: dict[int, float] = {}
    state = {"open": 0, "pending": 0, "sent": 0}
    drained: asyncio.Future[None] = loop.create_future()
    cpu0 = time.process_time()
    payloads = t.payloads

    def on_done(conn: Connection, r: Result) -> None:
        now = clock()
        m.add(r, starts.pop(id(conn), conn.sent_at), now)
        state["pending"] -= 1
        if conn.closed:
            conns.remove(conn)
            state["open"] -= 1
        else:
            idle.append(conn)
        if state["pending"] == 0 and now >= deadline and not drained.done():
            drained.set_result(None)

    async def fresh(at: float, raw: bytes) -> None:
        try:
            conn = await connect(t.host, t.port)
        except OSError as e:
            state["open"] -= 1
            state["pending"] -= 1
            step.requests += 1
            step.errors["connect"] += 1
            step.error_detail = step.error_detail or str(e)
            return
        conns.append(conn)
        conn.send(raw, on_done, t.stream)
        starts[id(conn)] = at

    ticker = loop.create_task(_tick(progress, step, t0)) if progress else None
    next_t = t0
    shape = burstiness
    with _Sweeper(conns, t.timeout):
        while next_t < deadline and state["sent"] < max_requests:
            now = clock()
            while next_t <= now and next_t < deadline and state["sent"] < max_requests:
                raw = payloads[state["sent"] % len(payloads)].raw
                state["sent"] += 1
                if idle:
                    conn = idle.pop()
                    state["pending"] += 1
                    conn.send(raw, on_done, t.stream)
                    starts[id(conn)] = next_t
                elif state["open"] < max_connections:
                    state["open"] += 1
                    state["pending"] += 1
                    loop.create_task(fresh(next_t, raw))
                else:
                    step.client_limited += 1
                next_t += rng.gammavariate(shape, 1.0 / (rate * shape))
            await asyncio.sleep(max(0.0, next_t - clock()))
        if state["pending"] > 0:
            await drained
    if ticker:
        ticker.cancel()
    for c in conns:
        c.abort()
    wall = max(clock() - t0, 1e-9)
    step.cpu_share = (time.process_time() - cpu0) / wall
    window = min(duration, wall)
    step.duration_s = window
    step.throughput_rps = step.throughput_rps / window
    # Little's law: the mean number in flight over the window.
    step.concurrency = m.lat_sum / window
    return step


async def _tick(progress: Callable[[Step, float], None] | None, step: Step, t0: float) -> None:
    while progress is not None:
        progress(step, clock() - t0)
        await asyncio.sleep(0.5)


def step_levels(steps: Sequence[Step]) -> list[Any]:
    """The steps as knee levels (the throughput's standard error from the latencies' spread)."""
    from inferwatch_sidecar.components.capacity.knee import Level

    out = []
    for s in steps:
        if s.ok < 2 or s.throughput_rps <= 0:
            continue
        se = s.throughput_rps * s.latency_cv() / math.sqrt(s.ok)
        out.append(Level(s.concurrency, s.throughput_rps, se, s.mean_latency()))
    return out

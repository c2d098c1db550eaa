"""A bounded load generator for vLLM: streamed completions over its OpenAI-compatible HTTP API.

The shape of :class:`~.loadgen.LoadGenerator` (open-loop rate, request and
time bounds, the malformed-events client), with each request a streamed
``POST /v1/completions`` to the demo's vLLM (:mod:`.vllm_engine`) carrying a
W3C ``traceparent`` whose trace ID is the request ID the sidecar sees.
Every request sets ``ignore_eos`` so it generates exactly ``max_tokens``
tokens, and the usage chunk at the end of the stream says how many tokens
vLLM counted. What a request looks like depends on the faults switched on:

- healthy: prompts of 8 to 40 words (about as many tokens), ``max_tokens`` 8
  to 32, ``temperature`` 0.6 to 0.9;
- ``drift``: prompts of 50 to 90 words, ``max_tokens`` 34 to 44,
  ``temperature`` 1.1 to 1.5 (every drift feature of the span moves, while
  the tokens per second stay within what vLLM keeps up with);
- ``latency``: :attr:`LlmLoadGenerator.long_share` of the requests become
  long (prompts of 200 to 240 words, ``max_tokens`` 240 to 260): with
  vLLM's sequence slots bounded (:data:`~.vllm_engine.MAX_NUM_SEQS`) they
  hold the slots for seconds, and the short requests queue behind them.

On :meth:`~LlmLoadGenerator.stop` no new request starts, and the streams in
flight are read to their end: a stream the client closes early sends no
span, and the demo's reconciliation counts every completion it sent.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferwatch_sidecar.demo.loadgen import LoadGenerator, LoadPlan, _Conn
from inferwatch_sidecar.demo.tiny_llm import CONTEXT, WORDS


@dataclass(frozen=True)
class Shape:
    """One kind of request: inclusive ranges of prompt words and max_tokens, and the temperature range."""

    prompt_words: tuple[int, int]
    max_tokens: tuple[int, int]
    temperature: tuple[float, float]

    def __post_init__(self) -> None:
        if self.prompt_words[1] + self.max_tokens[1] + 2 > CONTEXT:
            raise ValueError(f"{self}: prompt and completion must fit the model's {CONTEXT}-token context")


HEALTHY = Shape(prompt_words=(8, 40), max_tokens=(8, 32), temperature=(0.6, 0.9))
DRIFTED = Shape(prompt_words=(50, 90), max_tokens=(34, 44), temperature=(1.1, 1.5))
LONG = Shape(prompt_words=(200, 240), max_tokens=(240, 260), temperature=(0.6, 0.9))


def completion_body(model: str, rng: np.random.Generator, shape: Shape) -> dict[str, Any]:
    """A streamed completion request of ``shape``, drawn with ``rng``."""
    n = int(rng.integers(shape.prompt_words[0], shape.prompt_words[1] + 1))
    words = rng.integers(0, len(WORDS), size=n)
    return {"model": model, "prompt": " ".join(WORDS[int(w)] for w in words),
            "max_tokens": int(rng.integers(shape.max_tokens[0], shape.max_tokens[1] + 1)),
            "temperature": round(float(rng.uniform(*shape.temperature)), 3), "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


class LlmLoadGenerator(LoadGenerator):
    """Streams completions to ``vllm_url`` at ``plan.rate_per_s``; ``drift`` and ``latency`` may change live.

    Args:
        vllm_url: vLLM's OpenAI-compatible server, e.g. ``http://127.0.0.1:8000``.
        sidecar_url: the sidecar, for the malformed events of ``bad_events`` (None: none).
        plan: the bounds (``generate_share`` and ``label_share`` do not apply: every request is a
            generation, and an LLM's answer has no label here).
        model: the served model name.
        timeout_s: the timeout of each socket operation (connecting, sending, each read of the stream), not
            of a whole stream: a stream that keeps sending tokens runs as long as it takes.
        long_share: share of requests made long while :attr:`latency` is on.

    Counters (:meth:`snapshot`): ``completions`` (streams read to their end with status 200),
    ``completion_tokens`` and ``prompt_tokens`` (from their usage chunks), ``http_<status>``,
    ``connection_errors``.
    """

    def __init__(self, vllm_url: str, sidecar_url: str | None, plan: LoadPlan, model: str,
                 timeout_s: float = 60.0, long_share: float = 0.4) -> None:
        super().__init__(vllm_url, None, sidecar_url, plan, model=model, timeout_s=timeout_s, engine="vllm")
        if not 0.0 <= long_share <= 1.0:
            raise ValueError(f"long_share {long_share} must be between 0 and 1")
        self.long_share = long_share
        #: While True, :attr:`long_share` of the requests are long (the latency fault).
        self.latency = False

    def _worker(self, i: int, n: int) -> None:
        plan = self.plan
        rng = np.random.default_rng(plan.seed * 1000 + i)
        conn = _Conn(self.stable_url, self.timeout_s)
        try:
            for seq in self._paced(i, n):
                shape = (LONG if self.latency and rng.random() < self.long_share
                         else DRIFTED if self.drift else HEALTHY)
                # The trace ID: 32 hex digits, never all zero (the sidecar's request ID and exemplar).
                trace_id = f"{plan.seed + 1:08x}{i:08x}{seq:016x}"
                self._complete(conn, trace_id, completion_body(self.model, rng, shape))
        finally:
            conn.close()

    def _complete(self, conn: _Conn, trace_id: str, body: dict[str, Any]) -> None:
        try:
            status, usage = stream(conn, body, {"traceparent": f"00-{trace_id}-{trace_id[16:]}-01"})
        except (OSError, http.client.HTTPException, ValueError):
            self._count("connection_errors")
            return
        if status != 200:
            self._count(f"http_{status}")
            return
        with self._lock:
            self.counts["completions"] += 1
            self.counts["completion_tokens"] += int(usage.get("completion_tokens", 0))
            self.counts["prompt_tokens"] += int(usage.get("prompt_tokens", 0))


def stream(conn: _Conn, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST a streamed completion on ``conn`` and read its server-sent events to ``[DONE]``.

    Returns:
        The status and the usage chunk (empty when the status is not 200).

    Raises:
        ValueError: a 200 stream that ended without ``[DONE]`` or a usage chunk, or sent a chunk that is not JSON.
    """
    data = json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **headers}
    try:
        if conn.c is None:
            conn.c = http.client.HTTPConnection(conn.host, conn.port, timeout=conn.timeout)
        try:
            conn.c.request("POST", "/v1/completions", body=data, headers=hdrs)
            r = conn.c.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected):
            # vLLM closed the idle keep-alive connection before this request: one retry on a fresh one.
            conn.close()
            conn.c = http.client.HTTPConnection(conn.host, conn.port, timeout=conn.timeout)
            conn.c.request("POST", "/v1/completions", body=data, headers=hdrs)
            r = conn.c.getresponse()
        if r.status != 200:
            r.read()
            return r.status, {}
        usage: dict[str, Any] = {}
        done = False
        for raw in r:
            line = raw.strip()
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: "):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
        if not done or not usage:
            raise ValueError("the stream ended without its usage chunk and [DONE]")
        return r.status, usage
    except (OSError, http.client.HTTPException, ValueError):
        conn.close()
        raise

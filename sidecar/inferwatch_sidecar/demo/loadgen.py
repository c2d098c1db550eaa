"""A bounded load generator for the demo model server (loopback only, standard library HTTP).

Threads send ``POST /predict`` (and a share of ``POST /generate``) at a fixed
total rate over keep-alive connections, until a request count or a time
limit is reached. Inputs come from the demo dataset's generator: healthy,
shifted while ``drift`` is on, and a ``hard_share`` of them from the hard
segment (the confidence fault). Each prediction carries an applicant's
free-text ``note`` of :data:`SHORT_TOKENS` words, a ``long_share`` of them
:data:`LONG_TOKENS` (the ``long_inputs`` fault). While ``canary_share`` > 0
that share of the predictions goes to the canary server. The true labels of a share of the
predictions are posted to the sidecar's ``/v1/labels`` a moment later, joined
there by the request ID the generator sets in ``X-Request-ID``.

With ``engine="triton"`` the predictions are KServe v2 ``POST
/v2/models/<model>/infer`` calls to the Triton demo server
(:mod:`.triton_server`), with a W3C ``traceparent`` whose trace ID is the
request ID, and there are no streamed generations and no labels (the
callable's records have no request ID to join them by).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.demo.config import ENGINES
from inferwatch_sidecar.demo.faults import RETRY_STORM_CLIENT_TIMEOUT_S, RETRY_STORM_RETRIES

#: Words in a note: a healthy one, and a long one (the ``long_inputs`` fault), as (low, high) bounds.
SHORT_TOKENS = (8, 48)
LONG_TOKENS = (1500, 2500)
_WORDS = ("income", "rent", "salary", "loan", "car", "family", "job", "moved", "paid", "late", "bonus", "debt")


def note(rng: np.random.Generator, long: bool) -> str:
    """An applicant's free-text note: words drawn from a small vocabulary."""
    lo, hi = LONG_TOKENS if long else SHORT_TOKENS
    return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), int(rng.integers(lo, hi + 1))))


def _loopback(url: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1") or u.port is None:
        raise ValueError(f"{url}: the load generator only talks to loopback host:port URLs")
    return u.hostname, u.port


@dataclass
class LoadPlan:
    """How much load, for how long.

    Attributes:
        rate_per_s: total requests per second (predictions plus generations).
        max_requests: stop after this many requests.
        max_seconds: stop after this long.
        threads: sender threads (each keeps its own connections).
        generate_share: share of requests that are streamed generations.
        label_share: share of predictions whose true label is posted to the sidecar.
        label_delay_s: labels are posted in batches this often.
        seed: input seed.
    """

    rate_per_s: float = 80.0
    max_requests: int = 100_000
    max_seconds: float = 600.0
    threads: int = 8
    generate_share: float = 0.1
    label_share: float = 0.5
    label_delay_s: float = 0.5
    seed: int = 1


class _Conn:
    def __init__(self, url: str, timeout: float) -> None:
        self.host, self.port = _loopback(url)
        self.timeout = timeout
        self.c: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
        """POST ``body`` as JSON; returns the status and the response body."""
        data = json.dumps(body).encode()
        try:
            return self._request(path, data, headers)
        except (OSError, http.client.HTTPException):
            # The server may have closed the idle keep-alive connection: one retry, on a fresh connection.
            return self._request(path, data, headers)

    def _request(self, path: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.c is None:
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.c.request("POST", path, body=data, headers={"Content-Type": "application/json", **headers})
            r = self.c.getresponse()
            return r.status, r.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None


class LoadGenerator:
    """Runs the plan on background threads; ``drift`` and ``canary_share`` may change while it runs.

    Args:
        stable_url: the stable model server, e.g. ``http://127.0.0.1:8000``.
        canary_url: the canary model server (None: no canary).
        sidecar_url: the sidecar's HTTP address, for labels (None: no labels).
        plan: the bounds.
        model: the model name the labels are for.
        timeout_s: per-request timeout.
        engine: ``fastapi`` (the demo server's ``/predict`` and ``/generate``) or ``triton`` (KServe v2 infer
            calls to two Tritons).

    Raises:
        ValueError: a URL is not a loopback ``host:port``, or the engine is unknown.
    """

    def __init__(self, stable_url: str, canary_url: str | None, sidecar_url: str | None, plan: LoadPlan,
                 model: str = mdl.NAME, timeout_s: float = 10.0, engine: str = "fastapi") -> None:
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        self.engine = engine
        self.stable_url = stable_url
        self.canary_url = canary_url
        self.sidecar_url = sidecar_url
        for u in (stable_url, canary_url, sidecar_url):
            if u is not None:
                _loopback(u)
        self.plan = plan
        self.model = model
        self.timeout_s = timeout_s
        self.drift = False
        self.hard_share = 0.0
        self.long_share = 0.0
        self.canary_share = 0.0
        #: While True, post one malformed event (a confidence that is not a number) to /v1/events per cycle.
        self.bad_events = False
        #: While True, predictions time out after RETRY_STORM_CLIENT_TIMEOUT_S, hang up, and are sent again at once
        #: with the same X-Request-ID, up to RETRY_STORM_RETRIES times (the ``retry_storm`` fault).
        self.retry_storm = False
        #: The share of ``plan.rate_per_s`` sent now (the scenario raises it during the run).
        self.rate_scale = 1.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._issued = 0
        self._labels: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.started_at: float | None = None
        self.finished = threading.Event()

    # -- control ------------------------------------------------------------------------------
    def start(self) -> LoadGenerator:
        self.started_at = time.monotonic()
        n = max(1, self.plan.threads)
        for i in range(n):
            t = threading.Thread(target=self._worker, args=(i, n), name=f"iw-demo-load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.sidecar_url is not None:
            t = threading.Thread(target=self._label_loop, name="iw-demo-labels", daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._watch, name="iw-demo-load-watch", daemon=True).start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop sending, post the pending labels, and wait for the threads."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _watch(self) -> None:
        for t in self._threads:
            t.join()
        self.finished.set()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    # -- workers -----------------------------------------------------------------------------
    def _take(self) -> bool:
        with self._lock:
            if self._issued >= self.plan.max_requests:
                return False
            self._issued += 1
            return True

    def _paced(self, i: int, n: int) -> Iterator[int]:
        """Worker ``i`` of ``n``'s schedule: yields each request's sequence number (from 1) when it is due.

        The workers share ``plan.rate_per_s``, staggered; the schedule ends at :meth:`stop`, after
        ``plan.max_seconds`` or after ``plan.max_requests`` in all. Open loop: the schedule does not wait for
        slow responses (a request's time in the caller's loop body), but never bursts to catch up.
        """
        interval = n / (self.plan.rate_per_s * self.rate_scale)
        assert self.started_at is not None, "start() first"
        end = self.started_at + self.plan.max_seconds
        nxt = time.monotonic() + interval * i / n
        seq = 0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= end:
                return
            if nxt > now and self._stop.wait(nxt - now):
                return
            interval = n / (self.plan.rate_per_s * max(self.rate_scale, 0.01))
            nxt = max(nxt + interval, time.monotonic() - interval)
            if not self._take():
                return
            seq += 1
            yield seq

    def _worker(self, i: int, n: int) -> None:
        plan = self.plan
        rng = np.random.default_rng(plan.seed * 1000 + i)
        stable = _Conn(self.stable_url, self.timeout_s)
        canary = _Conn(self.canary_url, self.timeout_s) if self.canary_url else None
        rows: mdl.Batch | None = None
        rows_kind = (False, 0.0)
        k = 0
        try:
            for seq in self._paced(i, n):
                # Triton's request ID is the trace ID the callable sees: 32 hex digits, never all zero.
                rid = (f"{plan.seed + 1:08x}{i:08x}{seq:016x}" if self.engine == "triton"
                       else f"lg{plan.seed}-{i}-{seq}")
                if self.engine == "fastapi" and rng.random() < plan.generate_share:
                    self._generate(stable, rid, rng)
                    continue
                kind = (self.drift, self.hard_share)
                if rows is None or k >= len(rows) or rows_kind != kind:
                    rows, rows_kind, k = mdl.sample(256, rng, drift=kind[0], hard=kind[1]), kind, 0
                use_canary = canary is not None and rng.random() < self.canary_share
                self._predict(canary if use_canary and canary is not None else stable, rid, rows, k,
                              "canary" if use_canary else "stable", rng)
                k += 1
        finally:
            stable.close()
            if canary is not None:
                canary.close()

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _predict(self, conn: _Conn, rid: str, rows: mdl.Batch, k: int, target: str, rng: np.random.Generator) -> None:
        try:
            if self.engine == "triton":
                status, body = conn.post(f"/v2/models/{mdl.NAME}/infer", triton_body(rows, k),
                                         {"traceparent": f"00-{rid}-{rid[16:]}-01"})
            elif self.retry_storm:
                got = self._storm(conn, rid, {"features": rows.row(k), "note": note(rng, rng.random() < self.long_share)})
                if got is None:
                    return
                status, body = got
            else:
                body_in = {"features": rows.row(k), "note": note(rng, rng.random() < self.long_share)}
                status, body = conn.post("/predict", body_in, {"X-Request-ID": rid})
        except (OSError, http.client.HTTPException):
            self._count("connection_errors")
            return
        if status != 200:
            self._count(f"http_{status}")
            return
        self._count(f"predict_{target}")
        if self.sidecar_url is not None and self.engine == "fastapi" and rng.random() < self.plan.label_share:
            version = json.loads(body).get("model_version")
            with self._lock:
                self._labels.append({"request_id": rid, "label": rows.label[k], "model": self.model,
                                     "model_version": version})

    def _storm(self, conn: _Conn, rid: str, body: dict[str, Any]) -> tuple[int, bytes] | None:
        """A client with a short timeout that retries at once: the response, or None when every attempt timed out."""
        if conn.timeout != RETRY_STORM_CLIENT_TIMEOUT_S:
            conn.close()
            conn.timeout = RETRY_STORM_CLIENT_TIMEOUT_S
        data = json.dumps(body).encode()
        for attempt in range(1 + RETRY_STORM_RETRIES):
            try:
                return conn._request("/predict", data, {"X-Request-ID": rid})  # no hidden retry: each one counts
            except TimeoutError:  # _request closed the connection: the server sees the client leave
                self._count("giveups")
                if attempt < RETRY_STORM_RETRIES:
                    self._count("retries")
        return None

    def _generate(self, conn: _Conn, rid: str, rng: np.random.Generator) -> None:
        try:
            status, _ = conn.post("/generate", {"prompt": f"explain {rid}", "max_tokens": int(rng.integers(8, 33))},
                                  {"X-Request-ID": rid})
        except (OSError, http.client.HTTPException):
            self._count("connection_errors")
            return
        self._count("generate" if status == 200 else f"http_{status}")

    def _label_loop(self) -> None:
        assert self.sidecar_url is not None
        conn = _Conn(self.sidecar_url, self.timeout_s)
        try:
            while True:
                stopping = self._stop.wait(self.plan.label_delay_s) or all(
                    not t.is_alive() for t in self._threads if t is not threading.current_thread())
                with self._lock:
                    batch, self._labels = self._labels, []
                if batch:
                    try:
                        status, _ = conn.post("/v1/labels", {"labels": batch}, {})
                        self._count("labels_posted" if status == 200 else f"labels_http_{status}")
                        if status == 200:
                            with self._lock:
                                self.counts["labels"] += len(batch)
                    except (OSError, http.client.HTTPException):
                        self._count("label_errors")
                if self.bad_events and not stopping:
                    try:
                        status, _ = conn.post("/v1/events", {"events": [
                            {"type": "record", "model": self.model, "prediction": "approve", "confidence": "high"}]},
                            {})
                        self._count("bad_events_posted" if status == 200 else f"bad_events_http_{status}")
                    except (OSError, http.client.HTTPException):
                        self._count("label_errors")
                if stopping:
                    return
        finally:
            conn.close()


def triton_body(rows: mdl.Batch, k: int) -> dict[str, Any]:
    """Row ``k`` as a KServe v2 infer request for :mod:`.triton_server` (a batch of one)."""
    return {"inputs": [
        {"name": "numeric", "shape": [1, len(mdl.NUMERIC_NAMES)], "datatype": "FP32",
         "data": [float(v) for v in rows.numeric[k]]},
        {"name": "region", "shape": [1, 1], "datatype": "BYTES", "data": [rows.region[k]]},
    ]}

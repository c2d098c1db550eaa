"""The fault switches every model-server process reads: one small JSON file.

uvicorn runs several worker processes, and an admin request reaches only one
of them, so the state lives in a file that the admin endpoint replaces
atomically and every worker re-reads when its modification time changes
(checked at most every ``check_s`` seconds, off nothing but a ``stat``).

Faults that live in the model server:

- ``latency``: a share of inference batches sleeps ``delay_s`` longer;
- ``canary_fault``: the canary server's v2 turns bad: shifted class biases
  (a different prediction mix) and :data:`CANARY_SLOWDOWN_S` more per batch;
- ``leak``: the worker with that PID reports allocator memory that grows at
  ``rate_bytes_per_s`` from ``start_unix`` (the fake NVML backend in the
  sidecar scripts the matching device-side growth);
- ``confidence_temperature``: logits are divided by it (> 1 flattens the
  probabilities). No demo fault sets it; it is a knob for ``PUT /admin/faults``;
- ``retry_storm``: every batch sleeps :data:`RETRY_STORM_DELAY_S` longer (the latency
  fault's switches, on every batch), past the load generator's timeout, which gives up
  and retries at once;
- ``kv_cache_tokens`` and ``cpu_burn_ms``: the ``saturation`` fault's two phases
  (:mod:`.engine_sim`): a KV cache this small (requests wait for blocks), then
  preprocessing that burns this much CPU per request on the event loop.

Feature drift, the hard segment of the confidence fault, long inputs and the
canary's share of the traffic are load-generator faults (what inputs are sent,
and where); they are recorded here too so that ``GET /admin/faults`` shows
the whole picture.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: How much longer each batch of the faulty canary takes (its heavier model), in seconds.
CANARY_SLOWDOWN_S = 0.03
#: The ``retry_storm`` fault: every inference batch takes this much longer (seconds)...
RETRY_STORM_DELAY_S = 1.5
#: ...while the clients give up after this many seconds...
RETRY_STORM_CLIENT_TIMEOUT_S = 0.5
#: ...and send the same request (same X-Request-ID) again at once, this many times.
RETRY_STORM_RETRIES = 2
#: The ``saturation`` fault's KV-cache phase: each worker's KV cache holds this many tokens (about three requests: less than the offered load).
SATURATION_KV_TOKENS = 384
#: ... its host-CPU phase: each request's preprocessing burns this much CPU on the event loop (tokenizing).
SATURATION_CPU_MS = 40.0
#: ... and each phase lasts this long (the KV-cache phase first).
SATURATION_PHASE_S = 15.0


@dataclass
class Faults:
    """The injected faults (all off by default)."""

    latency_stage: str | None = None
    latency_share: float = 0.0
    latency_delay_s: float = 0.0
    confidence_temperature: float = 1.0
    leak_pid: int | None = None
    leak_start_unix: float | None = None
    leak_rate_bytes_per_s: float = 0.0
    feature_drift: bool = False
    hard_share: float = 0.0
    long_input_share: float = 0.0
    canary_share: float = 0.0
    canary_fault: bool = False
    kv_cache_tokens: int = 0
    cpu_burn_ms: float = 0.0
    injected_unix: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: Any) -> Faults:
        """Validate a JSON object; unknown keys or bad values raise ValueError."""
        if not isinstance(doc, dict):
            raise ValueError("faults must be a JSON object")
        known = set(cls.__dataclass_fields__)
        extra = set(doc) - known
        if extra:
            raise ValueError(f"unknown fault field(s): {', '.join(sorted(extra))}; known: {', '.join(sorted(known))}")
        f = cls(**doc)
        shares = ("latency_share", "canary_share", "hard_share", "long_input_share")
        if not all(0.0 <= getattr(f, k) <= 1.0 for k in shares):
            raise ValueError(f"{', '.join(shares)} must be between 0 and 1")
        if f.latency_delay_s < 0 or f.latency_delay_s > 30:
            raise ValueError("latency_delay_s must be between 0 and 30")
        if not 0.1 <= f.confidence_temperature <= 100:
            raise ValueError("confidence_temperature must be between 0.1 and 100")
        if f.kv_cache_tokens < 0 or not 0 <= f.cpu_burn_ms <= 1000:
            raise ValueError("kv_cache_tokens must be >= 0 and cpu_burn_ms between 0 and 1000")
        if f.leak_rate_bytes_per_s < 0:
            raise ValueError("leak_rate_bytes_per_s must be >= 0")
        return f

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write(path: str, faults: Faults) -> None:
    """Replace the fault file atomically (readers never see half a file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(faults.to_json(), f)
    os.replace(tmp, path)


def read(path: str) -> Faults:
    """Read the fault file; a missing file means no faults."""
    try:
        with open(path, encoding="utf-8") as f:
            return Faults.from_json(json.load(f))
    except FileNotFoundError:
        return Faults()


class FaultReader:
    """Cached view of the fault file for a server process.

    Args:
        path: the fault file (None: never any faults).
        check_s: re-check the file's modification time at most this often.
    """

    def __init__(self, path: str | None, check_s: float = 0.2) -> None:
        self.path = path
        self.check_s = check_s
        self._next = 0.0
        self._mtime: int | None = None
        self.current = Faults()

    def get(self) -> Faults:
        if self.path is None:
            return self.current
        now = time.monotonic()
        if now < self._next:
            return self.current
        self._next = now + self.check_s
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self.current, self._mtime = Faults(), None
            return self.current
        if mtime != self._mtime:
            try:
                self.current = read(self.path)
                self._mtime = mtime
            except (OSError, ValueError):
                pass  # keep the last good state; the writer validates before writing
        return self.current

"""``inferwatch.record_offline()`` and ``inferwatch.skew_sampled()``: the SDK's side of training-serving skew.

``skew_sampled()`` says whether the current request belongs to the skew sample: a CRC-32 of its request ID
below a share (``INFERWATCH_SKEW_SAMPLE_RATIO``, default 0: off; at most :data:`MAX_SAMPLE_RATIO`). The
sidecar's served-row sample (``skew.sample_ratio``) uses the same function, and a smaller share's IDs are a
subset of a larger one's, so a service that records features only for sampled requests has every one of them
written when the sidecar's share is at least as large, and the batch job can pick the same IDs.

A batch job (not the serving path) recomputes the features of recent requests the way training does and
posts them with their request IDs to the sidecar's ``POST /v1/skew``; the sidecar joins them with the served
values it holds and exports ``inferwatch_skew_match_ratio`` per feature (docs/skew.md). Standard library
only: ``urllib`` on loopback, in batches. It never raises for the sidecar's sake: a batch that cannot be
delivered is counted in ``failed`` and logged once per call.
"""

from __future__ import annotations

import json
import logging
import math
import os
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger("inferwatch")

#: The default of ``INFERWATCH_SIDECAR_HTTP``.
DEFAULT_SIDECAR_HTTP = "http://127.0.0.1:9464"
#: The largest share ``skew_sampled`` takes: the sample is a bounded share of the traffic.
MAX_SAMPLE_RATIO = 0.1


def id_in_sample(request_id: str, ratio: float) -> bool:
    """Whether ``request_id`` falls in the share ``ratio`` of IDs (CRC-32 of its UTF-8 below ``ratio`` of 2**32)."""
    return ratio > 0 and zlib.crc32(request_id.encode("utf-8", "replace")) < ratio * 4294967296.0


def _env_ratio() -> float:
    raw = os.environ.get("INFERWATCH_SKEW_SAMPLE_RATIO", "").strip()
    if not raw:
        return 0.0
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not 0 <= v <= MAX_SAMPLE_RATIO:
        log.warning("inferwatch: INFERWATCH_SKEW_SAMPLE_RATIO=%r is not a share in [0, %s]; the skew sample is off",
                    raw, MAX_SAMPLE_RATIO)
        return 0.0
    return v


#: ``INFERWATCH_SKEW_SAMPLE_RATIO``, read once when this module first loads.
_RATIO = _env_ratio()


def skew_sampled(request_id: str | None = None, ratio: float | None = None) -> bool:
    """Whether a request belongs to the training-serving skew sample (off unless a share is set).

    Use it to record the full feature row only for sampled requests::

        if inferwatch.skew_sampled():
            inferwatch.record(features=row)

    Args:
        request_id: the request's ID; default the current request's (``inferwatch.current_request_id()``).
        ratio: the share; default ``INFERWATCH_SKEW_SAMPLE_RATIO`` (0: off). Clamped to
            ``[0, MAX_SAMPLE_RATIO]``.

    Returns:
        True for a sampled request; False otherwise, outside a request, and on any error (it never raises).
    """
    try:
        r = _RATIO if ratio is None else min(max(float(ratio), 0.0), MAX_SAMPLE_RATIO)
        if not r > 0:
            return False
        if request_id is None:
            from inferwatch._core import current_request_id

            request_id = current_request_id()
        return bool(request_id) and id_in_sample(str(request_id), r)
    except Exception:
        return False


def _row(r: Any) -> dict[str, Any]:
    feats: Any
    if isinstance(r, Mapping):
        rid, feats = r.get("request_id"), r.get("features")
    else:
        rid, feats = r
    clean = {str(k): (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in dict(feats).items()}
    return {"request_id": rid, "features": clean}


def record_offline(
    rows: Iterable[Mapping[str, Any] | tuple[str, Mapping[str, Any]]],
    *,
    url: str | None = None,
    batch_size: int = 5000,
    timeout: float = 10.0,
) -> dict[str, int]:
    """Send offline feature values for served request IDs to the sidecar's live skew join.

    Args:
        rows: ``{"request_id": ..., "features": {name: value}}`` mappings, or ``(request_id, features)``
            pairs. Values are numbers, strings or None (NaN counts as None).
        url: the sidecar's HTTP base URL; default ``INFERWATCH_SIDECAR_HTTP`` or ``http://127.0.0.1:9464``.
        batch_size: rows per POST (the sidecar takes at most ``skew.max_offline_rows_per_post``).
        timeout: seconds to wait for each POST.

    Returns:
        Totals of the sidecar's answers: ``accepted``, ``joined``, ``waiting`` (no served row yet),
        ``duplicate``, ``bad``, and ``failed`` (rows of batches that were not delivered or were refused).

    Raises:
        ValueError: ``batch_size`` is not positive (a programming error, raised before anything is sent).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    base = (url or os.environ.get("INFERWATCH_SIDECAR_HTTP") or DEFAULT_SIDECAR_HTTP).rstrip("/")
    totals = {"accepted": 0, "joined": 0, "waiting": 0, "duplicate": 0, "bad": 0, "failed": 0}
    warned = False
    batch: list[dict[str, Any]] = []

    def send() -> None:
        nonlocal warned
        body = json.dumps({"rows": batch}, allow_nan=False, default=str).encode()
        req = urllib.request.Request(base + "/v1/skew", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                answer = json.loads(resp.read() or b"{}")
            for k in ("accepted", "joined", "waiting", "duplicate", "bad"):
                totals[k] += int(answer.get(k, 0))
        except (OSError, ValueError) as e:  # urllib.error.URLError and HTTPError are OSErrors
            totals["failed"] += len(batch)
            detail = e.read().decode("utf-8", "replace")[:300] if isinstance(e, urllib.error.HTTPError) else ""
            if not warned:
                log.warning("inferwatch.record_offline: %d rows not delivered to %s/v1/skew: %s %s",
                            len(batch), base, e, detail)
                warned = True

    for r in rows:
        try:
            batch.append(_row(r))
        except (TypeError, ValueError, AttributeError):
            totals["bad"] += 1
            continue
        if len(batch) >= batch_size:
            send()
            batch = []
    if batch:
        send()
    return totals

"""``inferwatch.record_offline()``: post what the training pipeline computes for served requests to the sidecar.

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
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger("inferwatch")

#: The default of ``INFERWATCH_SIDECAR_HTTP``.
DEFAULT_SIDECAR_HTTP = "http://127.0.0.1:9464"


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

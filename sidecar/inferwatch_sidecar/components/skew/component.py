"""The sidecar's skew component: served feature values joined live, by request ID, with the offline pipeline's.

Data flow:

1. ``handle`` (ingest thread) stages the decoded RECORD events (they already carry the request ID, the time
   and the features ``inferwatch.record(features=...)`` was given: no new wire type) in a bounded list.
2. The component's thread drains it every second. A record with a request ID and features is a served row:
   it waits (at most ``max_ids`` of them, for at most ``max_age_seconds``) for its offline values, and when its
   request ID falls in the sampled share (a hash of the ID below ``sample_ratio``) it is also written to the
   rotating Parquet files of ``served_dir`` (:mod:`.writer`).
3. Offline values come from ``POST /v1/skew`` (or ``inferwatch.record_offline()``, which posts there):
   ``{"rows": [{"request_id": ..., "features": {...}}, ...]}``. A row whose served row is waiting is joined at
   once; one that came first waits (at most ``max_ids``) for its served row.
4. Every joined row goes into its model version's window of the last ``window_rows`` joined rows. Every
   ``evaluate_seconds`` each window that changed is diagnosed with the same code as ``inferwatch skew``
   (:mod:`.diagnose`): the match ratio and the kind of skew per feature, published as gauges.

Memory: ``2 x max_ids`` waiting rows of at most ``max_pending_bytes`` (estimated, both sides together), plus
``max_models x window_rows`` joined rows of at most ``max_window_bytes``, whatever the traffic: offline rows come
from an unauthenticated route and served rows from any producer, and 64 values of 255 characters a row make
row counts alone worth gigabytes.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict, deque
from typing import Any

import pyarrow as pa

from inferwatch._offline import id_in_sample
from inferwatch.wire import EV_RECORD
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.identity import Key, VersionKeys, bounded_entry
from inferwatch_sidecar.components.periodic import StagedComponent
from inferwatch_sidecar.components.skew.config import SkewConfig
from inferwatch_sidecar.components.skew.diagnose import Options, diagnose
from inferwatch_sidecar.components.skew.writer import ServedWriter
from inferwatch_sidecar.metrics.samples import Samples
from inferwatch_sidecar.metrics.skew import (
    METRICS,
    SKEW_EXPLAINED_RATIO,
    SKEW_JOINED_ROWS_TOTAL,
    SKEW_MATCH_RATIO,
    SKEW_OFFLINE_ROWS_TOTAL,
    SKEW_PENDING_ROWS,
    SKEW_SERVED_BYTES,
    SKEW_SERVED_ROWS_DROPPED_TOTAL,
    SKEW_SERVED_ROWS_EXPIRED_TOTAL,
    SKEW_SERVED_ROWS_WRITTEN_TOTAL,
)

log = logging.getLogger("inferwatch.sidecar.skew")

_MAX_ID = 128


def sampled(request_id: str, ratio: float) -> bool:
    """Whether ``request_id`` is in the sampled share ``ratio``: a CRC-32 of the ID below ``ratio`` of its range.

    The SDK's ``inferwatch.skew_sampled()`` uses the same function, so every replica, the service and a batch
    job agree on the sampled IDs.
    """
    return id_in_sample(request_id, ratio)


def row_bytes(feats: dict[str, Any]) -> int:
    """Estimated bytes one row's ``name -> value`` dict holds (its entries and its strings; names are shared)."""
    n = 232 + 72 * len(feats)
    for v in feats.values():
        if type(v) is str:
            n += 49 + len(v)
    return n


def _features(feats: Any) -> dict[str, Any]:
    """A decoded RECORD's ``(schema, numeric values, categorical values)`` as a name -> value dict."""
    schema, nums, cats = feats
    out: dict[str, Any] = dict(zip(schema.numeric, nums, strict=False))
    out.update(zip(schema.categorical, cats, strict=False))
    return out


class _Served:
    __slots__ = ("key", "unix_ns", "feats")

    def __init__(self, key: Key, unix_ns: int, feats: dict[str, Any]) -> None:
        self.key, self.unix_ns, self.feats = key, unix_ns, feats


class _Window:
    """The last ``size`` joined rows of one model version and the result of their last diagnosis."""

    __slots__ = ("rows", "joined", "dirty", "report", "bytes")

    def __init__(self, size: int) -> None:
        #: (served features, offline features, their estimated bytes)
        self.rows: deque[tuple[dict[str, Any], dict[str, Any], int]] = deque(maxlen=size)
        self.bytes = 0
        self.joined = 0
        self.dirty = False
        self.report: dict[str, Any] | None = None


def _column(values: list[Any]) -> pa.Array:
    clean = [None if isinstance(v, float) and not math.isfinite(v) else v for v in values]
    try:
        return pa.array(clean)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in clean], pa.string())


class SkewComponent(StagedComponent):
    """The ``skew`` sidecar component (see the module docstring)."""

    name = "skew"
    record_types = frozenset({EV_RECORD})
    metrics = METRICS
    drop_reasons = ("staging_full", "no_request_id", "too_many_models", "window_full", "error")

    def __init__(self, config: SkewConfig, ctx: ComponentContext) -> None:
        super().__init__(ctx, interval_s=1.0, max_staged=config.max_staged, log=log)
        self.cfg = config
        self._served: OrderedDict[str, _Served] = OrderedDict()
        self._offline: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.windows: dict[Key, _Window] = {}
        self.expired = {"max_ids": 0, "max_age": 0, "max_pending_bytes": 0}
        #: estimated bytes of the rows waiting on both sides (bounded by max_pending_bytes)
        self.pending_bytes = 0
        #: estimated bytes of the joined rows in the windows (bounded by max_window_bytes)
        self.window_bytes = 0
        self.offline_rows = {"joined": 0, "waiting": 0, "unmatched": 0, "duplicate": 0, "bad": 0}
        self.joined: dict[Key, int] = {}
        self._last_eval = -math.inf
        self._keys = VersionKeys(ctx)
        self._to_write: list[tuple[str, int, Key, dict[str, Any]]] = []
        self._lim_feature = ctx.limiter("feature")
        self.writer = (ServedWriter(config.served_dir, config.file_max_bytes, config.rotate_seconds,
                                    config.max_bytes, ctx.clock)
                       if config.served_dir and config.sample_ratio > 0 else None)
        self._options = Options(rtol=config.rtol, atol=config.atol, max_lag=0)

    # -- the component's thread -----------------------------------------------------------------------------------

    def drain(self, now: float | None = None) -> int:
        """Take the staged served rows into the join (and the sample), then diagnose windows that are due."""
        now = self.ctx.clock() if now is None else now
        n = super().drain(now)
        to_write, self._to_write = self._to_write, []
        if self.writer is not None:
            if to_write:
                self.writer.write(to_write)
            self.writer.rotate_if_due()
        if now - self._last_eval >= self.cfg.evaluate_seconds:
            self._last_eval = now
            self.evaluate()
        return n

    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        """Join the served rows (the state lock held); the sampled ones wait in ``_to_write`` for the writer."""
        to_write = self._to_write
        ratio = self.cfg.sample_ratio if self.writer is not None else 0.0
        served, limit, max_bytes = self._served, self.cfg.max_ids, self.cfg.max_pending_bytes
        for ev in batch:
            try:
                feats, rid = ev[7], ev[3]
                if feats is None:
                    continue
                if rid is None:
                    self.dropped["no_request_id"] += 1
                    continue
                key = self._keys.of(ev[1])
                row = _Served(key, int(ev[2]), _features(feats))
                if ratio and sampled(rid, ratio):
                    to_write.append((rid, row.unix_ns, key, row.feats))
                off = self._offline.pop(rid, None)
                if off is not None:
                    self.pending_bytes -= row_bytes(off)
                    self._join(row, off)
                    continue
                old = served.pop(rid, None)
                if old is not None:
                    self.pending_bytes -= row_bytes(old.feats)
                served[rid] = row
                self.pending_bytes += row_bytes(row.feats)
                while served and (len(served) > limit or self.pending_bytes > max_bytes):
                    self.expired["max_ids" if len(served) > limit else "max_pending_bytes"] += 1
                    self.pending_bytes -= row_bytes(served.popitem(last=False)[1].feats)
            except Exception:
                self.dropped["error"] += 1
        self._expire(now)

    def _expire(self, now: float) -> None:
        cutoff = (now - self.cfg.max_age_seconds) * 1e9
        served = self._served
        while served:
            rid, row = next(iter(served.items()))
            if row.unix_ns >= cutoff:
                break
            served.popitem(last=False)
            self.pending_bytes -= row_bytes(row.feats)
            self.expired["max_age"] += 1

    def _join(self, row: _Served, offline: dict[str, Any]) -> bool:
        """Put one joined row into its model version's window (state lock held)."""
        size = self.cfg.window_rows
        w = bounded_entry(self.windows, row.key, self.cfg.max_models, lambda _k: _Window(size))
        if w is None:
            self.dropped["too_many_models"] += 1
            return False
        if len(w.rows) == w.rows.maxlen:
            self._drop_oldest(w)
        nbytes = row_bytes(row.feats) + row_bytes(offline)
        w.rows.append((row.feats, offline, nbytes))
        w.bytes += nbytes
        self.window_bytes += nbytes
        while self.window_bytes > self.cfg.max_window_bytes:
            # The window holding most gives its oldest row: one version's fat rows cannot push out the others.
            self._drop_oldest(max(self.windows.values(), key=lambda x: x.bytes))
            self.dropped["window_full"] += 1
        w.joined += 1
        w.dirty = True
        self.joined[row.key] = self.joined.get(row.key, 0) + 1
        self.offline_rows["joined"] += 1
        return True

    def _drop_oldest(self, w: _Window) -> None:
        _, _, nbytes = w.rows.popleft()
        w.bytes -= nbytes
        self.window_bytes -= nbytes

    def post_offline(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /v1/skew``: ``{"rows": [{"request_id": ..., "features": {...}}, ...]}`` -> (status, answer).

        Rows without a valid request ID or with features that are not a mapping of names to numbers, strings or
        nulls are counted as ``bad`` and skipped; the rest are joined or wait for their served row.
        """
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            return 400, {"error": f"the body is not JSON: {e}"}
        rows = doc.get("rows") if isinstance(doc, dict) else doc
        if not isinstance(rows, list):
            return 400, {"error": 'expected {"rows": [{"request_id": "...", "features": {"name": value}}, ...]}'}
        if len(rows) > self.cfg.max_offline_rows_per_post:
            return 413, {"error": f"{len(rows)} rows in one post; at most skew.max_offline_rows_per_post = "
                                  f"{self.cfg.max_offline_rows_per_post}: send them in batches"}
        out = {"joined": 0, "waiting": 0, "duplicate": 0, "bad": 0}
        errors: list[str] = []
        with self._state_lock:
            for i, r in enumerate(rows):
                why = _bad_row(r, self.cfg.max_features)
                if why is not None:
                    out["bad"] += 1
                    if len(errors) < 5:
                        errors.append(f"rows[{i}]: {why}")
                    continue
                rid, feats = r["request_id"], r["features"]
                row = self._served.pop(rid, None)
                if row is not None:
                    self.pending_bytes -= row_bytes(row.feats)
                    out["joined"] += self._join(row, feats)
                    continue
                if rid in self._offline:
                    out["duplicate"] += 1
                    continue
                self._offline[rid] = feats
                self.pending_bytes += row_bytes(feats)
                out["waiting"] += 1
                offline = self._offline
                while offline and (len(offline) > self.cfg.max_ids or self.pending_bytes > self.cfg.max_pending_bytes):
                    self.pending_bytes -= row_bytes(offline.popitem(last=False)[1])
                    self.offline_rows["unmatched"] += 1
            for k in ("waiting", "duplicate", "bad"):
                self.offline_rows[k] += out[k]
        answer: dict[str, Any] = {"accepted": len(rows) - out["bad"], **out}
        if errors:
            answer["errors"] = errors
        return 200, answer

    def evaluate(self, now: float | None = None) -> None:
        """Diagnose every window with new joined rows and publish the gauges."""
        with self._state_lock:
            due = [(k, list(w.rows)) for k, w in self.windows.items() if w.dirty]
            for k, _ in due:
                self.windows[k].dirty = False
        reports = {}
        for key, rows in due:
            try:
                reports[key] = self._diagnose(rows)
            except Exception:
                log.exception("skew: diagnosis failed for %s", key)
        with self._state_lock:
            for key, rep in reports.items():
                self.windows[key].report = rep
            snap = Samples()
            for key, w in self.windows.items():
                if w.report is None:
                    continue
                for feat, f in w.report["features"].items():
                    lab = (*key, self._lim_feature.get(feat))
                    snap.put(SKEW_MATCH_RATIO, lab, f["match_ratio"])
                    snap.put(SKEW_EXPLAINED_RATIO, (*lab, f["kind"]), f["explained_ratio"])
        self.publish(snap)

    def _diagnose(self, rows: list[tuple[dict[str, Any], dict[str, Any], int]]) -> dict[str, Any]:
        names: list[str] = []
        for s, o, _ in rows:
            for n in s:
                if n in o and n not in names and len(names) < self.cfg.max_features:
                    names.append(n)
        key = pa.array(range(len(rows)), pa.int64())
        served = pa.table({"__row": key, **{n: _column([r[0].get(n) for r in rows]) for n in names}})
        offline = pa.table({"__row": key, **{n: _column([r[1].get(n) for r in rows]) for n in names}})
        return diagnose(served, offline, "__row", options=self._options)

    # -- export -----------------------------------------------------------------------------------------------------

    def live_samples(self) -> Samples:
        """The counters and the pending rows, read at scrape time."""
        out = Samples()
        with self._state_lock:
            out.set(SKEW_JOINED_ROWS_TOTAL, [(k, float(n)) for k, n in self.joined.items()])
            out.set(SKEW_PENDING_ROWS, [(("served",), float(len(self._served))),
                                        (("offline",), float(len(self._offline)))])
        out.set(SKEW_OFFLINE_ROWS_TOTAL, [((k,), float(n)) for k, n in self.offline_rows.items()])
        out.set(SKEW_SERVED_ROWS_EXPIRED_TOTAL, [((k,), float(n)) for k, n in self.expired.items()])
        dropped = dict(self.dropped)
        w = self.writer
        dropped["write_error"] = w.write_errors if w else 0
        dropped["size_cap"] = w.dropped_size_cap if w else 0
        out.set(SKEW_SERVED_ROWS_DROPPED_TOTAL, [((k,), float(n)) for k, n in dropped.items()])
        out.set(SKEW_SERVED_ROWS_WRITTEN_TOTAL, [((), float(w.written if w else 0))])
        if w is not None:
            out.set(SKEW_SERVED_BYTES, [((), float(w.bytes))])
        return out

    def status(self) -> dict[str, Any]:
        with self._state_lock:
            models = []
            for k, w in sorted(self.windows.items()):
                feats = {} if w.report is None else {
                    n: {"match_ratio": f["match_ratio"], "kind": f["kind"], "explained_ratio": f["explained_ratio"]}
                    for n, f in w.report["features"].items()}
                models.append({"service": k[0], "model": k[1], "version": k[2], "joined": w.joined,
                               "window_rows": len(w.rows), "features": feats})
            pending = {"served": len(self._served), "offline": len(self._offline)}
            pending_bytes, window_bytes = self.pending_bytes, self.window_bytes
        return {
            "max_ids": self.cfg.max_ids,
            "pending": pending,
            "pending_bytes": pending_bytes,
            "window_bytes": window_bytes,
            "offline_rows": dict(self.offline_rows),
            "expired": dict(self.expired),
            "dropped": dict(self.dropped),
            "served_sample": None if self.writer is None else self.writer.status(),
            "models": models,
        }

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    def on_stop(self) -> None:
        """The last drain, and the served sample's file closed."""
        self.drain()
        if self.writer is not None:
            self.writer.close()


def _bad_row(r: Any, max_features: int) -> str | None:
    if not isinstance(r, dict):
        return "a row is an object"
    rid = r.get("request_id")
    if not isinstance(rid, str) or not rid or len(rid.encode()) > _MAX_ID:
        return f"request_id must be a non-empty string of at most {_MAX_ID} bytes"
    feats = r.get("features")
    if not isinstance(feats, dict) or not feats:
        return "features must be a non-empty object of name -> number, string or null"
    if len(feats) > max_features:
        return f"more than skew.max_features = {max_features} features"
    for k, v in feats.items():
        if not isinstance(k, str) or (v is not None and not isinstance(v, (int, float, str))) or isinstance(v, bool):
            return f"feature {k!r}: values are numbers, strings or null"
    return None


def build(config: SkewConfig, ctx: ComponentContext) -> SkewComponent:
    """Build the skew component."""
    return SkewComponent(config, ctx)

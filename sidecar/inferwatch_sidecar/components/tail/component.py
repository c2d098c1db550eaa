"""The sidecar's tail component: why the slowest requests of each model version are slow, window by window.

Data flow:

1. ``handle`` (ingest thread) appends the decoded REQUEST and RECORD tuples to
   a bounded staging list under a lock held for one ``list.extend``.
2. The component's thread drains the list every second. A record's features
   (trimmed to what a kept row holds when larger than a kept row can be) wait
   (by request ID, at most ``max_pending``) for their request; a request
   takes its record's features if they came first, and otherwise, when it is
   kept, waits for them. Each request goes into its model version's
   :class:`~inferwatch_sidecar.components.tail.window.TailWindow`.
3. When a window of ``window_seconds`` ends (tumbling windows aligned on the
   clock), every version's window is analysed (:mod:`.analysis`), the reports
   and metric samples are published, and new windows start. ``collect`` only
   copies the samples.

Memory: per model version ``max_tail + reservoir`` kept requests, each holding
at most ``max_features`` feature values of at most 64 characters (what the
analysis can use), their features at most ``max_window_bytes`` over all versions
(past it a kept request keeps its latency and stages but no features, counted as
``window_full``), plus the pending join tables of ``max_pending`` entries and
``max_pending_bytes`` each, and the staging list of ``max_staged_bytes``,
whatever the traffic.
"""

from __future__ import annotations

import logging
import math
from array import array
from collections import OrderedDict
from typing import Any, ClassVar

from inferwatch.wire import EV_RECORD, EV_REQUEST
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.identity import Key, VersionKeys, bounded_entry
from inferwatch_sidecar.components.periodic import StagedComponent
from inferwatch_sidecar.components.tail.analysis import analyse
from inferwatch_sidecar.components.tail.config import TailConfig
from inferwatch_sidecar.components.tail.window import Row, TailWindow
from inferwatch_sidecar.metrics.entry import Metric
from inferwatch_sidecar.metrics.samples import Samples
from inferwatch_sidecar.metrics.tail import (
    METRICS,
    TAIL_DROPPED_EVENTS_TOTAL,
    TAIL_FEATURE_ADJUSTED_P_VALUE,
    TAIL_FEATURE_DISTINGUISHES,
    TAIL_FEATURE_RATIO,
    TAIL_JOINED_RATIO,
    TAIL_LAST_WINDOW_END_TIMESTAMP_SECONDS,
    TAIL_LATENCY_SECONDS,
    TAIL_REQUESTS,
    TAIL_STAGE_EXCESS_RATIO,
    TAIL_STAGE_SECONDS,
    TAIL_STAGE_SHARE_RATIO,
    TAIL_THRESHOLD_SECONDS,
    TAIL_WINDOW_REQUESTS,
)

log = logging.getLogger("inferwatch.sidecar.tail")
#: Modules this component imports only where it first computes (scipy: 26-72 MiB that an idle sidecar need not
#: hold); start-up checks that they are installed (daemon/wiring.py), so a missing one is named at start.
LAZY_IMPORTS = ("scipy",)


def feats_bytes(feats: Any) -> int:
    """Estimated bytes a record's ``(schema, nums, cats)`` holds while it waits (its strings counted).

    A numeric value costs 32 bytes in a tuple (a float object and its pointer), 8 in the array of doubles a
    trimmed record holds (:func:`trim`).
    """
    try:
        _, nums, cats = feats
        per_num = 8 if type(nums) is array else 32
        if type(cats) is tuple and not cats:  # numeric-only records, the common kind: no generator to run
            return 120 + per_num * len(nums)
        return 120 + per_num * len(nums) + sum(57 + len(c) for c in cats if isinstance(c, str)) + 8 * len(cats)
    except (TypeError, ValueError):
        return 120


def _packed(nums: tuple[Any, ...]) -> Any:
    """``nums`` as an array of doubles (8 bytes a value against 32 in a tuple of floats), or as it is when
    empty or when a value is not a number (the analysis reads both the same way, by index)."""
    if not nums:
        return nums
    try:
        return array("d", nums)
    except (TypeError, OverflowError):
        return nums


#: No event's ctx (the identity check's start value in :meth:`TailComponent.absorb`).
_NO_CTX = object()
#: Longest categorical value a kept row holds: tail analysis compares categories, and 64 characters tell
#: them apart; 64 features of 255 characters in 1,536 rows per version x 16 versions were 500 MB.
MAX_KEPT_VALUE = 64


class _Trimmed:
    """The part of a record's schema a kept row holds: the names the analysis can use."""

    __slots__ = ("numeric", "categorical", "num_idx", "cat_idx", "all_numeric")

    def __init__(self, schema: Any, limit: int) -> None:
        names = sorted(set(schema.numeric) | set(schema.categorical))[:limit]
        keep = set(names)
        self.num_idx = [i for i, n in enumerate(schema.numeric) if n in keep]
        self.cat_idx = [i for i, n in enumerate(schema.categorical) if n in keep and n not in schema.numeric]
        self.numeric = tuple(schema.numeric[i] for i in self.num_idx)
        self.categorical = tuple(schema.categorical[i] for i in self.cat_idx)
        #: Every numeric value is kept, in order (the common case: fewer features than ``limit``).
        self.all_numeric = self.num_idx == list(range(len(schema.numeric)))


def trim(feats: Any, limit: int, cache: dict[int, tuple[Any, _Trimmed]]) -> Any:
    """What a kept row holds of ``feats``: the first ``limit`` feature names in sorted order (the ones
    :func:`~.analysis._columns` can pick), their numeric values as an array of doubles, and categorical
    values cut to :data:`MAX_KEPT_VALUE`. The row holds none of the decoded record's objects, which are
    freed with their batch: a row with 20 numeric features holds 160 bytes of values instead of 640.

    ``cache`` is keyed by the schema object's ``id`` and holds the schema beside its trim (so the id
    stays its own): a schema is a named tuple, and hashing it hashed every feature name, per kept row.
    """
    schema, nums, cats = feats
    e = cache.get(id(schema))
    if e is not None and e[0] is schema:
        t = e[1]
    else:
        if len(cache) >= 4096:
            cache.clear()
        t = _Trimmed(schema, limit)
        cache[id(schema)] = (schema, t)
    if t.all_numeric and type(nums) is tuple and len(nums) <= len(t.num_idx):
        kept_nums = _packed(nums)  # the same values in the same order: no selection
    else:
        kept_nums = _packed(tuple(nums[i] for i in t.num_idx if i < len(nums)))
    if not t.cat_idx:
        return (t, kept_nums, ())
    return (t, kept_nums, tuple(c[:MAX_KEPT_VALUE] if isinstance(c, str) else c
                                for c in (cats[i] for i in t.cat_idx if i < len(cats))))


class TailComponent(StagedComponent):
    """The ``tail`` sidecar component (see the module docstring)."""

    name = "tail"
    record_types = frozenset({EV_REQUEST, EV_RECORD})
    metrics = METRICS
    dropped_metric: ClassVar[Metric | None] = TAIL_DROPPED_EVENTS_TOTAL
    drop_reasons = ("staging_full", "too_many_models", "unmatched_record", "window_full", "error")

    def __init__(self, config: TailConfig, ctx: ComponentContext) -> None:
        super().__init__(ctx, interval_s=min(1.0, config.window_seconds / 10), max_staged=config.max_staged,
                         max_staged_bytes=config.max_staged_bytes, log=log)
        self.cfg = config
        self.windows: dict[Key, TailWindow] = {}
        #: request ID -> a record's features waiting for its request, and their estimated bytes
        self._pending: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        #: estimated bytes of ``_pending`` (bounded by max_pending_bytes)
        self.pending_bytes = 0
        self._trim_cache: dict[int, tuple[Any, _Trimmed]] = {}
        #: A waiting record estimated above this is trimmed as it starts waiting: the most a trimmed one can be
        #: (``max_features`` categorical values of ``MAX_KEPT_VALUE`` characters).
        self._trim_above = feats_bytes((None, (), ("x" * MAX_KEPT_VALUE,) * config.max_features))
        #: request ID -> a kept request (and its window) waiting for its record's features
        self._awaiting: OrderedDict[str, tuple[TailWindow, Row]] = OrderedDict()
        #: estimated bytes of the features the windows' kept rows hold (bounded by max_window_bytes)
        self.window_bytes = 0
        self.window_end: float | None = None
        #: The last complete window's report per model version.
        self.reports: dict[Key, dict[str, Any]] = {}
        self.last_window_end: float | None = None
        self._keys = VersionKeys(ctx)
        self._lim_stage = ctx.limiter("stage")
        self._lim_feature = ctx.limiter("feature")

    # -- the component's thread -----------------------------------------------------------------------------------

    def _window(self, ctx: Any) -> TailWindow | None:
        cfg = self.cfg
        return bounded_entry(self.windows, self._keys.of(ctx), cfg.max_models,
                             lambda k: TailWindow(k, cfg.max_tail, cfg.reservoir, cfg.seed))

    def absorb(self, batch: list[tuple[Any, ...]], now: float) -> None:
        """Take the staged events into the windows, then close the window if ``now`` is past its end.

        Two passes. The records first: one whose kept request waits for it (from an earlier batch) joins it;
        the others are held by request ID for this batch's requests. Then the requests: each takes its record
        from there or from the records still waiting from earlier batches. Only the records no request of the
        batch claimed wait on, sized and bounded (``_pending``): the SDK sends a request's record just before
        the request, so most never wait, and a record whose request was not kept is dropped with its batch.
        """
        W = self.cfg.window_seconds
        if self.window_end is None:
            self.window_end = (math.floor(now / W) + 1) * W
        arrived = self._records_of(batch)
        self._requests_of(batch, arrived)
        if arrived:
            self._wait(arrived)
        if now >= self.window_end:
            self._close(self.window_end)
            self.window_end = (math.floor(now / W) + 1) * W

    def _records_of(self, batch: list[tuple[Any, ...]]) -> dict[str, Any]:
        """The batch's records with features and a request ID, by ID (a later one replaces an earlier one);
        a record whose kept request already waits for it (``_awaiting``) joins that request instead."""
        awaiting = self._awaiting
        arrived: dict[str, Any] = {}
        rec = EV_RECORD
        for ev in batch:
            try:
                if ev[0] == rec and ev[7] is not None and ev[3] is not None:
                    rid = ev[3]
                    if awaiting and rid in awaiting:
                        self._attach(*awaiting.pop(rid), ev[7])
                        continue
                    arrived[rid] = ev[7]
            except Exception:
                self.dropped["error"] += 1
        return arrived

    def _requests_of(self, batch: list[tuple[Any, ...]], arrived: dict[str, Any]) -> None:
        """Offer the batch's requests to their windows; a kept one takes its record's features, or waits for them."""
        pending, awaiting, limit = self._pending, self._awaiting, self.cfg.max_pending
        cache: dict[Any, TailWindow | None] = {}
        last_ctx: Any = _NO_CTX
        last_w: TailWindow | None = None
        req = EV_REQUEST
        for ev in batch:
            try:
                if ev[0] != req:
                    continue
                ctx = ev[1]
                if ctx is last_ctx:  # a frame's events share one ctx object: no tuple hashed
                    w = last_w
                else:
                    w = cache[ctx] if ctx in cache else cache.setdefault(ctx, self._window(ctx))
                    last_ctx, last_w = ctx, w
                if w is None:
                    self.dropped["too_many_models"] += 1
                    continue
                rid = ev[6]
                feats = None
                if rid is not None:
                    feats = arrived.pop(rid, None)
                    if feats is None and pending:
                        got = pending.pop(rid, None)
                        if got is not None:
                            self.pending_bytes -= got[1]
                            feats = got[0]
                before = w.bytes
                row = w.offer(ev[3] * 1e-9, ev[8])  # None: not kept (no Row made)
                if row is None:
                    continue
                self.window_bytes += w.bytes - before  # rows it pushed out
                if feats is not None:
                    self._attach(w, row, feats)
                elif rid is not None:
                    awaiting[rid] = (w, row)
                    if len(awaiting) > limit:
                        awaiting.popitem(last=False)
            except Exception:
                self.dropped["error"] += 1

    def _wait(self, arrived: dict[str, Any]) -> None:
        """Let the records no request of their batch claimed wait for a later one, within ``max_pending``
        records and ``max_pending_bytes``; the oldest beyond either are dropped as ``unmatched_record``."""
        pending, limit, max_bytes = self._pending, self.cfg.max_pending, self.cfg.max_pending_bytes
        for rid, feats in arrived.items():
            try:
                old = pending.pop(rid, None)
                if old is not None:
                    self.pending_bytes -= old[1]
                # A record larger than any kept row can be waits trimmed to what a kept row would hold, not
                # whole until it joins: its full values (up to 64 x 255 characters) are freed with its batch,
                # and the budget holds several times more records. Smaller ones (the common kind) wait as they
                # came: trimming them would gain little, at a cost per record.
                nb = feats_bytes(feats)
                if nb > self._trim_above:
                    feats = trim(feats, self.cfg.max_features, self._trim_cache)
                    nb = feats_bytes(feats)
                pending[rid] = (feats, nb)
                self.pending_bytes += nb
                while pending and (len(pending) > limit or self.pending_bytes > max_bytes):
                    self.pending_bytes -= pending.popitem(last=False)[1][1]
                    self.dropped["unmatched_record"] += 1
            except Exception:
                self.dropped["error"] += 1

    def _attach(self, w: TailWindow, row: Row, feats: Any) -> None:
        """Give a kept row what it keeps of its record's features (trimmed unless a waiting record already was),
        within ``max_window_bytes`` over all windows."""
        kept = feats if type(feats[0]) is _Trimmed else trim(feats, self.cfg.max_features, self._trim_cache)
        nbytes = feats_bytes(kept)
        if self.window_bytes + nbytes > self.cfg.max_window_bytes:
            self.dropped["window_full"] += 1  # the row stays, for its latency and stages, without features
            return
        before = w.bytes
        w.attach(row, kept, nbytes)
        self.window_bytes += w.bytes - before

    def _close(self, end: float) -> None:
        """Analyse every version's window (lock held), publish the reports and start new windows."""
        reports: dict[Key, dict[str, Any]] = {}
        for key, w in self.windows.items():
            try:
                reports[key] = analyse(w, self.cfg)
            except Exception:
                log.exception("tail: analysis failed for %s", key)
        self.windows = {}
        self.window_bytes = 0
        self._awaiting.clear()
        snap = self._samples(reports)
        snap.put(TAIL_LAST_WINDOW_END_TIMESTAMP_SECONDS, (), end)
        with self._lock:
            self.reports = reports
            self.last_window_end = end
            self._snapshot = snap

    def _samples(self, reports: dict[Key, dict[str, Any]]) -> Samples:
        out = Samples()
        put = out.put
        for key, rep in reports.items():
            put(TAIL_WINDOW_REQUESTS, key, rep["requests"])
            put(TAIL_JOINED_RATIO, key, rep["joined_ratio"])
            med = rep["median"]
            if med is None:
                continue
            put(TAIL_LATENCY_SECONDS, (*key, "median"), med["latency_s"])
            for stage, s in med["stages"].items():
                put(TAIL_STAGE_SECONDS, (*key, self._lim_stage.get(stage), "median"), s)
            for tail, t in rep["tails"].items():
                put(TAIL_REQUESTS, (*key, tail), t["requests"])
                if t["status"] != "ok":
                    continue
                put(TAIL_THRESHOLD_SECONDS, (*key, tail), t["threshold_s"])
                put(TAIL_LATENCY_SECONDS, (*key, tail), t["latency_s"])
                for s in t["stages"]:
                    sl = (*key, self._lim_stage.get(s["stage"]))
                    put(TAIL_STAGE_SECONDS, (*sl, tail), s["seconds"])
                    put(TAIL_STAGE_SHARE_RATIO, (*sl, tail), s["share"])
                    put(TAIL_STAGE_EXCESS_RATIO, (*sl, tail), s["excess_share"])
                for f in t["features"]:
                    fl = (*key, self._lim_feature.get(f["feature"]), tail)
                    put(TAIL_FEATURE_ADJUSTED_P_VALUE, fl, f["p_adjusted"])
                    put(TAIL_FEATURE_DISTINGUISHES, fl, float(f["distinguishes"]))
                    if f["kind"] == "numeric":
                        put(TAIL_FEATURE_RATIO, fl, f["ratio"])
        return out

    # -- export -----------------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            reports = dict(self.reports)
            staged = len(self._staging)
            last_end = self.last_window_end
        with self._state_lock:
            current = [{"service": k[0], "model": k[1], "version": k[2], "requests": w.n}
                       for k, w in sorted(self.windows.items())]
            pending, awaiting = len(self._pending), len(self._awaiting)
        return {
            "window_seconds": self.cfg.window_seconds,
            "window_end_unix": self.window_end,
            "last_window_end_unix": last_end,
            "staged": staged,
            "pending_records": pending,
            "pending_bytes": self.pending_bytes,
            "window_bytes": self.window_bytes,
            "awaiting_records": awaiting,
            "dropped": dict(self.dropped),
            "current_window": current,
            "models": [{"service": k[0], "model": k[1], "version": k[2], **r} for k, r in sorted(reports.items())],
        }



def build(config: TailConfig, ctx: ComponentContext) -> TailComponent:
    """Build the tail component."""
    return TailComponent(config, ctx)

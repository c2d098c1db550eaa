"""Ground-truth labels joined to their predictions by request id, within bounded memory.

A label can arrive with its prediction (scored at once, "inline") or later in
a label-only record with the same request id. Predictions wait for their label
in an insertion-ordered map of at most ``max_pending`` entries, each for at
most ``ttl_s`` seconds; a label that finds its prediction is "joined", one that
does not is "unmatched", and a prediction evicted or timed out is "expired".
The counts and the accuracy they feed live on each model version's
:class:`~inferwatch_sidecar.components.drift.monitor.Monitor`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from inferwatch_sidecar.components.drift.monitor import Monitor
from inferwatch_sidecar.stats.columns import canon


class LabelJoiner:
    """Predictions waiting for their label (see the module docstring).

    Args:
        max_pending: predictions remembered at most (0: only inline labels are scored).
        ttl_s: seconds a prediction waits for its label.
        monotonic: the clock of the waits.
    """

    def __init__(self, max_pending: int, ttl_s: float, monotonic: Callable[[], float]) -> None:
        self.max_pending = max_pending
        self.ttl_s = ttl_s
        self._monotonic = monotonic
        #: request id -> (model version, canonical prediction, monotonic time it was seen)
        self.pending: OrderedDict[str, tuple[tuple[str, str], str | None, float]] = OrderedDict()

    def track(self, mon: Monitor, recs: list[tuple[Any, ...]], monitors: Mapping[tuple[str, str], Monitor]) -> None:
        """Score the inline labels of ``mon``'s records and remember the other predictions."""
        cap = self.max_pending
        mono = self._monotonic()
        pending, key = self.pending, mon.key
        # Predictions pushed out of a full table, counted per model version after the loop (one
        # ``count_label`` call per record was most of this method's time once the table is full).
        expired: dict[tuple[str, str], int] = {}
        try:
            for r in recs:
                pred, label = r[4], r[6]
                if pred is None:
                    continue
                if label is not None:
                    mon.count_label("inline", canon(pred) == canon(label))
                else:
                    rid = r[3]
                    if rid is not None and cap > 0:
                        pending[rid] = (key, pred if pred.__class__ is str else canon(pred), mono)
                        pending.move_to_end(rid)
                        if len(pending) > cap:
                            k = pending.popitem(last=False)[1][0]
                            expired[k] = expired.get(k, 0) + 1
        finally:
            for k, n in expired.items():
                m = monitors.get(k)
                if m is not None:
                    m.label_counts["expired"] += n

    def join(self, r: tuple[Any, ...], monitors: Mapping[tuple[str, str], Monitor]) -> bool:
        """Score a label-only record against its prediction. False when no model version could count it."""
        rid = r[3]
        ctx = r[1]
        key = (ctx[1] or "", ctx[2] or "")
        got = self.pending.pop(rid, None) if rid is not None else None
        if got is None:
            mon = monitors.get(key)
            if mon is None:
                # A label for a model version we never saw: count it against the first matching model.
                mon = next((m for k, m in monitors.items() if k[0] == key[0]), None)
            if mon is None:
                return False
            mon.count_label("unmatched")
            return True
        mkey, pred, _ = got
        mon = monitors.get(mkey)
        if mon is not None:
            mon.count_label("joined", pred == canon(r[6]))
        return True

    def expire(self, monitors: Mapping[tuple[str, str], Monitor]) -> None:
        """Forget the predictions that waited longer than ``ttl_s``."""
        if not self.pending:
            return
        limit = self._monotonic() - self.ttl_s
        while self.pending:
            rid, (k, _, t) = next(iter(self.pending.items()))
            if t > limit:
                break
            self.pending.popitem(last=False)
            m = monitors.get(k)
            if m is not None:
                m.count_label("expired")

"""Issue 28: the skew join's waiting rows and its windows are bounded by bytes, not only by rows.

Offline rows come from ``POST /v1/skew`` (unauthenticated) with up to ``max_features`` values each; served
rows from any producer. 50,000 ids a side of 64 values of 255 characters is over 1.6 GB by rows alone.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from typing import Any

from inferwatch.wire import EV_RECORD, Schema
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.skew.component import SkewComponent, row_bytes
from inferwatch_sidecar.components.skew.config import SkewConfig

NOW = 1_000_000.0
CATS = tuple(f"c{i}" for i in range(64))
FAT = Schema(9, (), CATS, struct.Struct("<"), struct.Struct(f"<{len(CATS)}H"))


def _value(i: int, j: int) -> str:
    return (f"{i}.{j}." + "x" * 255)[:255]


def _served(ids: range, versions: int = 1) -> list[tuple[Any, ...]]:
    return [(EV_RECORD, ("svc", "m", f"v{i % versions}"), int(NOW * 1e9), f"r{i}", None, None, None,
             (FAT, (), tuple(_value(i, j) for j in range(64)))) for i in ids]


def _offline(ids: range) -> bytes:
    return json.dumps({"rows": [{"request_id": f"r{i}", "features": {c: _value(i, j) for j, c in enumerate(CATS)}}
                                for i in ids]}).encode()


def _recount(c: SkewComponent) -> tuple[int, int]:
    pending = sum(row_bytes(r.feats) for r in c._served.values()) + sum(row_bytes(o) for o in c._offline.values())
    window = 0
    for w in c.windows.values():
        assert w.bytes == sum(r[2] for r in w.rows)
        window += w.bytes
    return pending, window


def test_waiting_rows_are_bounded_by_bytes_on_both_sides() -> None:
    budget = 2 << 20
    c = SkewComponent(SkewConfig(enabled=True, max_pending_bytes=budget, max_offline_rows_per_post=500),
                      ComponentContext(clock=lambda: NOW))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for k in range(6):  # 3,000 served rows whose offline values never come (~60 MB by rows)
        c.handle(0, 0, _served(range(k * 500, (k + 1) * 500)))
        c.drain(NOW)
        assert c.pending_bytes == _recount(c)[0] <= budget
    for k in range(6):  # and 3,000 offline rows for ids never served
        assert c.post_offline(_offline(range(10**6 + k * 500, 10**6 + (k + 1) * 500)))[0] == 200
        assert c.pending_bytes == _recount(c)[0] <= budget
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert held < 3 * budget, held
    assert c.expired["max_pending_bytes"] > 2000 and c.offline_rows["unmatched"] > 2000
    assert c.status()["pending_bytes"] == c.pending_bytes


def test_joined_windows_are_bounded_by_bytes_and_one_version_cannot_push_out_the_others() -> None:
    budget = 2 << 20
    c = SkewComponent(SkewConfig(enabled=True, max_window_bytes=budget, max_offline_rows_per_post=500,
                                 window_rows=1000), ComponentContext(clock=lambda: NOW))
    small = (EV_RECORD, ("svc", "m", "small"), int(NOW * 1e9), "s0", None, None, None,
             (Schema(3, ("x",), (), struct.Struct("<d"), struct.Struct("<")), (1.0,), ()))
    c.handle(0, 0, [small])
    c.drain(NOW)
    assert c.post_offline(json.dumps({"rows": [{"request_id": "s0", "features": {"x": 1.0}}]}).encode())[1][
        "joined"] == 1
    for k in range(4):  # 2,000 fat joined rows of one version: ~80 MB by window_rows alone
        c.handle(0, 0, _served(range(k * 500, (k + 1) * 500)))
        c.drain(NOW)
        assert c.post_offline(_offline(range(k * 500, (k + 1) * 500)))[1]["joined"] == 500
        assert c.window_bytes == _recount(c)[1] <= budget
    assert c.dropped["window_full"] > 1000
    windows = {k[2]: w for k, w in c.windows.items()}
    assert len(windows["small"].rows) == 1 and len(windows["v0"].rows) > 20
    c.evaluate(NOW)
    assert c.status()["window_bytes"] == c.window_bytes


def test_rows_under_the_budgets_are_all_kept() -> None:
    c = SkewComponent(SkewConfig(enabled=True, max_offline_rows_per_post=500), ComponentContext(clock=lambda: NOW))
    c.handle(0, 0, _served(range(300)))
    c.drain(NOW)
    assert c.post_offline(_offline(range(300)))[1]["joined"] == 300
    assert c.pending_bytes == 0 and c.dropped["window_full"] == 0 and len(next(iter(c.windows.values())).rows) == 300

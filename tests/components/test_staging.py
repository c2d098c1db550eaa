"""Staging: the batch-at-once byte sum stages and refuses exactly what one ``record_bytes`` per record did."""

from __future__ import annotations

import random
import struct
from typing import Any

from inferwatch.wire import EV_RECORD, EV_REQUEST, Schema
from inferwatch_sidecar.components.staging import CAT_BYTES, EVENT_BYTES, Staging, record_bytes


def reference_put(items: list[Any], nbytes: int, limit: int, max_bytes: int, records: list[Any]) -> tuple[int, int]:
    """The staging rule written plainly: in order, each record while the count and the byte budget allow."""
    refused = 0
    for i, r in enumerate(records):
        b = record_bytes(r)
        if len(items) >= limit or nbytes + b > max_bytes:
            refused = len(records) - i
            break
        items.append(r)
        nbytes += b
    return refused, nbytes


def random_event(rng: random.Random) -> tuple[Any, ...]:
    kind = rng.random()
    ctx = ("svc", "m", f"v{rng.randrange(3)}")
    if kind < 0.4:
        return (EV_REQUEST, ctx, 0, 1000, 0, None, "r", None, [("s", 10, None)])
    nn, nc = rng.randrange(0, 30), rng.randrange(0, 70)
    sch = Schema(1, tuple(f"n{i}" for i in range(nn)), tuple(f"c{i}" for i in range(nc)),
                 struct.Struct(f"<{nn}d"), struct.Struct(f"<{nc}H"))
    feats: Any = (sch, tuple(float(i) for i in range(nn)), tuple("x" * rng.randrange(256) for _ in range(nc)))
    odd = rng.random()
    if odd < 0.05:
        feats = None
    elif odd < 0.08:
        feats = (sch, 5, ())  # a length that raises: charged the floor
    elif odd < 0.10:
        feats = (sch, ())  # not three parts: charged the floor
    elif odd < 0.12:
        return (EV_RECORD, ctx, 0, "r")  # too short to carry features
    return (EV_RECORD, ctx, 0, "r", "cat", 0.9, None, feats)


def test_batch_sum_matches_one_estimate_per_record() -> None:
    rng = random.Random(23)
    for trial in range(60):
        limit = rng.choice([5, 50, 500, 10**6])
        max_bytes = rng.choice([1 << 20, 200_000, 40_000, 5_000 + trial])
        s = Staging(limit, max_bytes)
        items: list[Any] = []
        nbytes = 0
        for _ in range(rng.randrange(1, 12)):
            batch = [random_event(rng) for _ in range(rng.randrange(0, 120))]
            want_refused, nbytes = reference_put(items, nbytes, limit, max_bytes, batch)
            assert s.put(batch) == want_refused
            assert s.nbytes == nbytes <= max_bytes
            if rng.random() < 0.2:
                assert s.take() == items
                items, nbytes = [], 0
        assert s.take() == items


def test_record_bytes_bound_is_the_documented_one() -> None:
    sch = Schema(1, ("a", "b"), ("c",), struct.Struct("<2d"), struct.Struct("<1H"))
    r = (EV_RECORD, ("s", "m", "v"), 0, "r", None, None, None, (sch, (1.0, 2.0), ("z" * 255,)))
    assert record_bytes(r) == EVENT_BYTES + 16 + CAT_BYTES
    s = Staging(10, EVENT_BYTES + 16 + CAT_BYTES)
    assert s.put([r, r]) == 1 and s.nbytes == EVENT_BYTES + 16 + CAT_BYTES

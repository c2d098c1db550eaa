"""Builders of decoded EV_RECORD tuples for the drift tests."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from inferwatch.wire import EV_RECORD, Schema
from inferwatch_sidecar.components.base import ComponentContext


def schema(numeric: tuple[str, ...], categorical: tuple[str, ...] = (), sid: int = 1) -> Schema:
    return Schema(sid, numeric, categorical, struct.Struct(f"<{len(numeric)}d"), struct.Struct(f"<{len(categorical)}H"))


def rec(model: str, version: str, sch: Schema | None, nums: tuple[float, ...] = (), cats: tuple[Any, ...] = (),
        pred: Any = None, conf: float | None = None, label: Any = None, rid: str | None = None) -> tuple[Any, ...]:
    feats = None if sch is None else (sch, nums, cats)
    return (EV_RECORD, ("svc", model, version), 0, rid, pred, conf, label, feats)


def label_only(model: str, version: str, rid: str, label: Any) -> tuple[Any, ...]:
    return (EV_RECORD, ("svc", model, version), 0, rid, None, None, label, None)


def records(model: str, version: str, sch: Schema, a: np.ndarray, b: np.ndarray, color: list[str],
            pred: list[Any], conf: np.ndarray, start: int = 0) -> list[tuple[Any, ...]]:
    return [rec(model, version, sch, (float(a[i]), float(b[i])), (color[i],), pred=pred[i], conf=float(conf[i]),
                rid=f"r{start + i}") for i in range(len(a))]


class Clock:
    """Injectable wall and monotonic clock."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def context(clock: Clock | None = None) -> ComponentContext:
    c = clock or Clock()
    return ComponentContext(clock=c, monotonic=c)


def samples(families: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Flatten metric families into {(sample name, sorted labels): value}."""
    out = {}
    for fam in families:
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out

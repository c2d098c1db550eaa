"""Nothing raises while recording: every bad input is counted and dropped (or kept as missing)."""

from __future__ import annotations

import decimal
import fractions
import math
from typing import Any

import pytest

import inferwatch
from inferwatch.wire import EV_RECORD
from tests.sdk.conftest import Receiver


class BadFloat:
    def __float__(self) -> float:
        raise RuntimeError("no")

    def __str__(self) -> str:
        raise RuntimeError("no str either")


class BadItem:
    shape = ()

    def item(self) -> Any:
        raise RuntimeError("broken numpy-like scalar")


class BadMapping(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("cannot iterate")


def _drops_delta(before: dict[str, int]) -> dict[str, int]:
    after = inferwatch.stats()["drops"]
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


CASES: list[tuple[dict[str, Any], dict[str, int]]] = [
    ({"features": {"a": math.inf}}, {"invalid_value": 1}),
    ({"features": {"a": -math.inf, "b": 1.0}}, {"invalid_value": 1}),
    ({"features": {"a": [1, 2]}}, {"invalid_value": 1}),
    ({"features": {"a": {"nested": {"junk": [None]}}}}, {"invalid_value": 1}),
    ({"features": {"a": b"bytes"}}, {"invalid_value": 1}),
    ({"features": {"a": BadFloat()}}, {"invalid_value": 1}),
    ({"features": {"a": BadItem()}}, {"invalid_value": 1}),
    ({"features": {"a": 10**400}}, {"invalid_value": 1}),
    ({"features": {1: 1.0, None: 2.0, ("t",): 3.0}}, {"bad_name": 3}),
    ({"features": {"": 1.0, "x" * 65: 2.0, "ok": 3.0}}, {"bad_name": 2}),
    ({"features": {f"f{i}": float(i) for i in range(300)}}, {"too_many_features": 44}),
    ({"features": "not a mapping"}, {"invalid_value": 1}),
    ({"features": [1, 2, 3]}, {"invalid_value": 1}),
    ({"features": [("a", 1.0), ("b", "x")]}, {}),
    ({"features": BadMapping(a=1.0)}, {"invalid_value": 1}),
    ({"features": {"a": None, "b": math.nan, "c": True, "d": decimal.Decimal("1.5")}}, {}),
    ({"features": {"a": decimal.Decimal("sNaN"), "b": fractions.Fraction(1, 3)}}, {"invalid_value": 1}),
    ({"confidence": "high"}, {"invalid_value": 1}),
    ({"confidence": math.inf}, {"invalid_value": 1}),
    ({"confidence": BadFloat()}, {"invalid_value": 1}),
    ({"prediction": object()}, {"invalid_value": 1}),
    ({"prediction": [0.1, 0.9]}, {"invalid_value": 1}),
    ({"label": {"x": 1}}, {"invalid_value": 1}),
    ({"prediction": "x" * 1000, "label": "é" * 300}, {}),
    ({"prediction": None, "confidence": None, "features": None, "label": None}, {}),
    ({"features": {}}, {}),
]


@pytest.mark.parametrize(("kwargs", "expected"), CASES)
def test_bad_record_input_is_counted_and_dropped(sdk: Receiver, kwargs: dict[str, Any], expected: dict[str, int]) -> None:
    before = dict(inferwatch.stats()["drops"])
    with inferwatch.request("r"):
        inferwatch.record(**kwargs)
    assert inferwatch.flush() is True
    assert _drops_delta(before) == expected
    frames = sdk.poll()
    assert all(not f.errors for f in frames)
    recs = [r for f in frames for r in f.records if r[0] == EV_RECORD]
    assert len(recs) == 1  # the record itself survives; only the bad parts are dropped


def test_missing_values_are_sent_as_missing(sdk: Receiver) -> None:
    inferwatch.record(features={"a": None, "b": math.nan, "c": 2})
    assert inferwatch.flush()
    (rec,) = [r for r in sdk.records() if r[0] == EV_RECORD]
    schema, nums, cats = rec[7]
    assert schema.numeric == ("a", "b", "c")
    assert math.isnan(nums[0]) and math.isnan(nums[1]) and nums[2] == 2.0


def test_numpy_scalars_work(sdk: Receiver) -> None:
    np = pytest.importorskip("numpy")
    inferwatch.record(
        prediction=np.int64(3),
        confidence=np.float32(0.25),
        features={"f32": np.float32(1.5), "i64": np.int64(7), "b": np.bool_(True), "s": np.str_("DE")},
    )
    assert inferwatch.flush()
    (rec,) = [r for r in sdk.records() if r[0] == EV_RECORD]
    assert rec[4] == 3.0 and rec[5] == 0.25
    schema, nums, cats = rec[7]
    assert dict(zip(schema.numeric, nums, strict=True)) == {"f32": 1.5, "i64": 7.0, "b": 1.0}
    assert dict(zip(schema.categorical, cats, strict=True)) == {"s": "DE"}
    assert inferwatch.stats()["drops"] == {}


def test_other_apis_never_raise_on_bad_input(sdk: Receiver) -> None:
    before = dict(inferwatch.stats()["drops"])
    inferwatch.observe_batch("eight")  # type: ignore[arg-type]
    inferwatch.observe_batch(-1)
    inferwatch.observe_batch(2**80)
    inferwatch.set_queue_depth(None)  # type: ignore[arg-type]
    inferwatch.set_queue_depth(math.nan)  # type: ignore[arg-type]
    with inferwatch.request(BadFloat(), model=12, model_version=None) as r:  # type: ignore[arg-type]
        assert r.request_id  # replaced by a generated one
    s = inferwatch.stage("x")
    s.__exit__(None, None, None)  # exit without enter
    with s, s:  # re-entered: times the inner block, no error
        pass
    assert inferwatch.flush() is True
    # "eight", None and NaN cannot become integers; -1 and 2**80 are clamped.
    assert _drops_delta(before) == {"encode_error": 3}
    assert all(not f.errors for f in sdk.poll())


def test_features_mutated_after_record_do_not_break_the_sender(sdk: Receiver) -> None:
    feats: dict[str, Any] = {"a": 1.0}
    inferwatch.record(features=feats)
    feats["b"] = object()  # the caller misbehaves before the sender encodes
    assert inferwatch.flush() is True
    assert all(not f.errors for f in sdk.poll())

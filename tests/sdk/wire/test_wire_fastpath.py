"""The decoder's inlined REQUEST/RECORD fast paths agree with its general per-record decoder."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.wire import EV_BATCH, EV_RECORD, EV_REQUEST, EV_STAGE, Decoder, Encoder, WireError

CTX = ("svc", "model", "v1")


def _both(frames: list[bytes]) -> tuple[list[Any], list[Any]]:
    """Decode the same frames with the fast paths on and off; return both outcomes."""
    fast, slow = Decoder(), Decoder()
    slow._fast = False
    out_f: list[Any] = []
    out_s: list[Any] = []
    for f in frames:
        for dec, out in ((fast, out_f), (slow, out_s)):
            try:
                fr = dec.decode(f)
                out.append((fr.records, fr.errors))
            except WireError as e:
                out.append(e.reason)
    return out_f, out_s


def _same(frames: list[bytes]) -> list[Any]:
    out_f, out_s = _both(frames)
    # NaN != NaN, so compare reprs (they show the values, types and None exactly).
    assert repr(out_f) == repr(out_s)
    return out_f


def test_plain_requests_and_feature_records_round_trip_on_the_fast_path() -> None:
    enc = Encoder(1, 2)
    stages = [("pre", 10, None), ("inference", 2_000_000, None), ("post", 7, None)]
    events = [
        (EV_REQUEST, CTX, 5, 3_000_000, 0, None, "rid-1", None, stages),
        (EV_REQUEST, CTX, 6, 9, 1, "ValueError", None, bytes(range(16)), []),
        (EV_RECORD, CTX, 7, "rid-1", "cat", 0.75, None, {f"f{i}": float(i) for i in range(20)}),
        (EV_RECORD, CTX, 8, None, 1.5, None, "dog", {"x": math.nan, "c": "DE"}),
        (EV_RECORD, CTX, 9, "r", None, None, 2.0, None),
    ]
    (out,) = _same(enc.encode(events))
    recs, errors = out
    assert errors == []
    assert recs[0] == events[0][:8] + (tuple(events[0][8]),)  # stages decode as a tuple
    assert recs[1] == (EV_REQUEST, CTX, 6, 9, 1, "ValueError", None, bytes(range(16)), ())
    r = recs[2]
    assert r[:7] == (EV_RECORD, CTX, 7, "rid-1", "cat", 0.75, None)
    schema, nums, cats = r[7]
    assert schema.numeric == tuple(f"f{i}" for i in range(20)) and nums == tuple(float(i) for i in range(20))
    assert cats == ()
    r = recs[3]
    assert r[4:7] == (1.5, None, "dog")
    schema, nums, cats = r[7]
    assert schema.numeric == ("x",) and math.isnan(nums[0]) and cats == ("DE",)
    assert recs[4] == (EV_RECORD, CTX, 9, "r", None, None, 2.0, None)


def test_missing_categorical_zero_features_and_nan_confidence() -> None:
    enc = Encoder(1, 2)
    events = [
        (EV_RECORD, CTX, 1, "a", "p", math.nan, None, {"c": "x", "n": 1.0}),
        (EV_RECORD, CTX, 2, "b", "p", None, None, {}),
    ]
    (out,) = _same(enc.encode(events))
    recs = out[0]
    assert recs[0][5] is None  # NaN confidence decodes as "none"
    assert recs[0][7][2] == ("x",)
    assert recs[1][7] is None  # no features: schema ID 0
    # A categorical value that is missing on the wire (0xFFFF) decodes as None.
    frame = bytearray(Encoder(1, 2).encode([events[0]])[0])  # a fresh encoder announces the schema again
    # The categorical ref is the record's last two bytes.
    assert frame[-2:] != b"\xff\xff"
    frame[-2:] = b"\xff\xff"
    (out,) = _same([bytes(frame)])
    assert out[0][0][7][2] == (None,)


def test_streamed_stage_and_flags_fall_back_to_the_general_decoder() -> None:
    enc = Encoder(1, 2)
    stages = [("queue", 5, None), ("gen", 50, (10, 3, [4, 5]))]
    ev = (EV_REQUEST, CTX, 1, 100, 0, None, "r", None, stages)
    (out,) = _same(enc.encode([ev]))
    assert out == ([(EV_REQUEST, CTX, 1, 100, 0, None, "r", None, (("queue", 5, None), ("gen", 50, (10, 3, (4, 5)))))], [])
    # A reserved flag bit (2) on a plain stage: not a stream, decoded by the general path all the same.
    frame = bytearray(enc.encode([(EV_REQUEST, CTX, 1, 100, 0, None, None, None, [("s", 5, None)])])[0])
    frame[-1] = 2
    (out,) = _same([bytes(frame)])
    assert out[0][0][8] == (("s", 5, None),)


def test_unknown_schema_truncated_and_bad_records_count_the_same_reasons() -> None:
    feats = {f"f{i}": float(i) for i in range(5)}
    enc = Encoder(1, 2)
    first = enc.encode([(EV_RECORD, CTX, 1, "a", "p", 0.5, None, feats)])[0]
    second = enc.encode([(EV_RECORD, CTX, 2, "b", "p", 0.5, None, feats), (EV_BATCH, CTX, 3)])[0]
    # A fresh decoder sees the second frame without its schema: unknown_schema, the batch survives.
    out_f, out_s = _both([second])
    assert repr(out_f) == repr(out_s)
    assert out_f[0] == ([(EV_BATCH, CTX, 3)], ["unknown_schema"])
    # Truncated inside the last record, and a REQUEST with an invalid outcome.
    req = bytearray(enc.encode([(EV_REQUEST, CTX, 1, 2, 0, None, "r", None, [("s", 1, None)])])[0])
    req[req.index(b"\x01r\x00") - 4] = 7  # the outcome byte: before error type (2), stage count, rid length
    out = _same([first, first[:-3], bytes(req), bytes(req[:40])])
    assert out[0][1] == [] and out[1][1] == ["truncated"]
    assert out[2] == ([], ["bad_record"])


def test_a_schema_redefined_within_a_frame_is_not_served_from_the_cached_one() -> None:
    enc = Encoder(1, 2)
    frames = enc.encode([(EV_RECORD, CTX, 1, "a", None, None, None, {"x": 1.0, "y": 2.0})])
    # Re-announce schema 1 with one field, then a record that uses it, in one frame after the first.
    frame = bytearray(frames[0])
    dec = Decoder()
    assert dec.decode(bytes(frame)).errors == []
    enc2 = Encoder(1, 2)  # same producer ID, fresh schema numbering: schema 1 now means {"z"}
    frame2 = enc2.encode([(EV_RECORD, CTX, 2, "b", None, None, None, {"z": 3.0}),
                          (EV_RECORD, CTX, 3, "c", None, None, None, {"z": 4.0})])[0]
    out = _same([bytes(frame), frame2])
    recs = out[1][0]
    assert [r[7][0].numeric for r in recs] == [("z",), ("z",)] and [r[7][1] for r in recs] == [(3.0,), (4.0,)]


def test_every_stage_count_up_to_the_u8_limit_round_trips() -> None:
    enc = Encoder(1, 2)
    for n in (0, 1, 2, 7, 255):
        stages = [(f"s{i % 5}", i * 1000, None) for i in range(n)]
        (out,) = _same(enc.encode([(EV_REQUEST, CTX, 1, 2, 2, None, None, None, stages)]))
        assert out == ([(EV_REQUEST, CTX, 1, 2, 2, None, None, None, tuple(stages))], [])


def test_stage_events_and_other_types_take_the_general_path_unchanged() -> None:
    enc = Encoder(1, 2)
    ev = (EV_STAGE, CTX, 3, "r", ("inference", 9, None))
    (out,) = _same(enc.encode([ev]))
    assert out == ([ev], [])


def _sample_frames() -> list[bytes]:
    enc = Encoder(3, 4)
    return enc.encode([
        (EV_REQUEST, CTX, 1, 2, 0, None, "r", bytes(range(16)), [("a", 1, None), ("b", 2, (1, 3, [4, 5]))]),
        (EV_REQUEST, CTX, 1, 2, 1, "E", "r2", None, [("a", 1, None), ("b", 2, None), ("c", 3, None)]),
        (EV_RECORD, CTX, 1, "r", "cat", 0.5, 1.0, {"x": 1.0, "c": "DE"}),
        (EV_RECORD, CTX, 1, "r", 2.0, None, None, {f"f{i}": float(i) for i in range(20)}),
        (EV_RECORD, CTX, 1, None, None, None, "lbl", None),
        (EV_BATCH, CTX, 2),
    ])


SAMPLES = _sample_frames()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 10**6),
)
def test_fuzz_mutated_frames_decode_the_same_on_both_paths(frame: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    buf = bytearray(frame)
    for pos, val in flips:
        buf[pos % len(buf)] = val
    mutated = bytes(buf[: cut % (len(buf) + 1)] if cut % 3 == 0 else buf)
    _same([*SAMPLES, mutated])

"""Wire format v1: round trips through the reference decoder, splitting, schemas, and fuzzing."""

from __future__ import annotations

import decimal
import fractions
import math
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.wire import (
    EV_ALLOC,
    EV_ALLOC_SITE,
    EV_BATCH,
    EV_DROPS,
    EV_HELLO,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    MAX_FRAME,
    NONE_REF,
    Decoder,
    Encoder,
    WireError,
)

CTX = ("svc", "model", "v1")


class Clock:
    def __init__(self) -> None:
        self.now = 10**18

    def __call__(self) -> int:
        return self.now


def roundtrip(events: list[tuple[Any, ...]], enc: Encoder | None = None, dec: Decoder | None = None) -> list[Any]:
    enc = enc or Encoder(pid=42, producer_id=7)
    dec = dec or Decoder()
    out = []
    for frame in enc.encode(events):
        f = dec.decode(frame)
        assert f.errors == []
        out.extend(f.records)
    return out


def test_every_event_type_round_trips() -> None:
    stages = [("pre", 1000, None), ("gen", 5000, (300, 4, [10, 20, 30])), ("post", 7, None)]
    trace = bytes(range(1, 17))
    events = [
        (EV_HELLO, "0.1.0", "python", "host", 123),
        (EV_REQUEST, CTX, 1_700_000_000_000_000_000, 12345, 1, "ValueError", "rid-1", trace, stages),
        (EV_REQUEST, (None, None, None), 1, 2, 0, None, None, None, []),
        (EV_STAGE, CTX, 99, "rid-2", ("inference", 555, None)),
        (EV_STAGE, CTX, 99, None, ("tok", 555, (1, 1, []))),
        (EV_BATCH, CTX, 8),
        (EV_QUEUE, CTX, 0),
        (EV_DROPS, {"buffer_full": 3, "socket_absent": 2**40}),
        (EV_ALLOC, 5, 1, 100, 200, 50, 25, 3, 1, True),
        (EV_ALLOC_SITE, 5, 1, "/srv/app/cache.py", 42, "remember", 3 << 30, 12),
        (EV_ALLOC_SITE, 5, 0, None, 0, None, 0, 0),
    ]
    got = roundtrip(events)
    assert got[0] == events[0]
    assert got[1] == events[1][:7] + (trace, (("pre", 1000, None), ("gen", 5000, (300, 4, (10, 20, 30))), ("post", 7, None)))
    assert got[2] == events[2][:8] + ((),)  # stages decode as a tuple
    assert got[3] == events[3]
    assert got[4] == (EV_STAGE, CTX, 99, None, ("tok", 555, (1, 1, ())))
    assert got[5:] == events[5:]


def test_record_round_trips_with_schema_values_and_missing() -> None:
    feats = {"age": 31, "income": 1.5, "country": "DE", "missing": None, "nan": math.nan, "flag": True}
    ev = (EV_RECORD, CTX, 77, "rid", "cat", 0.93, "dog", feats)
    (rec,) = roundtrip([ev])
    assert rec[:7] == (EV_RECORD, CTX, 77, "rid", "cat", 0.93, "dog")
    schema, nums, cats = rec[7]
    assert schema.numeric == ("age", "income", "missing", "nan", "flag")
    assert schema.categorical == ("country",)
    assert nums[:2] == (31.0, 1.5) and math.isnan(nums[2]) and math.isnan(nums[3]) and nums[4] == 1.0
    assert cats == ("DE",)


def test_numeric_prediction_and_missing_confidence() -> None:
    (rec,) = roundtrip([(EV_RECORD, CTX, 1, None, 0.25, None, None, None)])
    assert rec == (EV_RECORD, CTX, 1, None, 0.25, None, None, None)


def test_fast_and_slow_feature_paths_agree() -> None:
    enc = Encoder(1, 2)
    dec = Decoder()
    base = {f"f{i}": float(i) for i in range(20)}
    variants = [base, {**base, "f3": math.nan}, {**base, "f4": math.inf}, {**base, "f5": 7}, base]
    out = []
    for v in variants:
        (rec,) = roundtrip([(EV_RECORD, CTX, 1, None, None, None, None, v)], enc, dec)
        schema, nums, _ = rec[7]
        out.append(dict(zip(schema.numeric, nums, strict=True)))
    assert out[0] == base == out[4]
    assert math.isnan(out[1]["f3"])
    assert "f4" not in out[2] and enc.drops == {"invalid_value": 1}
    assert out[3]["f5"] == 7.0


class _ArithButNoFloat:
    """Adds and subtracts like a number (so the fast path's NaN/inf check passes) but will not convert."""

    def __add__(self, other: Any) -> _ArithButNoFloat:
        return self

    __radd__ = __sub__ = __add__

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __float__(self) -> float:
        raise ValueError("not convertible")


class _BigInt(int):
    """An int subclass (an IntEnum is one), here too large for a float."""


@pytest.mark.parametrize(
    ("values", "expected", "drops"),
    [
        ({"a": 1.0, "b": decimal.Decimal("1.5")}, {"a": 1.0, "b": 1.5}, {}),
        ({"a": decimal.Decimal("1.5"), "b": decimal.Decimal(2)}, {"a": 1.5, "b": 2.0}, {}),
        ({"a": 1.0, "b": fractions.Fraction(1, 4)}, {"a": 1.0, "b": 0.25}, {}),
        ({"a": 2**64, "b": -(2**70)}, {"a": 2.0**64, "b": -(2.0**70)}, {}),
        ({"a": 1.0, "b": decimal.Decimal("NaN")}, {"a": 1.0, "b": math.nan}, {}),
        ({"a": decimal.Decimal(1), "b": decimal.Decimal("sNaN")}, {"a": 1.0}, {"invalid_value": 1}),
        ({"a": 1.0, "b": decimal.Decimal("-Infinity")}, {"a": 1.0}, {"invalid_value": 1}),
        ({"a": 1, "b": 10**400}, {"a": 1.0}, {"invalid_value": 1}),
        ({"a": 1.0, "b": _ArithButNoFloat()}, {"a": 1.0}, {"invalid_value": 1}),
        ({"a": 1.0, "b": 1j}, {"a": 1.0}, {"invalid_value": 1}),
        ({"a": _BigInt(10**400), "b": _BigInt(3)}, {"b": 3.0}, {"invalid_value": 1}),
    ],
)
def test_number_types_classify_the_same_on_the_fast_and_slow_feature_paths(
    values: dict[str, Any], expected: dict[str, float], drops: dict[str, int]
) -> None:
    def numeric(enc: Encoder, dec: Decoder) -> dict[str, float]:
        (rec,) = roundtrip([(EV_RECORD, CTX, 1, "r", None, None, None, values)], enc, dec)
        schema, nums, _ = rec[7]
        return dict(zip(schema.numeric, nums, strict=True))

    slow_enc = Encoder(1, 2)  # first sight of this key set: the general path classifies each value
    slow = numeric(slow_enc, Decoder())
    fast_enc, fast_dec = Encoder(1, 2), Decoder()
    roundtrip([(EV_RECORD, CTX, 1, "r", None, None, None, {"a": 0.5, "b": 0.5})], fast_enc, fast_dec)
    assert tuple(values) in fast_enc._feature_keys  # the key set is known: the next record tries the fast path
    fast = numeric(fast_enc, fast_dec)
    for got, enc in ((slow, slow_enc), (fast, fast_enc)):
        assert got.keys() == expected.keys()
        for k, v in expected.items():
            assert got[k] == v or (math.isnan(v) and math.isnan(got[k]))
        assert enc.drops == drops  # never encode_error: the record itself always survives


def test_schema_is_sent_once_then_repeated_after_the_interval() -> None:
    clock = Clock()
    enc = Encoder(1, 2, clock=clock, schema_repeat_s=2.0)
    ev = (EV_RECORD, CTX, 1, None, None, None, None, {"a": 1.0})

    def n_schemas(frame: bytes) -> int:
        return frame.count(b"\x04\x09\x00")  # SCHEMA record header with a 9-byte payload (1 field)

    f1 = enc.encode([ev, ev])
    f2 = enc.encode([ev])
    clock.now += 2 * 10**9
    f3 = enc.encode([ev])
    enc.forget_announcements()
    f4 = enc.encode([ev])
    assert [n_schemas(f[0]) for f in (f1, f2, f3, f4)] == [1, 0, 1, 1]
    dec = Decoder()
    assert len(dec.decode(f1[0]).records) == 2
    # A decoder that missed the announcement rejects the record alone.
    assert Decoder().decode(f2[0]).errors == ["unknown_schema"]


def test_large_batches_split_into_frames_under_the_limit() -> None:
    feats = {f"feature_{i}": float(i) for i in range(100)}
    events = [(EV_RECORD, CTX, i, f"rid-{i}", "x", 0.5, None, feats) for i in range(500)]
    enc = Encoder(1, 2)
    counted = enc.encode_counted(events)
    assert len(counted) > 1
    assert all(len(f) <= MAX_FRAME for f, _ in counted)
    assert sum(n for _, n in counted) == 500
    dec = Decoder()
    recs = []
    for f, n in counted:
        fr = dec.decode(f)
        assert fr.errors == []
        got = [r for r in fr.records if r[0] == EV_RECORD]
        assert len(got) == n
        recs.extend(got)
    assert [r[3] for r in recs] == [f"rid-{i}" for i in range(500)]
    assert [f.seq for f in map(Decoder().decode, [f for f, _ in counted[:1]])] == [1]


def test_extra_events_are_not_counted() -> None:
    counted = Encoder(1, 2).encode_counted([(EV_BATCH, CTX, 1)], [(EV_HELLO, "v", "py", "h", 0)])
    assert [n for _, n in counted] == [1]


def test_oversized_and_malformed_events_are_dropped_and_counted() -> None:
    enc = Encoder(1, 2, max_frame=300)
    big = (EV_REQUEST, CTX, 1, 1, 0, None, "r", None, [(f"stage{i}", 1, None) for i in range(100)])
    ok = (EV_BATCH, CTX, 3)
    frames = enc.encode([big, ok, (999,), (EV_BATCH, CTX, "x"), ("junk",), ()])
    assert enc.drops == {"event_too_large": 1, "encode_error": 4}
    recs = [r for f in frames for r in Decoder().decode(f).records]
    assert recs == [ok]


def test_long_strings_are_clipped_on_a_character_boundary() -> None:
    (rec,) = roundtrip([(EV_BATCH, ("é" * 200, None, None), 1)])
    assert rec[1][0] == "é" * 127
    (rec,) = roundtrip([(EV_STAGE, CTX, 1, "x" * 500, ("s", 1, None))])
    assert rec[3] == "x" * 128


def test_header_errors_raise_wire_error_with_a_reason() -> None:
    frame = Encoder(1, 2).encode([(EV_BATCH, CTX, 1)])[0]
    dec = Decoder()
    cases = {
        "truncated": frame[:10],
        "bad_magic": b"XX" + frame[2:],
        "bad_version": frame[:2] + b"\x09" + frame[3:],
    }
    for reason, buf in cases.items():
        with pytest.raises(WireError) as e:
            dec.decode(buf)
        assert e.value.reason == reason
    # A string table that runs past the end.
    with pytest.raises(WireError) as e:
        dec.decode(frame[:33])
    assert e.value.reason == "truncated"


def test_bad_record_is_dropped_alone() -> None:
    enc = Encoder(1, 2)
    frame = bytearray(enc.encode([(EV_BATCH, CTX, 1), (EV_QUEUE, CTX, 2)])[0])
    # Corrupt the first record's ctx refs to point outside the string table.
    first = frame.index(bytes([EV_BATCH, 10, 0]))
    frame[first + 3 : first + 5] = struct.pack("<H", 5000)
    f = Decoder().decode(bytes(frame))
    assert f.errors == ["bad_record"]
    assert f.records == [(EV_QUEUE, CTX, 2)]


def test_unknown_record_types_are_skipped() -> None:
    frame = bytearray(Encoder(1, 2).encode([(EV_BATCH, CTX, 1)])[0])
    # Append a record of a future type 200 and bump n_records.
    frame += bytes([200, 2, 0, 1, 2])
    n = struct.unpack_from("<H", frame, 30)[0]
    struct.pack_into("<H", frame, 30, n + 1)
    f = Decoder().decode(bytes(frame))
    assert f.records == [(EV_BATCH, CTX, 1)] and f.errors == ["unknown_record"]


def test_decoder_schema_cache_is_bounded() -> None:
    dec = Decoder(max_schemas=3)
    enc = Encoder(1, 2)
    for i in range(10):
        roundtrip([(EV_RECORD, CTX, 1, None, None, None, None, {f"k{i}": 1.0})], enc, dec)
    assert len(dec._schemas) == 3


def test_the_documented_none_ref_and_header_size() -> None:
    assert NONE_REF == 0xFFFF
    frame = Encoder(1, 2).encode([(EV_QUEUE, (None, None, None), 5)])[0]
    assert frame[:2] == b"IW" and frame[2] == 1
    # header (32) + empty string table + one record: type, u16 length 10, three none refs, u32 5
    assert frame[32:] == bytes([EV_QUEUE, 10, 0]) + b"\xff\xff" * 3 + struct.pack("<I", 5)


# -- fuzzing: the decoder raises nothing but WireError ------------------------------------

_FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sample_frames() -> list[bytes]:
    enc = Encoder(3, 4)
    events = [
        (EV_HELLO, "0.1.0", "python", "h", 1),
        (EV_REQUEST, CTX, 1, 2, 0, None, "r", bytes(range(16)), [("a", 1, None), ("b", 2, (1, 3, [4, 5]))]),
        (EV_RECORD, CTX, 1, "r", "cat", 0.5, 1.0, {"x": 1.0, "c": "DE"}),
        (EV_RECORD, CTX, 1, "r", 2.0, None, None, {f"f{i}": float(i) for i in range(20)}),
        (EV_STAGE, CTX, 1, None, ("s", 1, None)),
        (EV_BATCH, CTX, 2),
        (EV_QUEUE, CTX, 3),
        (EV_DROPS, {"buffer_full": 1}),
        (EV_ALLOC, 1, 0, 1, 2, 3, 4, 5, 6, False),
    ]
    return enc.encode(events)


SAMPLES = _sample_frames()


def _decode_only_wire_errors(buf: bytes) -> None:
    dec = Decoder()
    for f in SAMPLES:  # teach it the schemas first, so mutations reach the record paths
        dec.decode(f)
    try:
        frame = dec.decode(buf)
    except WireError:
        return
    assert isinstance(frame.records, list) and all(isinstance(e, str) for e in frame.errors)


@_FUZZ
@given(st.binary(max_size=512))
def test_fuzz_random_bytes(buf: bytes) -> None:
    _decode_only_wire_errors(buf)


@_FUZZ
@given(st.binary(max_size=256))
def test_fuzz_random_bytes_behind_a_valid_header(tail: bytes) -> None:
    _decode_only_wire_errors(SAMPLES[0][:32] + tail)


@_FUZZ
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 10**6),
)
def test_fuzz_mutated_frames(frame: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    buf = bytearray(frame)
    for pos, val in flips:
        buf[pos % len(buf)] = val
    _decode_only_wire_errors(bytes(buf[: max(cut % (len(buf) + 1), 0)] if cut % 3 == 0 else buf))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just(EV_BATCH), st.just(CTX), st.integers(-(2**70), 2**70)),
            st.tuples(
                st.just(EV_RECORD),
                st.just(CTX),
                st.integers(0, 2**62),
                st.one_of(st.none(), st.text(max_size=200)),
                st.one_of(st.none(), st.floats(), st.text(max_size=20), st.integers()),
                st.one_of(st.none(), st.floats()),
                st.one_of(st.none(), st.floats(), st.text(max_size=5)),
                st.dictionaries(
                    st.one_of(st.text(max_size=70), st.integers()),
                    st.one_of(st.none(), st.floats(), st.integers(), st.text(max_size=10), st.booleans()),
                    max_size=12,
                ),
            ),
        ),
        max_size=8,
    )
)
def test_fuzz_encoder_never_raises_and_its_output_decodes_cleanly(events: list[tuple[Any, ...]]) -> None:
    enc = Encoder(1, 2)
    dec = Decoder()
    n_ok = 0
    for frame, n in enc.encode_counted(events):
        f = dec.decode(frame)
        assert f.errors == []
        n_ok += n
    assert n_ok + enc.drops.get("encode_error", 0) + enc.drops.get("event_too_large", 0) == len(events)


def test_header_fields_sit_at_the_documented_offsets() -> None:
    clock = Clock()
    enc = Encoder(pid=0x01020304, producer_id=0x1122334455667788, clock=clock)
    frame = enc.encode([(EV_BATCH, ("s", None, None), 1)])[0]
    assert frame[0:2] == b"IW" and frame[2] == 1 and frame[3] == 0
    assert struct.unpack_from("<I", frame, 4)[0] == 0x01020304
    assert struct.unpack_from("<Q", frame, 8)[0] == 0x1122334455667788
    assert struct.unpack_from("<I", frame, 16)[0] == 1  # first frame of this producer
    assert struct.unpack_from("<q", frame, 20)[0] == clock.now
    assert struct.unpack_from("<HH", frame, 28) == (1, 1)
    assert frame[32:34] == b"\x01s"  # the string table: u8 length, UTF-8
    f = Decoder().decode(frame)
    assert (f.pid, f.producer_id, f.seq, f.sent_unix_ns) == (0x01020304, 0x1122334455667788, 1, clock.now)


def test_frames_never_exceed_max_frame_when_an_event_does_not_fit() -> None:
    """An event that overflows the frame must not leave its strings in the flushed frame's table."""
    enc = Encoder(1, 2, max_frame=2000)
    ctx = ("svc", "m", "v1")
    events = [
        (EV_REQUEST, ctx, 1, 1000, 0, None, f"r{i}", None,
         [(f"{'s' * 200}{i}_{j}", 10, None) for j in range(4)])
        for i in range(20)
    ]
    frames = enc.encode_counted(events)
    assert all(len(f) <= 2000 for f, _ in frames)
    dec = Decoder()
    decoded = [r for f, _ in frames for r in dec.decode(f).records]
    assert len(decoded) == sum(n for _, n in frames) == 20
    assert [r[6] for r in decoded] == [f"r{i}" for i in range(20)]

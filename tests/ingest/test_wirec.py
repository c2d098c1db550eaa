"""The sidecar's compiled record loop (``ingest/_wirec.c``) gives the Python decoder's frames, exactly.

Three decoders read every frame: the compiled loop, the SDK's generated loop and the general per-record
decoder (the reference). Frames come from the SDK's encoder over random event families, from mutations
of them (flipped bytes, cuts), and from records built by hand to hit each path the compiled loop hands
back to Python.
"""

from __future__ import annotations

import gc
import math
import os
import struct
import sys
import tracemalloc
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
    EV_HTTP,
    EV_QUEUE,
    EV_RECORD,
    EV_REQUEST,
    EV_STAGE,
    Decoder,
    Encoder,
    WireError,
)
from inferwatch_sidecar.ingest import fastwire

LOOP = fastwire.compiled()
if LOOP is None:
    if os.environ.get("CI") == "true":
        pytest.fail("the compiled wire loop (inferwatch_sidecar.ingest._wirec) was not built: "
                    "pip install -e . needs a C compiler and the Python headers", pytrace=False)
    pytest.skip("the compiled wire loop was not built (no C compiler at install)", allow_module_level=True)

CTX = ("svc", "model", "v1")


class Trio:
    """The compiled, generated and general decoders, each keeping its own schemas across frames."""

    def __init__(self) -> None:
        self.c = Decoder(loop=LOOP)
        self.py = Decoder()
        self.ref = Decoder()
        self.ref._fast = False

    def decode(self, frame: bytes) -> Any:
        outs = []
        for dec in (self.c, self.py, self.ref):
            try:
                f = dec.decode(frame)
                outs.append(("ok", f.pid, f.producer_id, f.seq, f.records, f.errors))
            except WireError as e:
                outs.append(("wire_error", e.reason))
        # NaN != NaN, so compare reprs: they show the values, their types and None exactly.
        assert repr(outs[0]) == repr(outs[1]) == repr(outs[2])
        return outs[0]


def _decode_all(frames: list[bytes]) -> list[Any]:
    trio = Trio()
    return [trio.decode(f) for f in frames]


# -- events drawn at random -----------------------------------------------------------------------------------

_text = st.text(max_size=12)
_ctx = st.tuples(st.one_of(st.none(), _text), st.one_of(st.none(), _text), st.one_of(st.none(), _text))
_rid = st.one_of(st.none(), st.text(max_size=40))
_u64 = st.integers(0, 2**64 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)
_stream = st.one_of(
    st.none(),
    st.tuples(_u64, st.integers(0, 2**32 - 1), st.lists(st.integers(0, 2**32 - 1), max_size=5)),
    st.tuples(_u64, st.integers(0, 2**32 - 1), st.lists(st.integers(0, 2**32 - 1), max_size=5),
              st.integers(0, 2**32 - 1)),
)
_stage = st.tuples(st.text(min_size=1, max_size=10), _u64, _stream)
_request = st.tuples(st.just(EV_REQUEST), _ctx, _i64, _u64, st.integers(0, 4), st.one_of(st.none(), _text), _rid,
                     st.one_of(st.none(), st.binary(min_size=16, max_size=16)), st.lists(_stage, max_size=6))
_value = st.one_of(st.none(), st.floats(), _text)
_features = st.one_of(st.none(), st.dictionaries(
    st.sampled_from([f"f{i}" for i in range(8)] + ["c0", "c1"]),
    st.one_of(st.none(), st.floats(), _text), max_size=10))
_record = st.tuples(st.just(EV_RECORD), _ctx, _i64, _rid, _value, st.one_of(st.none(), st.floats()), _value,
                    _features)
_http = st.tuples(st.just(EV_HTTP), _ctx, _i64, st.one_of(st.none(), _text), st.integers(0, 2**32 - 1),
                  st.integers(0, 4), st.integers(0, 2**32 - 1), _u64, st.booleans(), _rid)
_other = st.one_of(
    st.tuples(st.just(EV_HELLO), _text, _text, _text, _i64),
    st.tuples(st.just(EV_STAGE), _ctx, _i64, _rid, _stage),
    st.tuples(st.just(EV_BATCH), _ctx, st.integers(0, 2**32 - 1)),
    st.tuples(st.just(EV_QUEUE), _ctx, st.integers(0, 2**32 - 1)),
    st.tuples(st.just(EV_DROPS), st.dictionaries(st.sampled_from(["buffer_full", "send_failed"]),
                                                  st.integers(1, 10**6), max_size=2)),
    st.tuples(st.just(EV_ALLOC), _i64, st.integers(0, 255), _u64, _u64, _u64, _u64, _u64, _u64, st.booleans()),
    st.tuples(st.just(EV_ALLOC_SITE), _i64, st.integers(0, 255), _text, st.integers(0, 2**32 - 1), _text, _u64,
              st.integers(0, 2**32 - 1)),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_request, _record, _http, _other), max_size=40), st.integers(200, 65000))
def test_random_event_families_decode_to_the_python_decoders_frames(events: list[Any], max_frame: int) -> None:
    counted = Encoder(7, 11, max_frame=max_frame).encode_counted(events)
    outs = _decode_all([f for f, _ in counted])
    got = [r for o in outs if o[0] == "ok" for r in o[4]]
    assert all(o[0] == "ok" and o[5] == [] for o in outs)
    # Every event the encoder sent came back.
    assert len(got) == sum(n for _, n in counted)


SAMPLE_EVENTS = [
    (EV_HELLO, "0.1.0", "python", "h", 1),
    (EV_REQUEST, CTX, 1, 2, 0, None, "r", bytes(range(16)), [("a", 1, None), ("b", 2, (1, 3, [4, 5]))]),
    (EV_REQUEST, CTX, 5, 3_000_000, 1, "ValueError", "rid-1", None,
     [("pre", 10, None), ("inference", 2_000_000, None), ("post", 7, None)]),
    (EV_RECORD, CTX, 1, "r", "cat", 0.5, 1.0, {"x": 1.0, "c": "DE"}),
    (EV_RECORD, CTX, 1, "r", 2.0, None, None, {f"f{i}": float(i) for i in range(20)}),
    (EV_HTTP, CTX, 9, "/predict", 200, 0, 1, 0, False, "abc"),
    (EV_STAGE, CTX, 1, None, ("s", 1, None)),
    (EV_BATCH, CTX, 2),
    (EV_QUEUE, CTX, 3),
    (EV_DROPS, {"buffer_full": 1}),
    (EV_ALLOC, 1, 0, 1, 2, 3, 4, 5, 6, False),
]
SAMPLES = Encoder(3, 4).encode(SAMPLE_EVENTS)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 10**6),
)
def test_mutated_frames_give_the_same_records_and_error_reasons(frame: bytes, flips: list[tuple[int, int]],
                                                                 cut: int) -> None:
    buf = bytearray(frame)
    for pos, val in flips:
        buf[32 + pos % max(1, len(buf) - 32)] = val  # past the header, so the records are what changes
    trio = Trio()
    for f in SAMPLES:  # the schemas first, so mutations reach the record paths
        trio.decode(f)
    trio.decode(bytes(buf[: cut % (len(buf) + 1)] if cut % 3 == 0 else buf))


# -- records built by hand: each path the compiled loop hands back -------------------------------------------

def _frame(records: list[tuple[int, bytes]], strings: list[str], producer: int = 4) -> bytes:
    head = struct.pack("<2sBBIQIqHH", b"IW", 1, 0, 42, producer, 1, 0, len(strings), len(records))
    table = b"".join(bytes([len(s.encode())]) + s.encode() for s in strings)
    return head + table + b"".join(bytes([t]) + struct.pack("<H", len(p)) + p for t, p in records)


def _request(ctx: tuple[int, int, int] = (0, 1, 2), outcome: int = 0, err: int = 0xFFFF, rid: bytes = b"r1",
             trace: bytes = b"", stages: list[tuple[int, int, int]] | None = None, tail: bytes = b"") -> bytes:
    st_ = stages if stages is not None else [(3, 100, 0)]
    body = struct.pack("<3HqQBHB", *ctx, 5, 9, outcome, err, len(st_))
    body += bytes([len(rid)]) + rid + bytes([len(trace)]) + trace
    return body + b"".join(struct.pack("<HQB", *s) for s in st_) + tail


def _record(ctx: tuple[int, int, int] = (0, 1, 2), sid: int = 0, rid: bytes = b"r1", pred: bytes = b"\x00",
            conf: float = 0.5, label: bytes = b"\x00", feats: bytes = b"") -> bytes:
    return (struct.pack("<3HqI", *ctx, 7, sid) + bytes([len(rid)]) + rid + pred + struct.pack("<d", conf)
            + label + feats)


def _schema(sid: int, fields: list[tuple[int, int]]) -> bytes:
    return struct.pack("<IH", sid, len(fields)) + b"".join(struct.pack("<HB", r, k) for r, k in fields)


STRINGS = ["svc", "model", "v1", "inference", "x", "c", "DE"]

CASES = {
    "plain request": [(EV_REQUEST, _request())],
    "request, error type and trace": [(EV_REQUEST, _request(err=3, trace=bytes(16)))],
    "request, no stages": [(EV_REQUEST, _request(stages=[]))],
    "request, outcome out of range": [(EV_REQUEST, _request(outcome=5))],
    "request, ctx ref out of range": [(EV_REQUEST, _request(ctx=(0, 1, 99)))],
    "request, ctx none refs": [(EV_REQUEST, _request(ctx=(0xFFFF, 0xFFFF, 2)))],
    "request, error type out of range": [(EV_REQUEST, _request(err=50))],
    "request, stage name none": [(EV_REQUEST, _request(stages=[(0xFFFF, 1, 0)]))],
    "request, stage name out of range": [(EV_REQUEST, _request(stages=[(70, 1, 0)]))],
    "request, stream flag without its body": [(EV_REQUEST, _request(stages=[(3, 1, 1)]))],
    "request, a streamed stage": [(EV_REQUEST, _request(stages=[(3, 1, 1)], tail=struct.pack("<QIH", 5, 2, 1)
                                                        + struct.pack("<I", 9)))],
    "request, rid not UTF-8": [(EV_REQUEST, _request(rid=b"\xff\xfe"))],
    "request, a byte too many": [(EV_REQUEST, _request(tail=b"\x00"))],
    "request, trace past the end": [(EV_REQUEST, _request(trace=b"abc", stages=[])[:-2])],
    "request, too short": [(EV_REQUEST, _request()[:20])],
    "record, no features": [(EV_RECORD, _record())],
    "record, float prediction, NaN confidence": [(EV_RECORD, _record(pred=b"\x01" + struct.pack("<d", 2.5),
                                                                     conf=math.nan))],
    "record, string prediction and label": [(EV_RECORD, _record(pred=b"\x02\x06\x00", label=b"\x02\x04\x00"))],
    "record, prediction ref none": [(EV_RECORD, _record(pred=b"\x02\xff\xff"))],
    "record, bad value tag": [(EV_RECORD, _record(pred=b"\x07"))],
    "record, float label": [(EV_RECORD, _record(label=b"\x01" + struct.pack("<d", -1.0)))],
    "record, unknown schema": [(EV_RECORD, _record(sid=9, feats=struct.pack("<d", 1.0)))],
    "record, schema then features": [(4, _schema(9, [(4, 0), (5, 1)])),
                                     (EV_RECORD, _record(sid=9, feats=struct.pack("<dH", 1.0, 6)))],
    "record, missing categorical": [(4, _schema(9, [(4, 0), (5, 1)])),
                                    (EV_RECORD, _record(sid=9, feats=struct.pack("<dH", math.nan, 0xFFFF)))],
    "record, categorical out of range": [(4, _schema(9, [(4, 0), (5, 1)])),
                                         (EV_RECORD, _record(sid=9, feats=struct.pack("<dH", 1.0, 77)))],
    "record, features cut short": [(4, _schema(9, [(4, 0), (5, 1)])),
                                   (EV_RECORD, _record(sid=9, feats=struct.pack("<d", 1.0)))],
    "record, schema replaced mid-frame": [(4, _schema(9, [(4, 0)])), (EV_RECORD, _record(sid=9, feats=bytes(8))),
                                          (4, _schema(9, [(5, 1)])), (EV_RECORD, _record(sid=9, feats=b"\x06\x00")),
                                          (EV_RECORD, _record(sid=9, feats=bytes(8)))],
    "record, rid not UTF-8": [(EV_RECORD, _record(rid=b"\xc3"))],
    "http": [(EV_HTTP, struct.pack("<3HqHIBIQB", 0, 1, 2, 9, 3, 200, 0, 1, 5, 1) + b"\x02ab")],
    "http, outcome out of range": [(EV_HTTP, struct.pack("<3HqHIBIQB", 0, 1, 2, 9, 3, 200, 9, 1, 5, 1) + b"\x00")],
    "http, route none, no rid": [(EV_HTTP, struct.pack("<3HqHIBIQB", 0, 1, 2, 9, 0xFFFF, 0, 0, 0, 0, 0) + b"\x00")],
    "http, length off": [(EV_HTTP, struct.pack("<3HqHIBIQB", 0, 1, 2, 9, 3, 200, 0, 1, 5, 1) + b"\x00\x00")],
    "unknown record type": [(200, b"abc"), (EV_REQUEST, _request())],
    "bad schema kind": [(4, _schema(9, [(4, 5)])), (EV_REQUEST, _request())],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_hand_built_record_decodes_as_the_python_decoder_does(name: str) -> None:
    _decode_all([_frame(CASES[name], STRINGS)])


def test_a_record_header_past_the_end_and_a_length_past_the_end_are_truncated() -> None:
    good = _frame([(EV_REQUEST, _request())], STRINGS)
    (_, *_, errors), = _decode_all([good[:-3]])  # the length says more than is left
    assert errors == ["truncated"]
    head = struct.pack("<2sBBIQIqHH", b"IW", 1, 0, 42, 4, 1, 0, 0, 3)
    (_, *_, errors), = _decode_all([head + b"\x02\x01"])  # two records promised, half a header given
    assert errors == ["truncated"]


def test_more_contexts_in_a_frame_than_the_loop_shares_still_decode() -> None:
    events = [(EV_REQUEST, (f"s{i}", "m", "v"), i, 1, 0, None, None, None, []) for i in range(40)]
    (out,) = _decode_all(Encoder(1, 2).encode(events))
    assert [r[1] for r in out[4]] == [e[1] for e in events]


# -- what the compiled loop adds: shared contexts, tuples the collector need not walk, no leaks --------------

def _decoded(n: int = 200) -> list[Any]:
    events: list[Any] = []
    for i in range(n):
        events.append((EV_RECORD, CTX, i, f"r{i}", "cat", 0.9, None, {f"f{j}": float(j) for j in range(20)}))
        events.append((EV_REQUEST, CTX, i, 5, 0, None, f"r{i}", None, [("pre", 1, None), ("inference", 2, None)]))
    dec = Decoder(loop=LOOP)
    return [r for f in Encoder(1, 2).encode(events) for r in dec.decode(f).records]


def test_a_frames_events_share_one_context_and_atomic_tuples_are_untracked() -> None:
    recs = _decoded(50)
    assert len({id(r[1]) for r in recs}) == 1
    rec = next(r for r in recs if r[0] == EV_RECORD)
    req = next(r for r in recs if r[0] == EV_REQUEST)
    assert not gc.is_tracked(rec[7][1]) and not gc.is_tracked(rec[1]) and not gc.is_tracked(req[8][0])
    # The records themselves hold nothing the collector tracks (stages are a tuple, a schema's Structs cannot
    # refer back to it), so a staged event costs a young collection nothing (docs/sidecar.md).
    assert type(req[8]) is tuple and not gc.is_tracked(req[8])
    assert not gc.is_tracked(rec[7][0]) and not gc.is_tracked(rec[7]) and not gc.is_tracked(rec)
    assert not any(gc.is_tracked(r) for r in recs)


def test_a_schema_holding_anything_else_the_collector_tracks_stays_tracked() -> None:
    enc, dec = Encoder(1, 2), Decoder(loop=LOOP)
    (first,) = enc.encode([(EV_RECORD, CTX, 1, "r", "cat", 0.9, None, {"a": 1.0, "c": "x"})])
    dec.decode(first)
    ((key, schema),) = dec._schemas.items()

    class OwnStruct(struct.Struct):  # tracked, and not the Struct the loop knows holds nothing
        pass

    # Neither such a schema nor the features and records that hold it may be untracked.
    odd = dec._schemas[key] = schema._replace(cat_struct=OwnStruct(schema.cat_struct.format))
    (again,) = enc.encode([(EV_RECORD, CTX, 2, "r2", "cat", 0.9, None, {"a": 2.0, "c": "y"})])
    rec = dec.decode(again).records[0]
    assert rec[7][0] is odd
    assert gc.is_tracked(odd) and gc.is_tracked(rec[7]) and gc.is_tracked(rec)


def test_decoding_leaks_no_references_or_memory() -> None:
    frames = Encoder(1, 2).encode([(EV_RECORD, CTX, i, f"r{i}", "cat", 0.9, None, {"a": 1.0, "c": "x"})
                                   for i in range(100)] + [(EV_REQUEST, CTX, 1, 5, 0, "E", "r", None,
                                                            [("pre", 1, None)])] * 50)
    dec = Decoder(loop=LOOP)
    for f in frames:
        dec.decode(f)
    schema = next(iter(dec._schemas.values()))
    before = sys.getrefcount(schema)
    for _ in range(200):
        for f in frames:
            dec.decode(f)
    assert sys.getrefcount(schema) == before
    tracemalloc.start()
    try:
        for f in frames:
            dec.decode(f)
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(300):
            for f in frames:
                dec.decode(f)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown


def test_the_loop_refuses_wrong_arguments_with_a_clear_error() -> None:
    dec = Decoder()
    with pytest.raises(TypeError, match="6 arguments"):
        LOOP(dec, b"", 0)
    with pytest.raises(TypeError, match="bytes"):
        LOOP(dec, bytearray(b"x"), 0, 0, [], 0)


# -- the sidecar's choice -----------------------------------------------------------------------------------

def test_the_pipeline_runs_the_compiled_loop_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferwatch_sidecar.aggregate.aggregator import Aggregator
    from inferwatch_sidecar.aggregate.context import ComponentContext
    from inferwatch_sidecar.ingest.pipeline import Pipeline

    monkeypatch.delenv(fastwire.ENV, raising=False)
    p = Pipeline(Aggregator(ComponentContext()))
    assert p.decoder._loop is not None and p.totals()["wire_decoder"] == "compiled"
    for f in SAMPLES:
        p.datagram(f, "unix")
    assert p.totals()["events"] == len(SAMPLE_EVENTS)
    monkeypatch.setenv(fastwire.ENV, "python")
    p = Pipeline(Aggregator(ComponentContext()))
    assert p.decoder._loop is None and p.totals()["wire_decoder"] == "python"
    monkeypatch.setenv(fastwire.ENV, "cython")
    with pytest.raises(ValueError, match="INFERWATCH_WIRE_DECODER='cython'"):
        Pipeline(Aggregator(ComponentContext()))


def test_a_bad_choice_stops_start_up_with_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferwatch_sidecar.config import SidecarConfig
    from inferwatch_sidecar.daemon import Sidecar, StartupError

    monkeypatch.setenv(fastwire.ENV, "fast")
    with pytest.raises(StartupError, match="use 'auto'.*or 'python'"):
        Sidecar(SidecarConfig.model_validate({"gpu": {"enabled": False}}))

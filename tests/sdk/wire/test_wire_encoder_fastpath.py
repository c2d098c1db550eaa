"""The encoder's fast paths (generated encoders, runs) write exactly the bytes of its general path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferwatch.wire import EV_BATCH, EV_REQUEST, EV_STAGE, FAST_PATHS, MAX_FRAME, Decoder, Encoder, _codegen

NOW = 1_700_000_000_123_456_789


def _pair(**kw: Any) -> tuple[Encoder, Encoder]:
    """A fast-path encoder and a general-path one (every fast path off) with the same identity and clock."""
    fast = Encoder(1234, 0xABCDEF, clock=lambda: NOW, **kw)
    slow = Encoder(1234, 0xABCDEF, clock=lambda: NOW, **kw)
    for name in FAST_PATHS:
        setattr(slow, f"_fast_{name}", False)
    return fast, slow


def _same(events: list[tuple[Any, ...]], **kw: Any) -> list[tuple[bytes, int]]:
    """Encode with both paths (twice, so the second round reuses cached packers); assert identical output."""
    fast, slow = _pair(**kw)
    out: list[tuple[bytes, int]] = []
    for _ in range(2):
        got_f = fast.encode_counted(events)
        got_s = slow.encode_counted(events)
        assert got_f == got_s
        assert fast.drops == slow.drops
        out = got_f
    return out


# -- strategies ---------------------------------------------------------------------

_long = st.text(min_size=200, max_size=400)
_text = st.one_of(st.text(max_size=12), _long, st.sampled_from(["ok", "infer", "pré-process", "模型", "🚀" * 70]))
_opt_text = st.one_of(st.none(), _text)
_ctx_pool = [("svc", "model", "v1"), ("svc", None, None), (None, None, None), ("ß" * 300, "m", "v" * 256)]
_ctx = st.one_of(
    st.sampled_from(_ctx_pool),  # the very same tuple objects again and again (the identity cache)
    st.tuples(_opt_text, _opt_text, _opt_text),  # fresh tuples, sometimes equal to earlier ones
)
_int = st.one_of(
    st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=-(2**70), max_value=2**70),  # negative and past u64 / i64
    st.sampled_from([0, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -(2**63), -(2**63) - 1]),
)
_dur = st.one_of(_int, st.floats(min_value=-1e20, max_value=1e20, allow_nan=False), st.booleans())
_stream = st.one_of(
    st.none(),
    st.tuples(_int, st.integers(min_value=-5, max_value=2**33), st.lists(_int, max_size=6)),
)
_stage = st.tuples(st.one_of(_text, st.none()), _dur, st.one_of(st.none(), st.none(), _stream))
_rid = st.one_of(
    st.none(),
    st.just(""),
    st.text(max_size=40),
    st.text(min_size=100, max_size=200),  # over the 128-byte limit once UTF-8 encoded
    st.sampled_from(["req-é-模型-🚀", "x" * 128, "x" * 129, "é" * 64, "é" * 65]),
    st.integers(min_value=-(10**6), max_value=10**40),
)
_trace = st.one_of(st.none(), st.binary(max_size=20), st.binary(min_size=16, max_size=16).map(bytearray), st.just(b""))
_request = st.tuples(
    st.just(EV_REQUEST),
    _ctx,
    _int,
    _dur,
    st.one_of(st.sampled_from([0, 1, 2]), st.integers(min_value=-3, max_value=300)),
    st.one_of(st.none(), st.sampled_from(["ValueError", "TimeoutError"]), _text),
    _rid,
    _trace,
    st.lists(_stage, max_size=20),
)
_other = st.one_of(
    st.tuples(st.just(EV_BATCH), _ctx, st.integers(min_value=0, max_value=64)),
    st.tuples(st.just(EV_STAGE), _ctx, _int, _rid, _stage),
)
_events = st.lists(st.one_of(_request, _request, _request, _other), max_size=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events)
def test_hypothesis_request_events_encode_to_identical_bytes(events: list[tuple[Any, ...]]) -> None:
    _same(events)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(_request, min_size=1, max_size=40), max_frame=st.integers(min_value=200, max_value=2000))
def test_hypothesis_small_frames_split_identically(events: list[tuple[Any, ...]], max_frame: int) -> None:
    frames = _same(events, max_frame=max_frame)
    # An event that does not fit takes its strings out of the table again, so no frame is
    # ever larger than max_frame (a datagram over the limit could not be sent at all).
    assert all(len(f) <= max_frame for f, _ in frames)
    assert sum(c for _, c in frames) <= len(events)


# -- hand-picked cases ----------------------------------------------------------------

CTX = ("svc", "model", "v1")
NAMES = ["access", "queue", "preprocess", "inference", "postprocess"]


def _req(i: int, rid: str, stages: list[tuple[Any, ...]] | None = None) -> tuple[Any, ...]:
    if stages is None:
        stages = [(n, 1000 * i + k, None) for k, n in enumerate(NAMES)]
    return (EV_REQUEST, CTX, NOW + i, 50_000 + i, 0, None, rid, b"\x01" * 16, stages)


def test_plain_requests_never_reach_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path really runs: with the general path and stage packer broken, plain requests still encode."""
    events = [_req(i, f"r{i}") for i in range(50)]
    want = _pair()[1].encode_counted(events)

    def broken(*args: Any) -> Any:
        raise AssertionError("general path used")

    monkeypatch.setattr(Encoder, "_general", broken)
    monkeypatch.setattr(Encoder, "_stages", broken)
    fast = Encoder(1234, 0xABCDEF, clock=lambda: NOW)
    assert fast.encode_counted(events) == want
    assert fast.drops == {}
    # A streamed stage must fall back to the general path (which is broken here: counted, not raised).
    fast.encode([_req(0, "s", [("decode", 5, (1, 2, [3]))])])
    assert fast.drops == {"encode_error": 1}


def test_decoded_fast_path_frame_matches_the_events() -> None:
    events = [_req(i, f"req-{i}-é") for i in range(10)]
    frames = _same(events)
    assert len(frames) == 1
    fr = Decoder().decode(frames[0][0])
    assert fr.errors == []
    assert fr.records == [
        (
            EV_REQUEST,
            CTX,
            NOW + i,
            50_000 + i,
            0,
            None,
            f"req-{i}-é",
            b"\x01" * 16,
            tuple((n, 1000 * i + k, None) for k, n in enumerate(NAMES)),
        )
        for i in range(10)
    ]


@pytest.mark.parametrize("n", [0, 1, 2, 5, 20, 31, 32, 33, 40, 255, 300])
def test_every_stage_count_matches_including_past_the_fast_limit(n: int) -> None:
    stages = [(f"s{k % 7}", k * 1_000_003, None) for k in range(n)]
    frames = _same([_req(1, "a", stages), _req(2, "", stages), _req(3, "b" * 128, list(reversed(stages)))])
    rec = Decoder().decode(frames[0][0]).records[0]
    assert len(rec[8]) == min(n, 255)


def test_out_of_range_values_are_clamped_or_dropped_exactly_as_before() -> None:
    events = [
        _req(1, "neg", [("a", -5, None), ("b", 2**64, None), ("c", 3.7, None)]),
        (EV_REQUEST, CTX, NOW, -1, 0, None, "neg-dur", None, []),
        (EV_REQUEST, CTX, NOW, 2**80, 1, "E", "huge-dur", None, [("a", 1, None)]),
        (EV_REQUEST, CTX, 2**63, 1, 0, None, "end-too-big", None, []),  # dropped: encode_error
        (EV_REQUEST, CTX, NOW, 1, 256, None, "bad-outcome", None, []),  # dropped: encode_error
        (EV_REQUEST, CTX, NOW, 1, 0, None, "bad-stage", None, [("a", 1)]),  # dropped: encode_error
        (EV_REQUEST, CTX, NOW, 1, 0, None, 12345, bytearray(b"\x02" * 20), [("z", 1, None)]),
    ]
    frames = _same(events)
    fast, _ = _pair()
    fast.encode(events)
    assert fast.drops == {"encode_error": 3}
    assert sum(c for _, c in frames) == 4
    recs = Decoder().decode(frames[0][0]).records
    assert recs[0][8] == (("a", 0, None), ("b", 2**64 - 1, None), ("c", 3, None))
    assert recs[1][3] == 0 and recs[2][3] == 2**64 - 1
    assert recs[3][6] == "12345" and recs[3][7] == b"\x02" * 16 and recs[3][8] == (("z", 1, None),)


def test_context_identity_cache_is_per_frame_and_follows_the_object() -> None:
    a = ("svc", "m1", None)
    b = ("svc", "m2", "v")
    events = [_req(0, "x")] + [
        (EV_REQUEST, ctx, NOW, 1, 0, None, f"r{i}", None, [("inference", i, None)])
        for i, ctx in enumerate([a, a, b, a, ("svc", "m1", None), b, b, CTX])
    ]
    frames = _same(events, max_frame=300)  # several frames: the cache must restart with each
    assert len(frames) > 2
    dec = Decoder()
    got = [r[1] for f, _ in frames for r in dec.decode(f).records]
    assert got == [CTX, a, a, b, a, a, b, b, CTX]


def _frame_of(events: list[tuple[Any, ...]]) -> int:
    fast, _ = _pair()
    (frame,) = fast.encode(events)
    return len(frame)


def test_frame_splitting_at_the_65000_byte_boundary() -> None:
    """Fill a frame to exactly MAX_FRAME bytes, then one byte more: both paths split at the same event."""
    base = [_req(i, f"{i:040d}") for i in range(10_000)]
    size0 = _frame_of(base[:1])
    per = _frame_of(base[:2]) - size0  # the bytes one more request adds (names are already in the table)
    k = (MAX_FRAME - size0) // per  # requests that fit after the first, all with 40-byte IDs
    events = base[: k + 1]
    slack = MAX_FRAME - _frame_of(events)
    assert 0 <= slack < per
    # Grow the last request's ID by the slack (at most 128 bytes): first exactly at the limit, then one over.
    if slack + 40 > 128:  # move part of the slack into a second-to-last request
        events[-2] = _req(k - 1, "y" * (40 + slack - (128 - 40)))
        slack = 128 - 40
    events[-1] = _req(k, "z" * (40 + slack))
    frames = _same(events)
    assert [len(f) for f, _ in frames] == [MAX_FRAME]
    assert frames[0][1] == len(events)

    over = [*events, _req(k + 1, "q")]
    frames = _same(over)
    assert [c for _, c in frames] == [len(events), 1]
    assert len(frames[0][0]) == MAX_FRAME

    bigger = [*events[:-1], _req(k, "z" * (41 + slack))]
    frames = _same(bigger)
    assert [c for _, c in frames] == [len(events) - 1, 1]
    assert all(len(f) <= MAX_FRAME for f, _ in frames)
    # And many frames' worth of traffic splits the same way on both paths.
    frames = _same(base[:3000])
    assert len(frames) > 1 and sum(c for _, c in frames) == 3000


def test_packer_cache_stays_bounded() -> None:
    fast, slow = _pair()
    for lr in range(0, 129):
        for n in (0, 1, 3):
            ev = (EV_REQUEST, CTX, NOW, 1, 0, None, "r" * lr, None, [("a", 1, None)] * n)
            assert fast.encode([ev]) == slow.encode([ev])
    assert len(_codegen._ENCODERS) <= 16 + _codegen.MAX_FAST_STAGES
    assert all(len(fn.__globals__["cache"]) <= 4096 for fn in _codegen._ENCODERS.values())


def test_malformed_contexts_and_events_fail_the_same_way() -> None:
    """None, unhashable or short contexts, short events, odd stages: the same drops and bytes on both paths."""
    events: list[tuple[Any, ...]] = [
        (EV_REQUEST, None, NOW, 1, 0, None, "none-ctx", None, []),
        _req(1, "ok"),
        (EV_REQUEST, ["svc", "m", "v"], NOW, 1, 0, None, "list-ctx", None, []),
        (EV_REQUEST, ("svc", "m"), NOW, 1, 0, None, "short-ctx", None, []),
        (EV_REQUEST, CTX, NOW, 1, 0, None, "short-event"),
        (EV_REQUEST, CTX, NOW, 1, 0, None, "str-trace", "abc", []),
        (EV_REQUEST, CTX, NOW, 1, 0, 42, "int-error", None, []),
        (EV_REQUEST, CTX, NOW, 1, 0, None, "unhashable-name", None, [("new", 1, None), (["x"], 2, None)]),
        (EV_REQUEST, CTX, NOW, 1, 0, None, "str-dur", None, [("a2", 1, None), ("b2", "x", None), ("c2", 1, None)]),
        (EV_REQUEST, CTX, NOW, 1, 0, None, "falsy-stream", None, [("a3", 1, 0)]),
        (EV_REQUEST, CTX, float(NOW), 1, 0, None, "float-end", None, [("a4", 1, None)]),
        (EV_REQUEST, CTX, NOW, 1, True, None, "bool-outcome", None, [("a5", True, None)]),
        _req(2, "ok-again"),
    ]
    frames = _same(events)
    fast, _ = _pair()
    fast.encode(events)
    assert fast.drops == {"encode_error": 9}
    assert sum(c for _, c in frames) == 4


def test_streamed_and_plain_requests_interleaved_match() -> None:
    """LLM-style requests (a streamed stage) switch the fast path's guess back and forth; the bytes never change."""
    stream = ("decode", 9_000, (1_500, 3, [10, 20**9, -4]))
    events = []
    for i in range(60):
        stages: list[tuple[Any, ...]] = [("prefill", i, None)]
        if i % 3 != 1:
            stages.append(stream)
        if i % 7 == 0:
            stages.append((f"new{i}", -i, None))
        events.append(_req(i, f"llm-{i}", stages))
    frames = _same(events)
    recs = [r for f, _ in frames for r in Decoder().decode(f).records]
    assert len(recs) == 60
    assert recs[0][8][1] == ("decode", 9_000, (1_500, 3, (10, 2**32 - 1, 0)))
    assert recs[1][8] == (("prefill", 1, None),)


# -- runs of look-alike requests --------------------------------------------------------

_RUN_CTX = ("svc", "model", "v1")
_RUN_NAMES = ("ingress", "inference", "postprocess")


def _run_event(draw: Any, k: int) -> tuple[Any, ...]:
    """A request shaped like the run's template, or one that breaks the run in some way."""
    n = draw(st.sampled_from([0, 1, 2, 3]))
    names = list(_RUN_NAMES[:n])
    twist = draw(st.sampled_from(["none"] * 6 + ["name", "copy-name", "stream", "ctx", "ctx-copy", "error", "dur",
                                                  "rid", "trace", "arity", "outcome", "end"]))
    stages: list[tuple[Any, ...]] = [(nm, draw(_int) if twist == "dur" else 1000 + k, None) for nm in names]
    ctx: Any = _RUN_CTX
    err = None
    rid: Any = f"{0xABCDEF:x}-{k:x}"
    trace: Any = draw(st.sampled_from([None, None, b"\x07" * 16]))
    outcome: Any = draw(st.sampled_from([0, 1, 2]))
    end: Any = NOW + k
    if twist == "name" and stages:
        stages[-1] = ("other", 5, None)
    elif twist == "copy-name" and stages:
        stages[0] = ("".join(list(stages[0][0])), 7, None)  # equal, not the same object
    elif twist == "stream" and stages:
        stages[0] = (stages[0][0], 9, (1, 2, [3, 4]))
    elif twist == "ctx":
        ctx = ("svc", "model", "v2")
    elif twist == "ctx-copy":
        ctx = tuple(list(_RUN_CTX))
    elif twist == "error":
        err = draw(st.sampled_from(["ValueError", "http_503"]))
    elif twist == "rid":
        rid = draw(_rid)
    elif twist == "trace":
        trace = draw(_trace)
    elif twist == "outcome":
        outcome = draw(st.one_of(st.booleans(), st.integers(min_value=-3, max_value=300)))
    elif twist == "end":
        end = draw(st.one_of(_int, st.floats(allow_nan=False, allow_infinity=False)))
    if twist == "arity":
        return (EV_REQUEST, ctx, end, 50_000, outcome, err, rid, trace)
    return (EV_REQUEST, ctx, end, 50_000 + k, outcome, err, rid, trace, stages)


@st.composite
def _runs(draw: Any) -> list[tuple[Any, ...]]:
    count = draw(st.integers(min_value=1, max_value=120))
    return [_run_event(draw, k) for k in range(count)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_runs(), max_frame=st.sampled_from([MAX_FRAME, 2000, 400]))
def test_hypothesis_runs_of_look_alike_requests_encode_to_identical_bytes(
    events: list[tuple[Any, ...]], max_frame: int
) -> None:
    """Runs (one pack per request after the first of a shape) write the general path's bytes, frame for frame."""
    frames = _same(events, max_frame=max_frame)
    assert all(len(f) <= max_frame for f, _ in frames)


def test_a_run_really_packs_look_alikes_without_the_per_event_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first request of a shape, the rest of a run never calls _encode_event."""
    events = [(EV_REQUEST, _RUN_CTX, NOW + i, 10 + i, 0, None, f"id-{i:04d}", None, [("ingress", i, None)])
              for i in range(500)]
    want = _pair()[1].encode_counted(events)
    fast = Encoder(1234, 0xABCDEF, clock=lambda: NOW)
    calls = []
    real = Encoder._encode_event

    def counting(self: Encoder, *a: Any) -> Any:
        calls.append(1)
        return real(self, *a)

    monkeypatch.setattr(Encoder, "_encode_event", counting)
    assert fast.encode_counted(events) == want
    assert len(calls) == 1
    # A new ID length starts a new shape inside the same run; an error type ends the run, and the
    # request with the error (packed by the per-event fast path) starts the next one.
    calls.clear()
    events[100] = (EV_REQUEST, _RUN_CTX, NOW, 1, 0, "http_503", "id-x", None, [("ingress", 1, None)])
    events[200] = (EV_REQUEST, _RUN_CTX, NOW, 1, 0, None, "a-much-longer-request-id", None, [("ingress", 1, None)])
    want = _pair()[1].encode_counted(events)
    calls.clear()
    fast = Encoder(1234, 0xABCDEF, clock=lambda: NOW)
    assert fast.encode_counted(events) == want
    assert len(calls) == 2  # the first event and the one with the error

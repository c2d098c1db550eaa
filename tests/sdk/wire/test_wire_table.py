"""The public face of inferwatch.wire, and properties driven from its field table.

The event strategies below are built from ``RECORD_TYPES``: one strategy per
field kind, so a record type or field added to the table is fuzzed without a
change here (and a new kind fails ``test_every_kind_in_the_table_has_a_strategy``).
"""

from __future__ import annotations

import decimal
import fractions
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inferwatch.wire as wire
from inferwatch.wire import (
    FAST_PATHS,
    MAX_REQUEST_ID,
    MAX_STAGES,
    MAX_STRING,
    MAX_TRACE,
    RECORD_TYPES,
    Decoder,
    Encoder,
    Kind,
    RecordType,
    spec,
)
from tests.helpers.paths import REPO

NOW = 1_700_000_000_123_456_789


def test_every_name_in_all_resolves() -> None:
    assert len(wire.__all__) == len(set(wire.__all__))
    for name in wire.__all__:
        assert getattr(wire, name) is not None, name


def test_the_field_table_is_consistent() -> None:
    for code, rt in RECORD_TYPES.items():
        assert rt.code == code
        slots = sorted(f.slot for f in rt.fields if f.slot >= 0)
        assert slots == list(range(1, rt.arity)), rt.name  # every element of the event, once
        assert [rt.event[f.slot - 1] for f in rt.fields if f.slot >= 0] == [f.name for f in rt.fields if f.slot >= 0]
        assert all((f.slot < 0) == (f.kind in spec.DERIVED) for f in rt.fields if rt.event), rt.name


# -- strategies, one per field kind --------------------------------------------------------

_names = st.sampled_from(["inference", "preprocess", "queue", "pré-process", "模型", "x" * 300, "🚀" * 70])
_text = st.one_of(_names, st.text(max_size=12), st.text(min_size=250, max_size=300))
_opt_text = st.one_of(st.none(), _text)
#: The very same tuples again and again, so the identity caches and runs are exercised.
_CTX_POOL = [("svc", "model", "v1"), ("svc", None, None), (None, None, None), ("ß" * 300, "m", "v" * 256)]
_big = st.integers(min_value=-(2**70), max_value=2**70)


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Ints in ``[lo, hi]``, the upper half and the ends as often as small ones (hypothesis favours those)."""
    return st.one_of(
        st.integers(min_value=lo, max_value=min(hi, 300)), st.integers(min_value=hi // 2, max_value=hi),
        st.sampled_from(sorted({lo, hi, max(lo, 0), min(hi, 1)})),
    )


class _Str(str):
    """A str subclass: categorical, sent as a plain str."""


class _Int(int):
    """An int subclass (an IntEnum is one)."""


def _uint(bits: int) -> st.SearchStrategy[int]:
    return _ints(0, 2**bits - 1)


def _clean(kind: Kind) -> st.SearchStrategy[Any]:
    """Values of ``kind`` that every path encodes and that decode to :func:`_expected`."""
    if kind is spec.CTX:
        return st.one_of(st.sampled_from(_CTX_POOL), st.tuples(_opt_text, _opt_text, _opt_text))
    if kind is spec.STR:
        return _opt_text
    if kind is spec.I64:
        return st.one_of(_ints(-(2**63), 2**63 - 1), st.integers(min_value=-(2**63), max_value=0))
    if kind is spec.U64:
        return _uint(64)
    if kind is spec.U32:
        return _uint(32)
    if kind is spec.OUTCOME:
        return st.integers(min_value=0, max_value=2)
    if kind is spec.DEVICE:
        return _uint(8)
    if kind is spec.BOOL:
        return st.booleans()
    if kind is spec.CONF:
        return st.one_of(st.none(), st.floats(allow_infinity=False))
    if kind is spec.RID:
        return st.one_of(st.none(), st.just(""), st.text(max_size=40), st.text(min_size=100, max_size=200))
    if kind is spec.TRACE:
        return st.one_of(st.none(), st.binary(min_size=MAX_TRACE, max_size=MAX_TRACE), st.binary(max_size=20))
    if kind is spec.VALUE:
        return st.one_of(st.none(), st.floats(allow_infinity=False), _text)
    if kind is spec.STAGE:
        return _stage(clean=True)
    if kind is spec.STAGES:
        return st.lists(_stage(clean=True), max_size=12)
    if kind is spec.FEATURES:
        value = st.one_of(st.none(), st.floats(allow_infinity=False), st.integers(-(2**60), 2**60), st.booleans(), _text)
        return st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b", "age", "country", "f3"]), value,
                                                    max_size=5))
    if kind is spec.DROPS:
        return st.dictionaries(st.sampled_from(sorted(spec.DROP_CODES)), st.integers(1, 2**64 - 1), max_size=4)
    raise AssertionError(f"no strategy for {kind.name}")


def _wild(kind: Kind) -> st.SearchStrategy[Any]:
    """Anything an event may hold there: what every path must encode (or drop) alike."""
    odd = st.one_of(st.floats(), _big, st.booleans(), st.just(decimal.Decimal("1.5")), st.just("7"), st.none())
    if kind in (spec.I64, spec.U64, spec.U32, spec.OUTCOME, spec.DEVICE):
        bits = {spec.I64: 63, spec.U64: 64, spec.U32: 32}.get(kind, 8)
        edges = st.sampled_from([-1, 2**bits - 1, 2**bits, -(2**bits) - 1])  # just inside and just past the range
        return st.one_of(_clean(kind), _clean(kind), odd, edges, st.integers(min_value=-5, max_value=300))
    if kind is spec.CTX:
        return st.one_of(_clean(kind), _clean(kind), st.just(None), st.just(["svc", "m", "v"]), st.just(("svc", "m")))
    if kind is spec.STR:
        return st.one_of(_clean(kind), _clean(kind), st.just(42))
    if kind in (spec.CONF, spec.VALUE):
        awkward = st.sampled_from([math.inf, 1j, [1.0], decimal.Decimal("NaN"), decimal.Decimal("sNaN"), 10**400,
                                   _Str("sub"), _Int(3), fractions.Fraction(1, 3)])
        return st.one_of(_clean(kind), odd, awkward)
    if kind is spec.RID:
        return st.one_of(_clean(kind), st.integers(-(10**6), 10**40), st.sampled_from(["x" * 128, "x" * 129, "é" * 65]))
    if kind is spec.TRACE:
        return st.one_of(_clean(kind), st.binary(min_size=16, max_size=16).map(bytearray))
    if kind is spec.STAGE:
        return st.one_of(_stage(clean=False), st.just(("short", 1)))
    if kind is spec.STAGES:
        return st.lists(_stage(clean=False), max_size=40)
    if kind is spec.FEATURES:
        value = st.one_of(odd, st.just(math.inf), st.just(object()), st.just([1]))
        key = st.one_of(st.sampled_from(["a", "b", "age"]), st.just(""), st.just("k" * 65), st.just(3))
        return st.one_of(_clean(kind), st.dictionaries(key, value, max_size=6), st.just([("a", 1.0)]), st.just(5))
    if kind is spec.DROPS:
        return st.one_of(_clean(kind), st.dictionaries(st.sampled_from(["buffer_full", "nope"]),
                                                       st.integers(-3, 2**70), max_size=3))
    return _clean(kind)


def _stage(clean: bool) -> st.SearchStrategy[tuple[Any, ...]]:
    u64 = _uint(64) if clean else st.one_of(_uint(40), _big, st.floats(-1e20, 1e20), st.booleans())
    u32 = _uint(32) if clean else st.one_of(_uint(32), _big)
    stream = st.one_of(st.none(), st.none(), st.tuples(u64, u32, st.lists(u32, max_size=6)))
    return st.tuples(_names if clean else st.one_of(_names, st.none()), u64, stream)


def _events(rt: RecordType, kinds: Any) -> st.SearchStrategy[tuple[Any, ...]]:
    by_name = {f.name: f.kind for f in rt.fields}
    return st.tuples(st.just(rt.code), *[kinds(by_name[name]) for name in rt.event])


_TYPES = [rt for rt in RECORD_TYPES.values() if rt.event]


def test_every_kind_in_the_table_has_a_strategy() -> None:
    for rt in _TYPES:
        for f in rt.fields:
            if f.slot >= 0:
                _clean(f.kind)


def _stream_of(kinds: Any) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    # Requests more often, as they are in practice: they have the most fast paths.
    one = st.one_of(*[_events(rt, kinds) for rt in _TYPES], *[_events(RECORD_TYPES[wire.EV_REQUEST], kinds)] * 3)
    return st.lists(one, max_size=30)


# -- every fast path writes the general path's bytes ------------------------------------------

def _encoder(fast: frozenset[str], **kw: Any) -> Encoder:
    enc = Encoder(1234, 0xABCDEF, clock=lambda: NOW, **kw)
    for name in FAST_PATHS:
        setattr(enc, f"_fast_{name}", name in fast)
    return enc


_CONFIGS = [frozenset({name}) for name in FAST_PATHS] + [frozenset({"encode", "run"}), frozenset(FAST_PATHS)]
_SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(events=_stream_of(_wild), max_frame=st.sampled_from([wire.MAX_FRAME, 1500, 300]))
def test_every_fast_path_writes_the_general_paths_bytes(events: list[tuple[Any, ...]], max_frame: int) -> None:
    events = events + events  # the second time round, the caches (features, shapes, runs) are warm
    general = _encoder(frozenset(), max_frame=max_frame)
    want = general.encode_counted(events)
    for fast in _CONFIGS:
        enc = _encoder(fast, max_frame=max_frame)
        assert enc.encode_counted(events) == want, sorted(fast)
        assert enc.drops == general.drops, sorted(fast)
    assert all(len(f) <= max_frame for f, _ in want)


@_SETTINGS
@given(events=_stream_of(_wild))
def test_the_decoders_fast_path_reads_what_its_general_path_reads(events: list[tuple[Any, ...]]) -> None:
    frames = _encoder(frozenset(FAST_PATHS)).encode(events + events)
    fast, general = Decoder(), Decoder()
    general._fast = False
    for f in frames:
        # NaN != NaN, so compare reprs (they show the values, types and None exactly).
        assert repr(fast.decode(f)) == repr(general.decode(f))


# -- decode(encode(x)) gives x back, as the wire holds it -------------------------------------

def _clip(s: str | None, limit: int = MAX_STRING) -> str | None:
    return None if s is None else spec.clip(s, limit).decode()


def _u(x: int, bits: int) -> int:
    return min(max(int(x), 0), 2**bits - 1)


def _expected_stage(stage: tuple[Any, ...]) -> tuple[Any, ...]:
    name, dur, stream = stage
    if stream is not None:
        ttft, items, gaps = stream
        stream = (_u(ttft, 64), _u(items, 32), tuple(_u(g, 32) for g in gaps[: spec.MAX_GAPS]))
    return (_clip(name), _u(dur, 64), stream)


def _float_or_none(v: Any) -> Any:
    return None if v is None or v != v else v


def _expected(kind: Kind, v: Any) -> Any:
    """What the decoder gives back for the value ``v`` of a field of ``kind`` (one from ``_clean``)."""
    if kind is spec.CTX:
        return tuple(_clip(x) for x in v)
    if kind is spec.STR:
        return _clip(v)
    if kind is spec.RID:
        return _clip(v, MAX_REQUEST_ID) or None
    if kind is spec.TRACE:
        return bytes(v or b"")[:MAX_TRACE] or None
    if kind is spec.CONF:
        return _float_or_none(v)
    if kind is spec.VALUE:
        return _clip(v) if isinstance(v, str) else _float_or_none(v)
    if kind is spec.STAGE:
        return _expected_stage(v)
    if kind is spec.STAGES:
        return tuple(_expected_stage(s) for s in v[:MAX_STAGES])  # a tuple, so a decoded event is untrackable
    if kind is spec.FEATURES:
        if not v:
            return None
        return {k: _clip(x) if isinstance(x, str) else (math.nan if x is None else float(x)) for k, x in v.items()}
    return v  # ints, bools and drop counts as they are


def _features_of(decoded: Any) -> Any:
    if decoded is None:
        return None
    schema, nums, cats = decoded
    return {**dict(zip(schema.numeric, nums, strict=True)), **dict(zip(schema.categorical, cats, strict=True))}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_stream_of(_clean), fast=st.sampled_from(_CONFIGS + [frozenset()]))
def test_decode_of_encode_round_trips(events: list[tuple[Any, ...]], fast: frozenset[str]) -> None:
    enc = _encoder(fast)
    dec = Decoder()
    got = []
    for frame, _ in enc.encode_counted(events + events):
        f = dec.decode(frame)
        assert f.errors == []
        got.extend(f.records)
    assert enc.drops == {}
    assert len(got) == 2 * len(events)
    for ev, rec in zip(events + events, got, strict=True):
        rt = RECORD_TYPES[ev[0]]
        kinds = {f.name: f.kind for f in rt.fields}
        assert rec[0] == ev[0]
        for name, sent, back in zip(rt.event, ev[1:], rec[1:], strict=True):
            want = _expected(kinds[name], sent)
            if kinds[name] is spec.FEATURES:  # numeric features first on the wire, then categorical ones
                back = _features_of(back)
                back, want = (None if d is None else sorted(d.items()) for d in (back, want))
            assert repr(back) == repr(want), (rt.name, name)


@pytest.mark.parametrize("rt", _TYPES, ids=lambda rt: rt.name)
def test_every_record_type_but_drops_has_a_fast_encoder(rt: RecordType) -> None:
    from inferwatch.wire import _codegen

    assert _codegen.has_fast_encoder(rt) == (rt.code != wire.EV_DROPS)


# -- docs/wire.md shows the table as it is ----------------------------------------------------

_DOC = REPO / "docs" / "wire.md"


def _doc_table(tag: str) -> list[list[str]]:
    text = _DOC.read_text(encoding="utf-8")
    body = text.split(f"<!-- {tag}:", 1)[1].split(f"<!-- /{tag} -->", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("|")][2:]  # past the header and rule
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_docs_event_table_is_the_field_table() -> None:
    want = []
    for code, rt in RECORD_TYPES.items():
        event = f"`(EV_{rt.name}, {', '.join(rt.event)})`" if rt.event else "(wire only)"
        want.append([str(code), rt.name, event, ", ".join(f"`{f.name}` {f.kind.name}" for f in rt.fields)])
    assert _doc_table("event-table") == want


def test_the_docs_kind_table_lists_every_kind() -> None:
    kinds: dict[str, Kind] = {}
    for f in [f for rt in RECORD_TYPES.values() for f in rt.fields] + [*wire.STAGE_FIELDS, *wire.STREAM_FIELDS]:
        kinds.setdefault(f.kind.name, f.kind)
    want = [[k.name, f"`{k.code}`" if k.code else "variable", k.doc] for k in kinds.values()]
    assert _doc_table("kind-table") == want

"""Datagram ingest under crafted input: unknown schemas, forged counters, schema floods, fuzzed frames."""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import inferwatch
from inferwatch import _core
from inferwatch.wire import (
    EV_BATCH,
    EV_DROPS,
    EV_HELLO,
    EV_RECORD,
    EV_SCHEMA,
    Decoder,
    Encoder,
)
from inferwatch.wire.spec import HEADER, MAGIC, RECORD_HEADER, SCHEMA_FIELD_STRUCT, SCHEMA_HEAD, VERSION
from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.drift.component import build
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.config import IngestConfig
from inferwatch_sidecar.ingest.pipeline import Pipeline
from tests.components.drift.helpers import context, rec, schema
from tests.helpers.imports import load_file
from tests.helpers.paths import REPO
from tests.helpers.sidecar import parse_metrics, sample, wait_until

CTX = ("svc", "m", "v1")
#: What the SDK says in its first frame (sdk/inferwatch/_sender.py): a producer's gaps count from then on.
HELLO = (EV_HELLO, "0.0.0", "python", "host", 0)


def _rec(feats: dict[str, Any]) -> tuple[Any, ...]:
    return (EV_RECORD, CTX, 1, None, "p", None, None, feats)


def _frame(records: list[bytes], strings: list[bytes], producer: int = 7, seq: int = 1) -> bytes:
    """A hand-built frame: the encoder never writes what these tests need (a record of a schema it did not announce)."""
    head = HEADER.pack(MAGIC, VERSION, 0, 1, producer, seq, time.time_ns(), len(strings), len(records))
    return head + b"".join(bytes([len(s)]) + s for s in strings) + b"".join(records)


def _record_of(sid: int, a: float) -> bytes:
    # RECORD: ctx (3 refs), unix_ns, schema id, rid len 0, prediction none, confidence NaN, label none, features.
    body = struct.pack("<HHHqIB", 0, 1, 2, 1, sid, 0) + b"\x00" + struct.pack("<d", float("nan")) + b"\x00"
    body += struct.pack("<d", a)
    return RECORD_HEADER.pack(EV_RECORD, len(body)) + body


def _schema_of(sid: int, name_ref: int) -> bytes:
    body = SCHEMA_HEAD.pack(sid, 1) + SCHEMA_FIELD_STRUCT.pack(name_ref, 0)
    return RECORD_HEADER.pack(EV_SCHEMA, len(body)) + body


STRINGS = [b"svc", b"m", b"v1", b"a"]


# -- item 2: a record of an unknown schema is dropped alone --------------------------------------

@pytest.mark.parametrize("fast", [True, False])
def test_an_unknown_schema_between_two_known_records_drops_only_the_unknown_record(fast: bool) -> None:
    dec = Decoder()
    dec._fast = fast
    dec.decode(_frame([_schema_of(1, 3)], STRINGS))
    frame = dec.decode(_frame([_record_of(1, 1.0), _record_of(2, 2.0), _record_of(1, 3.0)], STRINGS))
    assert frame.errors == ["unknown_schema"]
    assert [r[7][0].schema_id for r in frame.records] == [1, 1]
    assert [r[7][1] for r in frame.records] == [(1.0,), (3.0,)]


def test_after_a_restart_two_feature_sets_lose_only_the_unannounced_records() -> None:
    enc = Encoder(1, 0xAB)
    a = [_rec({"x": float(i)}) for i in range(3)]
    b = [_rec({"y": "u"}) for _ in range(3)]
    for f in enc.encode([*a, *b]):  # both schemas announced to the sidecar that is about to die
        Decoder().decode(f)
    restarted = Pipeline(Aggregator(ComponentContext()))
    for f in Encoder(1, 0xAB).encode(a[:1]):  # only schema A (the producer's first) is announced again
        restarted.datagram(f, "unix")
    got: list[tuple[Any, ...]] = []
    restarted.dispatch = [("probe", frozenset({EV_RECORD}), lambda _p, _q, recs: got.extend(recs))]
    for f in enc.encode([a[0], b[0], a[1], b[1], a[2]]):
        restarted.datagram(f, "unix")
    assert [(r[7][0].numeric, r[7][1]) for r in got] == [(("x",), (float(i),)) for i in (0, 1, 2)]
    assert restarted.decode_errors == {("record", "unknown_schema"): 2}


def test_the_drift_component_drops_one_bad_record_not_its_batch(tmp_path: Path) -> None:
    comp = build(DriftConfig(warmup_events=10_000, window_events=10_000), context())
    sch = schema(("a",))
    good = [rec("m", "v1", sch, (float(i),), pred="x") for i in range(50)]
    bad = [(EV_RECORD, CTX, 0, None, "x", None, None, (None, (1.0,), ())),  # no schema
           (EV_RECORD, CTX, 0, None, "x", None, None, (sch, (1.0, 2.0), ()))]  # values the schema does not have
    comp.handle(1, 1, [*good[:25], *bad, *good[25:]])
    comp.drain()
    mon = comp.monitors[("m", "v1")]
    assert mon.window_rows + mon.reference_rows >= 50
    assert comp.dropped["bad_record"] == 2 and comp.dropped["error"] == 0


# -- item 7: counters a local writer can forge ---------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _drops_frame(producer: int, seq: int, counts: list[tuple[int, int]]) -> bytes:
    body = bytes([len(counts)]) + b"".join(struct.pack("<BQ", c, v) for c, v in counts)
    return _frame([RECORD_HEADER.pack(EV_DROPS, len(body)) + body], [], producer, seq)


def test_a_forged_drop_count_is_rejected_as_implausible() -> None:
    clock = _Clock()
    p = Pipeline(Aggregator(ComponentContext()), clock=clock)
    p.datagram(_drops_frame(5, 1, [(1, 3)]), "unix")
    clock.t += 2
    p.datagram(_drops_frame(5, 2, [(1, 10**19)]), "unix")
    assert p.agg.sdk_drops == {"buffer_full": 3}
    assert p.implausible["sdk_drops"] == 1


def test_an_unknown_drop_reason_is_rejected_by_reason() -> None:
    p = Pipeline(Aggregator(ComponentContext()))
    p.datagram(_drops_frame(5, 1, [(1, 3), (200, 4)]), "unix")
    assert p.agg.sdk_drops == {}
    assert p.decode_errors == {("record", "unknown_drop_reason"): 1}


def test_a_forged_sequence_gap_is_not_counted_as_lost_frames() -> None:
    clock = _Clock()
    p = Pipeline(Aggregator(ComponentContext()), clock=clock)
    enc = Encoder(1, 0x55)
    batch = [(EV_BATCH, CTX, 1)]
    p.datagram(enc.encode(batch, [HELLO])[0], "unix")
    clock.t += 1
    enc._seq += 3  # three frames really lost
    p.datagram(enc.encode(batch)[0], "unix")
    clock.t += 1
    for _ in range(100):  # a writer jumping the sequence by 2**31 - 2 each time
        enc._seq = (enc._seq + (1 << 31) - 1) & 0xFFFFFFFF
        p.datagram(enc.encode(batch)[0], "unix")
    assert p.lost_frames == 3
    assert p.implausible["lost_frames"] == 100


@pytest.fixture
def sdk_off() -> Iterator[None]:
    inferwatch.shutdown(timeout=1.0)
    yield
    inferwatch.shutdown(timeout=1.0)


def test_drops_reported_before_a_sidecar_restart_are_not_counted_again(tmp_path: Path, sdk_off: None) -> None:
    path = str(tmp_path / "s.sock")
    counted: dict[str, int] = {}

    def sidecar() -> tuple[socket.socket, Pipeline]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        s.settimeout(0.2)
        return s, Pipeline(Aggregator(ComponentContext()))

    def drain(s: socket.socket, p: Pipeline) -> None:
        try:
            while True:
                p.datagram(s.recv(70000), "unix")
        except TimeoutError:
            pass
        for k, v in p.agg.sdk_drops.items():
            counted[k] = counted.get(k, 0) + v
        p.agg.sdk_drops.clear()

    assert inferwatch.configure(sidecar=f"unix://{path}", flush_interval_ms=10_000, buffer_size=16)
    rt = _core._rt
    assert rt is not None
    s, p = sidecar()
    with rt.sender.lock:
        for i in range(22):
            inferwatch.observe_batch(i)  # 6 dropped: buffer_full
    assert inferwatch.flush() is True
    drain(s, p)
    assert counted == {"buffer_full": 6}
    s.close()
    os.unlink(path)
    s, p = sidecar()  # restarted between two sends: the SDK sees no failure
    with rt.sender.lock:
        for i in range(18):
            inferwatch.observe_batch(i)  # 2 more
    assert inferwatch.flush() is True
    drain(s, p)
    s.close()
    assert counted == {"buffer_full": 8} == inferwatch.stats()["drops"]


# -- item 9: schema memory bounded by bytes ------------------------------------------------------

def _big_schema_frame(producer: int, sid: int, rng: random.Random) -> bytes:
    """A frame with a 256-field schema of distinct 255-byte names: the most memory one SCHEMA can ask for."""
    strings = [bytes(rng.choice(b"abcdefghij") for _ in range(255)) for _ in range(250)]
    body = SCHEMA_HEAD.pack(sid, 250) + b"".join(SCHEMA_FIELD_STRUCT.pack(i, i & 1) for i in range(250))
    return _frame([RECORD_HEADER.pack(EV_SCHEMA, len(body)) + body], strings, producer, 1)


def test_a_flood_of_large_schemas_stays_within_the_byte_bound() -> None:
    bound = 8 << 20
    p = Pipeline(Aggregator(ComponentContext()), max_schema_bytes=bound)
    rng = random.Random(9)
    frames = [_big_schema_frame(1000 + i, 1, rng) for i in range(64)]  # reused: ~4 MB of datagrams
    proc = psutil.Process()
    before = proc.memory_info().rss
    for i in range(1024):
        p.datagram(frames[i % 64].replace(struct.pack("<Q", 1000 + i % 64), struct.pack("<Q", 5000 + i), 1), "unix")
        assert p.decoder.schema_bytes <= bound
    grown = proc.memory_info().rss - before
    assert p.decoder.evicted["bytes"] > 900
    assert grown < 3 * bound, f"RSS grew {grown} bytes for a {bound}-byte schema bound"
    enc = Encoder(1, 0x77)  # normal traffic still decodes
    got: list[tuple[Any, ...]] = []
    p.dispatch = [("probe", frozenset({EV_RECORD}), lambda _p, _q, recs: got.extend(recs))]
    for f in enc.encode([_rec({"x": 1.0, "c": "k"})]):
        p.datagram(f, "unix")
    assert len(got) == 1 and got[0][7][0].numeric == ("x",)
    fams = {f.name: f for f in p.collect(time.time(), 60, {})}
    used = {s.labels["kind"]: s.value for s in fams["inferwatch_ingest_schema_cache_bytes"].samples}
    assert 0 < used["used"] <= used["limit"] == bound


def test_a_schema_over_the_byte_bound_alone_is_refused() -> None:
    p = Pipeline(Aggregator(ComponentContext()), max_schema_bytes=1 << 10)
    p.datagram(_big_schema_frame(1, 1, random.Random(1)), "unix")
    assert p.decode_errors == {("record", "schema_too_large"): 1}
    assert p.decoder.schema_bytes == 0 and p.decoder.evicted["too_large"] == 1


def test_the_default_schema_byte_bound_fits_the_shipped_memory_limit() -> None:
    limit = 512 << 20  # deploy/k8s: resources.limits.memory
    assert IngestConfig().max_schema_bytes * 2 < limit // 2


def test_long_strings_are_cut_as_the_frame_is_decoded_and_counted() -> None:
    """Issue 28: 64 categorical values of 255 characters made every buffered record ~20 KB; they wait cut."""
    enc = Encoder(1, 0x78)
    cats = {f"c{j}": f"{j}." + "x" * 253 for j in range(64)}
    frames = enc.encode([_rec({"n": 1.0, "short": "ok", "long-naïve": "é" * 120, **cats})])
    # The default keeps what the wire allows (255: reference profiles keep categories whole, so a shorter
    # default would turn long values into drift); a deployment short of memory sets a lower cut.
    assert IngestConfig().max_string_chars == 255
    p = Pipeline(Aggregator(ComponentContext()), max_string_chars=IngestConfig(max_string_chars=128).max_string_chars)
    got: list[tuple[Any, ...]] = []
    p.dispatch = [("probe", frozenset({EV_RECORD}), lambda _p, _q, recs: got.extend(recs))]
    for f in frames:
        p.datagram(f, "unix")
    (r,) = got
    schema, nums, values = r[7]
    by_name = dict(zip(schema.categorical, values, strict=True))
    assert nums == (1.0,) and by_name["short"] == "ok"
    assert by_name["long-naïve"] == "é" * 120  # 240 bytes, 120 characters: under the cap, whole
    assert all(by_name[f"c{j}"] == (f"{j}." + "x" * 253)[:128] for j in range(64))
    assert p.decoder.truncated_strings == 64
    fams = {f.name: f for f in p.collect(time.time(), 60, {})}
    assert fams["inferwatch_ingest_truncated_strings"].samples[0].value == 64
    # The SDK's own decoder (and a pipeline built without the setting) keeps strings whole.
    whole = [Decoder().decode(f) for f in frames]
    assert [len(v) for fr in whole for rec in fr.records for v in rec[7][2]].count(255) == 64


# -- the bounded datagram fuzz (a bounded scripts/fuzz_datagrams.py) ----------------------------

fuzz = load_file(REPO / "scripts" / "fuzz_datagrams.py")


def _accounted(p: Pipeline, sent: int) -> None:
    frame_errors = sum(n for (scope, _), n in p.decode_errors.items() if scope == "frame")
    assert sum(p.frames.values()) == sent == p.frames_decoded + frame_errors
    assert ("frame", "internal_error") not in p.decode_errors
    assert ("record", "internal_error") not in p.decode_errors


def test_fuzzed_datagrams_are_each_accounted_for_in_process() -> None:
    inputs = fuzz.fuzz_inputs(1, 4000)
    p = Pipeline(Aggregator(ComponentContext()))
    for buf in inputs:
        p.datagram(buf, "unix")
    _accounted(p, len(inputs))
    # The valid frames alone: every record is accepted or rejected by reason.
    q = Pipeline(Aggregator(ComponentContext()))
    valid = fuzz.valid_frames(200)
    for buf in valid:
        q.datagram(buf, "unix")
    types = [t for f in valid for t in fuzz.record_types(f)]
    accepted = sum(sum(c) for c in q.counts.values())
    rejected = sum(n for (scope, _), n in q.decode_errors.items() if scope == "record")
    assert accepted + rejected + types.count(EV_SCHEMA) == len(types)
    assert rejected == 0 and types.count(EV_SCHEMA) > 0


def test_fuzzed_datagrams_over_a_real_socket_leave_metrics_answering(sidecar_factory: Any) -> None:
    sc = sidecar_factory()
    inputs = fuzz.fuzz_inputs(3, 200)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for buf in inputs:
            s.sendto(buf, sc.sock)
    finally:
        s.close()

    def frames() -> float:
        return sample(parse_metrics(sc.metrics()), "inferwatch_ingest_frames_total", transport="unix")

    wait_until(lambda: frames() >= len(inputs), timeout=10, what="every datagram received")
    m = parse_metrics(sc.metrics())
    decoded = sc.status()["ingest"]["frames_decoded"]
    frame_errors = sum(v for (name, labels), v in m.items()
                       if name == "inferwatch_ingest_decode_errors_total" and ("scope", "frame") in labels)
    assert frames() == len(inputs)
    assert decoded + frame_errors == len(inputs)
    assert not any(("reason", "internal_error") in labels for (name, labels) in m
                   if name == "inferwatch_ingest_decode_errors_total")
    code, _, _ = sc.get("/metrics")
    assert code == 200


def test_mutated_sequence_numbers_cannot_add_up_to_millions_of_lost_frames() -> None:
    """Issue 28: each small forged gap passed a 1 s-per-frame allowance; 1,000 of them claimed ~30M lost frames."""
    clock = _Clock()
    p = Pipeline(Aggregator(ComponentContext()), clock=clock)
    enc = Encoder(1, 0x56)
    batch = [(EV_BATCH, CTX, 1)]
    rng = random.Random(28)
    p.datagram(enc.encode(batch, [HELLO])[0], "unix")
    for _ in range(1000):  # 1,000 frames in one second, each jumping the sequence by up to 65,535
        clock.t += 0.001
        enc._seq = (enc._seq + rng.randrange(1, 1 << 16)) & 0xFFFFFFFF
        p.datagram(enc.encode(batch)[0], "unix")
    # At most what 100k frames/s for 1 s (plus the first second's allowance) could lose.
    assert p.lost_frames <= 2 * p.max_frame_rate
    assert p.implausible["lost_frames"] > 900
    # Real losses spread over time are still counted in full.
    for _ in range(50):
        clock.t += 1
        enc._seq += 1000
        p.datagram(enc.encode(batch)[0], "unix")
    assert p.lost_frames >= 50 * 999


def test_forged_producer_ids_add_no_lost_frames_and_a_late_hello_counts_the_gaps_it_waited_for() -> None:
    """Issue 28: mutated datagrams made up producer IDs, each with its own allowance: 35 million lost frames in a
    10-minute soak. Gaps count only for a producer that said HELLO, as the SDK does in its first frame."""
    clock = _Clock()
    p = Pipeline(Aggregator(ComponentContext()), clock=clock)
    rng = random.Random(280)
    batch = [(EV_BATCH, CTX, 1)]
    for _ in range(2000):  # 2,000 made-up producers, each jumping its sequence within its allowance
        enc = Encoder(1, rng.getrandbits(64))
        p.datagram(enc.encode(batch)[0], "unix")
        clock.t += 0.5
        enc._seq += rng.randrange(1, 40_000)
        p.datagram(enc.encode(batch)[0], "unix")
    assert p.lost_frames == 0
    # A producer whose HELLO came late (a sidecar restarted under it): its gaps wait, then count in full.
    enc = Encoder(2, 0x77)
    p.datagram(enc.encode(batch)[0], "unix")
    clock.t += 1
    enc._seq += 5
    p.datagram(enc.encode(batch)[0], "unix")
    assert p.lost_frames == 0
    clock.t += 1
    p.datagram(enc.encode(batch, [HELLO])[0], "unix")
    assert p.lost_frames == 5
    clock.t += 1
    enc._seq += 2
    p.datagram(enc.encode(batch)[0], "unix")
    assert p.lost_frames == 7


def test_socket_ingest_steps_aside_for_a_scrape_only_while_holding_a_datagram() -> None:
    """Stepping aside counts as events arriving (export/prerender.py); the drain loop's last, empty turn must not,
    or an idle sidecar's scrape takes the previous body instead of a fresh one."""
    from inferwatch_sidecar.export.priority import PRIORITY
    from inferwatch_sidecar.ingest.sockets import IngestThread

    got: list[bytes] = []

    class Pipe:
        def datagram(self, buf: bytes, transport: str) -> None:
            got.append(buf)

    class Sock:
        def __init__(self, n: int) -> None:
            self.left = n

        def recv(self, size: int) -> bytes:
            if not self.left:
                raise BlockingIOError
            self.left -= 1
            return b"frame"

    t = IngestThread(Pipe(), None)  # type: ignore[arg-type]
    before = PRIORITY.ingest_waits
    with PRIORITY:  # a scrape is being answered
        t._drain(Sock(0), "unix", 10)
        assert PRIORITY.ingest_waits == before and got == []
        t._drain(Sock(2), "unix", 10)
    assert PRIORITY.ingest_waits == before + 2 and got == [b"frame", b"frame"]

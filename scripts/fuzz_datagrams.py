"""Fuzz the datagram ingest and check that every frame and record is accounted for.

Seeded random bytes, valid frames and mutated valid frames (bytes flipped, cut,
spliced) go through the sidecar's own :class:`Pipeline` in-process; then some
go over a real Unix socket to a real sidecar subprocess, which then takes a
schema flood (4096 announcements of the largest schema one datagram can hold)
and a cardinality flood (distinct model names past the label budget) while its
RSS is measured.

Checks: frames received = frames decoded + frame errors by reason; on valid
frames, records accepted + rejected by reason + schema announcements = records
sent; no ``internal_error``; ``/metrics`` answers 200 afterwards.

Usage:
    .venv/bin/python scripts/fuzz_datagrams.py --count 100000 [--seed 1] [--socket 200] [--no-floods]

Prints the inputs tried, the crashes (an exception out of ``Pipeline.datagram``
or an ``internal_error``), the unaccounted items, and the sidecar's RSS before
and after each flood; exits 1 unless crashes and unaccounted are both 0.
The test suite runs the same checks on a bounded count
(``tests/ingest/test_datagram_hardening.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "sdk", REPO / "sidecar"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
if str(REPO) not in sys.path:  # the checkout's tests.helpers holds the one sidecar starter
    sys.path.append(str(REPO))

from tests.helpers.sidecar import SidecarProc  # noqa: E402

from inferwatch.wire import EV_BATCH, EV_DROPS, EV_RECORD, EV_SCHEMA, Encoder  # noqa: E402
from inferwatch.wire.spec import HEADER, MAGIC, RECORD_HEADER, SCHEMA_FIELD_STRUCT, SCHEMA_HEAD, VERSION  # noqa: E402

CTX = ("svc", "m", "v1")


def valid_frames(n: int, producer: int = 0xF00D) -> list[bytes]:
    """Frames the SDK's encoder writes: batches, records with features (and their schemas), drop counts."""
    enc = Encoder(2, producer)
    out: list[bytes] = []
    for i in range(n):
        events: list[tuple[Any, ...]] = [
            (EV_BATCH, CTX, i),
            (EV_RECORD, CTX, 1, None, "p", None, None, {"x": float(i), "c": str(i % 3)}),
            (EV_DROPS, {"buffer_full": 1}),
        ]
        out += enc.encode(events[: 1 + i % 3])
    return out


def fuzz_inputs(seed: int, n: int) -> list[bytes]:
    """``n`` datagrams: random bytes, valid frames, and valid frames with bytes flipped, cut or spliced."""
    rng = random.Random(seed)
    valid = valid_frames(64)
    out: list[bytes] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(rng.randbytes(rng.randrange(0, 200)))
        elif kind == 1:
            out.append(rng.choice(valid))
        elif kind == 2:
            b = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 6)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            out.append(bytes(b))
        else:
            a, b = rng.choice(valid), rng.choice(valid)
            out.append(a[: rng.randrange(len(a))] + b[rng.randrange(len(b)):])
    return out


def record_types(frame: bytes) -> list[int]:
    """The record types of a well-formed frame, read from its headers alone."""
    n_str, n_rec = struct.unpack_from("<HH", frame, HEADER.size - 4)
    off = HEADER.size
    for _ in range(n_str):
        off += 1 + frame[off]
    out = []
    for _ in range(n_rec):
        rtype, ln = RECORD_HEADER.unpack_from(frame, off)
        out.append(rtype)
        off += RECORD_HEADER.size + ln
    return out


def frame(records: list[bytes], strings: list[bytes], producer: int, seq: int = 1) -> bytes:
    head = HEADER.pack(MAGIC, VERSION, 0, 1, producer, seq, time.time_ns(), len(strings), len(records))
    return head + b"".join(bytes([len(s)]) + s for s in strings) + b"".join(records)


def big_schema(producer: int, rng: random.Random) -> bytes:
    """A SCHEMA of 250 distinct 255-byte names: about the most memory one datagram can ask for."""
    strings = [bytes(rng.choice(b"abcdefghijklmnop") for _ in range(255)) for _ in range(250)]
    body = SCHEMA_HEAD.pack(1, 250) + b"".join(SCHEMA_FIELD_STRUCT.pack(i, i & 1) for i in range(250))
    return frame([RECORD_HEADER.pack(EV_SCHEMA, len(body)) + body], strings, producer)


def in_process(inputs: list[bytes]) -> dict[str, int]:
    from inferwatch_sidecar.aggregate.aggregator import Aggregator
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.ingest.pipeline import Pipeline

    p = Pipeline(Aggregator(ComponentContext()))
    crashes = 0
    for buf in inputs:
        try:
            p.datagram(buf, "unix")
        except Exception:
            crashes += 1
    frame_errors = sum(n for (scope, _), n in p.decode_errors.items() if scope == "frame")
    crashes += sum(n for (_, reason), n in p.decode_errors.items() if reason == "internal_error")
    unaccounted = abs(sum(p.frames.values()) - p.frames_decoded - frame_errors) + abs(len(inputs) - sum(p.frames.values()))
    # Valid frames alone: records accepted + rejected + schema announcements = records sent.
    q = Pipeline(Aggregator(ComponentContext()))
    valid = valid_frames(max(1, len(inputs) // 20), producer=0xBEEF)
    for buf in valid:
        q.datagram(buf, "unix")
    types = [t for f in valid for t in record_types(f)]
    accepted = sum(sum(c) for c in q.counts.values())
    rejected = sum(n for (scope, _), n in q.decode_errors.items() if scope == "record")
    unaccounted += abs(len(types) - accepted - rejected - types.count(EV_SCHEMA))
    return {"inputs": len(inputs) + len(valid), "crashes": crashes, "unaccounted": unaccounted}


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _status(base: str) -> dict[str, Any]:
    code, body = _get(base + "/v1/status")
    assert code == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def _wait_frames(base: str, n: int, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = _status(base)
        if st["ingest"]["frames"] >= n or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def over_socket(inputs: list[bytes], floods: bool) -> dict[str, Any]:
    import psutil

    tmp = tempfile.mkdtemp(prefix="iw-fuzz-")
    sock_path = os.path.join(tmp, "ingest.sock")
    proc = SidecarProc(Path(tmp), sock=sock_path, ready_timeout=20)
    base = proc.url
    out: dict[str, Any] = {"inputs": len(inputs), "crashes": 0, "unaccounted": 0}
    try:
        proc.start()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sent = 0

        def send(bufs: list[bytes]) -> None:
            nonlocal sent
            for b in bufs:
                s.sendto(b, sock_path)
                sent += 1

        send(inputs)
        st = _wait_frames(base, sent)
        ing = st["ingest"]
        frame_errors = sum(n for k, n in ing["decode_errors"].items() if k.startswith("frame/"))
        out["unaccounted"] = abs(sent - ing["frames"]) + abs(ing["frames"] - ing["frames_decoded"] - frame_errors)
        out["crashes"] = sum(n for k, n in ing["decode_errors"].items() if k.endswith("/internal_error"))
        rss = psutil.Process(proc.pid)
        if floods:
            mib = 1 << 20
            rng = random.Random(5)
            schemas = [big_schema(0x10000 + i, rng) for i in range(64)]
            before = rss.memory_info().rss
            flood = [schemas[i % 64].replace(struct.pack("<Q", 0x10000 + i % 64), struct.pack("<Q", 0x20000 + i), 1)
                     for i in range(4096)]
            send(flood)
            st = _wait_frames(base, sent, timeout=120)
            out["schema_flood"] = {
                "datagrams": len(flood), "mb_sent": round(sum(map(len, flood)) / 1e6, 1),
                "rss_before_mib": round(before / mib, 1), "rss_after_mib": round(rss.memory_info().rss / mib, 1),
                "schema_cache_bytes": st["ingest"]["schema_cache_bytes"],
            }
            before = rss.memory_info().rss
            enc = Encoder(3, 0x30000)
            events = [(EV_BATCH, ("svc", f"model-{i}", f"v{i % 97}"), 1) for i in range(200_000)]
            flood = enc.encode(events)
            send(flood)
            _wait_frames(base, sent, timeout=120)
            out["cardinality_flood"] = {
                "distinct_models": 200_000, "datagrams": len(flood),
                "rss_before_mib": round(before / mib, 1), "rss_after_mib": round(rss.memory_info().rss / mib, 1),
            }
        s.close()
        code, _ = _get(base + "/metrics")
        out["metrics_status"] = code
        if code != 200:
            out["crashes"] += 1
    finally:
        if proc.proc is not None:
            proc.stop(timeout=15)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="datagrams fuzzed in-process")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--socket", type=int, default=200, help="datagrams sent to a real sidecar (0: none)")
    ap.add_argument("--no-floods", action="store_true", help="skip the schema and cardinality floods")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    res = {"in_process": in_process(fuzz_inputs(args.seed, args.count))}
    if args.socket:
        res["socket"] = over_socket(fuzz_inputs(args.seed + 1, args.socket), not args.no_floods)
    tried = sum(r["inputs"] for r in res.values())
    crashes = sum(r["crashes"] for r in res.values())
    unaccounted = sum(r["unaccounted"] for r in res.values())
    print(json.dumps(res, indent=2))
    print(f"inputs tried: {tried}  crashes: {crashes}  unaccounted: {unaccounted}  "
          f"({time.monotonic() - t0:.1f} s)")
    return 0 if crashes == 0 and unaccounted == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

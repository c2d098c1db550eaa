"""Fuzz the JSON ingest (``POST /v1/events`` and ``/v1/labels``) and check that every event is accounted for.

Seeded random and mutated bodies go through the sidecar's own :class:`JsonIngest`
in-process, and optionally over HTTP to a real sidecar subprocess on loopback.
For every body the answer must be 200 with ``accepted + rejected`` equal to the
events the body holds, or 400 with one body-level reason counted once; the
sidecar's counters must move by exactly what the answer says; and afterwards
``/metrics`` must render as Prometheus text and OpenMetrics and convert to OTLP.

Usage:
    .venv/bin/python scripts/fuzz_json.py --count 100000 [--seed 1] [--http 1000]

Prints the inputs tried, the crashes (an exception out of the handler, an
answer that is neither 200 nor 400, a scrape or OTLP conversion that fails) and
the unaccounted items (events neither accepted nor rejected by reason, or
counters that disagree with the answers); exits 1 unless both are 0.
The test suite runs the same checks on a bounded count
(``tests/ingest/test_json_ingest_hardening.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the checkout's tests.helpers holds the one sidecar starter
    sys.path.append(str(REPO))

from tests.helpers.sidecar import SidecarProc  # noqa: E402

#: Valid bodies covering every event type and field; the mutations start from these.
SEEDS: list[tuple[str, Any]] = [
    ("events", {"service": "svc", "model": "m", "model_version": "v1", "events": [
        {"type": "request", "duration_s": 0.12, "outcome": "ok", "request_id": "r1",
         "trace_id": "0123456789abcdef0123456789abcdef", "time_unix_s": 1.7e9,
         "stages": {"preprocess": 0.01, "inference": {"duration_s": 0.1, "ttft_s": 0.02, "items": 5,
                                                      "gaps_s": [0.01, 0.02]}}},
        {"type": "request", "duration_s": 1, "outcome": "error", "error_type": "Timeout",
         "stages": [{"stage": "queue", "duration_s": 0.5}]},
        {"type": "stage", "stage": "decode", "duration_s": 0.003, "request_id": "r2"},
        {"type": "record", "request_id": "r3", "prediction": "cat", "confidence": 0.9,
         "features": {"age": 31, "income": 1.5e4, "city": "Lyon", "missing": None}},
        {"type": "record", "prediction": 2.5, "label": 3, "features": {"x": -1}},
        {"type": "batch", "size": 8, "model": "other"},
        {"type": "queue", "depth": 3},
    ]}),
    ("events", [{"type": "batch", "size": 1}, {"type": "queue", "depth": 0, "service": "s2"}]),
    ("labels", {"model": "m", "labels": [{"request_id": "r3", "label": "dog"}, {"request_id": "r4", "label": 1}]}),
    ("labels", [{"request_id": "r5", "label": "cat", "model_version": "v2"}]),
]

#: Values that each broke, or could break, a field check: overflow, non-finite, wrong type, unexportable text.
NASTY_VALUES: list[Any] = [
    1e300, -1e300, 1e308, -1, -0.0, 0, 2**32, 2**64, 10**20, 10**310, -(10**400), 5e-324,
    float("inf"), float("-inf"), float("nan"), True, False, None, "", "ok", "x" * 300, "y" * 65,
    "\ud800", "a\udcffb", "\udbff\udfff", "\U0001f600", "\x00", "a\nb", '"', "\\",
    [], {}, [1, 2], {"a": 1}, [[[[]]]], {"stage": "s", "duration_s": 1e300},
]
#: Raw JSON text for the same cases where Python's json.dumps cannot write them.
NASTY_TOKENS: list[str] = [
    "1" * 400, "-" + "9" * 5000, "1" * 4301, "1e99999", "-1e99999", "NaN", "Infinity", "-Infinity",
    '"\\ud800"', '"\\udfff\\ud800"', '"\\u0000"', '"\ud800"', "[" * 3000 + "]" * 3000,
    '{"a":' * 2000 + "1" + "}" * 2000, "0.0e-99999", "1" * 310 + ".5",
]
_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null')
#: Depth of generated deep nesting: far past the recursion limit, so the answer never depends on stack depth.
DEEP = 3000


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    return doc


def _copy(v: Any) -> Any:
    return json.loads(json.dumps(v))


def _mutate_doc(rng: random.Random, doc: Any) -> Any:
    for _ in range(rng.randrange(1, 4)):
        paths = list(_leaves(doc))
        path = rng.choice(paths)
        op = rng.randrange(6)
        if op <= 2:
            doc = _set(doc, path, _copy(rng.choice(NASTY_VALUES)))
        elif op == 3 and path:  # delete a key or an item
            parent = doc
            for k in path[:-1]:
                parent = parent[k]
            del parent[path[-1]]
        elif op == 4:  # duplicate an event (more events per body)
            events = doc if not isinstance(doc, dict) else doc.get("events", doc.get("labels"))
            if isinstance(events, list) and events:
                events.extend(_copy(rng.choice(events)) for _ in range(rng.randrange(1, 20)))
        else:  # a new key with a nasty value
            target = doc
            for k in path:
                target = target[k]
            if isinstance(target, dict):
                key = rng.choice(["type", "model", "stage", "size", "features", "label", "zz"])
                target[key] = _copy(rng.choice(NASTY_VALUES))
    return doc


def _mutate_text(rng: random.Random, text: str) -> str:
    literals = list(_LITERAL.finditer(text))
    for _ in range(rng.randrange(1, 3)):
        if not literals:
            break
        m = rng.choice(literals)
        text = text[: m.start()] + rng.choice(NASTY_TOKENS) + text[m.end():]
        literals = list(_LITERAL.finditer(text))
    return text


def _mutate_bytes(rng: random.Random, b: bytearray) -> bytes:
    for _ in range(rng.randrange(1, 6)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            del b[rng.randrange(len(b)):]
        elif op == 2:
            b[rng.randrange(len(b) + 1):0] = rng.choice([b"\xed\xa0\x80", b"\xff", b"\x00", b"\\u", b'"', b"["])
        else:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
    return bytes(b)


def body(rng: random.Random) -> tuple[str, bytes]:
    """One fuzz body: ``(kind, bytes)``, kind being ``"events"`` or ``"labels"``."""
    kind, seed = rng.choice(SEEDS)
    doc = _copy(seed)
    r = rng.random()
    if r < 0.45:
        return kind, json.dumps(_mutate_doc(rng, doc)).encode()
    if r < 0.75:
        return kind, _mutate_text(rng, json.dumps(doc)).encode("utf-8", "surrogatepass")
    if r < 0.92:
        return kind, _mutate_bytes(rng, bytearray(json.dumps(_mutate_doc(rng, doc)).encode()))
    if r < 0.96:  # a valid event list wrapped in deep nesting
        return kind, b"[" * DEEP + json.dumps(doc).encode() + b"]" * DEEP
    return kind, rng.randbytes(rng.randrange(0, 300))


def events_in(kind: str, raw: bytes) -> int | None:
    """How many events ``raw`` holds if it is a well-shaped body, else None (an oracle independent of the decoder)."""
    try:
        doc = json.loads(raw, parse_int=float)  # structure only: no int-digit limit
    except (ValueError, RecursionError):
        return None
    if isinstance(doc, list):
        return len(doc)
    if isinstance(doc, dict) and isinstance(doc.get(kind), list):
        return len(doc[kind])
    return None


@dataclass
class Tally:
    """What a fuzz run saw."""

    inputs: int = 0
    events: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    bodies_rejected: dict[str, int] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)

    def check(self, kind: str, raw: bytes, status: int, answer: Any) -> None:
        """Check one answer against the oracle; ``answer`` is the decoded JSON reply."""
        self.inputs += 1
        n = events_in(kind, raw)
        where = f"body #{self.inputs} ({kind}, {len(raw)} bytes, {raw[:80]!r})"
        if status == 200:
            errors = answer.get("errors", {})
            if n is None or answer["accepted"] + answer["rejected"] != n or sum(errors.values()) != answer["rejected"]:
                self.unaccounted.append(f"{where}: holds {n} events, answered {answer}")
                return
            self.events += n
            self.accepted += answer["accepted"]
            for reason, k in errors.items():
                self.rejected[reason] = self.rejected.get(reason, 0) + k
        elif status == 400:
            from inferwatch_sidecar.ingest.http_json import BODY_REASONS

            reason = answer.get("reason")
            if reason not in BODY_REASONS or (n is not None and reason != "bad_body"):
                self.unaccounted.append(f"{where}: holds {n} events, answered 400 {answer}")
                return
            self.bodies_rejected[reason] = self.bodies_rejected.get(reason, 0) + 1
        else:
            self.crashes.append(f"{where}: answered {status} {answer!r:.200}")

    def report(self, label: str) -> str:
        return (f"{label}: inputs tried {self.inputs}, events {self.events} (accepted {self.accepted}, rejected "
                f"{sum(self.rejected.values())} {dict(sorted(self.rejected.items()))}), bodies rejected whole "
                f"{dict(sorted(self.bodies_rejected.items()))}, crashes {len(self.crashes)}, "
                f"unaccounted {len(self.unaccounted)}")


def ingest_chain(max_events: int = 50) -> tuple[Any, Any, Any]:
    """The sidecar's JSON ingest chain as the daemon wires it: ``(JsonIngest, registry, collect)``.

    ``registry`` renders what ``/metrics`` shows for ingest and aggregation;
    ``collect`` returns the same families for the OTLP conversion.
    """
    from prometheus_client import CollectorRegistry

    from inferwatch_sidecar.aggregate.aggregator import Aggregator
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.ingest.http_json import JsonDecoder, JsonIngest
    from inferwatch_sidecar.ingest.pipeline import Pipeline

    ctx = ComponentContext()
    agg = Aggregator(ctx)
    pipeline = Pipeline(agg)

    class Collector:
        def collect(self) -> Iterator[Any]:
            yield from agg.collect()
            yield from pipeline.collect(time.time(), 60.0, ctx.limiters)

    registry = CollectorRegistry()
    registry.register(Collector())
    return JsonIngest(pipeline, JsonDecoder(max_events)), registry, lambda: list(registry.collect())


def in_process(count: int, seed: int) -> Tally:
    """Fuzz :class:`JsonIngest` in this process, checking the pipeline's counters after every body."""
    ingest, registry, collect = ingest_chain()
    rng = random.Random(seed)
    tally = Tally()
    p = ingest.pipeline

    def counters() -> tuple[int, dict[str, int], int]:
        errs = {r: n for (s, r), n in p.decode_errors.items() if s == "json"}
        return sum(p.counts["http"]), errs, p.dropped.get("too_many_events", 0)

    for _ in range(count):
        kind, raw = body(rng)
        ev0, err0, drop0 = counters()
        try:
            status, answer = ingest.post(kind, raw)
        except BaseException as e:  # noqa: BLE001 - a crash is what we are looking for
            tally.inputs += 1
            tally.crashes.append(f"body #{tally.inputs} ({kind}, {raw[:80]!r}): {type(e).__name__}: {e}")
            continue
        before = len(tally.unaccounted)
        tally.check(kind, raw, status, answer)
        if len(tally.unaccounted) > before or status not in (200, 400):
            continue
        ev1, err1, drop1 = counters()
        moved = {r: err1[r] - err0.get(r, 0) for r in err1 if err1[r] != err0.get(r, 0)}
        if status == 200:
            errors = dict(answer["errors"])
            too_many = errors.pop("too_many_events", 0)
            ok = ev1 - ev0 == answer["accepted"] and moved == errors and drop1 - drop0 == too_many
        else:
            ok = ev1 == ev0 and moved == {answer["reason"]: 1} and drop1 == drop0
        if not ok:
            tally.unaccounted.append(f"body #{tally.inputs} ({raw[:80]!r}): answered {answer}, counters moved "
                                     f"events +{ev1 - ev0}, errors {moved}, too_many +{drop1 - drop0}")
    tally.crashes.extend(exposition_failures(registry, collect))
    return tally


def exposition_failures(registry: Any, collect: Callable[[], Any]) -> list[str]:
    """Render the registry as Prometheus text, OpenMetrics and OTLP; one line per failure."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from inferwatch_sidecar.export.otlp.convert import families_to_request

    out = []
    for name, render in (("text", generate_latest), ("OpenMetrics", generate_openmetrics)):
        try:
            render(registry)
        except Exception as e:
            out.append(f"{name} exposition failed: {type(e).__name__}: {e}")
    try:
        req, stats = families_to_request(collect(), {"service.name": "fuzz"}, now_s=time.time(), start_time_s=0.0)
        req.SerializeToString()
        if stats.dropped.get("family_error"):
            out.append(f"OTLP conversion dropped families: {stats.dropped}")
    except Exception as e:
        out.append(f"OTLP conversion failed: {type(e).__name__}: {e}")
    return out


def post(url: str, raw: bytes) -> tuple[int, Any]:
    """POST ``raw`` as JSON; the status and the decoded answer (raw bytes if it is not JSON)."""
    req = urllib.request.Request(url, data=raw, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            code, data = r.status, r.read()
    except urllib.error.HTTPError as e:
        code, data = e.code, e.read()
    try:
        return code, json.loads(data)
    except ValueError:
        return code, data


def over_http(base_url: str, count: int, seed: int, tally: Tally | None = None) -> Tally:
    """Fuzz a running sidecar at ``base_url``; checks each answer (the caller checks its counters)."""
    rng = random.Random(seed)
    tally = tally or Tally()
    for _ in range(count):
        kind, raw = body(rng)
        try:
            status, answer = post(f"{base_url}/v1/{kind}", raw)
        except OSError as e:
            tally.inputs += 1
            tally.crashes.append(f"body #{tally.inputs} ({raw[:80]!r}): no answer: {e}")
            continue
        tally.check(kind, raw, status, answer)
    return tally


def http_counters(metrics_text: str) -> tuple[float, dict[str, float], float]:
    """(events accepted over HTTP, JSON errors by reason, too_many_events drops) from a /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    events, errors, too_many = 0.0, {}, 0.0
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == "inferwatch_ingest_events_total" and s.labels["transport"] == "http":
                events += s.value
            elif s.name == "inferwatch_ingest_decode_errors_total" and s.labels["scope"] == "json":
                errors[s.labels["reason"]] = s.value
            elif s.name == "inferwatch_ingest_dropped_total" and s.labels["reason"] == "too_many_events":
                too_many = s.value
    return events, errors, too_many


def counter_mismatches(tally: Tally, metrics_text: str) -> list[str]:
    """Where a sidecar's counters (fresh, fed only by this tally's bodies) disagree with the answers."""
    events, errors, too_many = http_counters(metrics_text)
    want = {**tally.rejected, **tally.bodies_rejected}
    want_too_many = want.pop("too_many_events", 0)
    out = []
    if events != tally.accepted:
        out.append(f"inferwatch_ingest_events_total{{transport=http}} = {events}, answers accepted {tally.accepted}")
    if {r: v for r, v in errors.items() if v} != {r: float(v) for r, v in want.items()}:
        out.append(f"JSON decode errors {errors}, answers rejected {want}")
    if too_many != want_too_many:
        out.append(f"too_many_events drops {too_many}, answers {want_too_many}")
    return out


def run_sidecar(tmp: str) -> SidecarProc:
    """Start ``inferwatch sidecar`` on loopback (at most 50 events a body) and wait until it is ready."""
    return SidecarProc(Path(tmp), ["--set", "ingest.max_json_events=50"], sock=os.path.join(tmp, "s.sock"),
                       ready_timeout=20).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="bodies through the decoder in-process")
    ap.add_argument("--http", type=int, default=1000, help="bodies over HTTP to a real sidecar (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    tally = in_process(args.count, args.seed)
    print(tally.report("in-process") + f" ({time.monotonic() - t0:.1f} s)")
    bad = tally.crashes + tally.unaccounted
    if args.http:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            proc = run_sidecar(tmp)
            try:
                base = proc.url
                h = over_http(base, args.http, args.seed + 1)
                for accept in ("text/plain", "application/openmetrics-text"):
                    req = urllib.request.Request(base + "/metrics", headers={"Accept": accept})
                    with urllib.request.urlopen(req, timeout=10) as r:
                        text = r.read().decode()
                        if r.status != 200:
                            h.crashes.append(f"/metrics ({accept}) answered {r.status}")
                    if accept == "text/plain":
                        h.unaccounted.extend(counter_mismatches(h, text))
            except urllib.error.HTTPError as e:
                h.crashes.append(f"/metrics answered {e.code}: {e.read()[:200]!r}")
            finally:
                proc.stop(timeout=15)
        print(h.report("over HTTP") + f" ({time.monotonic() - t0:.1f} s)")
        bad += h.crashes + h.unaccounted
    for line in bad[:20]:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

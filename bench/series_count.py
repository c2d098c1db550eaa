"""Series per family of a real sidecar with every component on, measured from its /metrics (docs/scale.md).

Starts ``inferwatch sidecar`` (drift with a reference profile file, tail, canary, GPU on the fake
NVML with one device and ``--gpu-processes`` processes using it), sends the reference workload
of docs/scale.md over UDP with the SDK's encoder (1 service, ``--models`` models x ``--versions``
versions, 5 stages with a queue and a streaming one, one error type, recorded predictions with
``--numeric`` numeric and ``--categorical`` categorical features, the second version of each
model shifted so that drift and canary have something to say), waits until drift, tail and canary
have evaluated, then scrapes ``/metrics`` as text and as the protobuf exposition (native
histograms) and prints the series of every family, grouped by component, and per model version
and feature where the family grows with them.

A series is one sample line of the text exposition; in protobuf one metric of a family, a
native histogram being one series.

Usage (wrap in ``flock /tmp/bench.lock``)::

    python bench/series_count.py                      # 3 models x 2 versions, 8 numeric + 4 categorical
    python bench/series_count.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk"), str(REPO / "sidecar"), str(REPO)]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.helpers.sidecar import SidecarProc  # noqa: E402

from _harness import free_port  # noqa: E402  (bench/ is a folder of scripts, not a package)

STAGES = ("queue", "preprocess", "inference", "postprocess", "generate")
CATS = ["a", "b", "c", "d", "e"]
PROTO_ACCEPT = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"


def _profile(path: Path, numeric: int, categorical: int) -> None:
    from inferwatch_sidecar.components.drift import profile as prof

    rng = np.random.default_rng(0)
    n = 5000
    prof.build({f"x{j}": rng.normal(size=n) for j in range(numeric)},
               {f"c{j}": list(rng.choice(CATS, size=n)) for j in range(categorical)},
               source="bench").save(str(path))


def _component(name: str) -> str:
    """The component a family belongs to, from the metric catalog (the sidecar's process metrics apart)."""
    from inferwatch_sidecar.components.registry import CATALOG

    if name.startswith("inferwatch_sidecar_"):
        return "process"
    owner = {key: m.component for m in CATALOG.all_metrics() for key in (m.name, m.family)}
    return owner.get(name, "core")


def _text_series(body: bytes) -> Counter[str]:
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter[str] = Counter()
    for fam in text_string_to_metric_families(body.decode()):
        out[fam.name] += len(fam.samples)
    return out


def _proto_series(body: bytes) -> Counter[str]:
    from tests.metrics.promproto import parse_delimited

    out: Counter[str] = Counter()
    for fam in parse_delimited(body):
        n = 0
        for m in fam.metric:
            h = m.histogram if m.HasField("histogram") else None
            if h is not None and not h.bucket and (h.positive_span or h.negative_span or h.zero_count or h.schema):
                n += 1  # native only: one series
            elif h is not None:
                n += len(h.bucket) + 3 if not h.bucket or h.bucket[-1].upper_bound != float("inf") \
                    else len(h.bucket) + 2  # buckets, +Inf, _sum, _count (+ the native series, counted below)
                n += 1 if (h.positive_span or h.negative_span) else 0
            else:
                n += 1
        name = fam.name[: -len("_total")] if fam.type == 0 and fam.name.endswith("_total") else fam.name
        out[name] += n  # counters named as the text parser names them (without _total)
    return out


def traffic(udp: int, models: int, versions: int, numeric: int, categorical: int, seconds: float,
            rate: float) -> int:
    """Requests and records at ``rate`` per second per label set; the last version of each model shifted."""
    from inferwatch.wire import EV_RECORD, EV_REQUEST, Encoder

    rnd = random.Random(7)
    enc = Encoder(os.getpid(), 7)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sets = [("svc", f"model{m}", f"v{v}") for m in range(models) for v in range(versions)]
    start, k = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        events: list[tuple[Any, ...]] = []
        for ctx in sets:
            shifted = ctx[2] == f"v{versions - 1}" and versions > 1
            for _ in range(max(1, int(rate / 10))):
                k += 1
                rid = f"r{k}"
                stages = []
                for name in STAGES:
                    d = rnd.lognormvariate(-6 + (0.7 if shifted else 0), 0.8)
                    stream = (int(d * 0.1e9), 8, [rnd.randint(1000, 50_000) for _ in range(7)]) \
                        if name == "generate" else None
                    stages.append((name, int(d * 1e9), stream))
                outcome = 1 if rnd.random() < 0.02 else 0
                events.append((EV_REQUEST, ctx, time.time_ns(), sum(s[1] for s in stages), outcome,
                               "Timeout" if outcome else None, rid, None, stages))
                feats: dict[str, Any] = {f"x{j}": rnd.gauss(1.0 if shifted else 0.0, 1) for j in range(numeric)}
                feats.update({f"c{j}": rnd.choice(CATS[:3] if shifted else CATS) for j in range(categorical)})
                events.append((EV_RECORD, ctx, time.time_ns(), rid, rnd.randrange(3), rnd.random(), None, feats))
        for f in enc.encode(events):
            sock.sendto(f, ("127.0.0.1", udp))
        time.sleep(0.1)
    return k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--versions", type=int, default=2)
    ap.add_argument("--numeric", type=int, default=8)
    ap.add_argument("--categorical", type=int, default=4)
    ap.add_argument("--gpu-processes", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=25.0, help="seconds of traffic (default 25)")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second per label set (default 100)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    measured = measure(args)
    if measured is None:
        return 1
    n, text, proto, status = measured
    report(args, n, _text_series(text), _proto_series(proto), status)
    return 0


def _config(args: argparse.Namespace, tmp: Path) -> Path:
    """The sidecar's config file: every component on, drift on a reference file, the GPU on the fake NVML."""
    import yaml

    _profile(tmp / "profile.json", args.numeric, args.categorical)
    cfg = {
        "drift": {"reference": str(tmp / "profile.json"), "evaluate_interval_s": 1.0, "window_events": 2000},
        "tail": {"window_seconds": 5.0},
        "canary": {"window_seconds": 10.0, "evaluate_interval_s": 1.0, "min_requests": 50},
        "gpu": {"backend": "fake", "fake": {"devices": 1, "processes": [
            {"pid": 1000 + p, "base_gib": 4.0 + p} for p in range(args.gpu_processes)]}},
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return tmp / "cfg.yaml"


def measure(args: argparse.Namespace) -> tuple[int, bytes, bytes, dict[str, Any]] | None:
    """Run the sidecar, send the workload, and scrape it: (requests sent, text, protobuf, /v1/status); None when
    the sidecar did not start (its log is printed)."""
    tmp = Path(tempfile.mkdtemp(prefix="iw-series-"))
    cfg = _config(args, tmp)
    udp = free_port(socket.SOCK_DGRAM)
    # Only what the config file says: no --no-gpu / --no-drift.
    side = SidecarProc(tmp, ["--config", str(cfg), "--udp-port", str(udp)], sock=str(tmp / "s.sock"), defaults=(),
                       repo=REPO, ready_timeout=60)
    base = side.url
    try:
        try:
            side.start()
        except AssertionError as e:  # not ready: the message holds its log
            print(e, file=sys.stderr)
            return None
        n = traffic(udp, args.models, args.versions, args.numeric, args.categorical, args.seconds, args.rate)
        time.sleep(3)
        with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
            text = r.read()
        req = urllib.request.Request(base + "/metrics", headers={"Accept": PROTO_ACCEPT})
        with urllib.request.urlopen(req, timeout=30) as r:
            proto = r.read()
        with urllib.request.urlopen(base + "/v1/status", timeout=30) as r:
            status = json.loads(r.read())
    finally:
        if side.proc is not None:
            side.stop(timeout=20, check=False)
    return n, text, proto, status


def report(args: argparse.Namespace, n: int, classic: Counter[str], native: Counter[str],
           status: dict[str, Any]) -> None:
    """The tables of docs/scale.md: series by component, then by family (and the JSON with ``--json``)."""
    by_comp: dict[str, list[int]] = {}
    for name in sorted(set(classic) | set(native)):
        c = by_comp.setdefault(_component(name), [0, 0])
        c[0] += classic.get(name, 0)
        c[1] += native.get(name, 0)
    L, F = args.models * args.versions, args.numeric + args.categorical
    comps = {s["name"]: s.get("state") for s in status.get("components", [])} if isinstance(
        status.get("components"), list) else {k: v.get("state") for k, v in status.get("components", {}).items()}
    print(f"workload: {L} label sets (models x versions), {len(STAGES)} stages (1 queue, 1 streaming), "
          f"{F} features ({args.numeric} numeric, {args.categorical} categorical), 1 GPU with "
          f"{args.gpu_processes} processes; {n} requests; components: {comps}")
    print("| component | series, text (classic) | series, protobuf (native) | per label set (text) | "
          "per label set and feature (text) |")
    print("| --- | --- | --- | --- | --- |")
    for comp, (c, nat) in sorted(by_comp.items()):
        print(f"| {comp} | {c} | {nat} | {c / L:.1f} | {c / (L * F):.1f} |")
    tot_c, tot_n = sum(v[0] for v in by_comp.values()), sum(v[1] for v in by_comp.values())
    print(f"| **total** | **{tot_c}** | **{tot_n}** | | |")
    print()
    print("| family | text | protobuf |")
    print("| --- | --- | --- |")
    for name in sorted(set(classic) | set(native), key=lambda k: (_component(k), -classic.get(k, 0))):
        if not classic.get(name) and not native.get(name):
            continue
        print(f"| `{name}` | {classic.get(name, 0)} | {native.get(name, 0)} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"classic": classic, "native": native, "by_component": by_comp,
                                               "label_sets": L, "features": F}, indent=1))


if __name__ == "__main__":
    sys.exit(main())

"""A serving process instrumented with the real SDK, run as a subprocess by the tests and the bench.

Usage: python -m tests.helpers.sdk_producer SOCKET SERVICE N [--rate R] [--features K] [--sleep-ms MS]
       [--until-file PATH]

Sends N requests (each with stages preprocess/inference/postprocess and, with
--features, a record() of K features), then flushes and prints the SDK's
stats() as JSON on stdout, with ``requests``: how many requests it made.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import inferwatch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("service")
    ap.add_argument("n", type=int)
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s; 0 = as fast as possible")
    ap.add_argument("--features", type=int, default=0)
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="sleep inside the inference stage")
    ap.add_argument("--model", default="m1")
    ap.add_argument("--buffer-size", type=int, default=16384)
    ap.add_argument("--until-file", help="stop early (before N) once this file exists")
    args = ap.parse_args(argv)

    inferwatch.configure(
        service=args.service, model=args.model, model_version="v1", sidecar="unix://" + args.socket,
        buffer_size=args.buffer_size, hello_interval_s=0.2,
    )
    feats = {f"f{j}": float(j) for j in range(args.features)}
    sleep_s = args.sleep_ms / 1000
    start = time.perf_counter()
    sent = 0
    for i in range(args.n):
        if args.until_file and i % 100 == 0 and os.path.exists(args.until_file):
            break
        with inferwatch.request(request_id=f"{args.service}-{i}"):
            with inferwatch.stage("preprocess"):
                pass
            with inferwatch.stage("inference"):
                if sleep_s:
                    time.sleep(sleep_s)
            with inferwatch.stage("postprocess"):
                pass
            if args.features:
                inferwatch.record(prediction="cat", confidence=0.9, features=feats)
        sent += 1
        if args.rate:
            ahead = (i + 1) / args.rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
    inferwatch.flush(timeout=5.0)
    # One more HELLO/DROPS round so the final drop counts reach the sidecar.
    time.sleep(0.3)
    inferwatch.flush(timeout=5.0)
    stats = inferwatch.stats()
    stats["requests"] = sent
    inferwatch.shutdown(timeout=5.0)
    json.dump(stats, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

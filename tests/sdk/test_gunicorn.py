"""``gunicorn --preload``: the master configures the SDK at import but serves nothing, so it is no producer.

A process becomes a producer with its first events: until then it sends nothing, not even HELLO.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import inferwatch
from inferwatch.wire import EV_BATCH, EV_HELLO
from tests.conftest import IN_CI
from tests.helpers.apps import stop_process
from tests.helpers.net import free_port
from tests.helpers.sidecar import REPO, parse_metrics, sample, wait_until
from tests.sdk.conftest import Receiver

WORKERS = 3


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        return int(r.read())


def test_a_process_that_never_records_sends_nothing_not_even_hello(sock_path: str) -> None:
    rx = Receiver(sock_path)
    rx.start()
    inferwatch.shutdown(timeout=1.0)
    try:
        assert inferwatch.configure(sidecar=f"unix://{rx.path}", flush_interval_ms=10_000, hello_interval_s=0.01)
        assert inferwatch.flush() is True, "nothing to send is not a failure"
        time.sleep(0.05)  # past the hello interval
        assert inferwatch.flush() is True
        assert rx.poll(0.05) == []
        inferwatch.observe_batch(2)
        assert inferwatch.flush() is True
        types = [r[0] for r in rx.records(0.05)]
        assert types.count(EV_HELLO) == 1 and EV_BATCH in types
    finally:
        inferwatch.shutdown(timeout=1.0)
        rx.stop()


@pytest.mark.slow
def test_under_gunicorn_preload_producers_are_the_workers_not_the_master(sidecar_factory: Any, tmp_path: Path) -> None:
    try:
        import gunicorn  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail('gunicorn is not installed (pip install -e ".[dev]")')
        pytest.skip("gunicorn is not installed")
    sc = sidecar_factory()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    env.update({"INFERWATCH_SIDECAR": "unix://" + sc.sock, "INFERWATCH_SERVICE": "wsgi",
                "INFERWATCH_HELLO_INTERVAL_S": "0.2"})
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as out:
        app = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--preload", "--workers", str(WORKERS), "--bind", f"127.0.0.1:{port}",
             "--log-level", "warning", "tests.sdk.gunicorn_app:app"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}/"

        def up() -> bool:
            if app.poll() is not None:
                raise AssertionError(f"gunicorn exited with {app.returncode}:\n{log.read_text(errors='replace')}")
            try:
                return _get(url) > 0
            except (urllib.error.URLError, ConnectionError, OSError):
                return False

        wait_until(up, timeout=40, what="gunicorn up")
        # Sync workers serve one request at a time: rounds of as many concurrent requests as workers reach
        # every one (one round usually does; a worker still booting or a stalled client needs another).
        served: set[int] = set()

        def every_worker_served() -> bool:
            with ThreadPoolExecutor(WORKERS) as ex:
                served.update(ex.map(_get, [url] * WORKERS))
            return len(served) >= WORKERS

        wait_until(every_worker_served, timeout=20, what=f"{WORKERS} workers serving")
        assert len(served) == WORKERS and app.pid not in served

        def producer_pids() -> set[int]:
            return {p["pid"] for p in sc.status()["producers"]["table"]}

        wait_until(lambda: producer_pids() >= served, timeout=15, what="every worker a producer")
        time.sleep(1.0)  # five hello intervals: a master that announced itself would be in the table by now
        assert producer_pids() == served, f"master {app.pid} counted as a producer"
        assert sample(parse_metrics(sc.metrics()), "inferwatch_producers") == WORKERS
    finally:
        stop_process(app)

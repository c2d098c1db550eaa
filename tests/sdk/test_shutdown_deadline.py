"""Issue 28: shutdown(timeout=T) takes at most about T, not 2T, when the sender is stuck."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import inferwatch
from inferwatch import _core


def test_shutdown_keeps_one_deadline_when_the_sender_is_stuck(sock_dir: Path) -> None:
    assert inferwatch.configure(service="svc", sidecar=f"unix://{sock_dir}/absent.sock", flush_interval_ms=10)
    rt = _core._rt
    assert rt is not None
    s = rt.sender
    held = threading.Event()
    release = threading.Event()
    real = s._cycle

    def stuck() -> None:  # the sender thread's own cycle blocked in a send, holding the sender's lock
        if threading.current_thread() is s.thread:
            held.set()
            release.wait(10)
        real()

    s._cycle = stuck  # type: ignore[method-assign]
    inferwatch.record(features={"x": 1.0})
    rt.wake.set()
    assert held.wait(5)
    try:
        t0 = time.monotonic()
        assert inferwatch.shutdown(timeout=1.0) is False
        took = time.monotonic() - t0
    finally:
        release.set()
        s.thread.join(5)
        s.close()  # the stuck cycle ran after shutdown gave up on it
    assert took < 1.6, took  # it waited for the thread, then as long again for the lock: 2 s

"""Run ``inferwatch loadtest`` in process and read its ``--json`` document (the real-server tests use it)."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from inferwatch_sidecar.cli import main

STEP_KEYS = {"concurrency", "throughput_rps", "latency_p50_s", "latency_p99_s", "ttft_p99_s", "errors",
             "goodput_ratio"}


def loadtest_json(*args: str) -> tuple[dict[str, Any], str]:
    """The JSON document of ``inferwatch loadtest ARGS --json`` and its stderr; asserts it exited 0."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["loadtest", *args, "--json", "--no-progress"])
    assert rc == 0, err.getvalue()
    doc = json.loads(out.getvalue())
    assert set(doc) == {"steps", "knee"} and all(set(s) == STEP_KEYS for s in doc["steps"]), doc
    return doc, err.getvalue()

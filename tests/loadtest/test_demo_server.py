"""``inferwatch loadtest --sidecar`` against the demo's FastAPI server, instrumented, with a real sidecar.

The demo server (uvicorn, one worker) sends its requests' stages to the sidecar; each load-test step is
joined with the sidecar's stage means over the step, and the capacity component reports the requests in
flight it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.loadtest.sidecar_view import stage_means
from tests.helpers.net import free_port
from tests.helpers.sidecar import REPO, parse_metrics, sample, total, wait_until
from tests.loadtest.helpers import loadtest_json


def test_loadtest_joins_the_demo_server_with_its_sidecar(sidecar_factory: Any, tmp_path: Path) -> None:
    sc = sidecar_factory()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    env.update({"INFERWATCH_SIDECAR": "unix://" + sc.sock, "INFERWATCH_SERVICE": "demo",
                "INFERWATCH_MODEL": mdl.NAME, "INFERWATCH_MODEL_VERSION": "v1",
                "INFERWATCH_DEMO_STATE_DIR": str(tmp_path), "INFERWATCH_DEMO_ERROR_SHARE": "0",
                "INFERWATCH_DEMO_SHED_SHARE": "0"})
    app = subprocess.Popen([sys.executable, "-m", "uvicorn", "inferwatch_sidecar.demo.server:app", "--host",
                            "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(up, timeout=60, what="the demo server up")
        row = mdl.sample(1, np.random.default_rng(0)).row(0)
        before = parse_metrics(sc.metrics())
        doc, err = loadtest_json(f"http://127.0.0.1:{port}/predict", "--body", json.dumps({"features": row}),
                                 "--concurrency", "1,4", "--requests", "20", "--duration", "20",
                                 "--sidecar", sc.url)
        lab = {"service": "demo", "model": mdl.NAME, "model_version": "v1"}

        def counted() -> dict[Any, float] | None:
            m = parse_metrics(sc.metrics())
            return m if sample(m, "inferwatch_requests_total", **lab, outcome="ok") >= 41 else None

        after = wait_until(counted, timeout=30, what="the load test's requests counted")
    finally:
        app.terminate()
        app.wait(30)
    assert [s["errors"] for s in doc["steps"]] == [0, 0]
    # every request the load test sent (20 a step and the preflight one) reached the sidecar, once
    assert total(after, "inferwatch_requests_total", **lab) - total(before, "inferwatch_requests_total", **lab) == 41
    assert err.count("server: ") == 2 and "inference" in err and "queue" in err
    means = stage_means(before, after)
    assert {"ingress", "preprocess", "queue", "inference", "postprocess"} <= set(means)
    # the server's end-to-end mean is below the client's median latency at concurrency 1 plus the network
    assert 0 < means["request"] <= doc["steps"][1]["latency_p99_s"]

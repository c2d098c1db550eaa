"""``inferwatch canary --sidecar URL``: the table a pipeline or a person reads, line by line.

The status is a real canary component's (two canaries: a busier canary whose latency is inconclusive, and one
with 5x the errors, first pending, then failed), served over HTTP as a sidecar serves it; the CLI's output is
checked whole: the verdict line, the header, every metric's statistic and unit, ``why:`` and ``warning:``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.canary.component import CanaryComponent
from inferwatch_sidecar.components.canary.config import CanaryConfig
from inferwatch_sidecar.components.canary.judge import STATISTICS
from tests.components.canary.helpers import traffic
from tests.components.canary.test_llm_judge import loaded_traffic


class _Status:
    """Serves ``{"components": {"canary": <status>}}`` at /v1/status."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = json.dumps(outer.doc).encode()
                self.send_response(200 if self.path == "/v1/status" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def served() -> Iterator[_Status]:
    s = _Status()
    yield s
    s.server.shutdown()
    s.server.server_close()


def _component(now: list[float]) -> CanaryComponent:
    c = CanaryComponent(CanaryConfig(min_requests=500, baselines={"llm": "v1", "m": "v1"}),
                        ComponentContext(clock=lambda: now[0], monotonic=lambda: now[0]))
    rng = np.random.default_rng(7)
    b = loaded_traffic(rng, "v1", 1600, rho=0.4)
    m1 = traffic(rng, "v1", 3600)
    for producer, events in ((1, b[:800]), (2, b[800:]), (3, loaded_traffic(rng, "v2", 1500, rho=0.75)),
                             (4, m1[:2400]), (5, m1[2400:4800]), (6, m1[4800:]),  # 1200 requests per replica each
                             (7, traffic(rng, "v2", 1200, error_rate=0.05))):
        for i in range(0, len(events), 64):
            c.handle(producer, producer, events[i:i + 64])
    return c


def test_the_table_names_statistics_units_reasons_and_warnings(served: _Status, capsys: Any) -> None:
    now = [1_700_000_000.0]
    c = _component(now)
    c.drain(now[0])
    c.evaluate(now[0])
    served.doc = {"components": {"canary": {"state": "running", **c.status()}}}
    assert main(["canary", "--sidecar", served.url]) == 0  # nothing reported fail yet: both marginal
    out = capsys.readouterr().out
    blocks = out.split("\n\n")
    llm = next(b for b in blocks if b.startswith("llm (chat): v2 against stable v1: MARGINAL, score "))
    errs = next(b for b in blocks if b.startswith("m (svc): v2 against stable v1: MARGINAL, score "))
    lines = llm.splitlines()
    header = lines[1].split()
    assert header == ["metric", "statistic", "unit", "direction", "stable", "canary", "effect", "tolerance", "adj.", "p",
                      "result"]
    # Every metric row: its statistic and unit, as the judge names them (columns are padded, so search in order).
    st = {j["model"]: j for j in c.status()["judgements"]}
    rows = {ln.split()[0]: ln for ln in lines[2:] if not ln.strip().startswith(("why:", "warning:"))}
    for m in st["llm"]["metrics"]:
        label = m["name"] + (f"[{m['stage']}]" if m["stage"] else "")
        row = rows[label]
        statistic, unit = STATISTICS[m["name"]]
        assert row.index(statistic) < row.index(unit, row.index(statistic) + len(statistic)), (row, statistic, unit)
        assert row.rstrip().endswith(m["result"]), row
    assert rows["ttft"].split()[1] == "*" and rows["ttft"].rstrip().endswith("inconclusive")
    assert "Mann-Whitney U" in rows["ttft"] and "s (median)" in rows["ttft"]
    assert "Fisher exact" in rows["cancel_rate"] and "share" in rows["cancel_rate"]
    # The warnings, each on its own line, word for word.
    warned = [ln.strip().removeprefix("warning: ") for ln in lines if ln.strip().startswith("warning:")]
    assert warned == st["llm"]["warnings"] and len(warned) == 2
    assert warned[0].startswith("load per replica differs 1.88x (stable 800 requests on 2 replica(s), canary 1500 "
                                "on 1)")
    assert warned[1].startswith("inconclusive: ") and "busier ones" in warned[1]
    assert not any(ln.strip().startswith("why:") for ln in lines)  # nothing failed
    # The error canary: the judge fails it, the report holds it back, and says so.
    elines = errs.splitlines()
    assert [ln.strip() for ln in elines if ln.strip().startswith("why:")] == [f"why: {r}" for r in st["m"]["reasons"]]
    assert any(ln.strip().startswith("why: error_rate: increase ") for ln in elines)
    assert [ln.strip() for ln in elines if ln.strip().startswith("warning:")] == [
        "warning: failing since 2023-11-14 22:13:20 UTC: reported fail once it has failed for 60 s without a break "
        "(canary.fail_after_s), marginal until then"]
    assert "error_rate *" in errs and "Fisher exact" in errs
    assert out.rstrip().endswith("* critical: its failure fails the canary whatever the score")
    # 70 s of failing judgements later: reported fail, exit status 1, no pending warning.
    for t in range(10, 71, 10):
        now[0] = 1_700_000_000.0 + t
        c.drain(now[0])
        c.evaluate(now[0])
    served.doc = {"components": {"canary": {"state": "running", **c.status()}}}
    assert main(["canary", "--sidecar", served.url, "--model", "m"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("m (svc): v2 against stable v1: FAIL, score ") and "warning:" not in out
    assert "llm (chat)" not in out
    # --json: the judgements as the status holds them.
    assert main(["canary", "--sidecar", served.url, "--json", "--model", "llm"]) == 0
    (j,) = json.loads(capsys.readouterr().out)
    assert j["verdict"] == "marginal" and j["warnings"] == st["llm"]["warnings"]

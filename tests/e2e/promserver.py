"""A real Prometheus server on loopback, for end-to-end tests.

The process handling (config, start, readiness, stop) is the demo's
``DemoPrometheus``, so the demo and the tests run Prometheus the same way;
this adds context-manager use and small helpers over Prometheus's HTTP API.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from inferwatch_sidecar.demo.prom import DemoPrometheus


class PrometheusServer(DemoPrometheus):
    """One Prometheus process scraping ``targets`` every ``interval``.

    Args:
        binary: path to the prometheus binary.
        targets: ``host:port`` strings to scrape at ``/metrics``.
        rule_files: rule files to load.
        interval: scrape and rule evaluation interval, e.g. ``"1s"``.
    """

    def __init__(self, binary: str, targets: list[str], rule_files: list[Path] | None = None, interval: str = "1s"):
        super().__init__(binary, targets, [Path(p).resolve() for p in rule_files or []], interval)

    def log(self) -> str:
        return self.log_tail(4000)

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP API -------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{q}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus API {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; returns the result vector."""
        data = self.api("query", query=expr)
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def alert_states(self) -> dict[str, str]:
        """Alert name -> the 'highest' state among its instances (firing > pending)."""
        out: dict[str, str] = {}
        for a in self.alerts():
            name = a["labels"]["alertname"]
            if out.get(name) != "firing":
                out[name] = a["state"]
        return out

    def firing(self, alertname: str, **match: str) -> bool:
        """Whether an instance of ``alertname`` whose labels include ``match`` is firing now."""
        return any(
            a["labels"].get("alertname") == alertname and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in match.items())
            for a in self.alerts()
        )

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

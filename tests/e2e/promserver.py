"""A real Prometheus server on loopback, for end-to-end tests.

Starts Debian's ``prometheus`` binary with a generated config (short scrape and
evaluation intervals, the given rule files), waits until it is ready, and
offers small helpers over its HTTP API.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port


class PrometheusServer:
    """One Prometheus process scraping ``targets`` every ``interval``.

    Args:
        binary: path to the prometheus binary.
        targets: ``host:port`` strings to scrape at ``/metrics``.
        rule_files: rule files to load.
        interval: scrape and rule evaluation interval, e.g. ``"1s"``.
    """

    def __init__(self, binary: str, targets: list[str], rule_files: list[Path] | None = None, interval: str = "1s"):
        self.binary = binary
        self.targets = targets
        self.rule_files = [Path(p).resolve() for p in rule_files or []]
        self.interval = interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = tempfile.TemporaryDirectory(prefix="iw-prom-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = Path(self._tmp.name) / "prometheus.log"

    def start(self, timeout: float = 20.0) -> PrometheusServer:
        cfg = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "inferwatch",
                    "scrape_interval": self.interval,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }
        cfg_path = Path(self._tmp.name) / "prometheus.yml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={cfg_path}",
                    f"--storage.tsdb.path={Path(self._tmp.name) / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--enable-feature=exemplar-storage",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._tmp.cleanup()

    def __enter__(self) -> PrometheusServer:
        return self.start()

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

"""A real Alertmanager on loopback behind a real Prometheus, and a webhook receiver, for the alert tests.

- :func:`alertmanager_binaries`: Debian's ``prometheus-alertmanager`` (upstream names it
  ``alertmanager``) and ``amtool``; missing, they skip a test locally and fail it in CI.
- :func:`fast_config`: ``alerts/alertmanager.yml`` with every receiver's webhook pointed at the test's
  receiver (path = receiver name) and the timings shortened; routes, grouping and inhibitions as shipped.
- :class:`AlertmanagerServer`: the process, with clustering off and its storage in a temporary directory.
- :class:`WebhookReceiver`: ``http.server`` on loopback keeping every notification, at most
  :data:`MAX_NOTIFICATIONS`.
- :class:`AlertingPrometheus`: the tests' Prometheus, sending its alerts to an Alertmanager.
"""

from __future__ import annotations

import copy
import json
import shutil
import signal
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch_sidecar.demo.supervise import Process, free_port, wait_ready
from tests.conftest import IN_CI
from tests.e2e.promserver import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "alerts" / "alertmanager.yml"
#: A test that receives more notifications than this has a flapping alert or a loop; it fails.
MAX_NOTIFICATIONS = 500
#: The model that has its own route (and team) in alerts/alertmanager.yml: the demo's.
TEAM_MODEL = "credit-risk"
#: The timings a test's copy of the config uses (the shipped ones are minutes and hours).
FAST_TIMINGS = {"group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"}
#: How long after the last expected notification a test waits for anything else to arrive: 3 group intervals.
GRACE_S = 3 * 2.0


def alertmanager_binaries() -> tuple[str, str]:
    """(alertmanager, amtool). Locally a missing one skips the test; in CI (CI=true) it fails it."""
    am = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    amtool = shutil.which("amtool")
    if am is None or amtool is None:
        msg = "alertmanager/amtool are not on PATH (install Debian's 'prometheus-alertmanager' package)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return am, amtool


def load_config() -> dict[str, Any]:
    """The shipped configuration (a fresh copy)."""
    return copy.deepcopy(yaml.safe_load(CONFIG.read_text(encoding="utf-8")))


def fast_config(receiver_url: str) -> dict[str, Any]:
    """The shipped configuration, with each webhook sent to ``receiver_url/<receiver name>`` and short timings.

    Raises:
        AssertionError: a receiver does not have exactly one webhook (the rewrite would miss it).
    """
    cfg = load_config()
    for r in cfg["receivers"]:
        hooks = r.get("webhook_configs", [])
        assert len(hooks) == 1 and set(r) == {"name", "webhook_configs"}, f"receiver {r['name']}: one webhook only"
        hooks[0]["url"] = f"{receiver_url}/{r['name']}"

    def shorten(route: dict[str, Any]) -> None:
        for key, value in FAST_TIMINGS.items():
            if key in route:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(cfg["route"])
    return cfg


class AlertmanagerServer:
    """One Alertmanager process on 127.0.0.1 with ``config``.

    Args:
        binary: the alertmanager executable.
        config: the configuration (written into its directory).
    """

    def __init__(self, binary: str, config: dict[str, Any]) -> None:
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="iw-am-"))
        self.config_path = self.dir / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.proc: Process | None = None

    def start(self, timeout: float = 30.0) -> AlertmanagerServer:
        argv = [self.binary, f"--config.file={self.config_path}", f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="]
        self.proc = Process("alertmanager", argv, None, self.dir / "alertmanager.log")
        wait_ready(self.proc, f"{self.url}/-/ready", time.monotonic() + timeout)
        return self

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds, with ``status.state`` (active, suppressed) and ``status.inhibitedBy``."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as r:
            return list(json.loads(r.read()))

    def log(self) -> str:
        return self.proc.log_tail(4000) if self.proc is not None else ""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> AlertmanagerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Notification:
    """One webhook call: the receiver it was routed to (the URL path) and Alertmanager's payload."""

    receiver: str
    payload: dict[str, Any]

    @property
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.payload["alerts"])


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that records every POSTed notification (at most :data:`MAX_NOTIFICATIONS`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: list[Notification] = []
        self.overflowed = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with owner._lock:
                    full = len(owner._got) >= MAX_NOTIFICATIONS
                    if full:
                        owner.overflowed = True
                    else:
                        owner._got.append(Notification(self.path.lstrip("/"), json.loads(body)))
                self.send_response(500 if full else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def notifications(self) -> list[Notification]:
        with self._lock:
            return list(self._got)

    def firing(self) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
        """(receiver, alertname, sorted labels) of every alert some notification reported as firing."""
        return {(n.receiver, a["labels"]["alertname"], tuple(sorted(a["labels"].items())))
                for n in self.notifications() for a in n.alerts if a["status"] == "firing"}

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class AlertingPrometheus(PrometheusServer):
    """The tests' Prometheus (same process handling as the demo's), with ``alertmanager_url`` as its Alertmanager.

    The demo's Prometheus writes its own configuration; this adds the ``alerting`` section to it and
    reloads it (SIGHUP), then waits until Prometheus reports the Alertmanager as active.
    """

    def __init__(self, binary: str, targets: list[str], rule_files: list[Path], alertmanager_url: str,
                 interval: str = "1s") -> None:
        super().__init__(binary, targets, rule_files, interval)
        self.alertmanager_url = alertmanager_url

    def start(self, timeout: float = 30.0) -> AlertingPrometheus:
        super().start(timeout)
        assert self.proc is not None
        path = self.dir / "prometheus.yml"
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
        host = self.alertmanager_url.removeprefix("http://")
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [host]}]}]}
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        self.proc.p.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        want = f"{self.alertmanager_url}/api/v2/alerts"
        while not any(a["url"] == want for a in self.api("alertmanagers")["activeAlertmanagers"]):
            self.proc.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not take Alertmanager {host}:\n{self.log()}")
            time.sleep(0.2)
        return self

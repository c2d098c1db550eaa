"""Run Alertmanager for the demo: the checkout's ``alerts/alertmanager.yml``, fast, with a loopback receiver.

- :func:`alertmanager_binary`: Debian's ``prometheus-alertmanager`` (upstream names it ``alertmanager``).
- :func:`fast_config`: the shipped configuration with every receiver's webhook pointed at a local
  receiver (path = receiver name) and the timings shortened to seconds; routes, grouping and
  inhibitions stay as shipped.
- :class:`WebhookReceiver`: ``http.server`` on loopback in the demo process, keeping every
  notification (at most :data:`MAX_NOTIFICATIONS`).
- :class:`DemoAlertmanager`: the process, with clustering off and its storage in a temporary directory.

Prometheus sends to it through :class:`~inferwatch_sidecar.demo.prom.DemoPrometheus`'s
``alertmanagers`` argument.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from inferwatch_sidecar.demo.prom import REPO_ROOT
from inferwatch_sidecar.demo.supervise import Process, free_port, wait_ready

#: The example configuration in a source checkout.
CONFIG = REPO_ROOT / "alerts" / "alertmanager.yml"
#: More notifications than this means a flapping alert or a loop: the rest are refused (HTTP 500) and counted.
MAX_NOTIFICATIONS = 500
#: The timings of the fast copy (the shipped ones are minutes and hours).
FAST_TIMINGS = {"group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"}
#: The executables Alertmanager goes by: Debian's package name first.
BINARIES = ("prometheus-alertmanager", "alertmanager")


def alertmanager_binary() -> str | None:
    """The Alertmanager executable on PATH, or None."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def load_config(path: Path = CONFIG) -> dict[str, Any]:
    """The shipped configuration (a fresh copy).

    Raises:
        FileNotFoundError: not running from a source checkout.
    """
    return copy.deepcopy(yaml.safe_load(path.read_text(encoding="utf-8")))


def fast_config(receiver_url: str, path: Path = CONFIG) -> dict[str, Any]:
    """The configuration at ``path``, each webhook sent to ``receiver_url/<receiver name>``, timings in seconds.

    Raises:
        ValueError: a receiver does not have exactly one webhook and nothing else (the rewrite would miss
            a notification channel).
    """
    cfg = load_config(path)
    for r in cfg["receivers"]:
        hooks = r.get("webhook_configs", [])
        if len(hooks) != 1 or set(r) != {"name", "webhook_configs"}:
            raise ValueError(f"{path}: receiver {r['name']!r} must have exactly one webhook and nothing else")
        hooks[0]["url"] = f"{receiver_url}/{r['name']}"

    def shorten(route: dict[str, Any]) -> None:
        for key, value in FAST_TIMINGS.items():
            if key in route:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(cfg["route"])
    return cfg


@dataclass(frozen=True)
class Notification:
    """One webhook call: the receiver it was routed to (the URL path) and Alertmanager's payload."""

    receiver: str
    payload: dict[str, Any]

    @property
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.payload["alerts"])


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that records every POSTed notification (at most :data:`MAX_NOTIFICATIONS`).

    A body that is not a JSON object with an ``alerts`` list is answered 400 and counted in :attr:`rejected`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: list[Notification] = []
        self.overflowed = False
        self.rejected = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    payload = json.loads(body)
                    ok = isinstance(payload, dict) and isinstance(payload.get("alerts"), list)
                except ValueError:
                    ok = False
                with owner._lock:
                    full = ok and len(owner._got) >= MAX_NOTIFICATIONS
                    if not ok:
                        owner.rejected += 1
                    elif full:
                        owner.overflowed = True
                    else:
                        owner._got.append(Notification(self.path.lstrip("/"), payload))
                self.send_response(400 if not ok else 500 if full else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="iw-demo-webhook", daemon=True)
        self._started = False

    def start(self) -> WebhookReceiver:
        self._thread.start()
        self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._httpd.shutdown()
            self._started = False
        self._httpd.server_close()

    def notifications(self) -> list[Notification]:
        with self._lock:
            return list(self._got)

    def firing(self) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
        """(receiver, alertname, sorted labels) of every alert some notification reported as firing."""
        return {(n.receiver, a["labels"]["alertname"], tuple(sorted(a["labels"].items())))
                for n in self.notifications() for a in n.alerts if a["status"] == "firing"}

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DemoAlertmanager:
    """One Alertmanager process on 127.0.0.1 with ``config``, clustering off.

    Args:
        binary: the alertmanager executable.
        config: the configuration (written into its directory).
    """

    def __init__(self, binary: str, config: dict[str, Any]) -> None:
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="iw-demo-am-"))
        self.config_path = self.dir / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.proc: Process | None = None

    @property
    def target(self) -> str:
        """``host:port``, for Prometheus's ``alerting.alertmanagers`` section."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> DemoAlertmanager:
        """Start Alertmanager and wait until it is ready.

        Raises:
            supervise.ProcessError: it exited, or was not ready within ``timeout`` seconds.
        """
        argv = [self.binary, f"--config.file={self.config_path}", f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address={self.target}", "--cluster.listen-address="]
        self.proc = Process("alertmanager", argv, None, self.dir / "alertmanager.log")
        wait_ready(self.proc, f"{self.url}/-/ready", time.monotonic() + timeout)
        return self

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds, with ``status.state`` (active, suppressed) and ``status.inhibitedBy``."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as r:
            return list(json.loads(r.read()))

    def log_tail(self, n: int = 4000) -> str:
        return self.proc.log_tail(n) if self.proc is not None else ""

    def stop(self) -> None:
        """Stop Alertmanager and remove its directory."""
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> DemoAlertmanager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""A real Alertmanager on loopback behind a real Prometheus, and a webhook receiver, for the alert tests.

The process handling, the fast copy of ``alerts/alertmanager.yml`` and the receiver are the demo's
(:mod:`inferwatch_sidecar.demo.alertmanager`), so the demo and the tests run Alertmanager the same way;
this adds what only the tests need:

- :func:`alertmanager_binaries`: Alertmanager and ``amtool``; missing, they skip a test locally and fail
  it in CI.
- :class:`AlertmanagerServer`: the demo's Alertmanager with the tests' helper names.
- :class:`AlertingPrometheus`: the tests' Prometheus, sending its alerts to an Alertmanager.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inferwatch_sidecar.demo.alertmanager import (
    CONFIG,
    FAST_TIMINGS,
    MAX_NOTIFICATIONS,
    DemoAlertmanager,
    Notification,
    WebhookReceiver,
    alertmanager_binary,
    fast_config,
    load_config,
)
from tests.conftest import IN_CI
from tests.e2e.promserver import PrometheusServer

__all__ = [
    "CONFIG", "FAST_TIMINGS", "GRACE_S", "MAX_NOTIFICATIONS", "ROOT", "TEAM_MODEL", "AlertingPrometheus",
    "AlertmanagerServer", "Notification", "WebhookReceiver", "alertmanager_binaries", "fast_config", "load_config",
]

ROOT = Path(__file__).resolve().parents[2]
#: The model that has its own route (and team) in alerts/alertmanager.yml: the demo's.
TEAM_MODEL = "credit-risk"
#: How long after the last expected notification a test waits for anything else to arrive: 3 group intervals.
GRACE_S = 3 * 2.0


def alertmanager_binaries() -> tuple[str, str]:
    """(alertmanager, amtool). Locally a missing one skips the test; in CI (CI=true) it fails it."""
    am = alertmanager_binary()
    amtool = shutil.which("amtool")
    if am is None or amtool is None:
        msg = "alertmanager/amtool are not on PATH (install Debian's 'prometheus-alertmanager' package)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return am, amtool


class AlertmanagerServer(DemoAlertmanager):
    """The demo's Alertmanager process; :meth:`log` is the end of its log."""

    def log(self) -> str:
        return self.log_tail(4000)


class AlertingPrometheus(PrometheusServer):
    """The tests' Prometheus with ``alertmanager_url`` as its Alertmanager; :meth:`start` waits until it is active."""

    def __init__(self, binary: str, targets: list[str], rule_files: list[Path], alertmanager_url: str,
                 interval: str = "1s") -> None:
        super().__init__(binary, targets, rule_files, interval)
        self.alertmanagers = [alertmanager_url.removeprefix("http://")]

    def __enter__(self) -> AlertingPrometheus:
        self.start()
        return self

    def start(self, timeout: float = 30.0) -> AlertingPrometheus:
        super().start(timeout)
        return self

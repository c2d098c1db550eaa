"""What the runner sees at each poll: the sidecar's ``/metrics`` and ``/v1/status``, Prometheus's alerts, and
the notifications Alertmanager delivered.

:class:`Observer` turns each poll into a :class:`Snapshot`, which the judge,
the live view and the progress line read. Stage quantiles are over the last
10 s of scrapes, like a ``histogram_quantile(rate(...[10s]))``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferwatch_sidecar.demo import promtext
from inferwatch_sidecar.demo.alertmanager import Notification, WebhookReceiver
from inferwatch_sidecar.demo.inject import FaultState
from inferwatch_sidecar.demo.loadgen import LoadGenerator
from inferwatch_sidecar.export.live_view import WINDOW_S, Poller, SidecarView, drift_by_version, stage_quantiles

__all__ = ["ALERTS_SETTLE_S", "WINDOW_S", "Observer", "Snapshot", "drift_by_version", "stage_quantiles"]

#: Seconds after Prometheus's first successful scrape before its alerts count (rules need an evaluation).
ALERTS_SETTLE_S = 3.0


@dataclass
class Snapshot(SidecarView):
    """What the runner saw at one poll (what the live view shows): the sidecar's view (:class:`SidecarView`:
    stages, GPU, canary, tail, drift, latency, verdicts) and the demo's own.

    Attributes:
        faults: fault name -> FaultState.
        alerts: alert name -> state ("pending"/"firing"), from Prometheus.
        alert_items: Prometheus's alerts, with their labels.
        notifications: every notification Alertmanager delivered so far (with an Alertmanager).
        load: the load generator's counters, and the sidecar's count of producers.
        phase: "baseline", "faults" or "done".
    """

    faults: dict[str, FaultState] = field(default_factory=dict)
    alerts: dict[str, str] = field(default_factory=dict)
    alert_items: list[dict[str, Any]] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)
    load: dict[str, int] = field(default_factory=dict)
    phase: str = "baseline"


class Observer:
    """Polls the sidecar (and Prometheus, when there is one) into snapshots.

    Args:
        sidecar_url: the sidecar's HTTP address.

    Attributes:
        alerts_seen: alert name -> every state Prometheus showed it in.
    """

    def __init__(self, sidecar_url: str) -> None:
        self.sidecar_url = sidecar_url
        self.alerts_seen: dict[str, set[str]] = {}
        self._poller = Poller(sidecar_url)
        self._prom_scraped_at: float | None = None

    def poll(self, t: float, faults: dict[str, FaultState], loadgen: LoadGenerator | None,
             prometheus_url: str | None,
             receiver: WebhookReceiver | None = None) -> tuple[Snapshot, promtext.Scrape | None]:
        """Read everything at ``t`` (seconds since the sidecar started).

        Args:
            t: the poll's time.
            faults: the faults' records, shown in the snapshot.
            loadgen: the load generator, for its counters (None before the load starts).
            prometheus_url: Prometheus's address, for alert states (None: no alert states).
            receiver: the webhook receiver Alertmanager delivers to (None: no notifications).

        Returns:
            The snapshot, and the sidecar's scrape (None when the sidecar did not answer: the snapshot's
            ``errors`` say why).
        """
        snap = Snapshot(t, faults=faults)
        if receiver is not None:
            snap.notifications = receiver.notifications()
        _, scrape, _ = self._poller.poll(t, snap)
        if scrape is None:
            return snap, None
        if loadgen is not None:
            snap.load = loadgen.snapshot()
        snap.load["producers"] = int(scrape.value("inferwatch_producers", 0) or 0)
        if prometheus_url is not None:
            self._read_alerts(snap, prometheus_url)
        return snap, scrape

    def _read_alerts(self, snap: Snapshot, prometheus_url: str) -> None:
        if self._prom_scraped_at is None:
            # Until the first scrape (and the evaluation after it), absent(up) alerts are pending by
            # construction: not a finding.
            try:
                up = promtext.fetch_json(f"{prometheus_url}/api/v1/query?query=up")["data"]["result"]
                if any(r["value"][1] == "1" for r in up):
                    self._prom_scraped_at = snap.t
            except (OSError, ValueError, KeyError) as e:
                snap.errors.append(f"prometheus: {e}")
        if self._prom_scraped_at is not None and snap.t - self._prom_scraped_at >= ALERTS_SETTLE_S:
            try:
                items = promtext.fetch_json(f"{prometheus_url}/api/v1/alerts")["data"]["alerts"]
                snap.alert_items = items
                for a in items:
                    name = a["labels"]["alertname"]
                    self.alerts_seen.setdefault(name, set()).add(a["state"])
                    if snap.alerts.get(name) != "firing":
                        snap.alerts[name] = a["state"]
            except (OSError, ValueError, KeyError) as e:
                snap.errors.append(f"prometheus: {e}")

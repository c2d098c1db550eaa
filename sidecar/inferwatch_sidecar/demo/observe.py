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

#: Seconds of scrapes the stage quantiles are computed over.
WINDOW_S = 10.0
#: Seconds after Prometheus's first successful scrape before its alerts count (rules need an evaluation).
ALERTS_SETTLE_S = 3.0


@dataclass
class Snapshot:
    """What the runner saw at one poll (what the live view shows).

    Attributes:
        t: seconds since the sidecar started.
        stages: stage -> {0.5, 0.99, 0.999: seconds or None, "rate": calls/s} over the last 10 s.
        gpu: devices and processes from /v1/status, with leak verdicts.
        canary: the canary judge's judgements from /v1/status (verdict, score, metrics, reasons).
        tail: (model, version) -> the tail attribution of the last complete window, from /v1/status.
        drift: (model, version) -> {"features": {name: {"drifted", "scores", "p"}},
            "confidence": [current mean, reference mean], ...} (see :func:`drift_by_version`).
        faults: fault name -> FaultState.
        alerts: alert name -> state ("pending"/"firing"), from Prometheus.
        alert_items: Prometheus's alerts, with their labels.
        notifications: every notification Alertmanager delivered so far (with an Alertmanager).
        load: the load generator's counters, and the sidecar's count of producers.
        phase: "baseline", "faults" or "done".
        errors: what could not be read at this poll.
    """

    t: float
    stages: dict[str, dict[Any, Any]] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    canary: list[dict[str, Any]] = field(default_factory=list)
    tail: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    drift: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    faults: dict[str, FaultState] = field(default_factory=dict)
    alerts: dict[str, str] = field(default_factory=dict)
    alert_items: list[dict[str, Any]] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)
    load: dict[str, int] = field(default_factory=dict)
    phase: str = "baseline"
    errors: list[str] = field(default_factory=list)


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
        self._recent: list[promtext.Scrape] = []
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
        try:
            scrape = promtext.Scrape(promtext.fetch(f"{self.sidecar_url}/metrics"), t)
            status = promtext.fetch_json(f"{self.sidecar_url}/v1/status")
        except (OSError, ValueError) as e:
            snap.errors.append(f"sidecar: {e}")
            return snap, None
        self._recent.append(scrape)
        while len(self._recent) > 2 and self._recent[1].t <= t - WINDOW_S:
            self._recent.pop(0)
        old = self._recent[0] if len(self._recent) > 1 else None
        snap.stages = stage_quantiles(scrape, old)
        components = status.get("components") or {}
        snap.gpu = components.get("gpu") or {}
        snap.canary = (components.get("canary") or {}).get("judgements") or []
        snap.tail = {(m.get("model", ""), m.get("version", "")): m
                     for m in (components.get("tail") or {}).get("models") or []}
        snap.drift = drift_by_version(scrape)
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


def stage_quantiles(scrape: promtext.Scrape, old: promtext.Scrape | None) -> dict[str, dict[Any, Any]]:
    """Per stage, P50/P99/P99.9 and calls/s between ``old`` and ``scrape`` (since start without ``old``)."""
    name = "inferwatch_stage_duration_seconds"
    new_b = scrape.buckets(name, "stage")
    old_b = old.buckets(name, "stage") if old is not None else {}
    out: dict[str, dict[Any, Any]] = {}
    for stage, b in sorted(new_b.items()):
        d = promtext.delta(b, old_b.get(stage))
        q: dict[Any, Any] = dict(promtext.quantiles(d))
        dt = scrape.t - old.t if old is not None else 0.0
        q["rate"] = (max(d.values()) / dt) if dt > 0 and d else None
        out[stage] = q
    return out


def drift_by_version(scrape: promtext.Scrape) -> dict[tuple[str, str], dict[str, Any]]:
    """The drift component's gauges, by (model, version): per-feature scores and verdicts, and the summaries."""
    out: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(lab: dict[str, str]) -> dict[str, Any]:
        return out.setdefault((lab.get("model", ""), lab.get("model_version", "")),
                              {"features": {}, "confidence": [None, None]})

    for lab, v in scrape.get("inferwatch_drift_feature_drifted"):
        entry(lab)["features"].setdefault(lab["feature"], {})["drifted"] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_feature_score"):
        entry(lab)["features"].setdefault(lab["feature"], {}).setdefault("scores", {})[lab["measure"]] = v
    for lab, v in scrape.get("inferwatch_drift_feature_p_value"):
        entry(lab)["features"].setdefault(lab["feature"], {})["p"] = v
    for lab, v in scrape.get("inferwatch_drift_confidence_mean"):
        entry(lab)["confidence"][0 if lab.get("window") == "current" else 1] = v
    for lab, v in scrape.get("inferwatch_drift_dataset_drifted"):
        entry(lab)["dataset_drifted"] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_dataset_drifted_ratio"):
        entry(lab)["drifted_ratio"] = v
    for lab, v in scrape.get("inferwatch_drift_canary_drifted_ratio"):
        entry(lab)["canary_ratio"] = v
    for lab, v in scrape.get("inferwatch_drift_canary_feature_drifted"):
        entry(lab).setdefault("canary_columns", {})[lab["feature"]] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_estimated_accuracy_ratio"):
        entry(lab)["estimated_accuracy"] = v
    for lab, v in scrape.get("inferwatch_drift_estimated_accuracy_bound_ratio"):
        entry(lab).setdefault("estimated_interval", {})[lab["bound"]] = v
    for lab, v in scrape.get("inferwatch_drift_estimated_accuracy_calibrated"):
        entry(lab)["calibrated"] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_reference_accuracy_ratio"):
        entry(lab)["reference_accuracy"] = v
    for lab, v in scrape.get("inferwatch_drift_accuracy_ratio"):
        entry(lab)["accuracy"] = v
    for lab, v in scrape.get("inferwatch_drift_window_events"):
        entry(lab)["window_events"] = v
    for lab, v in scrape.get("inferwatch_drift_prediction_class_ratio"):
        entry(lab).setdefault("classes", {})[lab["class"]] = v
    return out

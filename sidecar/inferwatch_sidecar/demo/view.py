"""The demo's live terminal view (rich) and its plain-text progress line for ``--no-ui``."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from inferwatch_sidecar.demo import judge, report
from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.demo.config import KNOWN_FAULTS
from inferwatch_sidecar.demo.observe import Snapshot
from inferwatch_sidecar.demo.scenario import Scenario
from inferwatch_sidecar.export import live_view as live

GiB = 2**30
#: The model server's stages in request order: the stage table's rows.
STAGES = live.STAGES


def _stage_table(snap: Snapshot) -> Table:
    return live.stage_table(snap)


def _gpu_table(snap: Snapshot, sc: Scenario) -> Table:
    roles = {p: (mdl.CANARY if r == "canary" else mdl.STABLE) for r, pids in sc.worker_pids.items() for p in pids}
    return live.gpu_table(snap, roles, title="GPU memory (fake NVML)")


def _drift_table(snap: Snapshot) -> Table:
    versions = [v for v in (mdl.STABLE, mdl.CANARY) if (mdl.NAME, v) in snap.drift]
    return live.drift_table(snap, mdl.NAME, versions, [*mdl.NUMERIC_NAMES, mdl.CATEGORICAL_NAME, *live.OUTPUT_COLUMNS],
                            baseline=mdl.STABLE)


def _canary_table(snap: Snapshot) -> Table:
    return live.canary_table(snap, title="canary judge (inferwatch canary --sidecar URL)")


def _tail_text(snap: Snapshot) -> Text:
    return live.tail_text(snap, mdl.NAME)


def _fault_table(snap: Snapshot) -> Table:
    rows = []
    for name in KNOWN_FAULTS:
        st = snap.faults.get(name)
        if st is None:
            continue
        det = Text(f"{st.detected_at:.0f}s (+{st.latency_s:.0f}s)", style="bold green") if st.detected_at is not None \
            else Text("no" if st.injected_at is not None else "-", style="yellow" if st.injected_at else "dim")
        rows.append([report.FAULT_TITLES[name], "-" if st.injected_at is None else f"{st.injected_at:.0f}s", det,
                     st.detail])
    return live.table("faults and alerts", [("fault", "text"), ("injected", "num"), ("detected", "num"),
                                            ("evidence", "text")], rows)


def _alerts_text(snap: Snapshot, sc: Scenario) -> Text:
    if not sc.prometheus_url:
        return Text("Prometheus: not running (install the 'prometheus' package to see alert states)", style="dim")
    if not snap.alerts:
        return Text("Prometheus alerts: none pending or firing", style="green")
    out = Text("Prometheus alerts: ")
    for i, (name, state) in enumerate(sorted(snap.alerts.items())):
        if i:
            out.append(", ")
        out.append(f"{name} ({state})", style="bold red" if state == "firing" else "yellow")
    return out


def _notifications_table(snap: Snapshot) -> Table:
    rows: list[list[Any]] = [
        [d.receiver, d.alertname, Text(d.status, style="bold red" if d.statuses[-1] == "firing" else "green"),
         d.runbook_url] for d in report.delivered(snap.notifications)]
    if not rows:
        rows.append([Text("(none yet)", style="dim"), "", "", ""])
    return live.table("Alertmanager notifications (alerts/alertmanager.yml, timings in seconds)",
                      [("receiver", "text"), ("alert", "text"), ("status", "text"), ("runbook", "text")], rows)


def render(snap: Snapshot, sc: Scenario) -> Group:
    """The whole screen for one snapshot."""
    c = sc.cfg
    inj = c.injection_time()
    phase = (f"baseline: faults at {inj:.0f}s" if snap.phase == "baseline" else
             "faults injected" if snap.phase == "faults" else "finished")
    load = snap.load
    head = Text.assemble(
        ("inferwatch demo", "bold"), f"  t={snap.t:.0f}s of {c.duration_s:.0f}s  ", (phase, "cyan"),
        f"  requests: {load.get('predict_stable', 0)} v1, {load.get('predict_canary', 0)} canary, "
        f"{load.get('generate', 0)} streamed; labels {load.get('labels', 0)}; producers {load.get('producers', 0)}",
    )
    if sc.sidecar_url:
        head.append(f"\nstatus page {sc.sidecar_url}/  (the same view of any sidecar: inferwatch top --sidecar URL)")
    if snap.errors:
        head.append("\n" + "; ".join(snap.errors), style="red")
    parts: list[RenderableType] = [Panel(head), live.Pair(_stage_table(snap), _gpu_table(snap, sc)), _tail_text(snap),
                                   _drift_table(snap)]
    note = live.accuracy_note(snap, mdl.NAME)
    if note is not None:
        parts.append(note)
    cap = getattr(sc, "capacity", None)  # the live knee's headroom (issue 26): how it falls as requests pile up
    if cap is not None:
        parts.append(Text("\n".join(cap.lines())))
    parts += [_canary_table(snap), _fault_table(snap), _alerts_text(snap, sc)]
    if sc.receiver is not None:
        parts.append(_notifications_table(snap))
    return Group(*parts)


def progress_line(snap: Snapshot) -> str:
    """One line for ``--no-ui`` runs."""
    det = ", ".join(f"{n}{'+' if st.detected else '-'}" for n, st in snap.faults.items())
    inf = snap.stages.get("inference", {})
    firing = sorted(n for n, s in snap.alerts.items() if s == "firing")
    canary = judge.canary_verdict(snap)
    return (f"t={snap.t:5.1f}s {snap.phase:<8} requests={snap.load.get('predict_stable', 0)}+"
            f"{snap.load.get('predict_canary', 0)}+{snap.load.get('generate', 0)} "
            f"inference p99.9={report.seconds(inf.get(0.999))}{f' {canary}' if canary else ''} detected: {det}"
            + (f" firing: {', '.join(firing)}" if firing else "")
            + (f" notifications: {len(snap.notifications)}" if snap.notifications else ""))

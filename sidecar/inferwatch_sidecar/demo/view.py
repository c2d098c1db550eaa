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

GiB = 2**30
#: The model server's stages in request order: the stage table's rows.
STAGES = ("ingress", "preprocess", "queue", "inference", "postprocess")


def _stage_table(snap: Snapshot) -> Table:
    t = Table(title="stage latency, last 10 s", expand=True, title_justify="left")
    for h in ("stage", "calls/s", "P50", "P99", "P99.9"):
        t.add_column(h, justify="right" if h != "stage" else "left")
    order = [s for s in STAGES if s in snap.stages] + sorted(set(snap.stages) - set(STAGES))
    for stage in order:
        q = snap.stages[stage]
        rate = q.get("rate")
        p999 = q.get(0.999)
        style = "bold red" if p999 is not None and p999 > 1.0 else ""
        t.add_row(stage, "-" if rate is None else f"{rate:.1f}", report.seconds(q.get(0.5)),
                  report.seconds(q.get(0.99)), Text(report.seconds(p999), style=style))
    return t


def _gpu_table(snap: Snapshot, sc: Scenario) -> Table:
    t = Table(title="GPU memory (fake NVML)", expand=True, title_justify="left")
    for h in ("gpu / pid", "used", "leak verdict", "rate", "time to OOM"):
        t.add_column(h)
    roles = {p: (mdl.CANARY if r == "canary" else mdl.STABLE) for r, pids in sc.worker_pids.items() for p in pids}
    for dev in snap.gpu.get("devices", []):
        used, total = dev.get("used_bytes"), dev.get("total_bytes")
        leak = dev.get("leak") or {}
        t.add_row(f"gpu {dev.get('gpu')}", f"{(used or 0) / GiB:.1f} / {(total or 0) / GiB:.0f} GiB",
                  _verdict(leak.get("verdict")), report.rate(leak.get("rate_bytes_per_s")),
                  report.duration(leak.get("time_to_oom_s")))
        for p in dev.get("processes", []):
            t.add_row(f"  pid {p.get('pid')} {roles.get(p.get('pid'), '')}",
                      f"{(p.get('used_bytes') or 0) / GiB:.2f} GiB", _verdict(p.get("verdict")),
                      report.rate(p.get("rate_bytes_per_s")), report.duration(p.get("time_to_oom_s")))
    if not snap.gpu:
        t.add_row("(waiting for the sidecar)", "", "", "", "")
    return t


def _verdict(v: Any) -> Text:
    if v == "leak":
        return Text("LEAK", style="bold red")
    if v == "no_leak":
        return Text("ok", style="green")
    return Text(str(v or "-"), style="dim")


def _drift_table(snap: Snapshot) -> Table:
    t = Table(title=f"drift of {mdl.NAME} against its reference (score; * = drifted)", expand=True,
              title_justify="left")
    t.add_column("column")
    versions = [v for v in (mdl.STABLE, mdl.CANARY) if (mdl.NAME, v) in snap.drift]
    for v in versions:
        t.add_column(v, justify="right")
    names = [*mdl.NUMERIC_NAMES, mdl.CATEGORICAL_NAME, "prediction", "confidence"]
    for n in names:
        cells = []
        for v in versions:
            f = snap.drift[(mdl.NAME, v)]["features"].get(n, {})
            scores = f.get("scores", {})
            s = scores.get("wasserstein_norm", scores.get("psi"))
            txt = "-" if s is None else f"{s:.2f}"
            cells.append(Text(txt + (" *" if f.get("drifted") else ""), style="bold red" if f.get("drifted") else ""))
        t.add_row(n, *cells)
    for label, key in (("mean confidence (ref)", "confidence"),
                       ("estimated accuracy [95%] (ref)", "estimated_accuracy"),
                       ("accuracy (labels)", "accuracy"), ("share of inputs drifted", "drifted_ratio"),
                       ("canary: columns differing from v1", "canary_columns"), ("window events", "window_events")):
        values: list[str] = []
        for v in versions:
            d = snap.drift[(mdl.NAME, v)]
            if key == "canary_columns":
                cols = d.get("canary_columns")
                differ = sorted(c for c, x in (cols or {}).items() if x)
                values.append("-" if cols is None else ", ".join(differ) or "none")
            elif key == "confidence":
                cur, ref = d["confidence"]
                values.append("-" if cur is None else f"{cur:.3f} ({ref:.3f})" if ref is not None else f"{cur:.3f}")
            elif key == "estimated_accuracy":
                values.append(_estimate(d))
            else:
                x = d.get(key)
                values.append("-" if x is None else f"{x:.0f}" if key == "window_events" else f"{x:.1%}")
        t.add_row(Text(label, style="italic"), *values)
    return t


def _estimate(d: dict[str, Any]) -> str:
    """The accuracy estimate: calibrated with its interval and the reference accuracy, or marked uncalibrated."""
    x = d.get("estimated_accuracy")
    if x is None:
        return "-"
    if not d.get("calibrated"):
        return f"{x:.1%} (mean confidence, uncalibrated)"
    iv = d.get("estimated_interval", {})
    ref = d.get("reference_accuracy")
    return (f"{x:.1%} [{iv.get('lower', float('nan')):.1%}-{iv.get('upper', float('nan')):.1%}]"
            + (f" ({ref:.1%})" if ref is not None else ""))


def _canary_table(snap: Snapshot) -> Table:
    t = Table(title="canary judge (inferwatch canary --sidecar URL)", expand=True, title_justify="left")
    for h in ("canary", "verdict", "score", "requests", "why"):
        t.add_column(h)
    for j in snap.canary:
        v = j.get("verdict", "-")
        style = {"pass": "green", "marginal": "yellow", "fail": "bold red"}.get(v, "")
        t.add_row(f"{j.get('canary_version')} vs {j.get('baseline_version')}", Text(v.upper(), style=style),
                  f"{j.get('score', 0):.0f}/100", f"{j.get('canary_requests')} vs {j.get('baseline_requests')}",
                  "; ".join(j.get("reasons", [])) or "-")
    if not snap.canary:
        t.add_row(Text("(no canary with enough requests yet)", style="dim"), "", "", "", "")
    return t


def _tail_text(snap: Snapshot) -> Text:
    out = Text("why the slowest 1% is slow (tail attribution, last window): ", style="bold")
    sentences = [f"{ver}: {s}" for (model, ver) in sorted(snap.tail) if model == mdl.NAME
                 for _, _, s in [judge.tail_summary(snap, ver)] if s]
    out.append("; ".join(sentences) if sentences else "no window with a slowest 1% yet",
               style="" if sentences else "dim")
    return out


def _fault_table(snap: Snapshot) -> Table:
    t = Table(title="faults and alerts", expand=True, title_justify="left")
    for h in ("fault", "injected", "detected", "evidence"):
        t.add_column(h)
    for name in KNOWN_FAULTS:
        st = snap.faults.get(name)
        if st is None:
            continue
        det = Text(f"{st.detected_at:.0f}s (+{st.latency_s:.0f}s)", style="bold green") if st.detected_at is not None \
            else Text("no" if st.injected_at is not None else "-", style="yellow" if st.injected_at else "dim")
        t.add_row(report.FAULT_TITLES[name], "-" if st.injected_at is None else f"{st.injected_at:.0f}s", det, st.detail)
    return t


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
    t = Table(title="Alertmanager notifications (alerts/alertmanager.yml, timings in seconds)", expand=True,
              title_justify="left")
    for h in ("receiver", "alert", "status", "runbook"):
        t.add_column(h)
    rows = report.delivered(snap.notifications)
    for d in rows:
        t.add_row(d.receiver, d.alertname, Text(d.status, style="bold red" if d.statuses[-1] == "firing" else "green"),
                  d.runbook_url)
    if not rows:
        t.add_row(Text("(none yet)", style="dim"), "", "", "")
    return t


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
    if snap.errors:
        head.append("\n" + "; ".join(snap.errors), style="red")
    top = Table.grid(expand=True)
    top.add_column(ratio=1)
    top.add_column(ratio=1)
    top.add_row(_stage_table(snap), _gpu_table(snap, sc))
    parts: list[RenderableType] = [Panel(head), top, _tail_text(snap), _drift_table(snap), _canary_table(snap),
                                   _fault_table(snap), _alerts_text(snap, sc)]
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

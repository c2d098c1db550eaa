"""The live view and the ``--no-ui`` progress line of ``inferwatch demo --engine vllm``.

The same panels as :mod:`.view` (stage latency, fake GPU, alerts, notifications), with the LLM's
drift table (the span attributes against the warm-up reference), its faults (the ones that do not
apply listed as such) and the load as completions and tokens.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from inferwatch_sidecar.demo import report, view
from inferwatch_sidecar.demo import vllm_engine as ve
from inferwatch_sidecar.demo.observe import Snapshot
from inferwatch_sidecar.demo.scenario import Scenario
from inferwatch_sidecar.demo.vllm_scenario import FEATURES, TITLES, VERSION, VllmScenario
from inferwatch_sidecar.export import live_view as live


def _drift_table(snap: Snapshot) -> Table:
    d = snap.drift.get((ve.MODEL_NAME, VERSION), {})
    rows: list[list[Any]] = []
    for name in FEATURES:
        f = d.get("features", {}).get(name, {})
        s = f.get("scores", {}).get("wasserstein_norm")
        txt = "-" if s is None else f"{s:.2f}" + (" *" if f.get("drifted") else "")
        rows.append([name, Text(txt, style="bold red" if f.get("drifted") else "")])
    ratio, events = d.get("drifted_ratio"), d.get("window_events")
    rows.append([Text("share drifted", style="italic"), "-" if ratio is None else f"{ratio:.0%}"])
    rows.append([Text("window events", style="italic"), "-" if events is None else f"{events:.0f}"])
    return live.table(f"drift of {ve.MODEL_NAME}'s span attributes against its warm-up reference (score; * = drifted)",
                      [("span attribute", "text"), ("score", "num")], rows)


def _fault_table(snap: Snapshot, sc: VllmScenario) -> Table:
    rows: list[list[Any]] = []
    for name, st in snap.faults.items():
        det = Text(f"{st.detected_at:.0f}s (+{st.latency_s:.0f}s)", style="bold green") if st.detected_at is not None \
            else Text("no" if st.injected_at is not None else "-", style="yellow" if st.injected_at else "dim")
        rows.append([TITLES[name], "-" if st.injected_at is None else f"{st.injected_at:.0f}s", det, st.detail])
    for name, why in sc.not_applicable.items():
        rows.append([Text(name, style="dim"), Text("n/a", style="dim"), Text("n/a", style="dim"),
                     Text(why, style="dim")])
    return live.table("faults and alerts", [("fault", "text"), ("injected", "num"), ("detected", "num"),
                                            ("evidence", "text")], rows)


def render(snap: Snapshot, sc: Scenario) -> Group:
    """The whole screen for one snapshot of a :class:`~.vllm_scenario.VllmScenario`."""
    assert isinstance(sc, VllmScenario), "the vLLM view shows the vLLM scenario"
    c = sc.cfg
    phase = (f"baseline: faults at {c.injection_time():.0f}s" if snap.phase == "baseline" else
             "faults injected" if snap.phase == "faults" else "finished")
    load = snap.load
    head = Text.assemble(("inferwatch demo --engine vllm", "bold"), f"  t={snap.t:.0f}s of {c.duration_s:.0f}s  ",
                         (phase, "cyan"), f"  completions: {load.get('completions', 0)} streamed, "
                         f"{load.get('completion_tokens', 0)} tokens")
    if snap.errors:
        head.append("\n" + "; ".join(snap.errors), style="red")
    head.append(f"\nstatus page {sc.sidecar_url}/  (the same view of any sidecar: inferwatch top --sidecar URL)")
    parts: list[RenderableType] = [Panel(head), live.Pair(view._stage_table(snap), view._gpu_table(snap, sc)),
                                   _drift_table(snap), _fault_table(snap, sc),
                                   view._alerts_text(snap, sc)]
    if sc.receiver is not None:
        parts.append(view._notifications_table(snap))
    return Group(*parts)


def progress_line(snap: Snapshot) -> str:
    """One line for ``--no-ui`` runs."""
    det = ", ".join(f"{n}{'+' if st.detected else '-'}" for n, st in snap.faults.items())
    q = snap.stages.get("queue", {})
    firing = sorted(n for n, s in snap.alerts.items() if s == "firing")
    return (f"t={snap.t:5.1f}s {snap.phase:<8} completions={snap.load.get('completions', 0)} "
            f"queue p99={report.seconds(q.get(0.99))} detected: {det}"
            + (f" firing: {', '.join(firing)}" if firing else "")
            + (f" notifications: {len(snap.notifications)}" if snap.notifications else ""))

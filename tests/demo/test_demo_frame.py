"""The demo's final frame, drawn from a recorded poll of its sidecar the way a pipe (80 columns) and a wide
terminal show it: no cell cut, the status page's URL on it, the canary's stages named, and why the
label-free estimate and the labelled accuracy of v2 differ explained on screen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.demo.alertmanager import Notification, WebhookReceiver
from inferwatch_sidecar.demo.config import ScenarioConfig
from inferwatch_sidecar.demo.inject import FaultState
from inferwatch_sidecar.demo.observe import Snapshot
from inferwatch_sidecar.demo.scenario import Scenario
from inferwatch_sidecar.demo.view import render
from tests.cli.test_top import column_text, draw, recorded_view

RUNBOOK = "https://github.com/inferwatch/inferwatch/blob/main/docs/runbooks.md#inferwatchestimatedaccuracydrop"


@pytest.mark.parametrize("width", [80, 160])
def test_final_frame_cuts_no_cell_names_the_status_page_the_stages_and_why_the_accuracies_differ(
        tmp_path: Path, width: int) -> None:
    view, status = recorded_view()
    sc = Scenario(ScenarioConfig(duration_s=60, inject_at_s=12, workdir=str(tmp_path)))
    sc.worker_pids = {"stable": [25180, 25181], "canary": [25178]}
    sc.prometheus_url = "http://127.0.0.1:9"
    snap = Snapshot(t=60.0, phase="done", load={"predict_stable": 1159, "predict_canary": 839, "generate": 251,
                                                "labels": 1986, "producers": 3})
    # The same poll the recorded view came from.
    snap.stages, snap.drift, snap.gpu, snap.canary = view.stages, view.drift, view.gpu, view.canary
    snap.tail, snap.latency, snap.verdicts, snap.stage_window_s = view.tail, view.latency, view.verdicts, 5.0
    snap.faults = {"gpu_leak": FaultState("gpu_leak", injected_at=12.0, detected_at=22.0,
                                          detail="pid 25180: leak, 64.6 MiB/s, OOM in 15.8min"),
                   "canary": FaultState("canary", injected_at=12.0, detected_at=15.6, detail="v2 vs v1: differs")}
    snap.alerts = {"InferwatchEstimatedAccuracyDrop": "firing", "InferwatchCanaryFailing": "firing"}
    note = {"alerts": [{"status": "firing", "labels": {"alertname": "InferwatchEstimatedAccuracyDrop"},
                        "annotations": {"runbook_url": RUNBOOK}}]}
    snap.notifications = [Notification("credit-risk-team", note)]
    with WebhookReceiver() as hook:
        sc.attach_alertmanager(hook)
        text = draw(render(snap, sc), width)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= width
    assert "…" not in text, [ln for ln in lines if "…" in ln]
    flat = re.sub(r"\s+", " ", text.replace("│", " "))
    assert f"status page {sc.sidecar_url}/" in flat
    # Every stage, and every number of the stage table, whole.
    for stage in ("ingress", "preprocess", "queue", "inference", "postprocess"):
        assert re.search(rf"│ {stage}\s+│\s+\d+\.\d │", text), stage
    # The canary's cell names each failing stage.
    (j,) = [j for j in status["components"]["canary"]["judgements"] if j["canary_version"] == mdl.CANARY]
    why = column_text(text, "canary judge")[-1]
    failing = [m["stage"] for m in j["metrics"] if m["result"] == "fail" and m["stage"]]
    assert failing and all(f"stage_latency[{s}]" in why for s in failing), why
    # v2's label-free estimate next to its labels, and why they differ.
    v2 = view.drift[(mdl.NAME, mdl.CANARY)]
    assert v2["estimated_accuracy"] - v2["accuracy"] > 0.4
    assert f"v2 estimated {v2['estimated_accuracy']:.1%}, labelled {v2['accuracy']:.1%}" in flat
    assert "cannot see that model's own errors" in flat
    # The notification's runbook whole (folded, not cut), and the GPU rows with their roles.
    assert RUNBOOK.replace(" ", "") in column_text(text, "Alertmanager notifications")[-1]
    assert "pid 25180 v1" in flat and "pid 25178 v2" in flat

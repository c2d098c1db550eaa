"""End to end: the demo's faults reach Alertmanager's receivers as notifications, and nothing else does.

The demo scenario runs as in tests/e2e/test_e2e.py (real sidecar, SDK-instrumented model servers,
bounded load, every fault injected); its Prometheus, with the fast-profile rules, sends to a real
Alertmanager running alerts/alertmanager.yml (webhooks pointed at a loopback receiver, timings in
seconds). The run ends once every fault's alerts have been delivered, or at its deadline.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from alerts import generate, source
from tests.alerts.amserver import (
    GRACE_S,
    TEAM_MODEL,
    AlertingPrometheus,
    AlertmanagerServer,
    WebhookReceiver,
    alertmanager_binaries,
    fast_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

#: Hard bound of the scenario, from the sidecar's start (it stops as soon as every alert has arrived).
DURATION_S = 90.0
INJECT_AT_S = 15.0
#: Where the demo's alerts go: the demo's model has its own team; the GPU and ingest alerts carry no model.
PLATFORM_ALERTS = {"InferwatchGPUMemoryLeak", "InferwatchIngestDecodeErrors"}


def _receiver(alertname: str) -> str:
    return "ml-platform-tickets" if alertname in PLATFORM_ALERTS else "credit-risk-team"


def _undelivered(hook: WebhookReceiver, sc: Any) -> list[str]:
    """The expected alerts (name and labels, per fault) that no firing notification to their receiver carried."""
    from inferwatch_sidecar.demo.judge import EXPECTED_ALERTS

    firing = [(n.receiver, a["labels"]) for n in hook.notifications() for a in n.alerts if a["status"] == "firing"]
    return [f"{name} {match}" for fault in sc.cfg.faults for name, match in EXPECTED_ALERTS[fault]
            if not any(r == _receiver(name) and lab["alertname"] == name and match.items() <= lab.items()
                       for r, lab in firing)]


def test_the_demo_faults_arrive_as_notifications_and_nothing_else_does(prometheus_bin, tmp_path):
    from inferwatch_sidecar.demo import model as mdl
    from inferwatch_sidecar.demo.config import ALL_FAULTS, ScenarioConfig
    from inferwatch_sidecar.demo.scenario import Scenario

    assert mdl.NAME == TEAM_MODEL, "alerts/alertmanager.yml routes the demo's model to its team"
    am_bin, _ = alertmanager_binaries()
    rules = generate.write_rule_files(tmp_path / "rules", source.FAST)
    sc = Scenario(ScenarioConfig(duration_s=DURATION_S, inject_at_s=INJECT_AT_S, faults=ALL_FAULTS,
                                 workdir=str(tmp_path / "demo")))
    with WebhookReceiver() as hook, AlertmanagerServer(am_bin, fast_config(hook.url)) as am:
        prom: AlertingPrometheus | None = None
        try:
            sc.start(timeout=90)
            prom = AlertingPrometheus(prometheus_bin, [sc.sidecar_target], rules, am.url).start()
            sc.attach_prometheus(prom.url)
            # The load goes on after the last arrival, so that a late unexpected alert has its chance to arrive.
            sc.run(until=lambda snap: not _undelivered(hook, sc), stop_load=False)
            time.sleep(GRACE_S)
            held = am.alerts()
            notes = hook.notifications()
            summary = "\n".join(sc.summary_lines())
        finally:
            if prom is not None:
                prom.stop()
            sc.stop()

    assert not hook.overflowed
    missing = _undelivered(hook, sc)
    assert not missing, f"never delivered: {missing}\n{summary}\nAlertmanager log:\n{am.log()}"
    names = {a["labels"]["alertname"] for n in notes for a in n.alerts if a["status"] == "firing"}
    assert names == sc.expected_alert_names(), f"unexpected: {names - sc.expected_alert_names()}\n{summary}"
    by_name = {a.name: a for a in source.ALERTS}
    got = set()
    for n in notes:
        for a in n.alerts:
            name = a["labels"]["alertname"]
            # A critical alert pages on-call and (the route continues) reaches the model's team too.
            allowed = {_receiver(name)} | ({"oncall-pager"} if by_name[name].severity == "critical" else set())
            assert n.receiver in allowed, (n.receiver, a["labels"])
            got.add((name, n.receiver))
            assert a["annotations"]["runbook_url"] == by_name[name].runbook_url
            assert a["labels"]["severity"] == by_name[name].severity
    # Every critical alert the faults fire paged; the demo's (a failing canary) inhibits nothing.
    critical = {name for name in names if by_name[name].severity == "critical"}
    assert critical == {"InferwatchCanaryFailing"}
    assert {(name, "oncall-pager") for name in critical} <= got
    assert [a for a in held if a["status"]["state"] == "suppressed"] == []

"""alerts/alertmanager.yml: amtool accepts it, and a real Alertmanager routes, groups and inhibits as documented.

The live test runs our fast-profile rules in a real Prometheus against a synthetic exporter whose
series fire both alerts of every inhibition pair (and warnings that must get through), sends them to
a real Alertmanager with the shipped config (webhooks pointed at a loopback receiver, timings in
seconds), and checks exactly which notification reached which receiver. The demo's faults, end to
end through a real sidecar, are in tests/e2e/test_e2e.py.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from alerts import generate, source
from tests.alerts.amserver import (
    CONFIG,
    FAST_TIMINGS,
    GRACE_S,
    ROOT,
    TEAM_MODEL,
    AlertingPrometheus,
    AlertmanagerServer,
    Notification,
    WebhookReceiver,
    alertmanager_binaries,
    fast_config,
    load_config,
)

pytestmark = pytest.mark.prometheus

DOCS = ROOT / "docs" / "alertmanager.md"

#: Labels -> receivers, as `amtool config routes test` must resolve them.
ROUTES = [
    ({"severity": "critical", "model": TEAM_MODEL}, ["oncall-pager", "credit-risk-team"]),
    ({"severity": "critical", "gpu": "0"}, ["oncall-pager"]),
    ({"severity": "warning", "model": TEAM_MODEL}, ["credit-risk-team"]),
    ({"severity": "warning", "model": "ranker"}, ["ml-platform-tickets"]),
    ({"severity": "warning", "gpu": "0"}, ["ml-platform-tickets"]),
]


@pytest.fixture(scope="module")
def binaries() -> tuple[str, str]:
    return alertmanager_binaries()


def _amtool(amtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([amtool, *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config_accepts_the_example(binaries):
    run = _amtool(binaries[1], "check-config", str(CONFIG))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout
    assert " - 3 inhibit rules" in run.stdout and " - 3 receivers" in run.stdout, run.stdout


def test_amtool_check_config_rejects_a_route_to_an_undefined_receiver(binaries, tmp_path):
    """The check above can fail."""
    cfg = load_config()
    cfg["route"]["routes"][0]["receiver"] = "nobody"
    bad = tmp_path / "alertmanager.yml"
    bad.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    run = _amtool(binaries[1], "check-config", str(bad))
    assert run.returncode != 0
    assert 'undefined receiver "nobody"' in run.stdout + run.stderr


@pytest.mark.parametrize(("labels", "receivers"), ROUTES, ids=lambda v: ",".join(v) if isinstance(v, list) else None)
def test_routes_send_each_severity_and_model_to_its_receivers(binaries, labels, receivers):
    words = [f"{k}={v}" for k, v in labels.items()]
    run = _amtool(binaries[1], "config", "routes", "test", f"--config.file={CONFIG}", *words)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().split(",") == receivers


def _matcher_names(matchers: list[str]) -> list[str]:
    """The alertnames an ``alertname="X"`` or ``alertname=~"X|Y"`` matcher selects."""
    names = []
    for m in matchers:
        hit = re.fullmatch(r'alertname(=~?)"([A-Za-z0-9|]+)"', m)
        assert hit, f"inhibit matchers select by alertname only: {m!r}"
        names += hit.group(2).split("|")
    return names


def test_each_inhibition_lets_a_critical_alert_mute_warnings_of_real_alerts():
    by_name = {a.name: a for a in source.ALERTS}
    rules = load_config()["inhibit_rules"]
    assert rules
    for rule in rules:
        sources, targets = _matcher_names(rule["source_matchers"]), _matcher_names(rule["target_matchers"])
        assert set(sources) | set(targets) <= set(by_name), f"unknown alerts in {rule}"
        assert {by_name[n].severity for n in sources} == {"critical"}, rule
        assert {by_name[n].severity for n in targets} == {"warning"}, rule
        # Without `equal`, one critical alert anywhere would mute the warning fleet-wide.
        assert rule["equal"], rule


def test_groups_by_alertname_and_model_version():
    route = load_config()["route"]
    assert route["group_by"] == ["alertname", "model", "model_version"]
    assert set(FAST_TIMINGS) <= set(route), "the test shortens the root's timings: the root must set them"


def test_the_docs_name_every_receiver_and_every_inhibited_alert():
    text = DOCS.read_text(encoding="utf-8")
    cfg = load_config()
    names = [r["name"] for r in cfg["receivers"]]
    for rule in cfg["inhibit_rules"]:
        names += _matcher_names(rule["source_matchers"]) + _matcher_names(rule["target_matchers"])
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"docs/alertmanager.md does not name {missing}"
    assert "amtool check-config alerts/alertmanager.yml" in text


# ---------------------------------------------------------------------------
# live: Prometheus -> Alertmanager -> webhook


class _Exporter:
    """Synthetic /metrics whose series fire every inhibition pair, plus warnings that must get through.

    - stage inference of credit-risk: every call slower than 2.5 s (P99 and P99.9 budgets burn);
      its preprocess and postprocess, and ranker's inference: 5% of the calls (P99.9 only);
    - GPU 0: 8% free and falling (filling up soon and filling up); GPU 1: 20% free and falling (filling up);
    - process 1234 on GPU 0: out-of-memory errors, allocator retries and fragmentation; process 5678:
      allocator retries only.

    Inhibition mutes only while the critical alert fires, and a gauge over its threshold fires at the first
    evaluation, before any rate can: the fragmentation appears once the out-of-memory alert has had time to fire.
    """

    CALLS_PER_S = 20.0
    FRAGMENTED_AFTER_S = 10.0

    def __init__(self) -> None:
        self.t0: float | None = None

    def start(self) -> None:
        """Start exposing the series (until then /metrics is empty): once Prometheus sends to Alertmanager."""
        self.t0 = time.monotonic()

    def _stage(self, model: str, stage: str, slow: float, t: float) -> list[str]:
        n = t * self.CALLS_PER_S
        lab = f'service="svc",model="{model}",model_version="v1",stage="{stage}"'
        fast = n * (1 - slow)
        return [f'inferwatch_stage_duration_seconds_bucket{{{lab},le="{le}"}} {v}'
                for le, v in (("0.5", fast), ("1.0", fast), ("2.5", fast), ("+Inf", n))] + [
            f"inferwatch_stage_duration_seconds_sum{{{lab}}} {n * 3 * slow + fast * 0.1}",
            f"inferwatch_stage_duration_seconds_count{{{lab}}} {n}",
        ]

    def exposition(self) -> bytes:
        if self.t0 is None:
            return b""
        t = time.monotonic() - self.t0
        lines = ["# TYPE inferwatch_stage_duration_seconds histogram"]
        lines += self._stage(TEAM_MODEL, "inference", 1.0, t)
        lines += self._stage(TEAM_MODEL, "preprocess", 0.05, t)
        lines += self._stage(TEAM_MODEL, "postprocess", 0.05, t)
        lines += self._stage("ranker", "inference", 0.05, t)
        total = 80e9
        lines += [
            "# TYPE inferwatch_gpu_memory_total_bytes gauge",
            f'inferwatch_gpu_memory_total_bytes{{gpu="0"}} {total}',
            f'inferwatch_gpu_memory_total_bytes{{gpu="1"}} {total}',
            "# TYPE inferwatch_gpu_memory_free_bytes gauge",
            f'inferwatch_gpu_memory_free_bytes{{gpu="0"}} {0.08 * total - 1e8 * t}',
            f'inferwatch_gpu_memory_free_bytes{{gpu="1"}} {0.20 * total - 1e8 * t}',
            "# TYPE inferwatch_gpu_allocator_ooms_total counter",
            f'inferwatch_gpu_allocator_ooms_total{{gpu="0",pid="1234"}} {0.5 * t}',
            "# TYPE inferwatch_gpu_allocator_alloc_retries_total counter",
            f'inferwatch_gpu_allocator_alloc_retries_total{{gpu="0",pid="1234"}} {5 * t}',
            f'inferwatch_gpu_allocator_alloc_retries_total{{gpu="0",pid="5678"}} {5 * t}',
            "",
        ]
        if t >= self.FRAGMENTED_AFTER_S:
            lines[-1:-1] = ["# TYPE inferwatch_gpu_allocator_fragmentation_ratio gauge",
                            'inferwatch_gpu_allocator_fragmentation_ratio{gpu="0",pid="1234"} 0.5']
        return "\n".join(lines).encode()


def _serve(exporter: _Exporter) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exporter.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


_KEY_LABELS = ("model", "stage", "gpu", "pid")


def _key(receiver: str, labels: dict[str, str]) -> tuple[str, str, tuple[str, ...]]:
    return receiver, labels["alertname"], tuple(f"{k}={labels[k]}" for k in _KEY_LABELS if k in labels)


P99, P999 = "InferwatchStageLatencyP99BudgetBurn", "InferwatchStageLatencyP999BudgetBurn"
CM, INF = f"model={TEAM_MODEL}", "stage=inference"
#: (receiver, alertname, identifying labels) of every alert that must reach a receiver; nothing else may.
DELIVERED = {
    ("oncall-pager", P99, (CM, INF)),
    ("credit-risk-team", P99, (CM, INF)),
    ("credit-risk-team", P999, (CM, "stage=preprocess")),
    ("credit-risk-team", P999, (CM, "stage=postprocess")),
    ("ml-platform-tickets", P999, ("model=ranker", INF)),
    ("oncall-pager", "InferwatchGPUMemoryFillingUpSoon", ("gpu=0",)),
    ("ml-platform-tickets", "InferwatchGPUMemoryFillingUp", ("gpu=1",)),
    ("oncall-pager", "InferwatchGPUOutOfMemory", ("gpu=0", "pid=1234")),
    ("ml-platform-tickets", "InferwatchGPUAllocRetries", ("gpu=0", "pid=5678")),
}
#: (alertname, identifying labels) -> the alert that must inhibit it.
INHIBITED = {
    (P999, (CM, INF)): P99,
    ("InferwatchGPUMemoryFillingUp", ("gpu=0",)): "InferwatchGPUMemoryFillingUpSoon",
    ("InferwatchGPUAllocRetries", ("gpu=0", "pid=1234")): "InferwatchGPUOutOfMemory",
    ("InferwatchGPUAllocatorFragmented", ("gpu=0", "pid=1234")): "InferwatchGPUOutOfMemory",
}
#: The alerts whose production for: (30 to 60 minutes, 30 to 60 s in the fast profile) would make the test slow.
NO_WAIT = {n: {"for_s": 0} for n in ("InferwatchGPUMemoryFillingUp", "InferwatchGPUMemoryFillingUpSoon",
                                      "InferwatchGPUAllocatorFragmented")}
DEADLINE_S = 60.0


def _suppressed(am: AlertmanagerServer) -> dict[tuple[str, tuple[str, ...]], list[str]]:
    """(alertname, identifying labels) -> the alertnames of what inhibits it, for every suppressed alert."""
    held = am.alerts()
    fingerprints = {a["fingerprint"]: a["labels"]["alertname"] for a in held}
    return {_key("", a["labels"])[1:]: sorted(fingerprints.get(f, "?") for f in a["status"]["inhibitedBy"])
            for a in held if a["status"]["state"] == "suppressed"}


def test_a_real_alertmanager_routes_groups_and_inhibits_our_alerts(binaries, prometheus_bin, tmp_path):
    am_bin, _ = binaries
    rules = generate.write_rule_files(tmp_path / "rules", source.FAST, NO_WAIT)
    exporter = _Exporter()
    httpd = _serve(exporter)
    try:
        with WebhookReceiver() as hook, AlertmanagerServer(am_bin, fast_config(hook.url)) as am, \
                AlertingPrometheus(prometheus_bin, [f"127.0.0.1:{httpd.server_address[1]}"], rules, am.url) as prom:
            exporter.start()
            deadline = time.monotonic() + DEADLINE_S
            want_suppressed = {k: [v] for k, v in INHIBITED.items()}
            while time.monotonic() < deadline:
                got = {_key(r, dict(lab)) for r, _, lab in hook.firing()}
                if got >= DELIVERED and _suppressed(am) == want_suppressed:
                    break
                time.sleep(0.5)
            # Anything else would arrive within a group_interval or two: wait that long, then compare exactly.
            time.sleep(GRACE_S)
            got = {_key(r, dict(lab)) for r, _, lab in hook.firing()}
            notes = hook.notifications()
            context = f"\nPrometheus alerts: {prom.alert_states()}\nAlertmanager log:\n{am.log()}"
            assert got == DELIVERED, f"missing {DELIVERED - got}, unexpected {got - DELIVERED}{context}"
            assert _suppressed(am) == want_suppressed, context
            assert not hook.overflowed
            _check_notifications(notes)
    finally:
        httpd.shutdown()
        httpd.server_close()


def _check_notifications(notes: list[Notification]) -> None:
    group_by = load_config()["route"]["group_by"]
    for n in notes:
        p = n.payload
        assert p["receiver"] == n.receiver and p["version"] == "4"
        for a in n.alerts:
            name = a["labels"]["alertname"]
            assert a["annotations"]["runbook_url"] == next(x.runbook_url for x in source.ALERTS if x.name == name)
            assert a["annotations"]["summary"] and a["annotations"]["description"]
            # One group = one alertname, model and model_version.
            assert p["groupLabels"] == {k: a["labels"][k] for k in group_by if k in a["labels"]}, p["groupLabels"]
    # The two P99.9 burns of one model version arrive together, in one notification.
    stages = [{a["labels"]["stage"] for a in n.alerts} for n in notes
              if n.receiver == "credit-risk-team" and n.payload["groupLabels"].get("alertname") == P999]
    assert {"preprocess", "postprocess"} in stages, stages

"""The ``summary`` of ``/v1/status`` (what is bad now, since when, which runbook), the outcome counts it reads,
and the start-up line's component states agreeing with the status."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import pytest

from inferwatch.wire import EV_REQUEST, OUTCOMES
from inferwatch_sidecar.aggregate.aggregator import Aggregator, LatencyStatus
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.drift import verdicts as drift_verdicts
from inferwatch_sidecar.components.gpu import verdicts as gpu_verdicts
from inferwatch_sidecar.components.registry import verdict_readers
from inferwatch_sidecar.export import summary
from tests.export import status_fixture
from tests.helpers.sidecar import REPO, wait_until


def test_thresholds_and_runbooks_are_those_of_the_alerts() -> None:
    sys.path.insert(0, str(REPO))
    from alerts.source import ALERTS, RUNBOOK_BASE_URL

    by_name = {a.name: a for a in ALERTS}
    th = {(a.name, t.name): t.value for a in ALERTS for t in a.thresholds}
    assert summary.RUNBOOK_BASE_URL == RUNBOOK_BASE_URL
    assert th[("InferwatchHighErrorRate", "error_ratio")] == summary.ERROR_RATIO
    assert th[("InferwatchLoadShedding", "shed_ratio")] == summary.SHED_RATIO
    assert (th[("InferwatchRetryStorm", "amplification")], th[("InferwatchRetryStorm", "giveup_ratio")]) == \
        summary.RETRY_STORM
    assert (th[("InferwatchTimeoutMismatch", "wait_share")], th[("InferwatchTimeoutMismatch", "giveup_ratio")]) == \
        summary.TIMEOUT_MISMATCH
    assert th[("InferwatchEstimatedAccuracyDrop", "drop")] == drift_verdicts.ACCURACY_DROP
    assert th[("InferwatchEstimatedAccuracyLow", "accuracy")] == drift_verdicts.ACCURACY_FLOOR
    for v in status_fixture.status()["summary"]["verdicts"]:
        assert v["runbook_url"] == by_name[v["alert"]].runbook_url, v


READERS = verdict_readers()


def verdicts(doc: dict) -> list[dict]:
    return summary.verdicts(doc, READERS, status_fixture.NOW)


def test_verdicts_name_every_bad_component_and_only_what_is_bad() -> None:
    doc = status_fixture.status()
    found = {(v["component"], v["subject"], v["verdict"]): v for v in verdicts(doc)}
    assert set(found) == {
        ("gpu", "GPU 0 pid 4242", "leak"), ("gpu", "GPU 0 pids 4343, 4444", "duplicate model copies"),
        ("drift", "ranker v1", "drifted"), ("drift", "ranker v1", "prediction drift"),
        ("accuracy", "ranker v1", "accuracy estimate dropped"), ("accuracy", "ranker v1", "labelled accuracy dropped"),
        ("canary", "ranker v2 vs v1", "fail"),
        ("requests", "svc ranker v1", "high error rate"), ("ingest", "SDK", "dropping events"),
        ("requests", "svc ranker v1", "retry storm"), ("requests", "svc ranker v1", "timeout mismatch"),
        ("saturation", "svc/ranker/v1", "kv_cache-bound"),
        ("capacity", f"svc/{status_fixture.LONG_MODEL}/v1", "at its knee"),
    }
    # Since when: the components' own times, the drift window's start, nothing for the rest (first seen, later).
    since = {k[2]: (v["since_unix"], v["since_source"]) for k, v in found.items()}
    now = status_fixture.NOW
    assert since["kv_cache-bound"] == (now - status_fixture.SATURATED_FOR_S, "component")
    assert since["fail"] == (now - status_fixture.CANARY_FAILING_FOR_S, "component")
    assert since["drifted"] == since["accuracy estimate dropped"] == (now - 30 - status_fixture.DRIFT_WINDOW_S,
                                                                       "window")
    assert since["leak"] == (now - 420, "component") and since["retry storm"] == since["at its knee"] == (None, None)
    leak = found[("gpu", "GPU 0 pid 4242", "leak")]
    assert leak["since_unix"] == status_fixture.NOW - 420 and "11.2 min" in leak["detail"]
    assert "225.0 GiB/h" in leak["detail"]  # 64 MiB/s
    canary = found[("canary", "ranker v2 vs v1", "fail")]
    assert canary["detail"] == "score 35/100; failing: latency, stage_latency[queue], stage_latency[inference], " \
                               "prediction_mix; " + status_fixture.CANARY_WARNING
    err = found[("requests", "svc ranker v1", "high error rate")]
    assert err["detail"].startswith("6.0% of 1000 requests failed")  # 60 errors; 4xx and shed are not errors
    # The bad first, then by component.
    sev = [v["severity"] for v in verdicts(doc)]
    assert sev == sorted(sev, key=lambda s: s != "bad")

    # v2's estimate sits above its reference: no accuracy verdict for it; an interval reaching the reference
    # is no drop either; an error rate at the threshold is no verdict.
    ok = copy.deepcopy(doc)
    perf = ok["components"]["drift"]["models"][0]["performance"]
    perf.update(estimated_accuracy=0.80, estimated_accuracy_interval=[0.75, 0.87])  # 6.5 points below, but the
    # interval reaches the reference 0.865: no drop; and above the 0.7 floor
    ok["latency"]["models"][0]["outcomes"] = {"ok": 95, "error": 5}
    ok["components"]["gpu"]["leaks"] = []
    ok["components"]["gpu"]["duplicate_model_copies"] = []
    ok["components"]["canary"]["judgements"][0]["verdict"] = "pass"
    ok["components"]["drift"]["models"][0]["dataset_drift"] = False
    ok["components"]["drift"]["models"][0]["features"] = []
    ok["ingest"]["sdk_dropped"] = {}
    del ok["latency"]["models"][0]["http"]
    ok["components"]["saturation"]["verdicts"] = ok["components"]["capacity"]["verdicts"] = []
    ok["components"]["drift"]["models"][0]["labelled"] = {"events": 400, "accuracy": 0.85}
    assert verdicts(ok) == []
    perf.update(estimated_accuracy=0.66, estimated_accuracy_interval=[0.6, 0.9])
    (low,) = verdicts(ok)
    assert (low["verdict"], low["severity"], low["alert"]) == ("accuracy estimate low", "warn",
                                                               "InferwatchEstimatedAccuracyLow")
    perf.update(estimated_accuracy=0.80, estimated_accuracy_interval=[0.75, 0.87])
    # Too few requests for an error rate to mean anything.
    ok["latency"]["models"][0]["outcomes"] = {"ok": 10, "error": 9}
    assert verdicts(ok) == []
    # A component that failed, and one whose own verdicts pass through.
    ok["components"]["tail"] = {"state": "failed", "reason": "start() raised OSError: boom"}
    ok["components"]["overload"] = {"state": "running", "verdicts": [
        {"subject": "svc ranker", "verdict": "saturated", "severity": "bad", "detail": "queue full",
         "since_unix": 123.0, "alert": "InferwatchQueueBacklog"}]}
    got = {(v["component"], v["verdict"]): v for v in verdicts(ok)}
    assert got[("tail", "failed")]["detail"] == "start() raised OSError: boom"
    assert got[("overload", "saturated")]["since_unix"] == 123.0
    assert got[("overload", "saturated")]["runbook_url"].endswith("#inferwatchqueuebacklog")


def test_labels_show_a_changed_models_accuracy_that_the_estimate_cannot() -> None:
    from scipy.stats import binomtest

    doc = status_fixture.status()
    v2 = doc["components"]["drift"]["models"][1]
    assert v2["performance"]["estimated_accuracy"] > v2["performance"]["reference_accuracy"]  # the estimate: fine
    v2["labelled"] = {"events": 131, "accuracy": 54 / 131}
    (lab,) = [v for v in verdicts(doc) if v["subject"] == "ranker v2" and v["component"] == "accuracy"]
    ci = binomtest(54, 131).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = summary.wilson(54 / 131, 131)
    assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert lab["verdict"] == "labelled accuracy dropped" and lab["detail"] == (
        f"41.2% [{100 * ci.low:.1f}%-{100 * ci.high:.1f}%] of 131 labelled predictions correct against 86.5% on the "
        "reference")
    # Too few labels, or an interval that reaches the reference: no verdict.
    for labelled in ({"events": 30, "accuracy": 0.3}, {"events": 60, "accuracy": 0.78}):
        v2["labelled"] = labelled
        assert not [v for v in verdicts(doc) if v["subject"] == "ranker v2" and v["component"] == "accuracy"]


def test_a_device_filling_up_is_a_verdict_at_the_alerts_thresholds() -> None:
    GiB = 2**30
    doc = {"components": {"gpu": {"state": "ok", "devices": [
        {"gpu": 0, "total_bytes": 80 * GiB, "free_bytes": 16 * GiB, "device_time_to_oom_s": 3600.0},   # 20% free
        {"gpu": 1, "total_bytes": 80 * GiB, "free_bytes": 4 * GiB, "device_time_to_oom_s": 900.0},     # 5% free
        {"gpu": 2, "total_bytes": 80 * GiB, "free_bytes": 4 * GiB, "device_time_to_oom_s": None},      # not growing
        {"gpu": 3, "total_bytes": 80 * GiB, "free_bytes": 40 * GiB, "device_time_to_oom_s": 60.0}]}}}  # half free
    got = {v["subject"]: (v["severity"], v["alert"]) for v in verdicts(doc)}
    assert got == {"GPU 0": ("warn", "InferwatchGPUMemoryFillingUp"),
                   "GPU 1": ("bad", "InferwatchGPUMemoryFillingUpSoon")}
    sys.path.insert(0, str(REPO))
    from alerts.source import ALERTS

    th = {(a.name, t.name): t.value for a in ALERTS for t in a.thresholds}
    for got_th, alert in ((gpu_verdicts.FILLING_UP, "InferwatchGPUMemoryFillingUp"),
                          (gpu_verdicts.FILLING_UP_SOON, "InferwatchGPUMemoryFillingUpSoon")):
        want = (th[(alert, "free_ratio")], th[(alert, "horizon_seconds")])
        assert got_th == want, alert


def test_since_tracker_keeps_the_first_time_seen_and_forgets_what_cleared() -> None:
    tr = summary.SinceTracker()
    v = {"component": "drift", "subject": "m v1", "verdict": "drifted", "since_unix": None}
    assert tr.update([dict(v)], 100.0)[0]["since_unix"] == 100.0
    assert tr.update([dict(v)], 150.0)[0]["since_unix"] == 100.0
    assert tr.update([dict(v)], 150.0)[0]["since_source"] == "first seen"
    own = tr.update([{**v, "since_unix": 42.0, "since_source": "component"}], 160.0)[0]
    assert own["since_unix"] == 42.0 and own["since_source"] == "component"
    tr.update([], 170.0)  # cleared
    assert tr.update([dict(v)], 180.0)[0]["since_unix"] == 180.0
    # A window's start: the earliest one seen while it stays bad (the window slides on), forgotten once it clears.
    w = {**v, "since_source": "window"}
    tr = summary.SinceTracker()
    for start, want in ((1000.0, 1000.0), (1010.0, 1000.0), (1100.0, 1000.0)):
        got = tr.update([{**w, "since_unix": start}], start + 3600)[0]
        assert (got["since_unix"], got["since_source"]) == (want, "window")
    tr.update([], 5000.0)
    assert tr.update([{**w, "since_unix": 1200.0}], 5010.0)[0]["since_unix"] == 1200.0


def test_a_new_components_verdicts_come_from_its_registry_reader_or_its_own_list() -> None:
    """No component is named in the summary: a reader handed in (as the registry declares them) reads its section,
    and without one the rows the component lists pass through; a reader that raises marks the section unreadable."""
    doc = {"started_unix": 1000.0, "uptime_s": 50.0, "components": {
        "novel": {"state": "running", "queue": [{"name": "q1", "depth": 900, "since": 1010.0}]},
        "listing": {"state": "running", "verdicts": [
            {"subject": "x", "verdict": "stuck", "severity": "bad", "detail": "d", "alert": "InferwatchQueueBacklog",
             "since_unix": 1020.0}]},
        "broken": {"state": "running"}}}

    def novel(c: Any, now: float) -> list[dict[str, Any]]:
        return [summary.verdict("novel", q["name"], "backlog", "bad", f"{q['depth']} waiting at {now:.0f}",
                                "InferwatchQueueBacklog", q["since"]) for q in c["queue"] if q["depth"] > 100]

    def broken(c: Any, now: float) -> list[dict[str, Any]]:
        raise KeyError("devices")

    got = {(v["component"], v["verdict"]): v for v in summary.verdicts(doc, {"novel": novel, "broken": broken})}
    assert set(got) == {("novel", "backlog"), ("listing", "stuck"), ("broken", "unreadable")}
    assert got[("novel", "backlog")]["detail"] == "900 waiting at 1050"  # now: started + uptime
    assert (got[("novel", "backlog")]["since_unix"], got[("novel", "backlog")]["since_source"]) == (1010.0, "component")
    assert got[("listing", "stuck")]["runbook_url"].endswith("#inferwatchqueuebacklog")
    assert "cannot read its status: 'devices'" in got[("broken", "unreadable")]["detail"]
    # The registry declares the GPU monitor's, the drift engine's and the canary judge's readers.
    assert set(READERS) == {"gpu", "drift", "canary"}
    from inferwatch_sidecar.components.registry import REGISTRY

    assert all(s.verdicts is READERS.get(s.name) for s in REGISTRY)


def _latency(outcomes: dict[str, int], http: dict[str, Any] | None = None, p50: float = 10.0) -> dict[str, Any]:
    m: dict[str, Any] = {"service": "s", "model": "m", "model_version": "v", "outcomes": outcomes,
                         "request": {"p50_s": p50}}
    if http is not None:
        m["http"] = http
    return {"latency": {"window_s": 60.0, "models": [m]}}


def test_shedding_retry_storm_and_timeout_mismatch_verdicts_fire_just_above_the_alerts_thresholds() -> None:
    def found(doc: dict[str, Any]) -> set[str]:
        return {v["verdict"] for v in summary.verdicts(doc)}

    # Shed: 5% is the threshold (no verdict), 6% is above; errors, 4xx and cancels are not shed.
    assert found(_latency({"ok": 95, "shed": 5})) == set()
    (shed,) = summary.verdicts(_latency({"ok": 94, "shed": 6}))
    assert (shed["verdict"], shed["severity"], shed["alert"]) == ("shedding load", "warn", "InferwatchLoadShedding")
    assert shed["detail"].startswith("6.0% of 100 requests shed")
    assert found(_latency({"ok": 70, "client_error": 10, "cancelled": 20})) == set()
    assert found(_latency({"ok": 10, "shed": 9})) == set()  # too few requests
    # Retry storm: both above (1.5 attempts per unique request, 5% given up); either alone is no storm.
    storm = {"attempts": 1000, "retries": 400, "giveups": 60, "giveup_wait_p50_s": 20.0}  # 1.67x, 6%
    assert found(_latency({"ok": 100}, storm)) == {"retry storm"}
    assert found(_latency({"ok": 100}, {**storm, "retries": 333})) == set()  # 1.4995x
    assert found(_latency({"ok": 100}, {**storm, "giveups": 50})) == set()  # exactly 5%
    # Timeout mismatch: clients' median wait below the server's median, more than 1% given up.
    mism = {"attempts": 1000, "retries": 0, "giveups": 20, "giveup_wait_p50_s": 4.0}
    (m,) = summary.verdicts(_latency({"ok": 100}, mism, p50=12.5))
    assert (m["verdict"], m["severity"], m["alert"]) == ("timeout mismatch", "warn", "InferwatchTimeoutMismatch")
    assert m["detail"] == ("clients gave up after 4 s (median) while the server's median is 12.5 s; 2.0% of 1000 "
                           "attempts given up over the last 60 s")
    assert found(_latency({"ok": 100}, mism, p50=4.0)) == set()  # waited as long as the server takes
    assert found(_latency({"ok": 100}, {**mism, "giveups": 10}, p50=12.5)) == set()  # exactly 1%
    assert found(_latency({"ok": 100}, {**mism, "giveup_wait_p50_s": None}, p50=12.5)) == set()
    assert found(_latency({"ok": 100}, {**mism, "attempts": 19, "giveups": 5}, p50=12.5)) == set()  # too few


def test_latency_status_counts_http_attempts_retries_and_give_ups_in_the_window() -> None:
    from inferwatch.wire import EV_HTTP, OUTCOME_CANCELLED, OUTCOME_OK

    now = [0.0]
    agg = Aggregator(ComponentContext(default_label_budget=100))
    lat = LatencyStatus(agg, window_s=60.0, every_s=10.0, monotonic=lambda: now[0])
    ctx = ("svc", "m", "v1")
    seq = [0]

    def send(n: int, retry: bool = False, wait_s: float = 0.0) -> None:
        evs = []
        for _ in range(n):
            seq[0] += 1
            out = OUTCOME_CANCELLED if wait_s else OUTCOME_OK
            evs.append((EV_HTTP, ctx, 10**18 + seq[0], "/predict", 499 if wait_s else 200, out, int(retry),
                        int(wait_s * 1e9), False, None))
        evs.append((EV_REQUEST, ctx, 0, 1_000_000, 0, None, None, None, []))
        with agg.lock:
            agg.process(evs, [0] * 16)

    send(30)
    send(10, retry=True)
    (m,) = lat.status()["models"]
    assert m["http"] == {"attempts": 40, "retries": 10, "giveups": 0, "giveup_wait_p50_s": None}
    for t in range(10, 71, 10):
        now[0] = float(t)
        lat.sample()
        if t == 10:
            send(5, wait_s=4.0)  # give-ups in (2.5, 5] s
    now[0] = 75.0
    (m,) = lat.status()["models"]
    # The window starts at the copy of t=10, taken before the give-ups.
    assert m["http"] == {"attempts": 5, "retries": 0, "giveups": 5, "giveup_wait_p50_s": pytest.approx(3.75)}


def test_latency_status_counts_outcomes_in_the_window_and_since_start() -> None:
    now = [0.0]
    agg = Aggregator(ComponentContext(default_label_budget=100))
    lat = LatencyStatus(agg, window_s=60.0, every_s=10.0, monotonic=lambda: now[0])

    def send(outcome: int, n: int) -> None:
        ev = (EV_REQUEST, ("svc", "m", "v1"), 0, 1_000_000, outcome, "E" if outcome == 1 else None, None, None, [])
        with agg.lock:
            agg.process([ev] * n, [0] * 16)

    send(0, 30)
    send(1, 5)
    (m,) = lat.status()["models"]
    assert m["outcomes"] == m["outcomes_total"] == {"ok": 30, "error": 5, "cancelled": 0, "client_error": 0, "shed": 0}
    assert list(m["outcomes"]) == list(OUTCOMES)
    for t in range(10, 71, 10):
        now[0] = float(t)
        lat.sample()
        if t == 10:
            send(2, 7)
            send(1, 1)
    now[0] = 75.0
    (m,) = lat.status()["models"]
    # The window starts at the copy of t=10, taken before the cancelled and the one error.
    assert m["outcomes"] == {"ok": 0, "error": 1, "cancelled": 7, "client_error": 0, "shed": 0}
    assert m["outcomes_total"] == {"ok": 30, "error": 6, "cancelled": 7, "client_error": 0, "shed": 0}


def test_start_up_line_names_the_states_that_the_status_shows() -> None:
    d = tempfile.mkdtemp(prefix="iwsum", dir="/tmp")
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--socket", os.path.join(d, "s.sock"),
         "--http-port", "0", "--set", "gpu.enabled=true", "--no-drift"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))},
    )
    try:
        assert proc.stderr is not None
        line = ""
        for line in proc.stderr:
            if " ready: " in line:
                break
        m = re.search(r"status JSON (http://[^,]+),.*components (\S+)$", line.strip())
        assert m, line
        import json
        import urllib.request

        logged = dict(kv.split(":") for kv in m.group(2).split(","))

        def status() -> dict[str, str]:
            with urllib.request.urlopen(m.group(1), timeout=10) as r:
                comps = json.load(r)["components"]
            return {k: c["state"] for k, c in comps.items()}

        shown = wait_until(status, what="the status")
        assert logged == shown, (line, shown)
        if logged["gpu"] != "absent":
            pytest.skip("this machine has NVML: the start-up line and the status agree, and neither says absent")
    finally:
        proc.terminate()
        proc.communicate(timeout=20)

"""Deciding whether each injected fault was detected, from the sidecar's own signals.

A fault counts as *detected* when the sidecar's own signal shows it:

========== =====================================================================
latency    the stage's P99.9 over the last 10 s exceeds the P999 latency target
drift      ``inferwatch_drift_dataset_drifted`` = 1 for the stable version
confidence reference mean confidence - current mean > 0.1 (the alert's threshold)
gpu_leak   ``inferwatch_gpu_leak_detected`` = 1 for the leaking worker's PID
canary     ``inferwatch_drift_canary_feature_drifted{feature="prediction"}`` = 1 for the canary
bad_events ``inferwatch_ingest_decode_errors_total{scope="json"}`` > 0
========== =====================================================================

With Prometheus, :data:`EXPECTED_ALERTS` names the alerts each fault must
fire; every other alert must stay quiet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.demo import report
from inferwatch_sidecar.demo.inject import FaultState
from inferwatch_sidecar.demo.observe import Snapshot
from inferwatch_sidecar.demo.promtext import Scrape

#: The P999 latency objective's target (alerts/source.py LATENCY_OBJECTIVES): slower calls burn its budget.
P999_TARGET_S = 2.5
#: The confidence drop (reference mean - current mean) that the confidence alert fires on.
CONFIDENCE_DROP = 0.1

#: The alerts each fault must bring to ``firing`` (with the labels that must match).
EXPECTED_ALERTS: dict[str, list[tuple[str, dict[str, str]]]] = {
    "latency": [("InferwatchStageLatencyP999BudgetBurn", {"stage": "inference"})],
    "drift": [("InferwatchFeatureDrift", {"model_version": mdl.STABLE}),
              ("InferwatchPredictionDrift", {"model_version": mdl.STABLE})],
    "confidence": [("InferwatchConfidenceDrop", {"model_version": mdl.STABLE}),
                   ("InferwatchEstimatedAccuracyLow", {"model_version": mdl.STABLE})],
    "gpu_leak": [("InferwatchGPUMemoryLeak", {})],
    "canary": [("InferwatchCanaryDiverging", {"model_version": mdl.CANARY})],
    "bad_events": [("InferwatchIngestDecodeErrors", {"scope": "json"})],
}


def _stable(snap: Snapshot) -> dict[str, Any]:
    return snap.drift.get((mdl.NAME, mdl.STABLE), {})


def _latency(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    p999 = snap.stages.get("inference", {}).get(0.999)
    return (p999 is not None and p999 > P999_TARGET_S,
            f"inference P99.9 {report.seconds(p999)} (target {P999_TARGET_S:g}s)")


def _drift(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    stable = _stable(snap)
    ratio = stable.get("drifted_ratio")
    flagged = [f for f, d in stable.get("features", {}).items() if d.get("drifted")
               and f not in ("prediction", "confidence")]
    return bool(stable.get("dataset_drifted")), (
        f"{len(flagged)} inputs drifted ({', '.join(sorted(flagged)) or '-'}), share "
        f"{ratio:.0%}" if ratio is not None else "no drift evaluation yet")


def _confidence(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    cur, ref = _stable(snap).get("confidence", [None, None])
    if cur is None or ref is None:
        return False, "no confidence window yet"
    return ref - cur > CONFIDENCE_DROP, f"mean confidence {cur:.3f} vs reference {ref:.3f}"


def _gpu_leak(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    for dev in snap.gpu.get("devices", []):
        for p in dev.get("processes", []):
            if p.get("pid") == leak_pid:
                v = p.get("verdict")
                return v == "leak", (f"pid {leak_pid}: {v}, {report.rate(p.get('rate_bytes_per_s'))}, "
                                     f"OOM in {report.duration(p.get('time_to_oom_s'))}")
    return False, f"pid {leak_pid} not sampled yet"


def _canary(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    cols = snap.drift.get((mdl.NAME, mdl.CANARY), {}).get("canary_columns")
    if cols is None:
        return False, "no canary comparison yet"
    differs = cols.get("prediction", False)
    differing = sorted(c for c, d in cols.items() if d)
    return differs, (f"{mdl.CANARY} vs {mdl.STABLE}: prediction mix {'differs' if differs else 'the same'}"
                     + (f"; differing: {', '.join(differing)}" if differing else ""))


def _bad_events(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    n = scrape.value("inferwatch_ingest_decode_errors_total", 0.0, scope="json") or 0.0
    return n > 0, f"{n:.0f} malformed JSON events counted and dropped"


#: Fault -> its detection signal: (detected now, the evidence).
SIGNALS: dict[str, Callable[[Snapshot, Scrape, int | None], tuple[bool, str]]] = {
    "latency": _latency,
    "drift": _drift,
    "confidence": _confidence,
    "gpu_leak": _gpu_leak,
    "canary": _canary,
    "bad_events": _bad_events,
}


def judge(faults: dict[str, FaultState], snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> None:
    """Update every injected fault's record from this poll: detection time, evidence and alert states.

    The evidence is refreshed at every poll where the signal is on; at polls where it is off, the earlier
    evidence stays, so a later quiet poll does not overwrite what the detection showed.
    """
    for name, st in faults.items():
        if st.injected_at is None:
            continue
        ok, detail = SIGNALS[name](snap, scrape, leak_pid)
        if ok and st.detected_at is None:
            st.detected_at = snap.t
        if ok or not st.detail:
            st.detail = detail
        for alert, match in EXPECTED_ALERTS[name]:
            st.alerts[alert] = _alert_state(snap, alert, match)


def _alert_state(snap: Snapshot, alert: str, match: dict[str, str]) -> str:
    best = "inactive"
    for a in snap.alert_items:
        lab = a.get("labels", {})
        if lab.get("alertname") != alert or any(lab.get(k) != v for k, v in match.items()):
            continue
        if a.get("state") == "firing":
            return "firing"
        best = a.get("state", best)
    return best


def expected_alert_names(faults: Iterable[str]) -> set[str]:
    """Every alert that ``faults`` must fire."""
    return {a for f in faults for a, _ in EXPECTED_ALERTS[f]}


def unexpected_alerts(seen: dict[str, set[str]], faults: Iterable[str]) -> dict[str, set[str]]:
    """The alerts in ``seen`` (name -> states) that no fault in ``faults`` explains."""
    want = expected_alert_names(faults)
    return {n: s for n, s in seen.items() if n not in want}

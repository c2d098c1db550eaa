"""Deciding whether each injected fault was detected, from the sidecar's own signals.

A fault counts as *detected* when the sidecar's own signal shows it:

=========== =====================================================================
latency     the stage's P99.9 over the last 10 s exceeds the P999 latency target
long_inputs the tail attribution of the stable version's last window names
            ``queue`` as the stage and ``input_tokens`` as the first feature that
            sets its slowest 1% apart
drift       ``inferwatch_drift_dataset_drifted`` = 1 for the stable version
confidence  the stable version's calibrated accuracy estimate is more than 0.05
            below the reference accuracy, its whole 95% interval below it (the
            ``InferwatchEstimatedAccuracyDrop`` condition)
gpu_leak    ``inferwatch_gpu_leak_detected`` = 1 for the leaking worker's PID
canary      ``inferwatch_drift_canary_feature_drifted{feature="prediction"}`` = 1 for the canary
bad_events  ``inferwatch_ingest_decode_errors_total{scope="json"}`` > 0
saturation  ``inferwatch_saturation_bound`` = 1 for the stable version with
            ``resource="kv_cache"``, and later with ``resource="host_cpu"``: both
            phases named, in order
=========== =====================================================================

The evidence says more than the signal: the confidence fault's compares the
calibrated estimate with the labelled accuracy and the mean confidence,
averaged over the polls whose drift window lies wholly after the injection; the
canary's carries the canary judge's verdict and score, and its verdict at the
last poll before the injection (the healthy phase, :attr:`FaultState.before`).

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

#: A fault's detection signal: (this poll, the sidecar's /metrics, the leaking worker) -> (detected now, evidence).
Signal = Callable[[Snapshot, Scrape, int | None], tuple[bool, str]]
#: Alert name and the labels that must match.
Alerts = list[tuple[str, dict[str, str]]]

#: The P999 latency objective's target (alerts/source.py LATENCY_OBJECTIVES): slower calls burn its budget.
P999_TARGET_S = 2.5
#: The drop of the calibrated estimate below the reference accuracy that InferwatchEstimatedAccuracyDrop fires on.
ACCURACY_DROP = 0.05
#: The sidecar's drift window (supervise.sidecar_config): polls this long after the injection see only faults.
DRIFT_WINDOW_S = 10.0

#: The alerts each fault must bring to ``firing`` (with the labels that must match).
EXPECTED_ALERTS: dict[str, Alerts] = {
    "latency": [("InferwatchStageLatencyP999BudgetBurn", {"stage": "inference"})],
    "drift": [("InferwatchFeatureDrift", {"model_version": mdl.STABLE}),
              ("InferwatchPredictionDrift", {"model_version": mdl.STABLE})],
    "long_inputs": [],
    "confidence": [("InferwatchEstimatedAccuracyDrop", {"model_version": mdl.STABLE}),
                   ("InferwatchEstimatedAccuracyLow", {"model_version": mdl.STABLE})],
    "gpu_leak": [("InferwatchGPUMemoryLeak", {})],
    # The canary judge names the versions as the requests do (v2 with the SDK, 2 with Triton's spans); the demo
    # has one canary.
    "canary": [("InferwatchCanaryDiverging", {"model_version": mdl.CANARY}),
               ("InferwatchCanaryFailing", {"model": mdl.NAME})],
    "bad_events": [("InferwatchIngestDecodeErrors", {"scope": "json"})],
    "saturation": [],
    "retry_storm": [("InferwatchRetryStorm", {"model_version": mdl.STABLE}),
                    ("InferwatchTimeoutMismatch", {"model_version": mdl.STABLE})],
}

#: Alerts a fault may also fire as a true consequence, without being required to (timing decides whether
#: they get there in a short run). The latency fault slows every inference while the offered load stays, so the
#: requests in flight climb past the live knee (Little's law) and InferwatchCapacityHeadroomLow fires once its
#: window and ``for:`` have passed: the server really is past its capacity then.
MAY_FIRE: dict[str, tuple[str, ...]] = {
    "latency": ("InferwatchCapacityHeadroomLow",),
}


def _stable(snap: Snapshot) -> dict[str, Any]:
    return snap.drift.get((mdl.NAME, mdl.STABLE), {})


def _latency(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    p999 = snap.stages.get("inference", {}).get(0.999)
    return (p999 is not None and p999 > P999_TARGET_S,
            f"inference P99.9 {report.seconds(p999)} (target {P999_TARGET_S:g}s)")


def tail_summary(snap: Snapshot, version: str = mdl.STABLE) -> tuple[str | None, str | None, str]:
    """The slowest 1% of ``version``'s last tail window: culprit stage, first distinguishing feature, sentence."""
    p99 = (snap.tail.get((mdl.NAME, version)) or {}).get("tails", {}).get("p99") or {}
    if p99.get("status") != "ok":
        return None, None, ""
    feature = next((f["feature"] for f in p99.get("features", []) if f.get("distinguishes")), None)
    return p99.get("culprit"), feature, p99.get("summary", "")


def _long_inputs(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    culprit, feature, sentence = tail_summary(snap)
    if culprit is None:
        return False, "no tail window with a slowest 1% yet"
    return culprit == "queue" and feature == "input_tokens", f"tail of {mdl.STABLE}: {sentence}"


def _drift(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    stable = _stable(snap)
    ratio = stable.get("drifted_ratio")
    flagged = [f for f, d in stable.get("features", {}).items() if d.get("drifted")
               and f not in ("prediction", "confidence")]
    return bool(stable.get("dataset_drifted")), (
        f"{len(flagged)} inputs drifted ({', '.join(sorted(flagged)) or '-'}), share "
        f"{ratio:.0%}" if ratio is not None else "no drift evaluation yet")


def _accuracy_values(snap: Snapshot) -> dict[str, float | None] | None:
    """The stable version's calibrated estimate, its interval and reference, labelled accuracy, mean confidence."""
    d = _stable(snap)
    iv = d.get("estimated_interval", {})
    if not d.get("calibrated") or d.get("estimated_accuracy") is None or d.get("reference_accuracy") is None \
            or "upper" not in iv or "lower" not in iv:
        return None
    return {"estimate": d["estimated_accuracy"], "lower": iv["lower"], "upper": iv["upper"],
            "reference": d["reference_accuracy"], "labelled": d.get("accuracy"), "confidence": d["confidence"][0],
            "reference_confidence": d["confidence"][1]}


def _accuracy_text(v: dict[str, float | None], polls: int = 0) -> str:
    def num(k: str) -> str:
        x = v.get(k)
        return "-" if x is None else f"{x:.3f}"

    return (f"estimated accuracy {num('estimate')} (95% {num('lower')}-{num('upper')}, calibrated) vs reference "
            f"{num('reference')}; labelled {num('labelled')}; mean confidence {num('confidence')} vs reference "
            f"{num('reference_confidence')}" + (f" (mean of {polls} polls)" if polls else ""))


def _confidence(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    v = _accuracy_values(snap)
    if v is None:
        return False, "no calibrated accuracy estimate yet"
    ref, est, upper = v["reference"], v["estimate"], v["upper"]
    assert ref is not None and est is not None and upper is not None
    return ref - est > ACCURACY_DROP and upper < ref, _accuracy_text(v)


def _confidence_mean(st: FaultState, snap: Snapshot, detail: str) -> str:
    """The confidence evidence averaged over the polls whose drift window holds only faulty traffic.

    One window's labels are a few hundred, so one poll's labelled accuracy is noisy to a few points.
    """
    v = _accuracy_values(snap)
    if v is None or st.injected_at is None or snap.t < st.injected_at + DRIFT_WINDOW_S:
        return detail
    for k, x in v.items():
        if x is not None:
            st.series.setdefault(k, []).append(x)
    return _accuracy_text({k: sum(xs) / len(xs) for k, xs in st.series.items()}, len(st.series["estimate"]))


def _gpu_leak(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    for dev in snap.gpu.get("devices", []):
        for p in dev.get("processes", []):
            if p.get("pid") == leak_pid:
                v = p.get("verdict")
                return v == "leak", (f"pid {leak_pid}: {v}, {report.rate(p.get('rate_bytes_per_s'))}, "
                                     f"OOM in {report.duration(p.get('time_to_oom_s'))}")
    return False, f"pid {leak_pid} not sampled yet"


#: The canary's version -> the stable version it must be judged against: the SDK's names (the FastAPI server's
#: requests) and Triton's own (its spans' ``triton.model_version``, triton_server.ROLES).
CANARY_BASELINES = {mdl.CANARY: mdl.STABLE, "2": "1"}


def canary_verdict(snap: Snapshot) -> str:
    """The canary judge's verdict on the canary against the stable version at this poll, with its score and
    failing metrics ('' for none: no judgement yet, or one against another baseline)."""
    j = next((j for j in snap.canary if j.get("model") == mdl.NAME
              and CANARY_BASELINES.get(j.get("canary_version", "")) == j.get("baseline_version")), None)
    if j is None:
        return ""
    failed = [m["name"] if m.get("stage") is None else f"{m['name']}[{m['stage']}]"
              for m in j.get("metrics", []) if m.get("result") == "fail"]
    return (f"canary judge {j['verdict'].upper()} {j['score']:.0f}/100"
            + (f" (failing: {', '.join(failed)})" if failed else ""))


def _canary(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    cols = snap.drift.get((mdl.NAME, mdl.CANARY), {}).get("canary_columns")
    if cols is None:
        return False, "no canary comparison yet"
    differs = cols.get("prediction", False)
    differing = sorted(c for c, d in cols.items() if d)
    verdict = canary_verdict(snap)
    return differs, (f"{mdl.CANARY} vs {mdl.STABLE}: prediction mix {'differs' if differs else 'the same'}"
                     + (f"; differing: {', '.join(differing)}" if differing else "")
                     + (f"; {verdict}" if verdict else ""))


def _bad_events(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    n = scrape.value("inferwatch_ingest_decode_errors_total", 0.0, scope="json") or 0.0
    return n > 0, f"{n:.0f} malformed JSON events counted and dropped"


def _retry_storm(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    lab = {"model": mdl.NAME, "model_version": mdl.STABLE}
    att = scrape.value("inferwatch_request_attempts_total", 0.0, **lab) or 0.0
    ret = scrape.value("inferwatch_request_retries_total", 0.0, **lab) or 0.0
    gone = scrape.value("inferwatch_client_giveups_total", 0.0, **lab) or 0.0
    amp = att / (att - ret) if att > ret else 0.0
    return ret > 0 and gone > 0, (f"{ret:.0f} retries of {att:.0f} attempts ({amp:.2f} per unique request), "
                                  f"{gone:.0f} clients gave up")


def bound_now(scrape: Scrape, version: str = mdl.STABLE) -> str:
    """The resource the saturation verdict names for ``version`` at this scrape (``none`` without one)."""
    for lab, v in scrape.get("inferwatch_saturation_bound"):
        if v == 1 and lab.get("model") == mdl.NAME and lab.get("model_version") == version:
            return lab.get("resource", "none")
    return "none"


def _saturation(snap: Snapshot, scrape: Scrape, leak_pid: int | None) -> tuple[bool, str]:
    """This poll's bound resource and the verdict's sentence; :func:`judge` keeps the phases seen."""
    bound = bound_now(scrape)
    sentence = next((v.get("detail", "") for v in snap.verdicts if v.get("verdict") == f"{bound}-bound"), "")
    return False, f"{bound}" + (f": {sentence}" if sentence else "")


def _saturation_phases(st: FaultState, snap: Snapshot, detail: str) -> tuple[bool, str]:
    """Detected once the verdict named ``kv_cache``, then ``host_cpu``; the evidence names both with their time."""
    bound, _, sentence = detail.partition(": ")
    if bound in ("kv_cache", "host_cpu"):
        st.series.setdefault(f"{bound}_at", [snap.t])
        # The bound comes from /metrics and the sentence from /v1/status, read one after the other: the first
        # poll that names the bound may find the status a pass behind, so the sentence is kept when it comes.
        if sentence and not st.notes.get(bound):
            st.notes[bound] = sentence
    kv, cpu = st.series.get("kv_cache_at"), st.series.get("host_cpu_at")
    named = [f"{r}-bound at {st.series[f'{r}_at'][0]:.1f}s ({st.notes.get(r) or 'no sentence'})"
             for r in ("kv_cache", "host_cpu") if f"{r}_at" in st.series]
    return (kv is not None and cpu is not None and kv[0] < cpu[0],
            "; then ".join(named) if named else f"verdict now: {bound}")


#: Fault -> its detection signal: (detected now, the evidence).
SIGNALS: dict[str, Signal] = {
    "latency": _latency,
    "long_inputs": _long_inputs,
    "drift": _drift,
    "confidence": _confidence,
    "gpu_leak": _gpu_leak,
    "canary": _canary,
    "bad_events": _bad_events,
    "retry_storm": _retry_storm,
    "saturation": _saturation,
}


def judge(faults: dict[str, FaultState], snap: Snapshot, scrape: Scrape, leak_pid: int | None,
          signals: dict[str, Signal] | None = None,
          expected: dict[str, Alerts] | None = None) -> None:
    """Update every injected fault's record from this poll: detection time, evidence and alert states.

    The evidence is refreshed at every poll where the signal is on; at polls where it is off, the earlier
    evidence stays, so a later quiet poll does not overwrite what the detection showed.

    Args:
        faults: each configured fault's record.
        snap: this poll.
        scrape: the sidecar's /metrics at this poll.
        leak_pid: the worker the GPU leak is scripted in.
        signals: fault -> its detection signal (default :data:`SIGNALS`; the vLLM scenario has its own).
        expected: fault -> the alerts it must fire (default :data:`EXPECTED_ALERTS`).
    """
    signals = SIGNALS if signals is None else signals
    expected = EXPECTED_ALERTS if expected is None else expected
    for name, st in faults.items():
        if st.injected_at is None:
            if name == "canary":
                st.before = canary_verdict(snap) or st.before
            continue
        ok, detail = signals[name](snap, scrape, leak_pid)
        if name == "confidence":
            detail = _confidence_mean(st, snap, detail)
        elif name == "saturation":
            ok, detail = _saturation_phases(st, snap, detail)
        elif name == "canary" and st.before:
            detail += f"; before the fault: {st.before}"
        if ok and st.detected_at is None:
            st.detected_at = snap.t
        if ok or not st.detail:
            st.detail = detail
        for alert, match in expected[name]:
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


def expected_alert_names(faults: Iterable[str],
                         expected: dict[str, Alerts] | None = None) -> set[str]:
    """Every alert that ``faults`` must fire (``expected``: as for :func:`judge`)."""
    expected = EXPECTED_ALERTS if expected is None else expected
    return {a for f in faults for a, _ in expected[f]}


def allowed_alert_names(faults: Iterable[str],
                        expected: dict[str, Alerts] | None = None) -> set[str]:
    """The alerts ``faults`` explain: those they must fire and those they may (:data:`MAY_FIRE`)."""
    faults = list(faults)
    return expected_alert_names(faults, expected) | {a for f in faults for a in MAY_FIRE.get(f, ())}


def unexpected_alerts(seen: dict[str, set[str]], faults: Iterable[str],
                      expected: dict[str, Alerts] | None = None) -> dict[str, set[str]]:
    """The alerts in ``seen`` (name -> states) that no fault in ``faults`` explains."""
    want = allowed_alert_names(faults, expected)
    return {n: s for n, s in seen.items() if n not in want}


class CapacityTrace:
    """The stable version's live knee and headroom over the run (the summary's capacity line).

    Each poll adds (time, requests in flight) to :attr:`flights`, and (time, requests in flight, knee,
    headroom) to :attr:`points` once the knee is known. A live knee is only known once the traffic has gone
    beyond it (throughput flat while requests in flight rose), which in the demo is during a fault; so
    :meth:`lines` says how far the requests in flight rose past it from where they were before the fault
    (``inject_at``, scenario seconds), and where the headroom started and how far it fell when the knee was
    known before.
    """

    def __init__(self, inject_at: float | None = None) -> None:
        self.inject_at = inject_at
        self.points: list[tuple[float, float, float, float]] = []
        self.flights: list[tuple[float, float]] = []

    def observe(self, t: float, scrape: Scrape) -> None:
        lab = {"model": mdl.NAME, "model_version": mdl.STABLE}
        knee = scrape.value("inferwatch_capacity_knee_concurrency", None, **lab)
        head = scrape.value("inferwatch_capacity_headroom_ratio", None, **lab)
        flight = scrape.value("inferwatch_capacity_in_flight", None, **lab)
        if flight is not None:
            self.flights.append((t, flight))
        if knee is not None and head is not None and flight is not None:
            self.points.append((t, flight, knee, head))

    def fell(self) -> tuple[tuple[float, float, float, float], tuple[float, float, float, float]] | None:
        """The first point and the one with the least headroom after it, when the headroom fell."""
        if not self.points:
            return None
        first = self.points[0]
        low = min(self.points, key=lambda p: p[3])
        return (first, low) if low[3] < first[3] else None

    def rose(self) -> tuple[tuple[float, float], tuple[float, float, float, float]] | None:
        """Past the knee during the fault: (the most requests in flight before the fault, as (time, in flight);
        the point with the least headroom after it), when that headroom is negative and its requests in flight
        are more than before the fault; None otherwise (or with no injection time or no poll before it)."""
        if self.inject_at is None or not self.points:
            return None
        before = [f for f in self.flights if f[0] < self.inject_at]
        after = [p for p in self.points if p[0] >= self.inject_at]
        if not before or not after:
            return None
        top = max(before, key=lambda f: f[1])
        low = min(after, key=lambda p: p[3])
        return (top, low) if low[3] < 0 and low[1] > top[1] else None

    def lines(self) -> list[str]:
        if not self.points:
            return ["capacity (live knee of " + mdl.STABLE + "): not identified yet (the traffic has not shown "
                    "throughput levelling off while requests in flight rose)"]
        t, flight, knee, head = self.points[-1]
        out = [f"capacity (live knee of {mdl.STABLE}): knee {knee:.2f} requests in flight; now {flight:.2f} in "
               f"flight, headroom {head:.0%}"]
        fell = self.fell()
        if fell is not None:
            (t0, f0, _, h0), (t1, f1, _, h1) = fell
            out.append(f"  headroom fell from {h0:.0%} at {t0:.0f}s to {h1:.0%} at {t1:.0f}s as requests in flight "
                       f"rose from {f0:.2f} to {f1:.2f}")
        rose = self.rose()
        if rose is not None:
            (t0, f0), (t1, f1, k1, h1) = rose
            out.append(f"  requests in flight rose from at most {f0:.2f} before the fault ({t0:.0f}s) to {f1:.2f} at "
                       f"{t1:.0f}s, past the knee of {k1:.2f} (headroom {h1:.0%})")
        return out

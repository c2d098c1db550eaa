"""The demo's words and numbers: each fault's title, value formats, and the end-of-run summary."""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch_sidecar.demo.alertmanager import Notification
from inferwatch_sidecar.demo.inject import FaultState

# The value formats live with the live view that `inferwatch top` shares; the demo's modules use them from here.
from inferwatch_sidecar.export.live_view import duration as duration
from inferwatch_sidecar.export.live_view import rate as rate
from inferwatch_sidecar.export.live_view import seconds as seconds

FAULT_TITLES = {
    "latency": "latency spike in the inference stage",
    "long_inputs": "long inputs fill the batch and the queue",
    "drift": "feature drift (6 of 9 inputs shifted)",
    "confidence": "accuracy drop: traffic from a hard segment",
    "gpu_leak": "GPU memory leak in one worker (fake NVML)",
    "canary": "canary v2 turns bad: other mix, 30 ms slower",
    "bad_events": "a client posting malformed JSON events",
    "retry_storm": "retry storm: clients time out at 0.5 s, retry at once",
    "saturation": "saturation: KV cache full, then host CPU",
}


@dataclass(frozen=True)
class Delivered:
    """The notifications of one alert to one receiver: the statuses they carried, in order, and how many alerts."""

    receiver: str
    alertname: str
    runbook_url: str
    statuses: tuple[str, ...]
    alerts: int

    @property
    def status(self) -> str:
        """``firing``, ``resolved``, or ``firing/resolved`` for an alert that fired and then resolved."""
        return "/".join(self.statuses)


def delivered(notifications: list[Notification]) -> list[Delivered]:
    """One row per (receiver, alertname), in order of first arrival."""
    rows: dict[tuple[str, str], Delivered] = {}
    for n in notifications:
        for a in n.alerts:
            name = a.get("labels", {}).get("alertname", "?")
            status = str(a.get("status", "?"))
            old = rows.get((n.receiver, name))
            statuses = old.statuses if old is not None else ()
            if status not in statuses:
                statuses = (*statuses, status)
            rows[(n.receiver, name)] = Delivered(n.receiver, name, a.get("annotations", {}).get("runbook_url", "-"),
                                                 statuses, (old.alerts if old is not None else 0) + 1)
    return list(rows.values())


def notification_lines(notifications: list[Notification]) -> list[str]:
    """The summary's Alertmanager section: receiver, alertname, the statuses delivered and the runbook link."""
    rows = delivered(notifications)
    if not rows:
        return ["notifications (Alertmanager): none arrived"]
    lines = [f"notifications (Alertmanager): {len(notifications)} webhook calls"]
    lines += [f"  {d.receiver:<20} {d.alertname:<38} {d.status:<15} runbook {d.runbook_url}" for d in rows]
    return lines


def summary_lines(faults: dict[str, FaultState], injection_time: float,
                  unexpected_alerts: dict[str, set[str]] | None,
                  notifications: list[Notification] | None = None, *,
                  titles: dict[str, str] | None = None, not_applicable: dict[str, str] | None = None,
                  extra: list[str] | None = None, passed: bool | None = None) -> list[str]:
    """The end-of-run summary, one fault per line, then the verdict.

    Args:
        faults: each configured fault's record.
        injection_time: when the faults were due (for a run stopped before).
        unexpected_alerts: alerts no injected fault explains, with the states they were seen in; None
            without Prometheus (no alert lines).
        notifications: what Alertmanager delivered; None without Alertmanager (no notification lines).
        titles: fault -> its title, in the order of the lines (default :data:`FAULT_TITLES`).
        not_applicable: faults the engine cannot show, with the reason, listed after the others.
        extra: lines before the verdict (the vLLM scenario's counts side by side).
        passed: the verdict (default: every fault detected).
    """
    titles = FAULT_TITLES if titles is None else titles
    not_applicable = not_applicable or {}
    lines = ["fault                                          injected  detected  after   evidence"]
    for name, title in titles.items():
        st = faults.get(name)
        if st is None:
            continue
        inj = f"{st.injected_at:6.1f}s" if st.injected_at is not None else "     -"
        det = f"{st.detected_at:6.1f}s" if st.detected_at is not None else "    NO"
        after = f"{st.latency_s:5.1f}s" if st.latency_s is not None else "    -"
        lines.append(f"{title:<46} {inj}   {det}  {after}  {st.detail}")
        if unexpected_alerts is not None:
            for alert, state in st.alerts.items():
                lines.append(f"{'':<46} alert {alert}: {state}")
    lines += [f"{f + ': not applicable':<46} {why}" for f, why in not_applicable.items()]
    if unexpected_alerts is not None:
        lines.append("other alerts: " + (", ".join(f"{n} ({'/'.join(sorted(s))})" for n, s in
                                                  sorted(unexpected_alerts.items())) or "none (all quiet)"))
    if notifications is not None:
        lines += notification_lines(notifications)
    lines += extra or []
    injected = [st for st in faults.values() if st.injected_at is not None]
    if not injected:
        lines.append(f"NOT RUN: stopped before the faults were injected (t={injection_time:.0f}s)")
        return lines
    n = sum(st.detected for st in injected)
    if passed is None:
        passed = all(st.detected for st in faults.values())
    lines.append(f"{'PASS' if passed else 'FAIL'}: {n} of {len(injected)} injected faults detected"
                 + (f" ({len(not_applicable)} not applicable)" if not_applicable else ""))
    return lines

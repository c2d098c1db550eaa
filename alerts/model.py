"""The rule model of inferwatch's alerts: profiles, thresholds, alerts, recording rules and rule files.

The tunables an operator may change (:data:`SIDECAR_JOB_SELECTOR`, :data:`RUNBOOK_BASE_URL`) live here;
:mod:`alerts.source` re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

#: Selects the scrape job(s) of the sidecar, used by the "sidecar down / not scraped" alerts.
#: Change it to match your scrape config (the ServiceMonitor in deploy/k8s names the job "inferwatch").
SIDECAR_JOB_SELECTOR = 'job="inferwatch"'

#: Where runbook_url annotations point. Each alert links to its own anchor (the lower-cased alert name).
RUNBOOK_BASE_URL = "https://github.com/inferwatch/inferwatch/blob/main/docs/runbooks.md"

#: Labels that identify one served model version in the core (request/stage) metrics; the drift metrics
#: use the same model and model_version labels, so drift and latency series join.
SERVING = "service, model, model_version"
#: The same, plus the stage.
STAGE = "service, model, model_version, stage"


@dataclass(frozen=True)
class Profile:
    """How durations are rendered.

    Attributes:
        name: "production" or a test profile's name.
        scale: factor applied to every duration (1/60 turns 5m into 5s).
        min_seconds: lower bound of a scaled duration, so a range window still
            spans several scrapes.
    """

    name: str = "production"
    scale: float = 1.0
    min_seconds: float = 0.0

    def duration(self, seconds: float) -> str:
        """A Prometheus duration string for ``seconds`` scaled by this profile."""
        if seconds == 0:
            return "0s"
        s = max(seconds * self.scale, self.min_seconds)
        ms = int(round(s * 1000))
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                return f"{ms // size}{unit}"
        return f"{ms}ms"

    def seconds(self, seconds: float) -> float:
        """A plain number of seconds (for ``predict_linear`` horizons), scaled."""
        return max(seconds * self.scale, self.min_seconds) if seconds else 0.0


PRODUCTION = Profile()
#: For end-to-end tests scraping every second: 5m becomes 5s, 1h becomes 1m, at least 4s.
FAST = Profile(name="fast", scale=1 / 60, min_seconds=4.0)


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """A tunable value of one alert.

    Attributes:
        name: the threshold's name, unique within its alert; the template field ``{name}``.
        value: the number (or regex) the field renders.
        doc: what it means, for docs/alerts.md.
        duration: the value is seconds of time, scaled by the profile like the windows.
        bucket_of: a histogram whose bucket bounds the value must be one of (the rule counts whole buckets).
    """

    name: str
    value: float | str
    doc: str
    duration: bool = False
    bucket_of: str | None = None


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alerting rule.

    Attributes:
        name: the alertname (CamelCase, prefixed Inferwatch).
        group: the rule group it belongs to.
        severity: critical (pages), warning (ticket) or info.
        expr: the PromQL template.
        for_s: the ``for:`` duration in seconds (0 = fire at once).
        summary: one line, may use ``{labels.NAME}``.
        description: the details, with live values (``{value:humanize}``).
        thresholds: the tunable values the templates use.
    """

    name: str
    group: str
    severity: str
    expr: str
    for_s: float
    summary: str
    description: str
    thresholds: tuple[Threshold, ...] = ()

    @property
    def anchor(self) -> str:
        """The runbook section anchor (GitHub lower-cases heading text)."""
        return self.name.lower()

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_BASE_URL}#{self.anchor}"


@dataclass(frozen=True, kw_only=True)
class Recording:
    """One recording rule (``level:metric:operations`` naming).

    Attributes:
        record: the series it writes.
        group: the rule group it belongs to.
        expr: the PromQL template.
        labels: static labels added to the result.
        alert: the alert whose thresholds ``expr`` reads, so that an override of the alert moves both.
    """

    record: str
    group: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)
    alert: str | None = None


@dataclass(frozen=True, kw_only=True)
class RuleFile:
    """One generated rule file of ``alerts/``: its groups in file order, and the comment at its top."""

    name: str
    groups: tuple[str, ...]
    doc: str = ""


class LatencyObjective(NamedTuple):
    """A latency SLO of every stage; ``target_seconds`` must be a bucket bound of the stage histogram."""

    name: str
    objective: float
    target_seconds: float
    burn_rate: float
    severity: str

"""Config section ``canary:`` of the sidecar (the canary judge, docs/canary.md).

Example::

    canary:
      window_seconds: 600
      min_requests: 500
      baselines: {resnet: "2024-05-01"}   # the stable version per model; default: the busiest one
      tolerances: {latency_p99_ratio: 1.2}
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The judged metrics, by name (docs/canary.md, "Metrics"). ``stage_*`` are judged once per stage.
METRIC_NAMES = ("error_rate", "latency", "latency_p99", "stage_latency", "stage_p99", "prediction_mix",
                "confidence", "estimated_accuracy", "ttft", "itl", "goodput", "cancel_rate", "shed_rate")
#: The metrics judged per stage: ``canary.critical`` may name one stage of them, as ``stage_latency[inference]``.
STAGE_METRICS = ("stage_latency", "stage_p99")
_STAGE_ENTRY = re.compile(r"([a-z_0-9]+)\[([^\[\]]+)\]")


def _critical_metric(entry: str) -> str | None:
    """The metric a ``canary.critical`` entry names (None: a stage given to a metric that has none)."""
    m = _STAGE_ENTRY.fullmatch(entry)
    if m is None:
        return entry
    return m.group(1) if m.group(1) in STAGE_METRICS else None


def is_critical(critical: list[str], name: str, stage: str | None) -> bool:
    """Whether metric ``name`` (of ``stage``, for a stage metric) is critical under ``critical``."""
    return name in critical or (stage is not None and f"{name}[{stage}]" in critical)


class Tolerances(BaseModel):
    """How much worse a canary may be before a metric fails (each also needs a significant test, but accuracy).

    Attributes:
        error_rate_ratio: the canary's error rate may exceed the stable one's by this fraction (0.5: 50% more).
        error_rate_min_increase: ...and must exceed it by at least this much in absolute terms to fail.
        latency_shift: largest tolerated ``AUC - 0.5`` of the rank test, where AUC is the probability that a
            canary request is slower than a stable one (ties count one half).
        latency_p99_ratio: largest tolerated ratio of the canary's P99 to the stable version's.
        prediction_psi: largest tolerated PSI between the two prediction mixes.
        confidence_drop: largest tolerated drop of the mean confidence.
        accuracy_drop: largest tolerated drop of the drift component's estimated accuracy.
        stage_min_increase_s: a stage metric fails only when the canary's median (``stage_latency``) or P99
            (``stage_p99``) is also slower by more than this many seconds: an absolute floor far above timer
            noise (a 5 us stage measured 0.5 us slower is not a regression, however significant).
        ttft_shift, itl_shift: largest tolerated ``AUC - 0.5`` of time to first token and inter-token latency.
        stream_min_increase_s: ...and their medians must differ by more than this many seconds to fail.
        goodput_drop: largest tolerated drop of the share of requests meeting every SLO of ``canary.slo``.
        rate_min_increase: the cancelled and shed rates fail only beyond both the error-rate ratio and this
            absolute increase.
    """

    model_config = ConfigDict(extra="forbid")

    error_rate_ratio: float = Field(default=0.5, ge=0)
    error_rate_min_increase: float = Field(default=0.002, ge=0, le=1)
    latency_shift: float = Field(default=0.05, ge=0, le=0.5)
    latency_p99_ratio: float = Field(default=1.2, ge=1)
    prediction_psi: float = Field(default=0.1, ge=0)
    confidence_drop: float = Field(default=0.02, ge=0, le=1)
    accuracy_drop: float = Field(default=0.03, ge=0, le=1)
    stage_min_increase_s: float = Field(default=0.0001, ge=0)
    ttft_shift: float = Field(default=0.05, ge=0, le=0.5)
    itl_shift: float = Field(default=0.05, ge=0, le=0.5)
    stream_min_increase_s: float = Field(default=0.001, ge=0)
    goodput_drop: float = Field(default=0.05, ge=0, le=1)
    rate_min_increase: float = Field(default=0.02, ge=0, le=1)


class Slo(BaseModel):
    """Service-level objectives a request must meet to count toward goodput (unset: not part of it).

    Attributes:
        latency_s: end-to-end latency at most this.
        ttft_s: time to first token of every streamed stage at most this.
        itl_s: every gap between tokens at most this.
    """

    model_config = ConfigDict(extra="forbid")

    latency_s: float | None = Field(default=None, gt=0)
    ttft_s: float | None = Field(default=None, gt=0)
    itl_s: float | None = Field(default=None, gt=0)

    @property
    def enabled(self) -> bool:
        return self.latency_s is not None or self.ttft_s is not None or self.itl_s is not None


class Weights(BaseModel):
    """Weight of each metric group in the score (groups without data are left out and the rest rescaled).

    Attributes:
        errors: error, cancelled and shed rates.
        latency: latency, its P99, time to first token, inter-token latency and goodput.
        stages: each stage's latency and P99.
        outputs: prediction mix, confidence and estimated accuracy.
    """

    model_config = ConfigDict(extra="forbid")

    errors: float = Field(default=30.0, ge=0)
    latency: float = Field(default=40.0, ge=0)
    stages: float = Field(default=10.0, ge=0)
    outputs: float = Field(default=20.0, ge=0)


class CanaryConfig(BaseModel):
    """Canary judge settings. Extra keys are rejected so typos fail start-up.

    Attributes:
        enabled: build the canary component.
        window_seconds: both versions are compared over the same sliding window of this length.
        subwindows: the window is a ring of this many sub-windows; it slides by one of them.
        evaluate_interval_s: seconds between judgements (off the ingest thread).
        min_requests: a version is judged (or judged against) only with at least this many requests in the window.
        baselines: the stable version per model name; a model not listed takes its busiest version.
        alpha: family-wise error rate of one judgement (Holm's correction across its tests): with identical
            versions, the chance that any metric tests significant.
        pass_score: score from which the verdict is pass.
        marginal_score: score from which the verdict is marginal (below it: fail).
        critical: metrics whose failure fails the canary whatever the score; a stage metric may name one
            stage (``stage_latency[inference]``), else it is critical for every stage.
        tolerances: per-metric tolerances.
        weights: per-group weights of the score.
        max_versions: (service, model, version) tracked at once; others are dropped and counted.
        max_stages: stages tracked per version; others are dropped and counted.
        max_classes: prediction classes tracked per version; others count as ``__other__``.
        max_staged: events waiting for the judge's thread; beyond it events are dropped and counted.
        slo: objectives for goodput (judged only when one is set).
        load_imbalance_ratio: the judgement warns when one version's requests per replica (SDK producer)
            exceed the other's by this factor: the busier replicas are slower for load, not for code. When the
            canary is the busier one, the metrics load alone moves are inconclusive rather than failed.
        fail_after_s: a canary is reported ``fail`` only once its judgement has failed without a break for this
            many seconds (re-judgements over a window that moved on: new requests), ``marginal`` with a warning
            until then; 0 reports a fail at once; unset: one sub-window (``window_seconds / subwindows``, 60 s by
            default). It bounds the false fails of a rollout judged every ``evaluate_interval_s`` for many
            minutes (docs/canary.md, "Error rates").
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    window_seconds: float = Field(default=600.0, gt=0)
    subwindows: int = Field(default=10, ge=2, le=60)
    evaluate_interval_s: float = Field(default=10.0, gt=0, le=3600)
    min_requests: int = Field(default=500, ge=10)
    baselines: dict[str, str] = Field(default_factory=dict)
    alpha: float = Field(default=0.01, gt=0, lt=1)
    pass_score: float = Field(default=95.0, ge=0, le=100)
    marginal_score: float = Field(default=75.0, ge=0, le=100)
    critical: list[str] = Field(default_factory=lambda: ["error_rate", "latency", "latency_p99", "ttft"])
    tolerances: Tolerances = Field(default_factory=Tolerances)
    weights: Weights = Field(default_factory=Weights)
    max_versions: int = Field(default=32, ge=2, le=1000)
    max_stages: int = Field(default=16, ge=0, le=256)
    max_classes: int = Field(default=32, ge=1, le=256)
    max_staged: int = Field(default=200_000, ge=1000)
    slo: Slo = Field(default_factory=Slo)
    load_imbalance_ratio: float = Field(default=1.5, ge=1)
    fail_after_s: float | None = Field(default=None, ge=0, le=86400)

    @property
    def fail_hold_s(self) -> float:
        """``fail_after_s``, or one sub-window when it is unset."""
        return self.window_seconds / self.subwindows if self.fail_after_s is None else self.fail_after_s

    @model_validator(mode="after")
    def _check(self) -> CanaryConfig:
        if self.marginal_score > self.pass_score:
            raise ValueError("canary.marginal_score must not exceed canary.pass_score")
        unknown = sorted(c for c in self.critical if _critical_metric(c) not in METRIC_NAMES)
        if unknown:
            raise ValueError(f"canary.critical: unknown metric(s) {unknown}; known: {list(METRIC_NAMES)}, "
                             f"and {list(STAGE_METRICS)} for one stage as {STAGE_METRICS[0]}[STAGE]")
        w = self.weights
        if w.errors + w.latency + w.stages + w.outputs <= 0:
            raise ValueError("canary.weights: at least one group needs a positive weight")
        return self

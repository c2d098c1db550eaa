"""The canary judge: one canary version against the stable one over the same window, metric by metric.

In the spirit of Kayenta's judge: every metric has a direction (which way is
worse), a statistical test and a tolerance on its effect size; a metric fails
only when its Holm-adjusted p-value (across every test of the judgement) is at
most ``alpha`` *and* its effect exceeds the tolerance, so a large window cannot
fail a canary for a negligible difference and a small one cannot fail it on
noise. Holm's step-down correction bounds the family-wise error: with identical
versions, the chance that *any* metric of a judgement fails is at most
``alpha`` before the tolerances, which only lower it (docs/canary.md has the
measured rates). The score is the weighted share of passing metrics per group
(errors, latency, stages, outputs), 0 to 100; the verdict is ``fail`` when a
critical metric fails, else ``pass``, ``marginal`` or ``fail`` by score.

The component re-judges every ``evaluate_interval_s`` over a sliding window, so
one verdict is many re-judgements of mostly the same requests; a fail is
*reported* only once the judgement has failed without a break for
``fail_after_s`` (:class:`VerdictHold`), and is ``marginal`` with a warning until
then.

Metrics (docs/canary.md has the table):

- ``error_rate`` (higher is worse): Fisher's exact test, one-sided (the rates
  are small, so a normal approximation is anti-conservative in the tail the
  judge reads: a few errors more would fail an identical canary);
- ``latency`` and ``stage_latency`` per stage (higher is worse): Mann-Whitney
  on the binned latencies, ties handled (``stats.mann_whitney_binned``);
  effect ``AUC - 0.5``;
- ``latency_p99`` and ``stage_p99`` (higher is worse): each version's share
  of the requests above the P99 bin of both versions together, Fisher's exact
  test, one-sided; effect: ratio of the two P99s. The rank test alone cannot
  see a tail that moves while the body stays put;
- ``prediction_mix`` (any change is worse): chi-square homogeneity, effect PSI;
- ``confidence`` (lower is worse): Mann-Whitney on binned confidences, effect:
  drop of the mean;
- ``estimated_accuracy`` (lower is worse): the drift component's estimate for
  each version, compared with the tolerance only (it comes without a sample);
- ``ttft`` and ``itl`` (higher is worse): time to first token and inter-token
  gaps of streamed stages, Mann-Whitney like ``latency``;
- ``goodput`` (lower is worse): the share of requests meeting every SLO of
  ``canary.slo``, Fisher's exact test; judged only when an SLO is set;
- ``cancel_rate`` and ``shed_rate`` (higher is worse): clients that left, and
  429/503 the server returned, Fisher's exact tests like ``error_rate``.

Stage metrics and ``ttft``/``itl`` also need an absolute increase beyond a floor
(``stage_min_increase_s``, ``stream_min_increase_s``) to fail: a timer's noise
is significant on a large window but is no regression.

The judgement warns when one version's requests per replica exceed the other's
by ``load_imbalance_ratio``: busier replicas are slower for their load, not for
their code. When the canary is the busier one, a failure of a metric that load
alone moves (:data:`LOAD_SENSITIVE`: latency, stages, streams, goodput, cancels,
sheds) cannot be told from a regression: such a metric is ``inconclusive``, the
verdict at most ``marginal``, and the warning names the metrics and why.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferwatch_sidecar.components.canary.config import CanaryConfig, is_critical
from inferwatch_sidecar.components.canary.window import LATENCY_EDGES, Summary, quantile
from inferwatch_sidecar.stats import hypothesis as stats

VERDICTS = ("pass", "marginal", "fail")
#: Metrics that more load per replica moves on its own (queueing): judged inconclusive, not failed, when the
#: canary's replicas carry more load each than the stable version's.
LOAD_SENSITIVE = frozenset({"latency", "latency_p99", "stage_latency", "stage_p99", "ttft", "itl", "goodput",
                            "cancel_rate", "shed_rate"})
#: Metric group of each metric, for the score's weights.
GROUPS = {"error_rate": "errors", "latency": "latency", "latency_p99": "latency", "stage_latency": "stages",
          "stage_p99": "stages", "prediction_mix": "outputs", "confidence": "outputs", "estimated_accuracy": "outputs",
          "ttft": "latency", "itl": "latency", "goodput": "latency", "cancel_rate": "errors", "shed_rate": "errors"}
#: The statistic each metric is tested with, and the unit of its stable/canary values (the table's columns).
STATISTICS = {
    "error_rate": ("Fisher exact", "share"), "cancel_rate": ("Fisher exact", "share"),
    "shed_rate": ("Fisher exact", "share"), "goodput": ("Fisher exact", "share"),
    "latency": ("Mann-Whitney U", "s (median)"), "stage_latency": ("Mann-Whitney U", "s (median)"),
    "ttft": ("Mann-Whitney U", "s (median)"), "itl": ("Mann-Whitney U", "s (median)"),
    "latency_p99": ("Fisher exact, share above P99", "s (P99)"),
    "stage_p99": ("Fisher exact, share above P99", "s (P99)"),
    "prediction_mix": ("chi-square", "-"), "confidence": ("Mann-Whitney U", "mean confidence"),
    "estimated_accuracy": ("none (tolerance only)", "accuracy"),
}


@dataclass
class MetricResult:
    """One judged metric.

    Attributes:
        name: the metric (``config.METRIC_NAMES``).
        stage: the stage of a ``stage_*`` metric, else None.
        direction: ``increase`` (higher is worse), ``decrease`` or ``change``.
        baseline / canary: the compared values (error rate, median or P99 seconds, mean confidence, accuracy).
        effect_name / effect: the effect size the tolerance applies to.
        tolerance: the largest effect that passes.
        p_value / p_adjusted: the one-sided test's p-value, raw and Holm-adjusted (None: no test).
        result: pass, fail, nodata, or inconclusive (failed, but on a canary busier per replica and a metric
            load alone moves).
        critical: its failure fails the canary.
    """

    name: str
    stage: str | None
    direction: str
    baseline: float | None
    canary: float | None
    effect_name: str
    effect: float | None
    tolerance: float
    p_value: float | None
    critical: bool
    p_adjusted: float | None = None
    result: str = "nodata"
    #: The statistical test, and the unit of ``baseline`` and ``canary`` (``STATISTICS``).
    statistic: str = ""
    unit: str = ""

    def __post_init__(self) -> None:
        if not self.statistic:
            self.statistic, self.unit = STATISTICS[self.name]

    @property
    def group(self) -> str:
        return GROUPS[self.name]

    @property
    def label(self) -> str:
        return self.name if self.stage is None else f"{self.name}[{self.stage}]"

    def to_json(self) -> dict[str, Any]:
        return {k: _clean(v) for k, v in self.__dict__.items()}


@dataclass
class Judgement:
    """The canary's verdict against the stable version."""

    service: str
    model: str
    canary_version: str
    baseline_version: str
    canary_requests: int
    baseline_requests: int
    score: float
    verdict: str
    metrics: list[MetricResult] = field(default_factory=list)
    #: Why the judgement may be biased (unequal load per replica), for people.
    warnings: list[str] = field(default_factory=list)
    baseline_replicas: int = 0
    canary_replicas: int = 0
    #: This window's own verdict; ``verdict`` is what is reported, held back while a fail is new (VerdictHold).
    judged_verdict: str = ""
    #: Since when the reported verdict holds, and since when the judgement has failed without a break (Unix s).
    verdict_since_unix: float | None = None
    failing_since_unix: float | None = None

    def __post_init__(self) -> None:
        self.judged_verdict = self.judged_verdict or self.verdict

    @property
    def failed(self) -> list[MetricResult]:
        return [m for m in self.metrics if m.result == "fail"]

    @property
    def inconclusive(self) -> list[MetricResult]:
        return [m for m in self.metrics if m.result == "inconclusive"]

    def reasons(self) -> list[str]:
        """One line per failed metric, for people (status, CLI, docs)."""
        out = []
        for m in self.failed:
            p = "" if m.p_adjusted is None else f", adjusted p={m.p_adjusted:.2g}"
            out.append(f"{m.label}: {m.effect_name} {_fmt(m.effect)} beyond tolerance {_fmt(m.tolerance)} "
                       f"(stable {_fmt(m.baseline)}, canary {_fmt(m.canary)}{p})")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service, "model": self.model, "canary_version": self.canary_version,
            "baseline_version": self.baseline_version, "canary_requests": self.canary_requests,
            "baseline_requests": self.baseline_requests, "score": round(self.score, 2), "verdict": self.verdict,
            "reasons": self.reasons(), "warnings": list(self.warnings), "baseline_replicas": self.baseline_replicas,
            "canary_replicas": self.canary_replicas, "judged_verdict": self.judged_verdict,
            "verdict_since_unix": self.verdict_since_unix, "failing_since_unix": self.failing_since_unix,
            "metrics": [m.to_json() for m in self.metrics],
        }


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def exact_greater(kb: int, nb: int, kc: int, nc: int) -> float:
    """Fisher's exact one-sided p-value that the canary's share ``kc / nc`` exceeds the stable one's ``kb / nb``.

    Given the ``kb + kc`` events, the canary's count is hypergeometric under equal shares: the chance of
    ``kc`` or more. Exact (conservative) however few the events.

    The value of ``scipy.stats.hypergeom.sf(kc - 1, nb + nc, kb + kc, nc)`` (pinned by a test), computed by the
    function it calls (Boost's, in ``scipy.special``) without importing ``scipy.stats``: 46 MiB of modules over
    ``scipy.special``, which the drift and canary tests load anyway, for this one call (docs/benchmarks.md, soak).
    """
    total, events, draws, k = nb + nc, kb + kc, nc, kc - 1
    if not (total > 0 and 0 <= events <= total and 0 <= draws <= total):
        return math.nan  # what scipy.stats returns for arguments outside the distribution's
    if k < max(draws - (total - events), 0):  # below the support: certain
        return 1.0
    if k >= min(events, draws):  # at or above its top: impossible
        return 0.0
    return min(max(float(_hypergeom_sf()(k, events, draws, total)), 0.0), 1.0)


def _hypergeom_sf() -> Any:
    """Boost's hypergeometric survival function ``(k, n, N, M)``, as ``scipy.stats.hypergeom._sf`` calls it."""
    try:
        from scipy.special._ufuncs import _hypergeom_sf  # private to scipy: hence the fallback
    except ImportError:  # a scipy without it: through scipy.stats, the same value
        from scipy.stats import hypergeom

        return lambda k, n, big_n, m: hypergeom.sf(k, m, n, big_n)
    return _hypergeom_sf


def _error_rate(b: Summary, c: Summary, cfg: CanaryConfig) -> MetricResult:
    br, cr = b.errors / b.requests, c.errors / c.requests
    # Worse only beyond both tolerances: a ratio (50% more errors) and an absolute floor (0.2 points).
    tol = max(cfg.tolerances.error_rate_min_increase, br * cfg.tolerances.error_rate_ratio)
    return MetricResult("error_rate", None, "increase", br, cr, "increase", cr - br, tol,
                        exact_greater(b.errors, b.requests, c.errors, c.requests), "error_rate" in cfg.critical)


def _latency(name: str, stage: str | None, b: np.ndarray, c: np.ndarray, cfg: CanaryConfig) -> MetricResult:
    auc, _z, p = stats.mann_whitney_binned(b, c)
    return MetricResult(name, stage, "increase", quantile(b, 0.5), quantile(c, 0.5), "auc_shift", auc - 0.5,
                        cfg.tolerances.latency_shift, p, is_critical(cfg.critical, name, stage))


def _p99(name: str, stage: str | None, b: np.ndarray, c: np.ndarray, cfg: CanaryConfig) -> MetricResult:
    nb, nc = int(b.sum()), int(c.sum())
    # Each version's requests above the P99 bin of both together: a threshold that treats the two alike, so
    # with equal latencies the split of those requests between them is hypergeometric and Fisher's test is
    # exact. (The stable version's own P99 would not be: its share above it is at most 1% by construction,
    # the canary's is not, and identical canaries fail on the difference.)
    j = int(np.searchsorted(np.cumsum(b + c), 0.99 * (nb + nc), side="left"))
    kb, kc = int(b[j + 1:].sum()), int(c[j + 1:].sum())
    qb, qc = quantile(b, 0.99), quantile(c, 0.99)
    ratio = qc / qb if qb and qc is not None else None
    m = MetricResult(name, stage, "increase", qb, qc, "ratio", ratio, cfg.tolerances.latency_p99_ratio,
                     exact_greater(kb, nb, kc, nc), is_critical(cfg.critical, name, stage))
    if j >= LATENCY_EDGES.size:  # the P99 is in the overflow bin: nothing above it to count
        m.p_value = None
    return m


def _rate(name: str, kb: int, nb: int, kc: int, nc: int, cfg: CanaryConfig) -> MetricResult:
    """A share that is worse higher (cancelled, shed): like ``error_rate``, with its own absolute floor."""
    br, cr = kb / nb, kc / nc
    tol = max(cfg.tolerances.rate_min_increase, br * cfg.tolerances.error_rate_ratio)
    return MetricResult(name, None, "increase", br, cr, "increase", cr - br, tol, exact_greater(kb, nb, kc, nc),
                        name in cfg.critical)


def _goodput(b: Summary, c: Summary, cfg: CanaryConfig) -> MetricResult:
    assert b.good is not None and c.good is not None
    br, cr = b.good / b.requests, c.good / c.requests
    # Fewer good requests is more bad ones: the same exact test on the requests that missed an SLO.
    p = exact_greater(b.requests - b.good, b.requests, c.requests - c.good, c.requests)
    return MetricResult("goodput", None, "decrease", br, cr, "drop", br - cr, cfg.tolerances.goodput_drop, p,
                        "goodput" in cfg.critical)


def _stream(name: str, b: np.ndarray, c: np.ndarray, tol: float, cfg: CanaryConfig) -> MetricResult:
    auc, _z, p = stats.mann_whitney_binned(b, c)
    return MetricResult(name, None, "increase", quantile(b, 0.5), quantile(c, 0.5), "auc_shift", auc - 0.5, tol, p,
                        name in cfg.critical)


def imbalance(b: Summary, c: Summary, replicas: tuple[int, int], ratio: float) -> tuple[str, str] | None:
    """(busier side, the warning) when the two versions' requests per replica differ by ``ratio`` or more."""
    rb, rc = replicas
    if rb <= 0 or rc <= 0:
        return None
    lb, lc = b.requests / rb, c.requests / rc
    lo, hi = min(lb, lc), max(lb, lc)
    if lo <= 0 or hi / lo < ratio:
        return None
    busier = "canary" if lc > lb else "stable"
    return busier, (f"load per replica differs {hi / lo:.2f}x (stable {lb:.0f} requests on {rb} replica(s), canary "
                    f"{lc:.0f} on {rc}): the {busier} version's replicas carry more load each, which alone can make "
                    "it slower; compare latency with care")


def imbalance_warning(b: Summary, c: Summary, replicas: tuple[int, int], ratio: float) -> str | None:
    """A warning when the two versions' requests per replica differ by ``ratio`` or more; None otherwise."""
    found = imbalance(b, c, replicas, ratio)
    return None if found is None else found[1]


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control across the tests, any dependence)."""
    m = p_values.size
    order = np.argsort(p_values, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p_values[order])
    out = np.empty(m)
    out[order] = np.maximum.accumulate(scaled)
    return out


def _prediction_mix(b: Summary, c: Summary, cfg: CanaryConfig) -> MetricResult:
    names = sorted(set(b.classes) | set(c.classes))
    bc = np.array([b.classes.get(n, 0) for n in names], dtype=np.float64)
    cc = np.array([c.classes.get(n, 0) for n in names], dtype=np.float64)
    _chi, p, _dof = stats.chi2_homogeneity(bc, cc)
    psi = stats.psi(stats.proportions(bc), stats.proportions(cc))
    return MetricResult("prediction_mix", None, "change", None, None, "psi", psi, cfg.tolerances.prediction_psi, p,
                        "prediction_mix" in cfg.critical)


def _confidence(b: Summary, c: Summary, cfg: CanaryConfig) -> MetricResult:
    bm, cm = b.confidence_sum / b.confidence_n, c.confidence_sum / c.confidence_n
    _auc, _z, p = stats.mann_whitney_binned(c.confidence, b.confidence)  # the stable version's are larger
    return MetricResult("confidence", None, "decrease", bm, cm, "drop", bm - cm, cfg.tolerances.confidence_drop, p,
                        "confidence" in cfg.critical)


def judge(service: str, model: str, baseline_version: str, canary_version: str, b: Summary, c: Summary,
          cfg: CanaryConfig, accuracy: tuple[float | None, float | None] = (None, None),
          replicas: tuple[int, int] = (0, 0)) -> Judgement:
    """Judge canary ``c`` against the stable version ``b`` (both with at least ``cfg.min_requests`` requests).

    Args:
        service, model, baseline_version, canary_version: what is compared, for the result.
        b, c: the two versions' windows.
        cfg: tolerances, alpha, weights, thresholds and critical metrics.
        accuracy: the drift component's estimated accuracy of the stable and the canary version, if known.
        replicas: the producers (replicas) that sent each version's events (0: unknown).
    """
    metrics = _judged_metrics(b, c, cfg, accuracy)
    _decide(metrics, cfg)
    warnings = _load_warnings(metrics, b, c, replicas, cfg)
    score = _score(metrics, cfg)
    return Judgement(service, model, canary_version, baseline_version, c.requests, b.requests, score,
                     _verdict(metrics, score, cfg), metrics, warnings, replicas[0], replicas[1])


def _judged_metrics(b: Summary, c: Summary, cfg: CanaryConfig,
                    accuracy: tuple[float | None, float | None]) -> list[MetricResult]:
    """Every metric both windows hold enough of, with its effect and p-value (results not yet decided)."""
    metrics = [_error_rate(b, c, cfg), _latency("latency", None, b.e2e, c.e2e, cfg),
               _p99("latency_p99", None, b.e2e, c.e2e, cfg)]
    for stage in sorted(set(b.stages) & set(c.stages)):
        hb, hc = b.stages[stage], c.stages[stage]
        if hb.sum() >= cfg.min_requests and hc.sum() >= cfg.min_requests:
            metrics += [_latency("stage_latency", stage, hb, hc, cfg), _p99("stage_p99", stage, hb, hc, cfg)]
    if sum(b.classes.values()) >= cfg.min_requests and sum(c.classes.values()) >= cfg.min_requests:
        metrics.append(_prediction_mix(b, c, cfg))
    if b.confidence_n >= cfg.min_requests and c.confidence_n >= cfg.min_requests:
        metrics.append(_confidence(b, c, cfg))
    tol = cfg.tolerances
    if b.ttft is not None and c.ttft is not None and b.ttft.sum() >= cfg.min_requests \
            and c.ttft.sum() >= cfg.min_requests:
        metrics.append(_stream("ttft", b.ttft, c.ttft, tol.ttft_shift, cfg))
    if b.itl is not None and c.itl is not None and b.itl.sum() >= cfg.min_requests \
            and c.itl.sum() >= cfg.min_requests:
        metrics.append(_stream("itl", b.itl, c.itl, tol.itl_shift, cfg))
    if b.good is not None and c.good is not None:
        metrics.append(_goodput(b, c, cfg))
    # Judged when either version had any (a pair of zero rates tests nothing).
    if b.cancelled or c.cancelled:
        metrics.append(_rate("cancel_rate", b.cancelled, b.requests, c.cancelled, c.requests, cfg))
    if b.shed or c.shed:
        metrics.append(_rate("shed_rate", b.shed, b.requests, c.shed, c.requests, cfg))
    ab, ac = accuracy
    if ab is not None and ac is not None:
        metrics.append(MetricResult("estimated_accuracy", None, "decrease", ab, ac, "drop", ab - ac,
                                    tol.accuracy_drop, None, "estimated_accuracy" in cfg.critical))
    return metrics


def _decide(metrics: list[MetricResult], cfg: CanaryConfig) -> None:
    """Each metric's result: Holm-adjusted significance, its tolerance, and the absolute floors."""
    tol = cfg.tolerances
    tested = [m for m in metrics if m.p_value is not None]
    adj = holm(np.array([m.p_value for m in tested])) if tested else np.empty(0)
    for m, a in zip(tested, adj, strict=True):
        m.p_adjusted = float(a)
    for m in metrics:
        if m.effect is None:
            m.result = "nodata"
            continue
        significant = m.p_adjusted is None or m.p_adjusted <= cfg.alpha
        m.result = "fail" if significant and m.effect > m.tolerance else "pass"
        floor = _FLOORS.get(m.name)
        if m.result == "fail" and floor is not None and m.baseline is not None and m.canary is not None \
                and m.canary - m.baseline <= getattr(tol, floor):
            m.result = "pass"  # significant, but no slower than the absolute floor: timer noise, not a regression


def _load_warnings(metrics: list[MetricResult], b: Summary, c: Summary, replicas: tuple[int, int],
                   cfg: CanaryConfig) -> list[str]:
    """The per-replica load warning, turning load-sensitive fails of a busier canary inconclusive."""
    warnings: list[str] = []
    found = imbalance(b, c, replicas, cfg.load_imbalance_ratio)
    if found is None:
        return warnings
    warnings.append(found[1])
    confounded = [m for m in metrics if m.result == "fail" and m.name in LOAD_SENSITIVE]
    if found[0] == "canary" and confounded:
        for m in confounded:
            m.result = "inconclusive"
        warnings.append(f"inconclusive: {', '.join(m.label for m in confounded)} failed on the canary, whose "
                        "replicas are the busier ones: more load per replica alone makes them slower (and "
                        "sheds and cancels more), so this cannot be told from a regression; give both versions "
                        "the same load per replica (traffic weights in proportion to their replicas) to judge "
                        "them")
    return warnings


def _verdict(metrics: list[MetricResult], score: float, cfg: CanaryConfig) -> str:
    if any(m.critical and m.result == "fail" for m in metrics):
        return "fail"
    if score >= cfg.pass_score:
        return "marginal" if any(m.result == "inconclusive" for m in metrics) else "pass"
    return "marginal" if score >= cfg.marginal_score else "fail"


#: The metrics with an absolute floor on their increase (seconds), by tolerance name.
_FLOORS = {"stage_latency": "stage_min_increase_s", "stage_p99": "stage_min_increase_s",
           "ttft": "stream_min_increase_s", "itl": "stream_min_increase_s"}


def _score(metrics: list[MetricResult], cfg: CanaryConfig) -> float:
    weights = cfg.weights.model_dump()
    total = got = 0.0
    for group, w in weights.items():
        judged = [m for m in metrics if m.group == group and m.result in ("pass", "fail")]
        if not judged or w <= 0:
            continue
        total += w
        got += w * sum(m.result == "pass" for m in judged) / len(judged)
    return 100.0 * got / total if total else 100.0



class VerdictHold:
    """What each canary's reported verdict is, over the re-judgements of a sliding window.

    A judgement of ``fail`` is reported only once every judgement of the pair for ``fail_after_s`` seconds
    has failed (the window has moved on by that much: new requests, not the same ones judged again);
    until then the pair is reported ``marginal`` (inconclusive: Argo Rollouts neither promotes nor
    aborts) with a warning that says since when it fails. Any other verdict is reported as judged. It
    also keeps since when each reported verdict holds (the status summary's since-when).

    Memory: one entry per (service, model, canary, baseline) judged at the last evaluation.
    """

    def __init__(self, fail_after_s: float) -> None:
        self.fail_after_s = fail_after_s
        #: pair -> (since when it judges fail, or None; the reported verdict; since when it is reported)
        self._state: dict[tuple[str, str, str, str], tuple[float | None, str, float]] = {}

    def apply(self, judgements: list[Judgement], now: float) -> None:
        """Set each judgement's reported ``verdict`` and its since-when, in place; forget pairs not judged."""
        state: dict[tuple[str, str, str, str], tuple[float | None, str, float]] = {}
        for j in judgements:
            key = (j.service, j.model, j.canary_version, j.baseline_version)
            failing, shown, shown_since = self._state.get(key, (None, "", now))
            failing = (now if failing is None else failing) if j.judged_verdict == "fail" else None
            verdict = j.judged_verdict
            if failing is not None and now - failing < self.fail_after_s:
                verdict = "marginal"
                j.warnings.append(f"failing since {_clock(failing)}: reported fail once it has failed for "
                                  f"{self.fail_after_s:g} s without a break (canary.fail_after_s), marginal until then")
            if verdict != shown:
                shown, shown_since = verdict, now
            j.verdict, j.verdict_since_unix, j.failing_since_unix = verdict, shown_since, failing
            state[key] = (failing, shown, shown_since)
        self._state = state


def _clock(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))

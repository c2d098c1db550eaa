"""The catalog query check: every series a rule or panel query reads exists, with the labels it matches.

A series exists when the metric catalog (``inferwatch_sidecar.metrics.catalog``) exports it, when a
recording rule of ``alerts/source.py`` writes it, or when Prometheus itself creates it. The alert tests and
the dashboard generator both run every query through :func:`check_query`, so a renamed metric or label fails
there instead of leaving an alert or a panel silently empty.
"""

from __future__ import annotations

from alerts import promql, source
from inferwatch_sidecar.metrics.catalog import all_metrics, series_names

_BY = frozenset({"by"})


def _recorded_labels(expr: str) -> frozenset[str] | None:
    """The labels a recording rule's result carries: those of its ``by`` clauses.

    None for an expression without one: its result keeps the labels of the series it reads, which are
    not derived here, so queries of it are not checked for labels.
    """
    labels = promql.grouping_labels(expr, _BY) - {"le"}
    return frozenset(labels) if labels else None


def known_series() -> dict[str, frozenset[str] | None]:
    """Series names a query may use, with the labels each carries (None: labels not checked)."""
    out: dict[str, frozenset[str] | None] = {}
    for m in all_metrics():
        for s in series_names(m):
            extra = {"le"} if s.endswith("_bucket") and m.type == "histogram" else set()
            out[s] = frozenset(m.labels) | extra
    for g in source.groups(names=source.GROUPS + source.FLEET_GROUPS):
        for r in g["rules"]:
            if "record" in r:
                out[r["record"]] = _recorded_labels(r["expr"])
    for b in promql.BUILTIN_SERIES:
        out[b] = frozenset({"alertname", "alertstate", "severity"}) if b.startswith("ALERTS") else frozenset()
    return out


def check_query(expr: str, known: dict[str, frozenset[str] | None] | None = None) -> list[str]:
    """Problems with a query: unknown series, or labels matched that the series does not carry."""
    known = known if known is not None else known_series()
    problems = []
    for name in sorted(promql.series_names(expr)):
        if name not in known:
            problems.append(f"unknown series {name!r} (not in the metric catalog or the recording rules)")
    for name, labels in promql.selector_labels(expr):
        carried = known.get(name)
        if carried is not None:
            extra = labels - carried - promql.TARGET_LABELS
            if extra:
                problems.append(f"{name} has no label(s) {sorted(extra)}")
    return problems

"""Just enough PromQL lexing to say which series and labels an expression reads.

The rule and dashboard generators use it to refuse a query that names a
series the metric catalog does not export, so a renamed metric cannot leave an
alert or a panel silently empty. Syntax itself is checked by ``promtool``.
"""

from __future__ import annotations

import re

#: PromQL words that look like identifiers but are not series names.
KEYWORDS = frozenset({
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "inf", "nan", "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile", "atan2", "start", "end",
})
#: Series Prometheus itself creates (scrape health, alert state).
BUILTIN_SERIES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "scrape_samples_scraped"})
#: Labels every scraped series may carry besides the catalog's.
TARGET_LABELS = frozenset({"job", "instance", "__name__"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)")
_SELECTOR = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")


def _strip_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def series_names(expr: str) -> set[str]:
    """Names of the series an expression selects (metric names and recording-rule names).

    Args:
        expr: a PromQL expression; Grafana variables such as ``$__rate_interval`` are allowed.

    Returns:
        Every identifier used as a vector selector, including ``{__name__="..."}`` selectors.
    """
    names: set[str] = set()
    for m in re.finditer(r'__name__\s*=\s*"([^"]+)"', expr):
        names.add(m.group(1))
    text = _strip_strings(expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)
    for m in _IDENT.finditer(text):
        word = m.group(1)
        rest = text[m.end():].lstrip()
        if rest.startswith("("):  # a function call
            continue
        if word in KEYWORDS:
            continue
        names.add(word)
    return names


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """``(series name, label names matched)`` for every ``name{...}`` selector in ``expr``."""
    out: list[tuple[str, set[str]]] = []
    # Keep strings (label values) intact while scanning braces: blank their content instead.
    text = _STRING.sub(lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', expr)
    for m in _SELECTOR.finditer(text):
        name = m.group(1) or ""
        if name in KEYWORDS:
            continue
        labels = {lm.group(1) for lm in _MATCHER.finditer(m.group(2))}
        out.append((name, labels))
    return out


#: Every clause that names labels in parentheses.
GROUPING_CLAUSES = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


def grouping_labels(expr: str, clauses: frozenset[str] = GROUPING_CLAUSES) -> set[str]:
    """Label names used in ``clauses`` (default: ``by``/``without``/``on``/``ignoring``/``group_*``)."""
    text = _strip_strings(expr)
    out: set[str] = set()
    for m in _GROUPING.finditer(text):
        if m.group(1) not in clauses:
            continue
        inner = m.group(0)[m.group(0).index("(") + 1:-1]
        out.update(x.strip() for x in inner.split(",") if x.strip())
    return out

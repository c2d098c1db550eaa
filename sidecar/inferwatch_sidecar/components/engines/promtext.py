"""A fast, bounded parser for the Prometheus text exposition format (version 0.0.4).

The sidecar reads an inference engine's ``/metrics`` every second. prometheus_client's
``text_string_to_metric_families`` builds a family object per metric and a sample
tuple per series (about 30 us a series); this parser returns plain
``(name, labels, value)`` tuples and skips, before splitting labels, every series
whose name the caller does not want, so an endpoint with thousands of series it
does not read costs a prefix test per line (``bench/engine_parse.py`` compares both).

Malformed lines are counted, never raised: an engine that answers garbage is
reported, not a crash.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

#: One series: metric name, label pairs, value.
Series = tuple[str, dict[str, str], float]

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_SPECIAL = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan, "Inf": math.inf}


@dataclass
class Parsed:
    """What one parse found."""

    series: list[Series] = field(default_factory=list)
    #: Lines that are not comments, not blank and not a valid sample.
    bad_lines: int = 0
    #: Sample lines with a valid metric name (wanted or not).
    lines: int = 0
    #: The first malformed line (80 characters), for the status.
    first_bad: str = ""


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return v.replace("\\\\", "\x00").replace('\\"', '"').replace("\\n", "\n").replace("\x00", "\\")


def _value(text: str) -> float:
    s = _SPECIAL.get(text)
    if s is not None:
        return s
    return float(text)


def parse(text: str, want: Callable[[str], bool] | None = None, max_series: int = 100_000) -> Parsed:
    """Parse ``text``; keep only series whose name ``want`` accepts (all when None).

    Args:
        text: the exposition body.
        want: name filter, called once per sample line.
        max_series: stop keeping series past this many (the rest count as lines only).
    """
    out = Parsed()
    series = out.series
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            close = line.rfind("}")
            if close < brace:
                out.bad_lines += 1
                out.first_bad = out.first_bad or line[:80]
                continue
            rest = line[close + 1:].split()
            body = line[brace + 1:close]
        else:
            parts = line.split()
            if not parts:
                continue
            name, rest, body = parts[0], parts[1:], ""
        if not _NAME.match(name):
            out.bad_lines += 1
            out.first_bad = out.first_bad or line[:80]
            continue
        out.lines += 1
        if want is not None and not want(name):
            continue
        if not rest or len(rest) > 2:
            out.bad_lines += 1
            out.first_bad = out.first_bad or line[:80]
            continue
        try:
            value = _value(rest[0])
        except ValueError:
            out.bad_lines += 1
            out.first_bad = out.first_bad or line[:80]
            continue
        labels: dict[str, str] = {}
        if body:
            pos = 0
            n = len(body)
            ok = True
            while pos < n:
                m = _LABEL.match(body, pos)
                if m is None:
                    ok = body[pos:].strip() == ""
                    break
                labels[m.group(1)] = _unescape(m.group(2))
                pos = m.end()
            if not ok:
                out.bad_lines += 1
                out.first_bad = out.first_bad or line[:80]
                continue
        if len(series) < max_series:
            series.append((name, labels, value))
    return out

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

    Lines of series ``want`` refuses cost a name cut and the lookup: they are not validated. When no
    series is kept, every line is validated, so that a body of garbage is reported as such.

    Args:
        text: the exposition body.
        want: name filter, called once per sample line.
        max_series: stop keeping series past this many (the rest count as lines only).
    """
    out = Parsed()
    series = out.series
    lines = text.split("\n")
    for line in lines:
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace > 0:
            name = line[:brace]
        else:
            space = line.find(" ")
            name = line if space < 0 else line[:space]
        out.lines += 1
        if want is not None and not want(name):
            continue
        s = _sample(line, name, brace)
        if s is None:
            out.bad_lines += 1
            out.first_bad = out.first_bad or line[:80]
        elif len(series) < max_series:
            series.append(s)
    if not series and want is not None:
        out.lines = out.bad_lines = 0
        for line in lines:
            if line and line[0] != "#":
                brace = line.find("{")
                name = line[:brace] if brace > 0 else line.split(" ", 1)[0]
                if _sample(line, name, brace) is None:
                    out.bad_lines += 1
                    out.first_bad = out.first_bad or line[:80]
                else:
                    out.lines += 1
    return out


def _sample(line: str, name: str, brace: int) -> Series | None:
    """One sample line as a series, or None when it is malformed."""
    if not _NAME.match(name):
        return None
    if brace > 0:
        close = line.rfind("}")
        if close < brace:
            return None
        rest = line[close + 1:].split()
        body = line[brace + 1:close]
    else:
        rest = line.split()[1:]
        body = ""
    if not rest or len(rest) > 2:
        return None
    try:
        value = _value(rest[0])
    except ValueError:
        return None
    labels: dict[str, str] = {}
    pos, n = 0, len(body)
    while pos < n:
        m = _LABEL.match(body, pos)
        if m is None:
            if body[pos:].strip():
                return None
            break
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return name, labels, value

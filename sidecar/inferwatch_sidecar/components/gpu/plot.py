"""``gpu analyze --plot``: each series with its release floor, fitted trend, detections and projected OOM.

One panel per series (the device first, then its processes), at most :data:`MAX_PANELS` of them
(:func:`choose`). What a panel holds is built once
(:func:`panels`) and drawn by one of two renderers:

- ``.html``: a self-contained page of inline SVG, written with the standard library only;
- ``.png``: matplotlib (the ``plot`` extra: ``pip install "inferwatch[plot]"``), imported only then.

The release floor drawn is the level memory returns to after each release of the allocator's cache:
the lowest sample of every release (:func:`release_floor`), and the lower envelope where no release
comes for :data:`FLOOR_S` (the longest sawtooth period the detector's test family covers).
The trend of each leak episode starts on that floor at the episode's onset estimate and climbs at the
episode's rate until it cleared (or the end of the log); a series without an episode gets the slope of
the detector's shortest judged window over that window. The projected OOM is the end of the log plus
the time to OOM: the series' own, and for a process also the device's (every growing process together).
"""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from inferwatch_sidecar.components.gpu.analysis import Series, stamp

#: Most panels one plot draws: the leaking series first, fastest first, then the fastest-growing others
#: (:func:`choose`); a log of hundreds of processes would give a page or image no one can read.
MAX_PANELS = 24
#: Without a release for this long, the release floor drawn is the lower envelope, seconds.
FLOOR_S = 600.0
#: Smallest fall below the peak counted as a release, bytes.
RELEASE_MIN = 64 * 2**20
#: Time buckets per panel: each keeps its lowest and highest sample, so a sawtooth keeps its envelope.
BUCKETS = 1000
GiB = 2**30

#: name -> (colour, dash) shared by both renderers.
STYLE = {
    "memory used": ("#9bb7d4", ""),
    "release floor": ("#1f4e8c", ""),
    "trend": ("#e07b00", ""),
    "projected trend": ("#e07b00", "6 4"),
    "memory full": ("#777777", "2 3"),
    "detected": ("#c62828", ""),
    "cleared": ("#2e7d32", ""),
    "projected OOM": ("#c62828", "6 4"),
    "device OOM (all growing processes)": ("#6a1b9a", "6 4"),
}


class PlotError(ValueError):
    """The plot cannot be written (unknown format, missing extra, unwritable file)."""


@dataclass
class Panel:
    """What one series' panel draws, in seconds and bytes.

    Attributes:
        label: the series' name (its panel title).
        lines: (style name, xs, ys) polylines.
        points: (style name, x, y, hover text) markers.
        vlines: (style name, x, hover text) vertical markers.
        notes: text lines under the title (verdict, rate, OOM beyond the plot).
        x_range: the x extent (the log, stretched to show a near projected OOM).
    """

    label: str
    lines: list[tuple[str, list[float], list[float]]] = field(default_factory=list)
    points: list[tuple[str, float, float, str]] = field(default_factory=list)
    vlines: list[tuple[str, float, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    x_range: tuple[float, float] = (0.0, 1.0)


def check_target(path: str) -> str:
    """The format of ``path`` ("html" or "png"), checked before any log is read.

    Raises:
        PlotError: another extension, or ``.png`` without matplotlib.
    """
    low = path.lower()
    if low.endswith((".html", ".htm")):
        return "html"
    if low.endswith(".png"):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PlotError(f'--plot {path}: PNG output needs matplotlib: pip install "inferwatch[plot]" '
                            "(or write FILE.html, which needs nothing more)") from None
        return "png"
    raise PlotError(f"--plot {path}: the file must end in .png or .html")


def choose(series: list[Series], limit: int = MAX_PANELS) -> tuple[list[Series], list[Series]]:
    """The series to draw (at most ``limit``, in their order) and those left out.

    Leaking series (verdict ``leak``, or any episode) come first, fastest first; then the others by the
    slope of the detector's shortest judged window, fastest-growing first.
    """
    def rank(k: int) -> tuple[bool, float, int]:
        r = series[k].result
        leaking = r["verdict"] == "leak" or bool(r["episodes"])
        rate = r["leak_rate_bytes_per_s"]
        return (not leaking, -(rate if rate is not None else -math.inf), k)

    keep = set(sorted(range(len(series)), key=rank)[:limit])
    return ([s for k, s in enumerate(series) if k in keep], [s for k, s in enumerate(series) if k not in keep])


def write(path: str, series: list[Series], limit: int = MAX_PANELS) -> list[Series]:
    """Draw the series :func:`choose` keeps into ``path`` (.html or .png); returns those left out.

    Raises:
        PlotError: bad target (see :func:`check_target`) or the file cannot be written.
    """
    kind = check_target(path)
    kept, left = choose(series, limit)
    ps = panels(kept)
    try:
        if kind == "html":
            with open(path, "w", encoding="utf-8") as f:
                f.write(render_html(ps, [s.label for s in left]))
        else:
            render_png(ps, path, len(left))
    except OSError as e:
        raise PlotError(f"--plot {path}: cannot write: {e.strerror or e}") from e
    return left


def left_out_note(shown: int, left: int) -> str:
    """What the plot says about the series it does not draw."""
    return (f"{left} more series left out: {shown} panels at most, the leaking ones first, then the "
            "fastest-growing")


# -- what to draw ---------------------------------------------------------------------------------------------
def _envelope(t: list[float], v: list[float], t0: float, width: float) -> tuple[list[float], list[float]]:
    """Per bucket the lowest and the highest sample, in time order."""
    if len(t) <= 2 * BUCKETS:
        return list(t), list(v)
    best: dict[int, list[int]] = {}
    for i, ti in enumerate(t):
        k = min(BUCKETS - 1, int((ti - t0) / width))
        b = best.get(k)
        if b is None:
            best[k] = [i, i]
        else:
            if v[i] < v[b[0]]:
                b[0] = i
            if v[i] > v[b[1]]:
                b[1] = i
    idx = sorted({i for b in best.values() for i in b})
    return [t[i] for i in idx], [v[i] for i in idx]


def _release_troughs(v: list[float]) -> list[int]:
    """Indices of the lowest sample of every release: a fall of more than max(64 MiB, 12 sigma) below the
    peak since the previous release. Sigma is the per-sample noise, read off
    second differences (a ramp of the sawtooth has none): their robust SD over sqrt(6)."""
    d2 = sorted(abs(c - 2 * b + a) for a, b, c in zip(v, v[1:], v[2:], strict=False))
    sigma = 1.4826 * d2[len(d2) // 2] / math.sqrt(6) if d2 else 0.0
    thr = max(RELEASE_MIN, 12 * sigma)
    out = []
    peak = v[0]
    trough: int | None = None
    for i, x in enumerate(v):
        if trough is None:
            if x > peak:
                peak = x
            elif peak - x > thr:
                trough = i
        elif x < v[trough]:
            trough = i
        elif x - v[trough] > thr:
            out.append(trough)
            trough, peak = None, x
    if trough is not None:
        out.append(trough)
    return out


def release_floor(t: list[float], v: list[float]) -> tuple[list[float], list[float]]:
    """The per-release minima, at most :data:`BUCKETS` points.

    Each release of the allocator's cache gives one point, its lowest sample. Where no release comes
    for :data:`FLOOR_S` (idle, flat, or growth without a sawtooth) the floor is the series' lower
    envelope: the lowest sample of each of :data:`BUCKETS` time buckets.

    Args:
        t: sample times, ascending.
        v: values.
    """
    if not t:
        return [], []
    t0, span = t[0], max(t[-1] - t[0], 1e-9)
    width = max(span / BUCKETS, 1e-9)
    troughs = _release_troughs(v)
    idx = list(troughs)
    # Stretches without a release for FLOOR_S (before the first, between two, after the last, or the whole
    # series): their lower envelope. Bounds are (first index, last index) of the stretch's samples.
    is_trough = set(troughs)
    bounds = [0, *troughs, len(t) - 1]
    for a, b in zip(bounds, bounds[1:], strict=False):
        if t[b] - t[a] > FLOOR_S or not troughs:
            lo = a if a not in is_trough else a + 1  # the series' first and last samples belong to it
            hi = b + 1 if b not in is_trough else b
            idx += _lowest_per_bucket(t, v, range(lo, hi), t0, width)
    if len(idx) > BUCKETS:
        idx = _lowest_per_bucket(t, v, idx, t0, width)
    idx = sorted(set(idx))
    return [t[i] for i in idx], [v[i] for i in idx]


def _lowest_per_bucket(t: list[float], v: list[float], indices: Iterable[int], t0: float, width: float) -> list[int]:
    low: dict[int, int] = {}
    for i in indices:
        b = min(BUCKETS - 1, int((t[i] - t0) / width))
        if b not in low or v[i] < v[low[b]]:
            low[b] = i
    return sorted(low.values())


def _at(xs: list[float], ys: list[float], x: float) -> float:
    """Linear interpolation of a polyline at ``x`` (clamped to its ends)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xs[mid] <= x:
            lo = mid
        else:
            hi = mid
    f = (x - xs[lo]) / (xs[hi] - xs[lo]) if xs[hi] > xs[lo] else 0.0
    return ys[lo] + f * (ys[hi] - ys[lo])


def _dur(s: float) -> str:
    return f"{s / 86400:.1f} d" if s >= 86400 else f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


def panels(series: list[Series]) -> list[Panel]:
    """One :class:`Panel` per series."""
    out = []
    for s in series:
        p = Panel(s.label)
        r = s.result
        if not s.t:
            p.notes.append("no samples")
            out.append(p)
            continue
        t0, t1 = s.t[0], s.t[-1]
        span = max(t1 - t0, 1.0)
        xs, ys = _envelope(s.t, s.v, t0, span / BUCKETS)
        p.lines.append(("memory used", xs, ys))
        fx, fy = release_floor(s.t, s.v)
        p.lines.append(("release floor", fx, fy))
        p.notes.append(f"verdict {r['verdict']}, {len(r['episodes'])} leak episode(s)"
                       + (", judged on the memory no process accounts for" if r.get("series") == "nvml_unattributed"
                          else "") + (f"; the process left the log at {r['ended']}" if r.get("ended") else ""))
        eps = s.det.episodes
        for e in eps:
            end = e.cleared_at if e.cleared_at is not None else t1
            y0 = _at(fx, fy, e.onset_estimate)
            p.lines.append(("trend", [e.onset_estimate, end], [y0, y0 + e.rate * (end - e.onset_estimate)]))
            p.points.append(("detected", e.detected_at, _at(s.t, s.v, e.detected_at),
                             f"detected {stamp(e.detected_at)}, {e.rate / 2**20 * 3600:.2f} MiB/h"))
            if e.cleared_at is not None:
                p.points.append(("cleared", e.cleared_at, _at(s.t, s.v, e.cleared_at),
                                 f"cleared {stamp(e.cleared_at)} ({e.end})"))
        res = s.det.results
        if not eps and res:
            w = min(x.window_s for x in res)
            slope = s.det.trend_rate() or 0.0
            a = max(t0, t1 - w)
            y1 = _at(fx, fy, t1)
            p.lines.append(("trend", [a, t1], [y1 - slope * (t1 - a), y1]))
        x_hi = t1
        ooms = [("projected OOM", r["time_to_oom_s"])]
        if r["device_time_to_oom_s"] != r["time_to_oom_s"]:
            ooms.append(("device OOM (all growing processes)", r["device_time_to_oom_s"]))
        for name, tto in ooms:
            if tto is None:
                continue
            at = t1 + tto
            text = f"{name}: {stamp(at)} (in {_dur(tto)})"
            if tto <= span:
                p.vlines.append((name, at, text))
                x_hi = max(x_hi, at)
            else:
                p.notes.append(text + ", beyond the plot")
        # A projected OOM is in view: show the level it is reached at (not on a device's unattributed memory,
        # which is not what fills up).
        if s.headroom is not None and x_hi > t1 and r.get("series") != "nvml_unattributed":
            full = s.v[-1] + s.headroom
            p.lines.append(("memory full", [t0, x_hi], [full, full]))
        open_ep = eps[-1] if eps and eps[-1].cleared_at is None else None
        if open_ep is not None and x_hi > t1:
            y_end = _at(fx, fy, open_ep.onset_estimate) + open_ep.rate * (t1 - open_ep.onset_estimate)
            p.lines.append(("projected trend", [t1, x_hi], [y_end, y_end + open_ep.rate * (x_hi - t1)]))
        p.x_range = (t0, x_hi if x_hi > t0 else t0 + 1.0)
        out.append(p)
    return out


# -- HTML with inline SVG ---------------------------------------------------------------------------------------
_W, _H = 960, 280
_L, _R, _T, _B = 70, 20, 16, 34


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values in [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


#: Tick steps of the time axis, seconds.
_TIME_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


def _time_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """About ``n`` ticks on round minutes, hours or days (UTC, as the logs are read)."""
    step = next((s for s in _TIME_STEPS if s * n >= hi - lo), _TIME_STEPS[-1])
    first = math.ceil(lo / step) * step
    return [float(first + i * step) for i in range(int((hi - first) // step) + 1)]


def _time_label(t: float, span: float) -> str:
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    return d.strftime("%m/%d %H:%M") if span > 2 * 86400 else d.strftime("%H:%M")


def _svg(p: Panel) -> str:
    x0, x1 = p.x_range
    ys = [y for _, _, yy in p.lines for y in yy] + [y for _, _, y, _ in p.points]
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (y1 - y0) * 0.05 or max(abs(y1) * 0.05, float(GiB) / 16)
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = _W - _L - _R, _H - _T - _B

    def X(x: float) -> float:
        return _L + (x - x0) / (x1 - x0) * pw

    def Y(y: float) -> float:
        return _T + ph - (y - y0) / (y1 - y0) * ph

    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
           f'role="img" aria-label="{e(p.label)}" data-series="{e(p.label)}">',
           f"<title>{e(p.label)}</title>",
           f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    for v in _ticks(y0 / GiB, y1 / GiB):
        y = Y(v * GiB)
        out.append(f'<line x1="{_L}" x2="{_L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{_L - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{v:g} GiB</text>')
    span = x1 - x0
    for tv in _time_ticks(x0, x1):
        x = X(tv)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_T}" y2="{_T + ph}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{_H - 14}" text-anchor="middle" font-size="11">'
                   f"{_time_label(tv, span)}</text>")
    for name, xs, yy in p.lines:
        colour, dash = STYLE[name]
        pts = " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in zip(xs, yy, strict=True))
        width = 1 if name == "memory used" else 2
        out.append(f'<polyline class="{e(name)}" fill="none" stroke="{colour}" stroke-width="{width}"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + f' points="{pts}"/>')
    for name, x, text in p.vlines:
        colour, dash = STYLE[name]
        out.append(f'<line class="{e(name)}" x1="{X(x):.1f}" x2="{X(x):.1f}" y1="{_T}" y2="{_T + ph}" '
                   f'stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"><title>{e(text)}</title></line>')
    for name, x, y, text in p.points:
        colour, _ = STYLE[name]
        out.append(f'<circle class="{e(name)}" cx="{X(x):.1f}" cy="{Y(y):.1f}" r="5" fill="{colour}">'
                   f"<title>{e(text)}</title></circle>")
    out.append("</svg>")
    return "\n".join(out)


def render_html(ps: list[Panel], left_out: list[str] | None = None) -> str:
    """A self-contained HTML page: a legend, then one titled SVG panel per series, then the series left out.

    The page carries the strict Content-Security-Policy of every inferwatch page (``export/htmlsafe.py``)
    in a ``<meta http-equiv>``: it has no script, so none may run; nothing is loaded from anywhere.
    """
    from inferwatch_sidecar.export.htmlsafe import harden

    e = html.escape
    legend = " ".join(f'<span style="color:{c}">&#9632; {e(n)}</span>' for n, (c, _) in STYLE.items())
    head = f"<p>{legend}</p>\n"
    if left_out:
        head += f'<p class="left-out">{e(left_out_note(len(ps), len(left_out)))} (listed at the end).</p>\n'
    body = []
    for p in ps:
        notes = "".join(f"<li>{e(n)}</li>" for n in p.notes + [t for _, _, t in p.vlines])
        body.append(f'<section class="series"><h2>{e(p.label)}</h2><ul>{notes}</ul>\n{_svg(p)}\n</section>')
    if left_out:
        items = "".join(f"<li>{e(label)}</li>" for label in left_out)
        body.append(f'<section class="left-out"><h2>Left out ({len(left_out)})</h2><ul>{items}</ul></section>')
    page = ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>inferwatch gpu analyze</title>"
            "<style>body{font-family:sans-serif;margin:1em}h2{font-size:1.05em;margin:1em 0 0}"
            "ul{margin:.2em 0;font-size:.9em}</style></head><body>\n<h1>GPU memory leak analysis</h1>\n"
            + head + "\n".join(body) + "\n</body></html>\n")
    hardened: bytes = harden(page.encode())[0]
    return hardened.decode()


# -- PNG through matplotlib ---------------------------------------------------------------------------------------
#: Figure geometry at 100 dpi: a 50 px header plus 300 px per panel, 1200 px wide.
PNG_WIDTH_IN, PNG_PANEL_IN, PNG_HEAD_IN, PNG_DPI = 12.0, 3.0, 0.5, 100


def render_png(ps: list[Panel], path: str, left_out: int = 0) -> None:
    """Write the panels as one PNG (matplotlib's Agg backend, no display needed); the title names how many
    series were ``left_out``."""
    from matplotlib.figure import Figure

    n = max(1, len(ps))
    height = PNG_HEAD_IN + PNG_PANEL_IN * n
    fig = Figure(figsize=(PNG_WIDTH_IN, height), dpi=PNG_DPI)
    top = 1 - PNG_HEAD_IN / height
    fig.subplots_adjust(left=0.07, right=0.98, top=top, bottom=0.35 / height, hspace=0.55)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    title = "GPU memory leak analysis" + (f" ({left_out_note(len(ps), left_out)})" if left_out else "")
    fig.suptitle(title, y=1 - 0.15 / height)
    for ax, p in zip(axes, ps, strict=False):
        x0 = p.x_range[0]
        for name, xs, ys in p.lines:
            colour, dash = STYLE[name]
            ax.plot([(x - x0) / 3600 for x in xs], [y / GiB for y in ys], color=colour,
                    linestyle="--" if dash else "-", linewidth=0.8 if name == "memory used" else 1.6, label=name)
        for name, x, _text in p.vlines:
            colour, _ = STYLE[name]
            ax.axvline((x - x0) / 3600, color=colour, linestyle="--", linewidth=1.6, label=name)
        for name, x, y, _text in p.points:
            colour, _ = STYLE[name]
            ax.plot([(x - x0) / 3600], [y / GiB], "o", color=colour, label=name)
        ax.set_title("\n".join([p.label, *textwrap.wrap("; ".join(p.notes), 170)]), fontsize=8, loc="left")
        ax.set_ylabel("GiB")
        ax.set_xlabel(f"hours since {stamp(x0)} (UTC as logged)", fontsize=8)
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles, strict=True))
        ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="upper left")
    fig.savefig(path, format="png", dpi=PNG_DPI)

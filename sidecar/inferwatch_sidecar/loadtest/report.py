"""The load test's output: a table row per step, the ``--json`` document, and ``--plot`` (PNG or HTML)."""

from __future__ import annotations

import html
import math
from typing import Any

from inferwatch_sidecar.components.capacity.knee import Knee
from inferwatch_sidecar.loadtest.runner import Step

HEADER = ("conc", "req/s", "p50 s", "p99 s", "ttft p99", "itl p50", "tok/s", "errors", "goodput", "cpu")
WIDTHS = (7, 9, 8, 8, 8, 8, 8, 7, 7, 5)


def _f(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}g}"


def goodput(s: Step) -> float:
    return s.good / s.requests if s.requests else 0.0


def header() -> str:
    return "  ".join(h.rjust(w) for h, w in zip(HEADER, WIDTHS, strict=True))


def row(s: Step) -> str:
    cells = (_f(s.concurrency, 3), f"{s.throughput_rps:.1f}", _f(s.quantile("latencies", 0.5)),
             _f(s.quantile("latencies", 0.99)), _f(s.quantile("ttfts", 0.99)), _f(s.quantile("itls", 0.5)),
             f"{s.output_tokens / s.duration_s:.0f}" if s.output_tokens else "-", str(s.error_count),
             f"{goodput(s):.3f}", f"{s.cpu_share:.0%}")
    line = "  ".join(c.rjust(w) for c, w in zip(cells, WIDTHS, strict=True))
    notes = []
    if s.errors:
        notes.append("errors: " + ", ".join(f"{k} {v}" for k, v in s.errors.most_common()))
        if s.error_detail:
            notes.append(f"first error: {s.error_detail[:120]}")
    if s.client_limited:
        notes.append(f"{s.client_limited} arrivals found every connection busy (raise --max-connections)")
    if s.cpu_share >= 0.85:
        notes.append(f"the generator used {s.cpu_share:.0%} of one core: at this step it may be the bottleneck, "
                     "not the server")
    if s.server:
        notes.append("server: " + s.server.get("summary", ""))
    return line + "".join("\n        " + n for n in notes)


def knee_line(k: Knee | None) -> str:
    if k is None:
        return "knee: not enough levels (at least 3 with answers) to place one"
    if not k.reached:
        return (f"knee: not reached; throughput was still rising at the last level (the fit's lower bound: "
                f"concurrency {k.concurrency:.3g}, {k.throughput_rps:.1f} req/s)")
    return (f"knee: concurrency {k.concurrency:.3g} (90% interval {k.low:.3g} to {k.high:.3g}), "
            f"{k.throughput_rps:.1f} req/s at most")


def document(steps: list[Step], k: Knee | None) -> dict[str, Any]:
    """The ``--json`` document: exactly the keys docs/capacity.md lists."""
    return {
        "steps": [{
            "concurrency": round(s.concurrency, 4),
            "throughput_rps": round(s.throughput_rps, 4),
            "latency_p50_s": s.quantile("latencies", 0.5),
            "latency_p99_s": s.quantile("latencies", 0.99),
            "ttft_p99_s": s.quantile("ttfts", 0.99),
            "errors": s.error_count,
            "goodput_ratio": round(goodput(s), 6),
        } for s in steps],
        "knee": {"concurrency": round(k.concurrency, 4) if k and k.reached else None,
                 "throughput_rps": round(k.throughput_rps, 4) if k and k.reached else None},
    }


def check_plot(path: str) -> str:
    low = path.lower()
    if low.endswith((".html", ".htm")):
        return "html"
    if low.endswith(".png"):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError(f"--plot {path}: a PNG needs matplotlib (pip install 'inferwatch[plot]'), "
                             "or write FILE.html, which needs nothing more") from None
        return "png"
    raise ValueError(f"--plot {path}: the file must end in .png or .html")


def plot(path: str, steps: list[Step], k: Knee | None) -> None:
    xs = [s.concurrency for s in steps]
    thr = [s.throughput_rps for s in steps]
    p50 = [s.quantile("latencies", 0.5) or 0.0 for s in steps]
    p99 = [s.quantile("latencies", 0.99) or 0.0 for s in steps]
    knee = k.concurrency if k and k.reached else None
    if check_plot(path) == "png":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
        a1.plot(xs, thr, "o-", label="throughput")
        a1.set_ylabel("req/s")
        a2.plot(xs, p50, "o-", label="p50")
        a2.plot(xs, p99, "s--", label="p99")
        a2.set_ylabel("latency (s)")
        a2.set_xlabel("concurrency")
        for a in (a1, a2):
            a.set_xscale("log", base=2)
            if knee:
                a.axvline(knee, color="red", linestyle=":", label=f"knee {knee:.3g}")
            a.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(xs, {"throughput (req/s)": thr}, {"p50 (s)": p50, "p99 (s)": p99}, knee))


def _svg(xs: list[float], series: dict[str, list[float]], knee: float | None, title: str) -> str:
    w, h, pad = 640, 240, 50
    lx = [math.log2(max(x, 1e-9)) for x in xs]
    x0, x1 = min(lx), max(lx) if max(lx) > min(lx) else min(lx) + 1
    ymax = max((v for vs in series.values() for v in vs), default=1.0) or 1.0

    def X(x: float) -> float:
        return pad + (math.log2(max(x, 1e-9)) - x0) / (x1 - x0) * (w - 2 * pad)

    def Y(y: float) -> float:
        return h - pad + -(y / ymax) * (h - 2 * pad)

    colors = ("#1f77b4", "#d62728", "#2ca02c")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
             f'<text x="{pad}" y="20">{html.escape(title)}</text>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<text x="5" y="{pad}">{ymax:.3g}</text>']
    for x in xs:
        parts.append(f'<text x="{X(x) - 8:.1f}" y="{h - pad + 16}">{x:.3g}</text>')
    for (name, vs), col in zip(series.items(), colors, strict=False):
        pts = " ".join(f"{X(x):.1f},{Y(v):.1f}" for x, v in zip(xs, vs, strict=True))
        parts.append(f'<polyline fill="none" stroke="{col}" stroke-width="2" points="{pts}"/>')
        parts.append(f'<text x="{w - pad - 120}" y="{pad + 16 * list(series).index(name)}" fill="{col}">'
                     f'{html.escape(name)}</text>')
    if knee:
        parts.append(f'<line x1="{X(knee):.1f}" y1="{pad}" x2="{X(knee):.1f}" y2="{h - pad}" stroke="red" '
                     f'stroke-dasharray="4"/><text x="{X(knee) + 4:.1f}" y="{pad + 12}" fill="red">knee '
                     f'{knee:.3g}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(xs: list[float], top: dict[str, list[float]], bottom: dict[str, list[float]], knee: float | None) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>inferwatch loadtest</title></head><body>"
            "<h1>inferwatch loadtest</h1>" + _svg(xs, top, knee, "throughput against concurrency") + "<br>"
            + _svg(xs, bottom, knee, "latency against concurrency") + "</body></html>\n")

"""The terminal view of a running sidecar: what ``inferwatch top`` and ``inferwatch demo`` draw (rich).

:func:`read_sidecar` turns one poll of a sidecar's ``/metrics`` and
``/v1/status`` into a :class:`SidecarView`; the ``*_table`` functions draw
its parts. Every table fits the width it is given without cutting a cell:
numbers never wrap (a column of them is at least as wide as its widest
value), text wraps at words and a long word or URL folds onto the next line;
:class:`Pair` sets two tables side by side only when both fit, and one above
the other otherwise (80 columns, a pipe). ``tests/cli/test_top.py`` renders a
recorded sidecar poll at 80 and 200 columns and finds every number whole.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from inferwatch_sidecar.export import promtext
from inferwatch_sidecar.export.summary import Reader
from inferwatch_sidecar.export.summary import verdicts as summary_verdicts

GiB = 2**30
MiB = 2**20
#: Seconds of scrapes the stage quantiles are computed over.
WINDOW_S = 10.0
#: The SDK's usual stages in request order: the stage table's first rows.
STAGES = ("ingress", "preprocess", "queue", "inference", "postprocess")
#: Drift rows that are no input column.
OUTPUT_COLUMNS = ("prediction", "confidence")


@dataclass
class SidecarView:
    """One poll of a sidecar.

    Attributes:
        t: the poll's time (seconds since the sidecar started for the demo; since ``top`` started for ``top``).
        stages: stage -> {0.5, 0.99, 0.999: seconds or None, "rate": calls/s} over the last 10 s.
        gpu: devices and processes from /v1/status, with leak verdicts.
        canary: the canary judge's judgements from /v1/status (verdict, score, metrics, reasons).
        tail: (model, version) -> the tail attribution of the last complete window, from /v1/status.
        drift: (model, version) -> {"features": {name: {"drifted", "scores", "p"}},
            "confidence": [current mean, reference mean], ...} (see :func:`drift_by_version`).
        latency: the status's ``latency`` section (quantiles and outcomes per label set).
        verdicts: what is bad now (the status's ``summary``; computed from the status when it has none).
        url: the sidecar polled.
        errors: what could not be read at this poll.
    """

    t: float
    stages: dict[str, dict[Any, Any]] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    canary: list[dict[str, Any]] = field(default_factory=list)
    tail: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    drift: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    errors: list[str] = field(default_factory=list)
    #: Seconds the stage quantiles span (None: since the sidecar started, a first poll).
    stage_window_s: float | None = None


def apply(view: SidecarView, scrape: promtext.Scrape, old: promtext.Scrape | None, status: dict[str, Any],
          readers: dict[str, Reader] | None = None) -> None:
    """Fill ``view`` from one scrape (``old``: the one ~10 s before, for rates) and the status document.

    ``readers``: the components' status readers (``components.registry.verdict_readers()``), for a status from
    a sidecar too old to carry its own summary.
    """
    view.stages = stage_quantiles(scrape, old)
    view.stage_window_s = scrape.t - old.t if old is not None else None
    components = status.get("components") or {}
    view.gpu = components.get("gpu") or {}
    view.canary = (components.get("canary") or {}).get("judgements") or []
    view.tail = {(m.get("model", ""), m.get("version", "")): m
                 for m in (components.get("tail") or {}).get("models") or []}
    view.drift = drift_by_version(scrape)
    view.latency = status.get("latency") or {}
    summary = status.get("summary")
    view.verdicts = (list(summary.get("verdicts") or []) if isinstance(summary, dict)
                     else summary_verdicts(status, readers))


class Poller:
    """Polls one sidecar into views, keeping the scrapes of the last 10 s for the stage rates.

    Args:
        url: the sidecar's HTTP address (``http://host:port``).
        readers: the components' status readers, for a sidecar whose status has no summary (see :func:`apply`).
    """

    def __init__(self, url: str, readers: dict[str, Reader] | None = None) -> None:
        self.url = url.rstrip("/")
        self.recent: list[promtext.Scrape] = []
        self.readers = readers

    def poll(self, t: float, view: SidecarView | None = None) -> tuple[SidecarView, promtext.Scrape | None,
                                                                     dict[str, Any] | None]:
        """Read the sidecar at ``t``; returns the view, the scrape and the status (None when it did not answer)."""
        view = view if view is not None else SidecarView(t)
        view.url = self.url
        try:
            scrape = promtext.Scrape(promtext.fetch(f"{self.url}/metrics"), t)
            status = promtext.fetch_json(f"{self.url}/v1/status")
        except (OSError, ValueError) as e:
            view.errors.append(f"sidecar {self.url}: {e}")
            return view, None, None
        self.recent.append(scrape)
        while len(self.recent) > 2 and self.recent[1].t <= t - WINDOW_S:
            self.recent.pop(0)
        old = self.recent[0] if len(self.recent) > 1 else None
        apply(view, scrape, old, status, self.readers)
        return view, scrape, status


def stage_quantiles(scrape: promtext.Scrape, old: promtext.Scrape | None) -> dict[str, dict[Any, Any]]:
    """Per stage, P50/P99/P99.9 and calls/s between ``old`` and ``scrape`` (since start without ``old``)."""
    name = "inferwatch_stage_duration_seconds"
    new_b = scrape.buckets(name, "stage")
    old_b = old.buckets(name, "stage") if old is not None else {}
    out: dict[str, dict[Any, Any]] = {}
    for stage, b in sorted(new_b.items()):
        d = promtext.delta(b, old_b.get(stage))
        q: dict[Any, Any] = dict(promtext.quantiles(d))
        dt = scrape.t - old.t if old is not None else 0.0
        q["rate"] = (max(d.values()) / dt) if dt > 0 and d else None
        out[stage] = q
    return out


def drift_by_version(scrape: promtext.Scrape) -> dict[tuple[str, str], dict[str, Any]]:
    """The drift component's gauges, by (model, version): per-feature scores and verdicts, and the summaries."""
    out: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(lab: dict[str, str]) -> dict[str, Any]:
        return out.setdefault((lab.get("model", ""), lab.get("model_version", "")),
                              {"features": {}, "confidence": [None, None]})

    for lab, v in scrape.get("inferwatch_drift_feature_drifted"):
        entry(lab)["features"].setdefault(lab["feature"], {})["drifted"] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_feature_score"):
        entry(lab)["features"].setdefault(lab["feature"], {}).setdefault("scores", {})[lab["measure"]] = v
    for lab, v in scrape.get("inferwatch_drift_feature_p_value"):
        entry(lab)["features"].setdefault(lab["feature"], {})["p"] = v
    for lab, v in scrape.get("inferwatch_drift_confidence_mean"):
        entry(lab)["confidence"][0 if lab.get("window") == "current" else 1] = v
    for lab, v in scrape.get("inferwatch_drift_dataset_drifted"):
        entry(lab)["dataset_drifted"] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_dataset_drifted_ratio"):
        entry(lab)["drifted_ratio"] = v
    for lab, v in scrape.get("inferwatch_drift_canary_drifted_ratio"):
        entry(lab)["canary_ratio"] = v
    for lab, v in scrape.get("inferwatch_drift_canary_feature_drifted"):
        entry(lab).setdefault("canary_columns", {})[lab["feature"]] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_estimated_accuracy_ratio"):
        entry(lab)["estimated_accuracy"] = v
    for lab, v in scrape.get("inferwatch_drift_estimated_accuracy_bound_ratio"):
        entry(lab).setdefault("estimated_interval", {})[lab["bound"]] = v
    for lab, v in scrape.get("inferwatch_drift_estimated_accuracy_calibrated"):
        entry(lab)["calibrated"] = v == 1.0
    for lab, v in scrape.get("inferwatch_drift_reference_accuracy_ratio"):
        entry(lab)["reference_accuracy"] = v
    for lab, v in scrape.get("inferwatch_drift_accuracy_ratio"):
        entry(lab)["accuracy"] = v
    for lab, v in scrape.get("inferwatch_drift_window_events"):
        entry(lab)["window_events"] = v
    for lab, v in scrape.get("inferwatch_drift_prediction_class_ratio"):
        entry(lab).setdefault("classes", {})[lab["class"]] = v
    return out


# -- formats -------------------------------------------------------------------------------------------------------


def seconds(v: float | None) -> str:
    """A latency: ``12.3ms`` below a second, ``2.50s`` above; ``-`` for none."""
    if v is None or math.isnan(v):
        return "-"
    return f"{v * 1000:.1f}ms" if v < 1 else f"{v:.2f}s"


def rate(v: float | None) -> str:
    """A memory growth rate in bytes/s, as MiB/s."""
    return "-" if v is None else f"{v / MiB:.1f} MiB/s"


def duration(v: float | None) -> str:
    """A time span in seconds, in the largest unit that keeps it above 1 (s, min, h)."""
    if v is None:
        return "-"
    for size, unit in ((3600, "h"), (60, "min")):
        if v >= size:
            return f"{v / size:.1f}{unit}"
    return f"{v:.0f}s"


def pct(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:.{digits}f}%"


def ago(unix: float | None, now: float | None = None) -> str:
    if unix is None:
        return "-"
    return duration(max(0.0, (time.time() if now is None else now) - unix)) + " ago"


# -- tables that never cut a cell ----------------------------------------------------------------------------------


def table(title: str, columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]) -> Table:
    """A table whose ``num`` columns never wrap and are as wide as their widest cell, and whose ``text``
    columns wrap at words and fold a longer word (a URL, a metric name): nothing is cut with an ellipsis.

    Args:
        title: shown above, left.
        columns: (heading, ``num`` or ``text``).
        rows: cells (str or rich Text; plain strings are never read as markup).
    """
    rows = [[c if isinstance(c, Text) else Text(str(c)) for c in r] for r in rows]
    t = Table(title=title, title_justify="left", expand=False)
    for i, (head, kind) in enumerate(columns):
        if kind == "num":
            widest = max([len(head)] + [r[i].cell_len for r in rows])
            t.add_column(head, justify="right", no_wrap=True, min_width=widest)
        else:
            t.add_column(head, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


class Pair:
    """Two renderables side by side when both fit the width, else one above the other."""

    def __init__(self, left: RenderableType, right: RenderableType) -> None:
        self.left, self.right = left, right

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        a = Measurement.get(console, options, self.left).maximum
        b = Measurement.get(console, options, self.right).maximum
        if a + b + 1 <= options.max_width:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(width=a)
            grid.add_column(width=b)
            grid.add_row(self.left, self.right)
            yield grid
        else:
            yield self.left
            yield self.right


def verdict_text(v: Any) -> Text:
    if v == "leak":
        return Text("LEAK", style="bold red")
    if v == "no_leak":
        return Text("ok", style="green")
    return Text(str(v or "-"), style="dim")


def stage_table(view: SidecarView) -> Table:
    order = [s for s in STAGES if s in view.stages] + sorted(set(view.stages) - set(STAGES))
    rows = []
    for stage in order:
        q = view.stages[stage]
        r, p999 = q.get("rate"), q.get(0.999)
        rows.append([stage, "-" if r is None else f"{r:.1f}", seconds(q.get(0.5)), seconds(q.get(0.99)),
                     Text(seconds(p999), style="bold red" if p999 is not None and p999 > 1.0 else "")])
    w = view.stage_window_s
    title = "stage latency since the sidecar started" if w is None else f"stage latency, last {w:.0f} s"
    return table(title, [("stage", "text"), ("calls/s", "num"), ("P50", "num"),
                                               ("P99", "num"), ("P99.9", "num")], rows)


def gpu_table(view: SidecarView, roles: dict[int, str] | None = None, title: str = "GPU memory") -> Table:
    roles = roles or {}
    rows: list[list[Any]] = []
    for dev in view.gpu.get("devices", []):
        used, total = dev.get("used_bytes"), dev.get("total_bytes")
        leak = dev.get("leak") or {}
        rows.append([f"gpu {dev.get('gpu')}", f"{(used or 0) / GiB:.1f}/{(total or 0) / GiB:.0f} GiB",
                     verdict_text(leak.get("verdict")), rate(leak.get("rate_bytes_per_s")),
                     duration(leak.get("time_to_oom_s"))])
        for p in dev.get("processes", []):
            role = roles.get(p.get("pid"), "")
            rows.append([f"  pid {p.get('pid')}" + (f" {role}" if role else ""),
                         f"{(p.get('used_bytes') or 0) / GiB:.2f} GiB", verdict_text(p.get("verdict")),
                         rate(p.get("rate_bytes_per_s")), duration(p.get("time_to_oom_s"))])
    if not view.gpu:
        rows.append([Text("(waiting for the sidecar)", style="dim"), "", "", "", ""])
    elif not view.gpu.get("devices"):
        rows.append([Text(f"GPU monitor {view.gpu.get('state', '-')}", style="dim"), "", "", "", ""])
    return table(title, [("gpu / pid", "text"), ("used", "num"), ("leak", "text"), ("rate", "num"),
                         ("time to OOM", "num")], rows)


def estimate(d: dict[str, Any]) -> str:
    """The accuracy estimate: calibrated with its interval and the reference accuracy, or marked uncalibrated."""
    x = d.get("estimated_accuracy")
    if x is None:
        return "-"
    if not d.get("calibrated"):
        return f"{x:.1%} (mean confidence, uncalibrated)"
    iv = d.get("estimated_interval", {})
    ref = d.get("reference_accuracy")
    return (f"{x:.1%} [{iv.get('lower', float('nan')):.1%}-{iv.get('upper', float('nan')):.1%}]"
            + (f" ({ref:.1%})" if ref is not None else ""))


def drift_table(view: SidecarView, model: str, versions: Sequence[str] | None = None,
                names: Sequence[str] | None = None, baseline: str | None = None) -> Table:
    """One model's drift by version: each column's score (``*``: drifted), then confidence, accuracy and the rest."""
    versions = list(versions) if versions is not None else sorted(v for m, v in view.drift if m == model)
    if names is None:
        seen: list[str] = []
        for v in versions:
            seen += [f for f in view.drift[(model, v)]["features"] if f not in seen]
        names = sorted(f for f in seen if f not in OUTPUT_COLUMNS) + [f for f in OUTPUT_COLUMNS if f in seen]
    rows: list[list[Any]] = []
    for n in names:
        cells: list[Any] = [n]
        for v in versions:
            f = view.drift[(model, v)]["features"].get(n, {})
            scores = f.get("scores", {})
            s = scores.get("wasserstein_norm", scores.get("psi"))
            cells.append(Text(("-" if s is None else f"{s:.2f}") + (" *" if f.get("drifted") else ""),
                              style="bold red" if f.get("drifted") else ""))
        rows.append(cells)
    base = baseline or (versions[0] if versions else "")
    for label, key in (("mean confidence (ref)", "confidence"), ("estimated accuracy [95%] (ref)", "estimated_accuracy"),
                       ("accuracy (labels)", "accuracy"), ("share of inputs drifted", "drifted_ratio"),
                       (f"canary: columns differing from {base}", "canary_columns"), ("window events", "window_events")):
        cells = [Text(label, style="italic")]
        for v in versions:
            d = view.drift[(model, v)]
            if key == "canary_columns":
                cols = d.get("canary_columns")
                differ = sorted(c for c, x in (cols or {}).items() if x)
                cells.append(Text("-" if cols is None else ", ".join(differ) or "none"))
            elif key == "confidence":
                cur, ref = d["confidence"]
                cells.append(Text("-" if cur is None else f"{cur:.3f} ({ref:.3f})" if ref is not None else f"{cur:.3f}"))
            elif key == "estimated_accuracy":
                cells.append(Text(estimate(d)))
            else:
                x = d.get(key)
                cells.append(Text("-" if x is None else f"{x:.0f}" if key == "window_events" else f"{x:.1%}"))
        rows.append(cells)
    t = table(f"drift of {model} against its reference (score; * = drifted)",
              [("column", "text"), *[(v, "text") for v in versions]], rows)
    for c in t.columns[1:]:
        c.justify = "right"
    return t


#: How far apart the estimate and the labelled accuracy of a version must be for the view to explain why.
EXPLAIN_GAP = 0.10


def accuracy_note(view: SidecarView, model: str) -> Text | None:
    """Why a version's label-free estimate and its labelled accuracy differ, when they do by 10 points or more."""
    gaps = []
    for (m, v), d in sorted(view.drift.items()):
        est, lab = d.get("estimated_accuracy"), d.get("accuracy")
        if m == model and est is not None and lab is not None and abs(est - lab) >= EXPLAIN_GAP:
            gaps.append(f"{v} estimated {est:.1%}, labelled {lab:.1%}")
    if not gaps:
        return None
    return Text.assemble(
        ("why the estimate and the labels differ: ", "bold"), "; ".join(gaps) + ". ",
        "The estimate needs no labels: it reads each version's own confidences through the calibration "
        "fitted on the reference model's labelled data. It follows a shift of the inputs, but a changed model "
        "brings its own confidences, so it cannot see that model's own errors; only labels can "
        "(POST /v1/labels, or a canary judged against the stable version).")


def canary_table(view: SidecarView, title: str = "canary judge") -> Table:
    rows: list[list[Any]] = []
    for j in view.canary:
        v = j.get("verdict", "-")
        style = {"pass": "green", "marginal": "yellow", "fail": "bold red"}.get(v, "")
        failed = [m for m in j.get("metrics", []) if m.get("result") == "fail"]
        why = "\n".join(j.get("reasons") or []) or "-"
        if failed and not j.get("reasons"):
            why = ", ".join(m["name"] + (f"[{m['stage']}]" if m.get("stage") else "") for m in failed)
        # Why the verdict may mislead (unequal load per replica) or is held back (a fail not yet confirmed).
        why = "\n".join([*([] if why == "-" and j.get("warnings") else [why]),
                         *(f"warning: {w}" for w in j.get("warnings") or [])])
        rows.append([f"{j.get('model', '')} {j.get('canary_version')} vs {j.get('baseline_version')}",
                     Text(str(v).upper(), style=style), f"{j.get('score', 0):.0f}/100",
                     f"{j.get('canary_requests')} vs {j.get('baseline_requests')}", Text(why)])
    if not view.canary:
        rows.append([Text("(no canary with enough requests yet)", style="dim"), "", "", "", ""])
    return table(title, [("canary", "text"), ("verdict", "text"), ("score", "num"), ("requests", "num"),
                         ("why (stage by stage)", "text")], rows)


def tail_text(view: SidecarView, model: str | None = None) -> Text:
    out = Text("why the slowest 1% is slow (tail attribution, last window): ", style="bold")
    sentences = []
    for (m, ver) in sorted(view.tail):
        if model is not None and m != model:
            continue
        p99 = (view.tail[(m, ver)].get("tails") or {}).get("p99") or {}
        if p99.get("status") == "ok" and p99.get("summary"):
            sentences.append(f"{ver if model is not None else f'{m} {ver}'}: {p99['summary']}")
    out.append("; ".join(sentences) if sentences else "no window with a slowest 1% yet",
               style="" if sentences else "dim")
    return out


def verdicts_table(view: SidecarView, now: float | None = None) -> Group:
    """What is bad now, each since when and with its runbook section (the status's summary)."""
    rows: list[list[Any]] = []
    bases: list[str] = []
    sources: set[str] = set()
    for v in view.verdicts:
        mark = _SINCE_MARKS.get(str(v.get("since_source")), "")
        if mark:
            sources.add(mark)
        bad = v.get("severity") == "bad"
        url = str(v.get("runbook_url") or "")
        base, _, anchor = url.partition("#")
        if base and base not in bases:
            bases.append(base)
        rows.append([Text("BAD" if bad else "warn", style="bold red" if bad else "yellow"),
                     f"{v.get('component')}: {v.get('subject')}", Text(str(v.get("verdict")), style="bold"),
                     v.get("detail", ""), ago(v.get("since_unix"), now) + mark, f"#{anchor}" if anchor else "-"])
    if not view.verdicts:
        rows.append([Text("ok", style="green"), Text("nothing is bad now", style="green"), "", "", "", ""])
    t = table("what is wrong now", [("", "text"), ("what", "text"), ("verdict", "text"), ("detail", "text"),
                                    ("since", "num"), ("runbook", "text")], rows)
    legend = [f"{m} {what}" for m, what in _SINCE_LEGEND if m in sources]
    notes = [Text("since: the component's own time" + "".join(f"; {x}" for x in legend), style="dim")] if legend else []
    return Group(t, *notes, *[Text(f"runbook sections: {b}#...", overflow="fold") for b in bases])


#: How ``since`` reads where it is not the component's own time (export/summary.py's ``since_source``).
_SINCE_MARKS = {"first seen": "*", "window": "^"}
_SINCE_LEGEND = (("*", "first seen by this sidecar (starts over on a restart)"),
                 ("^", "the start of the window that first showed it"))


def requests_table(view: SidecarView) -> Table:
    """Per label set: requests in the status's window, their P50/P99, and each outcome's share other than ok."""
    models = view.latency.get("models") or []
    extra: list[str] = []
    for m in models:
        extra += [k for k in (m.get("outcomes") or {}) if k != "ok" and k not in extra]
    rows: list[list[Any]] = []
    for m in models:
        req = m.get("request") or {}
        out = m.get("outcomes") or {}
        n = sum(out.values()) if out else req.get("count", 0)
        rows.append([f"{m.get('service')} {m.get('model')} {m.get('model_version')}", str(n),
                     seconds(req.get("p50_s")), seconds(req.get("p99_s")),
                     *[pct(out[k] / n, 2) if n and k in out else "-" for k in extra]])
    names = {"error": "errors", "client_error": "4xx", "cancelled": "cancelled"}
    window = view.latency.get("window_s")
    return table(f"requests, last {duration(window)}" if window else "requests",
                 [("service model version", "text"), ("requests", "num"), ("P50", "num"), ("P99", "num"),
                  *[(names.get(k, k), "num") for k in extra]], rows)


def render_top(views: Sequence[SidecarView], now: float | None = None) -> Group:
    """``inferwatch top``'s screen: per sidecar, what is wrong now, requests, stages, GPU, drift, canary, tail."""
    parts: list[RenderableType] = []
    for view in views:
        head = Text.assemble(("inferwatch top", "bold"), f"  {view.url}  ",
                             time.strftime("%H:%M:%S", time.localtime(now)))
        if view.errors:
            head.append("\n" + "; ".join(view.errors), style="red")
        parts += [head, verdicts_table(view, now), requests_table(view), Pair(stage_table(view), gpu_table(view))]
        for model in sorted({m for m, _ in view.drift}):
            parts.append(drift_table(view, model))
            note = accuracy_note(view, model)
            if note is not None:
                parts.append(note)
        parts += [canary_table(view), tail_text(view), Text("")]
    return Group(*parts)

"""The deep-dive HTML report, by Evidently (optional ``report`` extra, imported lazily).

Two sources:

- two data files (``inferwatch report --reference A --current B``): the raw
  columns, sampled to ``max_rows`` rows each (read offline, by
  :mod:`inferwatch_sidecar.offline.drift.report`, which renders them here);
- a running sidecar window (``GET /admin/drift/report?model=M&model_version=V``
  with the admin token, or ``inferwatch report --sidecar URL``), served by the
  daemon's drift component, which is why this module is the component's. The sidecar
  keeps bins, not raw values, so both the reference and the window are
  *reconstructed from their bins*: each numeric bin becomes its count of
  values at the bin's mean, each category its count of that category, scaled
  to at most ``RECON_ROWS`` rows. The report's per-column charts and tests are
  therefore computed on binned data; the sidecar's own metrics remain the
  authoritative numbers.

Evidently's per-column verdicts are not ours, and the page says so: a section
at its top (:func:`comparison_html`) renders, for every column, our verdict and
why (adjusted p-value against alpha, effect against the floor that applied)
next to Evidently's (its method, score and threshold), with what differs:
Evidently tests each column on its own at its threshold (a p-value below 0.05,
or a distance of at least 0.1 for references above 1000 rows), with no
correction for testing many columns and no allowance for the noise of a
small window; we use Benjamini-Hochberg across every test of the window and a
floor that grows as the window shrinks. So Evidently flags more columns; a
column both flag has changed by more than noise explains.
"""

from __future__ import annotations

import html
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from inferwatch_sidecar.components.drift import engine, explain
from inferwatch_sidecar.components.drift.monitor import Monitor
from inferwatch_sidecar.export.htmlsafe import ScriptSafeJson, UnsafeHTML, harden
from inferwatch_sidecar.stats.columns import CategoricalColumn, NumericColumn

INSTALL = 'the drift report needs Evidently: pip install "inferwatch[report]"'
RECON_ROWS = 5000


class ReportError(RuntimeError):
    """The report cannot be produced; the message says why and what to do."""


def _evidently() -> tuple[Any, Any, Any]:
    try:
        with warnings.catch_warnings():
            # Evidently's import emits deprecation warnings about its own dependencies.
            warnings.simplefilter("ignore")
            import pandas as pd
            from evidently import Report
            from evidently.legacy.utils import dashboard
            from evidently.presets import DataDriftPreset
    except ImportError as e:
        raise ReportError(f"{INSTALL} ({e})") from None
    # Evidently embeds its data with json.dumps inside <script>, so a category "</script><script>..." would
    # run: its module's json becomes one whose dumps escapes < > & (htmlsafe.script_json).
    dashboard.json = ScriptSafeJson
    return pd, Report, DataDriftPreset


def evidently_verdicts(snapshot_dict: dict[str, Any]) -> dict[str, tuple[str, float, float, bool]]:
    """Evidently's per-column ``(method, score, threshold, drifted)`` from a snapshot's ``dict()``.

    A method named "... p_value" drifts when the score is below the threshold; a distance when it is
    at least the threshold (Evidently's rule).
    """
    out = {}
    for m in snapshot_dict.get("metrics", []):
        cfg: Any = m.get("config") or {}
        if not str(cfg.get("type", "")).endswith("ValueDrift"):
            continue
        method, score, thr = str(cfg.get("method", "")), float(m.get("value")), float(cfg.get("threshold"))
        out[str(cfg.get("column"))] = (method, score, thr, score < thr if "p_value" in method else score >= thr)
    return out


def comparison_html(ours: engine.Evaluation, theirs: dict[str, tuple[str, float, float, bool]],
                    alpha: float) -> str:
    """The section that puts our verdict and why next to Evidently's for every column (module docstring)."""
    rows = []
    for r in ours.results:
        t = theirs.get(r.feature)
        ev = "-" if t is None else f"{'drifted' if t[3] else 'no'}: {t[0]} {t[1]:.3g} vs {t[2]:g}"
        rows.append(f"<tr><td>{html.escape(r.feature)}</td><td><b>{explain.verdict(r)}</b>: "
                    f"{html.escape(explain.why(r, alpha))}</td><td>{html.escape(ev)}</td></tr>")
    j = ours.multivariate
    joint = "" if j is None else (
        f"<p>Joint drift (ours only; per-column tests cannot see it): <b>{explain.verdict(j)}</b>: "
        f"{html.escape(explain.why_joint(j))}.</p>")
    n_theirs = sum(1 for t in theirs.values() if t[3])
    return (
        '<section id="inferwatch-verdicts" style="font-family:sans-serif;margin:1em;padding:1em;'
        'border:1px solid #888">'
        "<h2>inferwatch's verdicts next to Evidently's</h2>"
        f"<p>inferwatch: {ours.n_drifted} of {ours.n_features} features drifted, dataset drift "
        f"{'yes' if ours.dataset_drift else 'no'}. Evidently: {n_theirs} of {len(theirs)} columns drifted.</p>"
        "<p>They differ by design. Evidently tests each column on its own: a p-value below 0.05 (Kolmogorov-"
        "Smirnov, chi-square) for references of at most 1000 rows, else a distance of at least 0.1 "
        "(normalized Wasserstein, Jensen-Shannon), with no correction for testing many columns and no "
        "allowance for the noise of a small window. inferwatch flags a column when its Benjamini-Hochberg "
        f"adjusted p-value across every test of the window is at most {alpha:g} <em>and</em> its effect "
        "(W: normalized Wasserstein; PSI) reaches a floor: the larger of 0.1 and the effect's noise level at "
        "this sample size. So Evidently flags more columns; a column both flag changed by more than noise "
        "explains. inferwatch's numbers are the ones its metrics and alerts use.</p>"
        f"{joint}"
        "<table border=1 cellpadding=4 style=\"border-collapse:collapse\"><tr><th>column</th>"
        "<th>inferwatch (p_adj vs alpha; effect vs floor)</th><th>Evidently (method score vs threshold)</th></tr>"
        + "".join(rows) + "</table></section>"
    )


def _inject(page: bytes, section: str) -> bytes:
    """Put ``section`` at the top of the page's body."""
    i = page.find(b"<body")
    end = page.find(b">", i) + 1 if i >= 0 else 0
    return page[:end] + section.encode() + page[end:]


def render(reference: dict[str, Any], current: dict[str, Any], categorical: list[str],
           ours: engine.Evaluation | None = None, alpha: float = 0.05) -> bytes:
    """Render an Evidently DataDriftPreset report of two column dicts as HTML bytes.

    With ``ours``, our evaluation of the same data, the page starts with :func:`comparison_html`.
    The page carries its Content-Security-Policy (:func:`~inferwatch_sidecar.export.htmlsafe.harden`):
    only its own inline scripts run, so a value from traffic cannot add one.
    """
    pd, Report, DataDriftPreset = _evidently()
    from evidently import DataDefinition, Dataset

    num = [c for c in reference if c not in categorical]
    dd = DataDefinition(numerical_columns=num, categorical_columns=[c for c in reference if c in categorical])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_df = pd.DataFrame(reference)
        cur_df = pd.DataFrame({k: current[k] for k in reference if k in current})
        snap = Report([DataDriftPreset()]).run(Dataset.from_pandas(cur_df, data_definition=dd),
                                               Dataset.from_pandas(ref_df, data_definition=dd))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "report.html")
            snap.save_html(out)
            with open(out, "rb") as f:
                page = f.read()
        if ours is not None:
            page = _inject(page, comparison_html(ours, evidently_verdicts(snap.dict()), alpha))
    try:
        return harden(page)[0]
    except UnsafeHTML as e:
        raise ReportError(f"the report cannot be written safely: {e}") from None


def _reconstruct(ref: Any, counts: np.ndarray, sums: np.ndarray | None, rows: int) -> list[Any]:
    total = counts.sum()
    if total <= 0:
        return [None] * rows
    # Largest-remainder rounding of the bin shares to `rows` values: deterministic.
    raw = counts / total * rows
    k = np.floor(raw).astype(int)
    rest = rows - k.sum()
    if rest > 0:
        k[np.argsort(-(raw - k), kind="stable")[:rest]] += 1
    if isinstance(ref, NumericColumn):
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, (sums if sums is not None else ref.bin_means * counts) / np.maximum(counts, 1),
                             0.0)
        return np.repeat(means, k).tolist()
    cats = [*ref.categories, "__other__"]
    return [c for c, n in zip(cats, k.tolist(), strict=True) for _ in range(n)]


def window_report(monitors: Iterable[Monitor], model: str | None, version: str | None) -> bytes:
    """HTML report of one model version's window against its reference, reconstructed from bins."""
    mons = [m for m in monitors if (model is None or m.key[0] == model)
            and (version is None or m.key[1] == version) and m.profile is not None]
    if not mons:
        raise ReportError("no model version with a built reference matches; see /v1/status components.drift")
    mon = mons[0]
    ref_cols: dict[str, Any] = {}
    cur_cols: dict[str, Any] = {}
    cats = []
    for name, cw in mon.columns.items():
        s = cw.summary
        ref_cols[name] = _reconstruct(cw.ref, cw.ref.counts, None, RECON_ROWS)
        cur_cols[name] = _reconstruct(cw.ref, s.counts, s.sums, RECON_ROWS)
        if isinstance(cw.ref, CategoricalColumn):
            cats.append(name)
    return render(ref_cols, cur_cols, cats, mon.last)


def admin_report(query: dict[str, str], window: Callable[[str | None, str | None], bytes]) -> tuple[int, str, bytes]:
    """Admin route handler: ``/admin/drift/report?model=M&model_version=V``.

    ``model_version`` is the metrics' label name; the older ``version`` parameter is still accepted.

    Args:
        query: the request's query parameters.
        window: :func:`window_report` of the component's model versions, taken under its state lock.
    """
    mv, old = query.get("model_version"), query.get("version")
    if mv is not None and old is not None and mv != old:
        return 400, "text/plain; charset=utf-8", (
            f"model_version={mv!r} and version={old!r} disagree; pass only model_version\n").encode()
    try:
        body = window(query.get("model"), mv if mv is not None else old)
    except ReportError as e:
        code = 501 if INSTALL in str(e) else 404
        return code, "text/plain; charset=utf-8", (str(e) + "\n").encode()
    return 200, "text/html; charset=utf-8", body

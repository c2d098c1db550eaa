"""The deep-dive HTML report of two data files, and the report fetched from a running sidecar (the CLI's half).

``inferwatch report --reference A --current B`` reads both files (:mod:`.dataio`), samples them to
``max_rows`` rows each, computes our verdicts on exactly those rows and has Evidently render the page
(:func:`inferwatch_sidecar.components.drift.report.render`, the renderer the daemon's
``/admin/drift/report`` shares). ``inferwatch report --sidecar URL`` fetches that admin route instead.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import numpy as np

from inferwatch_sidecar.components.drift import engine
from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.report import ReportError, render
from inferwatch_sidecar.offline.drift.dataio import DataError, read_table
from inferwatch_sidecar.stats.columns import to_float

__all__ = ["ReportError", "fetch_from_sidecar", "report_for_files"]


def report_for_files(reference: str, current: str, *, categorical: list[str] | None = None,
                     numeric: list[str] | None = None, max_rows: int = 50000) -> bytes:
    """HTML report for two data files (types inferred as in ``drift compare``)."""
    try:
        rt = read_table(reference, categorical=categorical, numeric=numeric)
        ct = read_table(current, categorical=[c for c in categorical or [] if c], numeric=numeric)
    except DataError as e:
        raise ReportError(str(e)) from None
    cols = [c for c in rt.order if c in ct.order]
    if not cols:
        raise ReportError("the two files have no column in common")
    cats = [c for c in cols if c in rt.categorical]

    def pick(t: Any) -> dict[str, Any]:
        idx = np.arange(t.rows)
        if t.rows > max_rows:
            idx = np.sort(np.random.default_rng(0).choice(t.rows, max_rows, replace=False))
        out: dict[str, Any] = {}
        for c in cols:
            if c in cats:
                src = t.categorical.get(c)
                vals = src if src is not None else [None if not np.isfinite(v) else str(v) for v in t.numeric[c]]
                out[c] = [vals[i] for i in idx]
            else:
                src = t.numeric.get(c)
                if src is None:
                    src = np.array([to_float(v) for v in t.categorical[c]])
                out[c] = src[idx]
        return out

    ref_cols, cur_cols = pick(rt), pick(ct)
    # Our verdicts on exactly the rows Evidently sees.
    p = prof.build({c: np.asarray(v, dtype=np.float64) for c, v in ref_cols.items() if c not in cats},
                   {c: ref_cols[c] for c in cats}, order=cols)
    ours = engine.compare_columns(p, {c: np.asarray(v, dtype=np.float64) for c, v in cur_cols.items() if c not in cats},
                                  {c: cur_cols[c] for c in cats}, engine.Settings())
    return render(ref_cols, cur_cols, cats, ours)


def fetch_from_sidecar(url: str, token: str | None, model: str | None, version: str | None) -> bytes:
    """GET the report from a running sidecar's admin endpoint."""
    token = token or os.environ.get("INFERWATCH_ADMIN_TOKEN")
    if not token:
        raise ReportError("the admin endpoint needs a token: pass --token or set INFERWATCH_ADMIN_TOKEN")
    q = {k: v for k, v in (("model", model), ("model_version", version)) if v}
    full = url.rstrip("/") + "/admin/drift/report" + ("?" + urllib.parse.urlencode(q) if q else "")
    req = urllib.request.Request(full, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as e:
        raise ReportError(f"{full}: HTTP {e.code}: {e.read(500).decode(errors='replace').strip()}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ReportError(f"{full}: {getattr(e, 'reason', e)}") from None

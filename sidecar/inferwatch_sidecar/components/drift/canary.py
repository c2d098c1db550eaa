"""Canary comparison: each version of a model against its stable version, window to window.

Versions share bins only when they share a reference (the configured profile),
so only those are compared. The baseline's window becomes a pseudo-reference
(:func:`pseudo_reference`) and every other version's window is scored against
it with the usual tests and decision. The stable version is
:func:`~inferwatch_sidecar.components.identity.baseline`'s (``canary.baselines``,
else the busiest version), the same the canary judge compares with. This says *which columns* differ; whether the
canary is *worse* (errors, latency, outputs) and should be rolled back is the
canary judge's verdict (``inferwatch_sidecar.components.canary``, docs/canary.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from inferwatch_sidecar.components.drift import engine
from inferwatch_sidecar.components.drift.monitor import Monitor
from inferwatch_sidecar.components.drift.window import ColumnWindow
from inferwatch_sidecar.components.identity import baseline
from inferwatch_sidecar.stats.columns import CategoricalColumn, Column, NumericColumn


def pseudo_reference(cw: ColumnWindow) -> Column:
    """A window's bins as a reference column."""
    ref = cw.ref
    s = cw.summary
    if isinstance(ref, NumericColumn):
        assert s.sums is not None
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(s.counts > 0, s.sums / np.where(s.counts > 0, s.counts, 1), 0.0)
        return NumericColumn(name=ref.name, role=ref.role, count=int(s.counts.sum()), missing=s.missing,
                             mean=ref.mean, std=ref.std, min=ref.min, max=ref.max, edges=ref.edges,
                             counts=s.counts, bin_means=means, psi_edges=ref.psi_edges)
    return CategoricalColumn(name=ref.name, role=ref.role, count=int(s.counts.sum()), missing=s.missing,
                             categories=ref.categories, counts=s.counts)


def compare_canaries(monitors: Iterable[Monitor], settings: engine.Settings,
                     baselines: Mapping[str, str] | None = None) -> None:
    """Set every monitor's ``canary``: its comparison with the baseline version, or None.

    Args:
        monitors: every model version's monitor.
        settings: the engine's tests and decision.
        baselines: ``canary.baselines`` (model -> stable version).
    """
    by_model: dict[str, list[Monitor]] = {}
    for mon in monitors:
        mon.canary = None
        if mon.profile is not None and mon.window_rows >= settings.min_samples:
            by_model.setdefault(mon.key[0], []).append(mon)
    for model, mons in by_model.items():
        if len(mons) < 2:
            continue
        ver = baseline(model, {m.key[1]: m.window_rows for m in mons}, baselines or {})
        base = next((m for m in mons if m.key[1] == ver), None)
        if base is None:
            continue
        for mon in mons:
            if mon is base or mon.profile is not base.profile:
                continue
            results = [engine.score(pseudo_reference(base.columns[n]), mon.columns[n].summary, settings)
                       for n in mon.columns]
            ev = engine.decide(results, settings)
            # A canary's predictions and confidence matter as much as its inputs: its share counts
            # every column (exported with the feature label like the inputs).
            ev.n_features = len(results)
            ev.n_drifted = sum(r.drifted for r in results)
            ev.share_drifted = ev.n_drifted / ev.n_features if results else 0.0
            mon.canary = {"baseline_version": base.key[1], "evaluation": ev}

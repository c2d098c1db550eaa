"""Issue 28: /metrics renders family by family and keeps a component snapshot's bytes until it changes.

The body must be byte for byte what the whole-registry encoders give (text, OpenMetrics, protobuf),
a snapshot family must be rendered once per snapshot (and cut by the series budget without building
its samples), and a new snapshot must show at the next scrape.
"""

from __future__ import annotations

import json

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from inferwatch_sidecar.config import load_config
from inferwatch_sidecar.daemon import Sidecar
from inferwatch_sidecar.export.budget import ExpositionBudget
from inferwatch_sidecar.http.routes import scrape_registry
from inferwatch_sidecar.metrics import families
from inferwatch_sidecar.metrics.drift import METRICS as DRIFT_METRICS
from tests.components.drift.test_component import make_profile, traffic
from tests.metrics.test_native import PROM_242_ACCEPT

ACCEPTS = ("", "text/plain", "application/openmetrics-text; version=1.0.0", PROM_242_ACCEPT)


def _sidecar(tmp_path, family_budget: int = 5000) -> tuple[Sidecar, ExpositionBudget, object]:
    s = Sidecar(load_config(environ={}, overrides={
        "gpu": {"enabled": False}, "drift": {"reference": make_profile(tmp_path), "window_events": 2000},
        }))
    s._build_components()
    drift = next(x.component for x in s.slots if x.name == "drift")
    for x in s.slots:
        if x.component is not None:
            x.state = "running"
    # The process collector's CPU and memory change between two renders; the rest does not while idle.
    reg = CollectorRegistry()
    reg.register(families.CatalogCollector(s._collect_core, ()))
    reg.register(families.CatalogCollector(s._collect_components, ()))
    return s, ExpositionBudget(reg, s.cfg.labels.max_exposition_series, family_budget), drift


def _feed(s: Sidecar, drift: object, seed: int, shift: float) -> None:
    body = json.dumps({"service": "svc", "model": "m", "model_version": "v1", "events": [
        {"type": "request", "duration_s": 0.01 * (i + 1), "stages": {"queue": 0.001, "infer": 0.005}}
        for i in range(50)]}).encode()
    assert s.json_ingest.post("events", body)[0] == 200
    for v, sh in (("v1", shift), ("v2", 0.0)):
        recs, _ = traffic(600, seed, shift=sh, version=v)
        drift.handle(1, 1, recs)  # type: ignore[attr-defined]
    drift.drain()  # type: ignore[attr-defined]
    drift.evaluate()  # type: ignore[attr-defined]


def test_body_is_the_whole_registry_encoders_and_snapshots_render_once(tmp_path) -> None:
    s, view, drift = _sidecar(tmp_path)
    _feed(s, drift, 1, 0.0)
    for accept in ACCEPTS:
        assert view.render(accept) == scrape_registry(view, accept), accept  # type: ignore[arg-type]
    rendered = dict(view.renderer.rendered)
    drift_fams = {k for k in rendered if k.startswith("inferwatch_drift_")}
    assert len(drift_fams) > 10 and all(rendered[k] == 3 for k in drift_fams)  # text, OpenMetrics, protobuf
    for accept in ACCEPTS:
        view.render(accept)
    assert {k: view.renderer.rendered[k] for k in drift_fams} == {k: rendered[k] for k in drift_fams}
    misses = view.renderer.misses
    text_before = view.render("")[0]
    # A new evaluation replaces the snapshot: the next scrape shows it, and still byte for byte.
    _feed(s, drift, 2, 3.0)
    for accept in ACCEPTS:
        assert view.render(accept) == scrape_registry(view, accept), accept  # type: ignore[arg-type]
    assert view.renderer.misses > misses
    text_after = view.render("")[0]
    assert text_after != text_before
    p_after = [ln for ln in text_after.decode().splitlines()
               if ln.startswith("inferwatch_drift_feature_p_value{") and 'feature="a"' in ln and '"v1"' in ln]
    assert p_after and float(p_after[0].rsplit(" ", 1)[1]) < 1e-6  # the shifted feature, from the new snapshot


def test_snapshot_families_are_lazy_and_equal_to_eager_ones() -> None:
    rng = np.random.default_rng(4)
    for m in DRIFT_METRICS:
        if m.type not in ("gauge", "counter"):
            continue
        n = int(rng.integers(1, 40)) if m.labels else 1  # a snapshot has one value per label set
        values = [(tuple(f"{lab}{rng.integers(0, 9)}-{i}" for lab in m.labels), float(rng.normal())) for i in range(n)]
        (lazy,) = families.from_snapshot([m], {m.name: values})
        eager = families.family(m)
        for labels, v in values:
            eager.add_metric(list(labels), v)  # type: ignore[attr-defined]
        assert lazy.snapshot_values is values and lazy.__dict__["_todo"] is values  # type: ignore[attr-defined]
        assert lazy.samples == eager.samples and lazy.name == eager.name and lazy.type == eager.type
        # Cut by the budget: the lazy cut keeps what the generic cut keeps, sample for sample.
        allow = int(rng.integers(1, n + 1))
        plain = Metric(eager.name, eager.documentation, eager.type, eager.unit)
        plain.samples = list(eager.samples)
        cut_lazy = ExpositionBudget._cut(lazy, allow)
        assert cut_lazy.samples == ExpositionBudget._cut(plain, allow).samples
        assert cut_lazy.snapshot_key == (*lazy.snapshot_key, allow)  # type: ignore[attr-defined]


def test_the_family_budget_cuts_a_snapshot_family_and_counts_it(tmp_path) -> None:
    s, view, drift = _sidecar(tmp_path, family_budget=40)
    _feed(s, drift, 1, 0.0)
    body, _ = view.render("")
    bins = [ln for ln in body.decode().splitlines() if ln.startswith("inferwatch_drift_bin_events")]
    assert len(bins) == 40 and view.overflow.overflowed >= 1 and view.last_dropped > 0
    assert body == scrape_registry(view, "")[0]  # type: ignore[arg-type]
    assert view.render("")[0] == body
    assert view.renderer.rendered["inferwatch_drift_bin_events"] == 1  # the cut family is cached too


def test_fast_text_encoder_writes_what_prometheus_client_writes() -> None:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
        SummaryMetricFamily,
    )
    from prometheus_client.exposition import generate_latest
    from prometheus_client.samples import Exemplar

    from inferwatch_sidecar.export.render import _One, text_family

    rng = np.random.default_rng(11)
    alphabet = list('ab"\\\n{}=,é☃ x-_.') + ["</script>"]
    floats = [0.0, -0.0, 1.0, 1e-9, 2.5e17, float("inf"), float("-inf"), float("nan"), 123456789.0, 0.1]

    def val() -> str:
        return "".join(rng.choice(alphabet, size=int(rng.integers(0, 8))))

    def num() -> float:
        return float(rng.choice(floats)) if rng.random() < 0.5 else float(rng.normal() * 10.0 ** int(rng.integers(-6, 9)))

    for trial in range(60):
        labels = ["model", "stage", "zeta", "a_b"][: int(rng.integers(0, 5))]
        if trial % 7 == 0:
            labels.append("bad-name")  # a label name the text format escapes: the generic encoder's job
        doc = "help " + val()
        fams = [CounterMetricFamily(f"c{trial}_total", doc, labels=labels),
                GaugeMetricFamily(f"g{trial}", doc, labels=labels),
                HistogramMetricFamily(f"h{trial}_seconds", doc, labels=labels),
                SummaryMetricFamily(f"s{trial}", doc, labels=labels),
                InfoMetricFamily(f"i{trial}", doc)]
        for _ in range(int(rng.integers(0, 6))):
            lv = [val() for _ in labels]
            fams[0].add_metric(lv, abs(num()), created=1.5 if rng.random() < 0.2 else None)
            fams[1].add_metric(lv, num(), timestamp=12.5 if rng.random() < 0.1 else None)
            ex = Exemplar({"trace_id": "ab"}, 0.2, 3.0) if rng.random() < 0.5 else None
            fams[2].add_metric(lv, [("0.1", 1.0), ("1.0", 2.0, ex) if ex else ("1.0", 2.0), ("+Inf", 3.0)], num())
            fams[3].add_metric(lv, count_value=3, sum_value=num())
        fams[4].add_metric([], {"version": val()})
        for fam in fams:
            assert text_family(fam) == generate_latest(_One(fam)), (trial, fam.name)  # type: ignore[arg-type]

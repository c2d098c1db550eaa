"""The series budget of docs/scale.md, held on a real exposition of the reference workload.

The reference workload (``Workload()``): 1 service, 3 models x 2 versions, 5 stages (one of them
``queue``, one streaming), one error type, recorded predictions. Its events go through the
aggregator; the text exposition's series (sample lines) and the protobuf exposition's (a
native histogram is one series) are counted per family and must match
``budget.aggregator_series`` family by family, which is where docs/scale.md's table comes from.
"""

from __future__ import annotations

import random
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.wire import EV_RECORD, EV_REQUEST
from inferwatch_sidecar.aggregate.aggregator import Aggregator
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.metrics import protobuf
from inferwatch_sidecar.metrics.budget import Workload, aggregator_series
from inferwatch_sidecar.metrics.families import CatalogCollector
from tests.metrics.promproto import parse_delimited

#: The stated budgets for the reference workload (docs/scale.md).
CLASSIC_BUDGET = 1900
NATIVE_BUDGET = 120


def reference_events(w: Workload, n: int, seed: int) -> list[tuple[Any, ...]]:
    rnd = random.Random(seed)
    out: list[tuple[Any, ...]] = []
    for m in range(w.models):
        for v in range(w.versions):
            ctx = ("svc", f"model{m}", f"v{v}")
            for k in range(n):
                stages = []
                for j, name in enumerate(w.stages):
                    stream = None
                    if j >= len(w.stages) - w.streaming:
                        stream = (rnd.randint(10**6, 10**8), 8, [rnd.randint(1000, 50_000) for _ in range(7)])
                    stages.append((name, int(rnd.lognormvariate(13, 1.5)), stream))
                outcome = 1 if k % 10 == 0 else 0
                out.append((EV_REQUEST, ctx, 10**18 + k, sum(s[1] for s in stages), outcome,
                            "Timeout" if outcome else None, f"r{k}", None, stages))
                out.append((EV_RECORD, ctx, 10**18 + k, f"r{k}", 0.5, None, None, {"x": 1.0}))
    return out


def count_text(agg: Aggregator) -> dict[str, int]:
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, ()))
    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        name = fam.name + "_total" if fam.type == "counter" else fam.name.removesuffix("_info")
        if fam.samples:
            out[name] = len(fam.samples)
    return out


def count_protobuf(agg: Aggregator) -> dict[str, int]:
    reg = CollectorRegistry()
    reg.register(CatalogCollector(agg.collect, ()))
    out: dict[str, int] = {}
    for mf in parse_delimited(protobuf.encode(reg)):
        name = mf.name.removesuffix("_info")
        n = 0
        for m in mf.metric:
            h = m.histogram if m.HasField("histogram") else None
            n += 1 if h is None or h.zero_threshold else len(h.bucket) + 3
        out[name] = n
    return out


def test_reference_workload_holds_its_series_budget_family_by_family() -> None:
    w = Workload()
    agg = Aggregator(ComponentContext(), frozenset({"queue"}))
    agg.process(reference_events(w, 50, 1), [0] * 16)
    classic, native = count_text(agg), count_protobuf(agg)
    assert classic == aggregator_series(w, native=False)
    assert native == aggregator_series(w, native=True)
    total_c, total_n = sum(classic.values()), sum(native.values())
    assert total_c <= CLASSIC_BUDGET and total_n <= NATIVE_BUDGET, (total_c, total_n)
    assert total_c >= 5 * total_n


def test_the_budget_formula_follows_other_workloads() -> None:
    """Random workloads: more models, versions, stages and streams; the formula still counts every series."""
    rnd = random.Random(3)
    for _ in range(4):
        n_stages = rnd.randint(1, 6)
        w = Workload(models=rnd.randint(1, 3), versions=rnd.randint(1, 3),
                     stages=tuple(["queue", "a", "b", "c", "d", "e"][:n_stages]),
                     streaming=rnd.randint(0, n_stages), error_types=1)
        agg = Aggregator(ComponentContext(), frozenset({"queue"}))
        agg.process(reference_events(w, 20, rnd.randint(0, 99)), [0] * 16)
        assert count_text(agg) == aggregator_series(w, native=False)
        assert count_protobuf(agg) == aggregator_series(w, native=True)

"""Generate inferwatch's Grafana dashboards (``dashboards/src/``, one module per dashboard) as JSON.

Usage::

    python dashboards/generate.py          # rewrite dashboards/*.json
    python dashboards/generate.py --check  # exit 1 when a JSON file is stale
    python dashboards/generate.py --list   # print every panel query

The dashboards are built with grafana-foundation-sdk's typed builders (a test-only dependency: the JSON is
committed). Every query is checked while generating (``alerts/catalog_check.py``): each series it names must
be in the metric catalog, be a recording rule of ``alerts/source.py`` or be one of Triton's and vLLM's own
metrics (``ENGINE_FAMILIES``, for the engines' dashboards), and each label it matches must belong to that
series, so a renamed metric fails generation instead of leaving a panel empty.

Conventions (for Grafana file provisioning): a ``datasource``-type template variable instead of ``__inputs``;
``service``, ``model`` and ``version`` variables (``version`` holds the ``model_version`` label's values);
stable UIDs (the file is named after the UID); units and thresholds on every panel.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make ``alerts`` and ``dashboards`` importable
    sys.path.insert(0, str(ROOT))

from alerts.catalog_check import check_query, known_series  # noqa: E402
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel  # noqa: E402
from grafana_foundation_sdk.models.prometheus import Dataquery  # noqa: E402

from alerts import promql  # noqa: E402
from dashboards.src import drift, gpu, llm, overview, queue, saturation, sidecar, stages, triton, vllm  # noqa: E402

OUT_DIR = ROOT / "dashboards"
#: The dashboard modules, in menu order.
BOARDS = (overview, stages, queue, llm, gpu, drift, sidecar, triton, vllm, saturation)
UID_PREFIX = "inferwatch-"

#: What makes a panel show data beyond plain request traffic with recorded features. A healthy service
#: legitimately leaves these panels empty ("No data"); an end-to-end test should expect data from a panel
#: only when its scenario produces what the panel needs.
NEEDS: dict[str, str] = {
    "errors": "requests that end in an error",
    "queue": "queue stages (ingest.queue_stages) or queue depth reports",
    "batches": "dynamic batch size reports",
    "streaming": "streaming stages that yield tokens",
    "allocator": "PyTorch allocator records from the SDK's torch probe",
    "leak": "a leak verdict from the GPU leak detector (the rate exists once it has enough data)",
    "gpu_errors": "NVML sampling errors",
    "labels": "ground-truth labels joined to predictions (/v1/labels or inline)",
    "canary": "two versions of one model with traffic (canary vs stable)",
    "component_errors": "an exception inside a component",
    "drops": "data the sidecar dropped (oversized bodies, full allocator table, ...)",
    "decode_errors": "malformed frames or JSON events",
    "triton": "Triton's own /metrics scraped beside the sidecar (docs/triton.md)",
    "vllm": "vLLM's own /metrics scraped beside the sidecar (docs/vllm.md)",
    "tail_p999": "a tail-attribution window with enough requests to name the slowest 0.1% (docs/tail.md)",
    "binary": "a binary model whose reference was built with its labels (reference build --label)",
    "skew": "offline feature values posted for served request IDs (skew.enabled, POST /v1/skew; docs/skew.md)",
    "engines": "an engine's /metrics read by the sidecar (engines targets, --engine-metrics; docs/saturation.md)",
    "capacity": "traffic that visited in-flight levels on both sides of the knee (docs/capacity.md)",
    "slo": "capacity.slo objectives configured for the model (docs/capacity.md)",
}
#: ``dashboard uid -> need`` for every panel of a dashboard (the engines' dashboards).
DASHBOARD_NEEDS: dict[str, str] = {triton.UID: "triton", vllm.UID: "vllm", saturation.UID: "engines"}

#: ``(dashboard uid, panel title) -> need`` or ``(uid, title, refId) -> need`` for one query of a panel.
PANEL_NEEDS: dict[tuple[str, ...], str] = {
    ("inferwatch-overview", "Errors by type"): "errors",
    ("inferwatch-drift", "Served values matching the offline pipeline"): "skew",
    ("inferwatch-drift", "Kind of skew per feature"): "skew",
    ("inferwatch-queue", "Queue wait P50 / P99 / P999"): "queue",
    ("inferwatch-queue", "Queue depth"): "queue",
    ("inferwatch-queue", "Batch size distribution"): "batches",
    ("inferwatch-queue", "Mean batch size and batches per second"): "batches",
    ("inferwatch-queue", "Batch size P50 / P99"): "batches",
    ("inferwatch-queue", "In flight against the live knee"): "capacity",
    ("inferwatch-queue", "Capacity headroom"): "capacity",
    ("inferwatch-queue", "Goodput against the objectives"): "slo",
    **{("inferwatch-llm", t): "streaming" for t in (
        "Time to first token P50 / P99 / P999", "Inter-token latency P50 / P99 / P999", "Tokens per second",
        "Tokens per stream P50 / P99", "Mean tokens per second per stream")},
    ("inferwatch-gpu", "Allocator allocated / reserved"): "allocator",
    ("inferwatch-gpu", "Fragmentation ratio"): "allocator",
    ("inferwatch-gpu", "Alloc retries and OOMs per second"): "allocator",
    ("inferwatch-gpu", "Non-allocator memory"): "allocator",
    ("inferwatch-gpu", "Leak rate (with confidence interval)"): "leak",
    ("inferwatch-gpu", "Time to OOM"): "leak",
    ("inferwatch-gpu", "Collector errors and CPU", "A"): "gpu_errors",
    ("inferwatch-drift", "Estimated vs real accuracy", "B"): "labels",
    ("inferwatch-drift", "Columns differing from the stable version"): "canary",
    ("inferwatch-drift", "Canary columns that differ"): "canary",
    ("inferwatch-sidecar", "Component errors"): "component_errors",
    ("inferwatch-sidecar", "Sidecar drops by reason", "A"): "drops",
    ("inferwatch-sidecar", "Sidecar drops by reason", "E"): "drops",
    ("inferwatch-sidecar", "Decode errors by reason"): "decode_errors",
    **{("inferwatch-overview", t): "tail_p999" for t in (
        "Why is P99.9 slow: time of the slowest 0.1% by stage", "Stage time: slowest 0.1% vs median requests",
        "What slow requests have: feature vs the rest (x median)")},
    ("inferwatch-drift", "Estimated binary metrics"): "binary",
}


def dashboards() -> list[Dashboard]:
    """Every dashboard, in menu order."""
    return [m.build() for m in BOARDS]


def filename(d: Dashboard) -> str:
    """The JSON file of a dashboard: its UID without the ``inferwatch-`` prefix (``overview.json``)."""
    return f"{(d.uid or '').removeprefix(UID_PREFIX)}.json"


def _panels(d: Dashboard) -> list[Panel]:
    return [p for p in d.panels or [] if isinstance(p, Panel)]


@dataclass(frozen=True, kw_only=True)
class PanelQuery:
    """One query of one panel."""

    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool = False
    #: a key of NEEDS when the query is empty without that kind of data; None when traffic alone fills it
    needs: str | None = None

    @property
    def series(self) -> frozenset[str]:
        """The series (metrics and recording rules) this query reads."""
        return frozenset(promql.series_names(self.expr))


def panel_queries() -> list[PanelQuery]:
    """Every panel query of every dashboard, as written (with Grafana variables)."""
    out: list[PanelQuery] = []
    for d in dashboards():
        uid = d.uid or ""
        for p in _panels(d):
            for t in p.targets or []:
                assert isinstance(t, Dataquery)
                needs = PANEL_NEEDS.get((uid, p.title or "", t.ref_id),
                                        PANEL_NEEDS.get((uid, p.title or ""), DASHBOARD_NEEDS.get(uid)))
                out.append(PanelQuery(dashboard=uid, panel=p.title or "", ref=t.ref_id, expr=t.expr,
                                      instant=bool(t.instant), needs=needs))
    return out


def _variable_queries(d: Dashboard) -> dict[str, str]:
    """``name -> query`` of the query variables of a dashboard."""
    out = {}
    for v in d.templating.list_val or []:
        if v.type_val == "query" and isinstance(v.query, dict):
            out[v.name] = str(v.query["query"])
    return out


def _single_value_defaults() -> dict[str, str]:
    """The default of every variable that holds one value (not "All"), across the dashboards."""
    out = {}
    for d in dashboards():
        for v in d.templating.list_val or []:
            if v.type_val == "query" and not v.include_all and v.current is not None:
                out[v.name] = str(v.current.value)
    return out


_VAR = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}")


def substitute(expr: str, rate_interval: str = "1m", range_: str = "5m", variables: dict[str, str] | None = None
               ) -> str:
    """Replace Grafana variables so that ``expr`` is plain PromQL.

    Args:
        expr: a panel query.
        rate_interval: value of ``$__rate_interval`` (and ``$__interval``).
        range_: value of ``$__range``.
        variables: values for template variables; every other ``$name`` becomes its default when the variable
            holds one value (``$measure``), else ``.*`` (Grafana's "All"); ``$1`` (a capture group) stays.

    Returns:
        The query as Grafana would send it.
    """
    values = {"__rate_interval": rate_interval, "__interval": rate_interval, "__range": range_,
              **_single_value_defaults(), **(variables or {})}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name.isdigit():  # a label_replace capture group ("$1"), which Grafana leaves alone too
            return m.group(0)
        return values.get(name, ".*")

    return _VAR.sub(sub, expr)


def check_all() -> list[str]:
    """Problems in every panel and variable query of every dashboard."""
    known = known_series()
    problems = []
    for q in panel_queries():
        problems += [f"{q.dashboard} / {q.panel} / {q.ref}: {p}" for p in check_query(q.expr, known)]
    for d in dashboards():
        for name, query in _variable_queries(d).items():
            inner = re.match(r"label_values\((.*),\s*\w+\)$", query)
            if inner:
                problems += [f"{d.uid} / variable {name}: {p}" for p in check_query(inner.group(1), known)]
    return problems


def render() -> dict[Path, str]:
    """Every dashboard file and its content."""
    problems = check_all()
    if problems:
        raise SystemExit("dashboard queries do not match the metric catalog:\n  " + "\n  ".join(problems))
    return {OUT_DIR / filename(d): json.dumps(d, cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"
            for d in dashboards()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate inferwatch's Grafana dashboards from the metric catalog.")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a JSON file is stale")
    ap.add_argument("--list", action="store_true", help="print every panel query (variables substituted)")
    args = ap.parse_args(argv)
    if args.list:
        for q in panel_queries():
            print(f"# {q.dashboard} / {q.panel} / {q.ref}\n{substitute(q.expr)}\n")
        return 0
    files = render()
    stale = []
    for path, text in files.items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    known = {p.name for p in files}
    orphans = sorted(p.name for p in OUT_DIR.glob("*.json") if p.name not in known)
    if orphans:
        print(f"dashboards/ holds JSON no generator writes: {', '.join(orphans)}", file=sys.stderr)
        return 1
    if stale:
        print(f"stale dashboards: {', '.join(stale)}; run `python dashboards/generate.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

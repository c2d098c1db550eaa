"""Catalog entries for the engines component (the engine's own state, read from its /metrics).

Labels: ``service``, ``model``, ``model_version`` come from the ``engines:`` target's config, or, where the
config leaves ``model`` out, from the engine's model label (at most ``engines.max_models`` per target);
``target`` is the configured target name and ``kind`` the engine kind. No value comes from traffic.
"""

from __future__ import annotations

from inferwatch_sidecar.metrics.entry import Metric

_M = ("service", "model", "model_version")

ENGINE_REQUESTS_RUNNING = Metric(
    name="inferwatch_engine_requests_running", type="gauge", labels=_M, component="engines",
    help="Requests the engine is executing now (vLLM num_requests_running, SGLang num_running_reqs, "
    "TensorRT-LLM scheduled).",
)
ENGINE_REQUESTS_WAITING = Metric(
    name="inferwatch_engine_requests_waiting", type="gauge", labels=_M, component="engines",
    help="Requests queued in the engine, not yet scheduled (vLLM num_requests_waiting, SGLang num_queue_reqs, "
    "Triton pending_request_count).",
)
ENGINE_KV_CACHE_USAGE_RATIO = Metric(
    name="inferwatch_engine_kv_cache_usage_ratio", type="gauge", unit="ratio", labels=_M, component="engines",
    help="Share of the engine's KV-cache blocks in use (1 = full; the fullest data-parallel engine).",
)
ENGINE_PREEMPTIONS_TOTAL = Metric(
    name="inferwatch_engine_preemptions_total", type="counter", labels=_M, component="engines",
    help="Requests the engine preempted (vLLM) or retracted (SGLang) for lack of KV cache since the sidecar "
    "started watching it; engine restarts add, never subtract.",
)
ENGINE_PREFIX_CACHE_HIT_RATIO = Metric(
    name="inferwatch_engine_prefix_cache_hit_ratio", type="gauge", unit="ratio", labels=_M, component="engines",
    help="Share of prompt tokens found in the prefix cache over the last scrape interval.",
)
ENGINE_QUEUE_TIME_SHARE_RATIO = Metric(
    name="inferwatch_engine_queue_time_share_ratio", type="gauge", unit="ratio", labels=_M, component="engines",
    help="Share of end-to-end request time spent queued in the engine over the last scrape interval.",
)
ENGINE_UP = Metric(
    name="inferwatch_engine_up", type="gauge", labels=("target", "kind"), component="engines",
    help="1 when the last scrape of the engine endpoint succeeded and was recognised, else 0.",
)
ENGINE_SCRAPES_TOTAL = Metric(
    name="inferwatch_engine_scrapes_total", type="counter", labels=("target", "result"), component="engines",
    help="Scrapes of an engine endpoint by result: ok, refused, timeout, http_error, too_large, garbage, "
    "unrecognised, error.",
)
ENGINE_SCRAPE_DURATION_SECONDS = Metric(
    name="inferwatch_engine_scrape_duration_seconds", type="gauge", unit="seconds", labels=("target",),
    component="engines",
    help="Wall time of the last scrape (fetch and parse).",
)

METRICS = (
    ENGINE_REQUESTS_RUNNING, ENGINE_REQUESTS_WAITING, ENGINE_KV_CACHE_USAGE_RATIO, ENGINE_PREEMPTIONS_TOTAL,
    ENGINE_PREFIX_CACHE_HIT_RATIO, ENGINE_QUEUE_TIME_SHARE_RATIO, ENGINE_UP, ENGINE_SCRAPES_TOTAL,
    ENGINE_SCRAPE_DURATION_SECONDS,
)

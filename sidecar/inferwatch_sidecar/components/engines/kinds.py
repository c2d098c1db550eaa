"""Engine recognition and the engine-neutral reading.

Each engine names the same few facts differently (checked against the installed
vLLM's ``vllm/v1/metrics/loggers.py``, Triton's ``/metrics`` as the suite's
PyTriton serves it, SGLang's and TensorRT-LLM backend's documented names):

=================  ============================  ======================  ======================================
fact               vLLM (v1; v0 fallback)         SGLang                  Triton / TensorRT-LLM backend
=================  ============================  ======================  ======================================
running            vllm:num_requests_running      sglang:num_running_reqs nv_trt_llm_request_metrics{scheduled}
waiting            vllm:num_requests_waiting      sglang:num_queue_reqs   nv_inference_pending_request_count /
                                                                          nv_trt_llm_request_metrics{waiting}
KV-cache usage     vllm:kv_cache_usage_perc       sglang:token_usage      nv_trt_llm_kv_cache_block_metrics
                   (vllm:gpu_cache_usage_perc)                            {fraction} or used / max
preemptions        vllm:num_preemptions_total     sglang:num_retracted_   -
                                                  reqs(_total)
prefix-cache hits  vllm:prefix_cache_hits_total / sglang:cache_hit_rate   -
                   queries_total (v0: gpu_
                   prefix_cache_hit_rate)
queue time         vllm:request_queue_time_       sglang:queue_time_      nv_inference_queue_duration_us /
                   seconds_sum / e2e_request_     seconds_sum / e2e_      nv_inference_request_duration_us
                   latency_seconds_sum            request_latency_..._sum
prefill / decode   vllm:request_prefill_time_...  -                       -
                   / request_decode_time_..._sum
process CPU        process_cpu_seconds_total      process_cpu_seconds_    nv_cpu_utilization (host share)
                                                  total
=================  ============================  ======================  ======================================

vLLM's ``kv_cache_usage_perc`` is a fraction (1 = full) despite its name.
Series are grouped by the engine's model label (``model_name`` for vLLM and SGLang,
``model``/``version`` for Triton); data-parallel engines (vLLM's ``engine`` label)
are summed for counts and maxed for ratios, since the fullest one is the one that preempts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferwatch_sidecar.components.engines.promtext import Series

KINDS = ("vllm", "sglang", "triton", "tensorrt_llm")

#: Name prefixes each kind is recognised by, most specific first.
_PREFIXES = (("tensorrt_llm", "nv_trt_llm_"), ("vllm", "vllm:"), ("sglang", "sglang:"), ("triton", "nv_inference_"))


def detect(names: Iterable[str]) -> str | None:
    """The engine kind from the series names, or None when none is recognised."""
    seen = set()
    for n in names:
        for kind, prefix in _PREFIXES:
            if n.startswith(prefix):
                seen.add(kind)
                break
    for kind, _ in _PREFIXES:
        if kind in seen:
            return kind
    return None


@dataclass
class ModelReading:
    """One model's facts from one scrape; None where the engine does not say.

    Counters (``*_total``, ``*_sum``) are the engine's cumulative values; the
    target turns them into interval rates.
    """

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    prefix_hit_rate: float | None = None
    queue_s: float | None = None
    e2e_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    kv_used_blocks: float | None = None
    kv_max_blocks: float | None = None


@dataclass
class Reading:
    """Everything one scrape said, by engine model key (``(model, version)``)."""

    kind: str
    models: dict[tuple[str, str], ModelReading] = field(default_factory=dict)
    #: process_cpu_seconds_total of the engine process (vLLM, SGLang).
    cpu_seconds: float | None = None
    #: Triton's host CPU utilisation (0..1), when that is all there is.
    host_cpu_ratio: float | None = None


def _add(cur: float | None, v: float) -> float:
    return v if cur is None else cur + v


def _max(cur: float | None, v: float) -> float:
    return v if cur is None else max(cur, v)


# (series name, ModelReading attribute, combine): combine "sum" or "max" over engines of one model.
_VLLM = {
    "vllm:num_requests_running": ("running", "sum"),
    "vllm:num_requests_waiting": ("waiting", "sum"),
    "vllm:kv_cache_usage_perc": ("kv_usage", "max"),
    "vllm:gpu_cache_usage_perc": ("kv_usage", "max"),
    "vllm:num_preemptions_total": ("preemptions", "sum"),
    "vllm:prefix_cache_hits_total": ("prefix_hits", "sum"),
    "vllm:prefix_cache_queries_total": ("prefix_queries", "sum"),
    "vllm:gpu_prefix_cache_hit_rate": ("prefix_hit_rate", "max"),
    "vllm:request_queue_time_seconds_sum": ("queue_s", "sum"),
    "vllm:e2e_request_latency_seconds_sum": ("e2e_s", "sum"),
    "vllm:request_prefill_time_seconds_sum": ("prefill_s", "sum"),
    "vllm:request_decode_time_seconds_sum": ("decode_s", "sum"),
}
_SGLANG = {
    "sglang:num_running_reqs": ("running", "sum"),
    "sglang:num_queue_reqs": ("waiting", "sum"),
    "sglang:token_usage": ("kv_usage", "max"),
    "sglang:num_retracted_reqs_total": ("preemptions", "sum"),
    "sglang:num_retracted_requests_total": ("preemptions", "sum"),
    "sglang:cache_hit_rate": ("prefix_hit_rate", "max"),
    "sglang:queue_time_seconds_sum": ("queue_s", "sum"),
    "sglang:e2e_request_latency_seconds_sum": ("e2e_s", "sum"),
}
_TRITON = {
    "nv_inference_pending_request_count": ("waiting", "sum"),
    "nv_inference_queue_duration_us_total": ("queue_s", "sum"),
    "nv_inference_queue_duration_us": ("queue_s", "sum"),
    "nv_inference_request_duration_us_total": ("e2e_s", "sum"),
    "nv_inference_request_duration_us": ("e2e_s", "sum"),
}
_TRTLLM_REQUEST = {"scheduled": "running", "waiting": "waiting"}
_US = {"nv_inference_queue_duration_us", "nv_inference_queue_duration_us_total", "nv_inference_request_duration_us",
       "nv_inference_request_duration_us_total"}


#: Every series name some kind reads: the parser splits only these into labels (histogram buckets and
#: the rest of an endpoint cost a name lookup each).
WANTED_NAMES = frozenset({*_VLLM, *_SGLANG, *_TRITON, "nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics",
                          "process_cpu_seconds_total", "nv_cpu_utilization"})


def wanted(name: str) -> bool:
    """The parser's filter: only series some kind reads are split into labels."""
    return name in WANTED_NAMES


def _model_key(kind: str, labels: dict[str, str]) -> tuple[str, str]:
    if kind in ("triton", "tensorrt_llm"):
        return labels.get("model", ""), labels.get("version", "")
    return labels.get("model_name", ""), ""


def _put(mr: ModelReading, attr: str, how: str, v: float) -> None:
    cur = getattr(mr, attr)
    setattr(mr, attr, _add(cur, v) if how == "sum" else _max(cur, v))


def extract(kind: str, series: list[Series]) -> Reading:
    """The engine-neutral reading of ``series`` for ``kind``; non-finite values are left out."""
    r = Reading(kind)
    table = {"vllm": _VLLM, "sglang": _SGLANG}.get(kind, _TRITON)
    for name, labels, v in series:
        if not math.isfinite(v):
            continue
        if name == "process_cpu_seconds_total":
            r.cpu_seconds = v
            continue
        if name == "nv_cpu_utilization":
            r.host_cpu_ratio = v
            continue
        if kind == "tensorrt_llm" and name.startswith("nv_trt_llm_"):
            mr = r.models.setdefault(_model_key(kind, labels), ModelReading())
            if name == "nv_trt_llm_request_metrics":
                attr = _TRTLLM_REQUEST.get(labels.get("request_type", ""))
                if attr:
                    _put(mr, attr, "sum", v)
            elif name == "nv_trt_llm_kv_cache_block_metrics":
                t = labels.get("kv_cache_block_type", "")
                if t == "fraction":
                    _put(mr, "kv_usage", "max", v)
                elif t == "used":
                    _put(mr, "kv_used_blocks", "sum", v)
                elif t == "max":
                    _put(mr, "kv_max_blocks", "sum", v)
            continue
        hit = table.get(name)
        if hit is None:
            continue
        if name in _US:
            v = v / 1e6
        mr = r.models.setdefault(_model_key(kind, labels), ModelReading())
        _put(mr, hit[0], hit[1], v)
    for mr in r.models.values():
        if mr.kv_usage is None and mr.kv_used_blocks is not None and mr.kv_max_blocks:
            mr.kv_usage = mr.kv_used_blocks / mr.kv_max_blocks
    return r

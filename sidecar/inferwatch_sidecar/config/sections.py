"""The daemon's own config sections: ingest, HTTP, labels, OTLP traces and aggregation.

Each field carries its description (``Field(description=...)``), from which the reference in
docs/config.md is generated (:mod:`.reference`). The components' sections are their own models
(``components/<name>/config.py``), joined under the root by :mod:`.root`.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

# The SDK defines the default socket and the stage-name rules, so both sides agree on them.
from inferwatch._core import check_stage_name
from inferwatch._env import DEFAULT_SOCKET
from inferwatch_sidecar.aggregate.aggregator import CONFIGURABLE_HISTOGRAMS

__all__ = ["DEFAULT_LABEL_BUDGETS", "MAX_BUCKET_BOUNDS", "TRACE_PRESETS", "AggregateConfig", "BucketsConfig",
           "HttpConfig", "IngestConfig", "LabelsConfig", "NativeConfig", "Section", "TracesConfig"]


class Section(BaseModel):
    """A config section: unknown keys are rejected (a typo stops start-up), defaults are validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class IngestConfig(Section):
    """Where and how events arrive."""

    socket: str | None = Field(
        DEFAULT_SOCKET,
        description="Unix datagram socket path the SDK sends to; null or '' disables it. "
        "In Kubernetes put its directory on an emptyDir shared with the model server.",
    )
    socket_mode: int = Field(
        0o666, ge=0, le=0o777,
        description="Permissions of the socket file, octal as a string (\"0666\") or an integer. Writers need "
        "write permission; the default lets a model-server container running as another user send.",
    )

    @field_validator("socket_mode", mode="before")
    @classmethod
    def _octal(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return int(v.removeprefix("0o"), 8)
            except ValueError:
                raise ValueError(f"must be octal permissions such as \"0666\", got {v!r}") from None
        return v
    socket_dir_shared: bool = Field(
        False,
        description="Accept a socket directory that group or others can write, such as a Kubernetes emptyDir "
        "(world-writable, but only the pod's containers reach it). Leave false on a host: there the directory "
        "must be writable by this user (or root) only, or start-up stops.",
    )
    udp_port: int | None = Field(None, ge=0, le=65535, description="UDP port for udp://host:port producers; null disables.")
    udp_host: str = Field("127.0.0.1", description="Address the UDP socket binds; loopback keeps ingest local.")
    rcvbuf_bytes: int = Field(
        8 * 1024 * 1024, ge=65536, le=1 << 30,
        description="Kernel receive buffer asked for on the ingest sockets (capped by net.core.rmem_max "
        "unless running with CAP_NET_ADMIN). For Unix sockets the kernel also caps the queue at "
        "net.unix.max_dgram_qlen datagrams; past it the SDK counts send failures.",
    )
    max_producers: int = Field(1024, ge=1, description="Producers (SDK processes) remembered in the producers table.")
    producer_timeout_s: float = Field(60.0, gt=0, description="A producer silent for this long no longer counts as connected.")
    max_schemas: int = Field(4096, ge=1, description="Feature schemas remembered across producers; the one announced longest ago is forgotten first.")
    max_schema_bytes: int = Field(
        16 << 20, ge=1 << 20,
        description="Memory the remembered feature schemas may hold (estimated); past it the ones announced longest "
        "ago are forgotten, and a schema larger on its own is refused. The default keeps a flood of crafted "
        "schemas well inside the shipped manifest's 512Mi limit.",
    )
    max_string_chars: int = Field(
        255, ge=16, le=255,
        description="Longest string kept from an SDK frame (categorical values, feature and stage names): longer "
        "ones are cut as the frame is decoded and counted in inferwatch_ingest_truncated_strings_total. The wire "
        "allows 255 bytes, and so does the JSON ingest path; 64 categorical values of 255 characters make each "
        "record ~20 KB in every buffer that holds it (staging, tail, drift warm-up). A lower value saves memory, "
        "but the drift reference profile keeps its categories and feature names whole: live values longer than "
        "the cut then match none of them and show as drift. Label values are cut further to labels.max_length.",
    )
    max_producer_event_rate: float = Field(
        1e7, gt=0,
        description="Most events per second one SDK process can report as dropped (the SDK's hot path costs "
        "over 100 ns an event); a DROPS record above it times the seconds since the producer's previous "
        "frame (at least 1 s) is rejected as forged.",
    )
    max_producer_frame_rate: float = Field(
        1e5, gt=0,
        description="Most frames per second one SDK process can send (one syscall each); a sequence-number gap "
        "above it times the seconds since the producer's previous frame is not counted as lost frames.",
    )
    max_json_body_bytes: int = Field(1 << 20, ge=1024, description="Largest POST /v1/events or /v1/labels body.")
    max_json_events: int = Field(10000, ge=1, description="Most events in one JSON body.")
    queue_stages: list[str] = Field(
        default_factory=lambda: ["queue"],
        description="Stage names whose durations also feed inferwatch_queue_wait_seconds.",
    )


class HttpConfig(Section):
    """The HTTP server: /metrics, health, status, JSON ingest, admin."""

    host: str = Field("127.0.0.1", description="Bind address; use 0.0.0.0 so Prometheus can scrape a pod.")
    port: int = Field(9464, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    max_connections: int = Field(
        1024, ge=1, le=60000,
        description="Open connections served at once; one more is answered 503 and closed at once. Every "
        "connection costs a file descriptor and a little memory, never a thread.",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=3600,
        description="Time to send a request line and headers, counted from connecting (or from the first "
        "byte after a keep-alive pause); then 408 and close.",
    )
    body_timeout_s: float = Field(
        10.0, gt=0, le=3600,
        description="Time to send a whole request body (then 408 and close), and to take a response off "
        "the socket (then the connection is dropped). Bodies are capped by ingest.max_json_body_bytes.",
    )
    admin_token: SecretStr | None = Field(
        None, description="Bearer token for /admin/... routes; admin routes are disabled without one. "
        "Prefer the INFERWATCH_ADMIN_TOKEN environment variable to a file.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header names accepted besides localhost, 127.0.0.1 and ::1. Checked when bound to a "
        "loopback address (a DNS-rebinding page sends its own name; answered 421), or whenever this list is set.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser Origins (scheme://host[:port]) allowed besides the sidecar's own; a request from any "
        "other Origin is answered 403, so a web page cannot post events or read /metrics.",
    )
    metrics_wait_s: float = Field(
        0.05, ge=0, le=60,
        description="/metrics is rendered on a thread of its own, ahead of each expected scrape. A scrape that finds "
        "such a render (at most metrics_max_age_s old) takes it as soon as events arrive within this time; "
        "otherwise, and on an idle sidecar, it waits for a render that starts after it arrived. Long enough that "
        "a starved ingest thread still shows activity (10 ms was not, at a load of 9 on 2 cores).",
    )
    metrics_max_age_s: float = Field(
        5.0, gt=0, le=3600,
        description="The oldest render (by when it started) a scrape takes while events arrive, instead of "
        "waiting for a fresh one.",
    )

    @field_validator("admin_token")
    @classmethod
    def _token_long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return v


#: Default cardinality budgets of the core labels.
DEFAULT_LABEL_BUDGETS = {"service": 20, "model": 50, "model_version": 50, "stage": 50, "error_type": 50}


class LabelsConfig(Section):
    """Cardinality budgets: distinct values admitted per label before __overflow__."""

    default_max_values: int = Field(100, ge=1, description="Budget for labels not listed in max_values.")
    max_values: dict[str, int] = Field(
        default_factory=lambda: dict(DEFAULT_LABEL_BUDGETS),
        description="Budget per label name; labels you do not list keep their default budget.",
    )
    max_length: int = Field(128, ge=8, le=1024, description="Longer label values are truncated.")
    max_label_sets: int = Field(
        1000, ge=1,
        description="Distinct (service, model, model_version) combinations kept; later ones are aggregated "
        "under __overflow__ (counted as label=\"label_set\" in inferwatch_label_overflow_total).",
    )
    max_series: int = Field(
        50000, ge=100,
        description="Exposition lines (samples) the request, stage, error and stream families may hold over all "
        "label sets together; past it new label sets, stages, error types and stream histograms go to the "
        "__overflow__ label set (counted as label=\"series\" in inferwatch_label_overflow_total).",
    )
    max_exposition_series: int = Field(
        40000, ge=1000,
        description="Samples one /metrics scrape may hold over every family; past it (or past max_family_series "
        "in one family) whole label sets are left out and the cut counted as label=\"exposition\" in "
        "inferwatch_label_overflow_total.",
    )
    max_family_series: int = Field(
        5000, ge=100, description="Samples one metric family may hold in a scrape (see max_exposition_series); "
        "the request, stage, error and stream families send new series to __overflow__ before they reach it.",
    )

    @field_validator("max_values")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        for k, n in v.items():
            if n < 1:
                raise ValueError(f"budget for label {k!r} must be >= 1, got {n}")
        return {**DEFAULT_LABEL_BUDGETS, **v}


#: The OTLP trace presets, in the order spans are offered to them (ingest/otlp_traces/presets.py).
TRACE_PRESETS = ("triton", "vllm", "generic")


class TracesConfig(Section):
    """POST /v1/traces: OTLP spans from Triton, vLLM or any instrumented server (docs/otlp-traces.md)."""

    enabled: bool = Field(True, description="Serve POST /v1/traces on the HTTP port.")
    presets: list[str] = Field(
        default_factory=lambda: list(TRACE_PRESETS),
        description="Presets offered each span, in order (triton, vllm, generic); leave one out to stop "
        "recognising its spans. The generic preset makes any other SERVER span a request.",
    )
    stages: dict[str, str] = Field(
        default_factory=dict,
        description="Span name -> stage name: spans with these names under a request span become its stages.",
    )
    features: list[str] | None = Field(
        None,
        description="Span (or resource) attributes recorded as drift features of each request; null takes each "
        "preset's defaults (vLLM: token counts and sampling parameters), [] records none.",
    )
    model_attribute: str | None = Field(
        None, description="Span or resource attribute naming the model, over the preset's choice.",
    )
    version_attribute: str | None = Field(
        None, description="Span or resource attribute naming the model version, over the preset's choice.",
    )
    service_attribute: str = Field("service.name", description="Span or resource attribute for the service label.")
    join_timeout_s: float = Field(
        5.0, gt=0, le=600,
        description="How long stage spans wait for their request span (spans of one trace may come in "
        "different exports); then they are counted as orphan.",
    )
    max_pending_spans: int = Field(20000, ge=1, description="Stage spans waiting at once; past it the oldest traces are evicted.")
    max_body_bytes: int = Field(4 << 20, ge=1024, description="Largest POST /v1/traces body, as sent (compressed).")
    max_decompressed_bytes: int = Field(
        4 << 20, ge=1024,
        description="Largest body once gzip is undone (parsing costs up to ~28 bytes of memory per byte; bodies "
        "over 256 KiB are decoded one at a time).",
    )
    max_spans_per_export: int = Field(10000, ge=1, description="Spans taken from one export; the rest are rejected.")
    max_pending_bytes: int = Field(
        16 << 20, ge=1 << 16,
        description="Estimated bytes the join buffer holds over all traces; past it the oldest traces are evicted.",
    )
    max_spans_per_trace: int = Field(
        2048, ge=1,
        description="Spans remembered per trace for the join; further stage spans of the trace are dropped as "
        "trace_full.",
    )
    max_attributes_per_span: int = Field(
        128, ge=1, description="Attributes kept per span and per resource at decode; the rest are counted as cut.",
    )
    max_events_per_span: int = Field(128, ge=1, description="Events kept per span at decode.")
    max_attributes_per_event: int = Field(16, ge=0, description="Attributes kept per span event at decode.")
    max_json_containers: int = Field(
        1 << 19, ge=1024,
        description="Most JSON objects and arrays in one OTLP/JSON body, counted before parsing (413 past it).",
    )

    @field_validator("presets")
    @classmethod
    def _known_presets(cls, v: list[str]) -> list[str]:
        for p in v:
            if p not in TRACE_PRESETS:
                raise ValueError(f"unknown preset {p!r}; choose from {', '.join(TRACE_PRESETS)}")
        if len(set(v)) != len(v):
            raise ValueError("a preset is listed twice")
        return v

    @field_validator("stages")
    @classmethod
    def _stage_names(cls, v: dict[str, str]) -> dict[str, str]:
        for span, stage in v.items():
            if not span or not stage or len(stage) > 255:
                raise ValueError(f"span {span!r} -> stage {stage!r}: both must be non-empty, stages at most 255 characters")
        return v

    @field_validator("features")
    @classmethod
    def _feature_names(cls, v: list[str] | None) -> list[str] | None:
        for f in v or []:
            if not f or len(f) > 64:
                raise ValueError(f"feature {f!r}: attribute names used as features are 1 to 64 characters")
        return v


#: Most bounds one configured histogram may have: every bound is one more series per label set.
MAX_BUCKET_BOUNDS = 64


def _check_bounds(where: str, bounds: list[float]) -> list[float]:
    if not 1 <= len(bounds) <= MAX_BUCKET_BOUNDS:
        raise ValueError(f"{where}: 1 to {MAX_BUCKET_BOUNDS} bucket bounds, got {len(bounds)}")
    for b in bounds:
        if not math.isfinite(b) or b <= 0:
            raise ValueError(f"{where}: bucket bound {b!r} is not a finite number > 0 (+Inf is always added)")
    for lo, hi in pairwise(bounds):
        if hi <= lo:
            raise ValueError(f"{where}: bucket bounds must be strictly increasing ({lo!r} then {hi!r})")
    return bounds


class BucketsConfig(Section):
    """Histogram bucket bounds that replace the catalog's defaults (docs/sidecar.md, "Buckets")."""

    families: dict[str, list[float]] = Field(
        default_factory=dict,
        description="Histogram family name -> bucket upper bounds in the family's unit (1 to 64, finite, > 0, "
        "strictly increasing; +Inf is added). Families: " + ", ".join(CONFIGURABLE_HISTOGRAMS) + ".",
    )
    stages: dict[str, list[float]] = Field(
        default_factory=dict,
        description="Stage name -> bounds of that stage's inferwatch_stage_duration_seconds series; other stages "
        "keep the family's.",
    )

    @field_validator("families")
    @classmethod
    def _families(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for name, bounds in v.items():
            if name not in CONFIGURABLE_HISTOGRAMS:
                raise ValueError(f"{name!r} is not a histogram the aggregator keeps; use one of "
                                 f"{', '.join(CONFIGURABLE_HISTOGRAMS)}")
            _check_bounds(name, bounds)
        return v

    @field_validator("stages")
    @classmethod
    def _stages(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for name, bounds in v.items():
            try:
                check_stage_name(name)
            except (TypeError, ValueError) as e:
                raise ValueError(f"stage {name!r}: {e}") from None
            _check_bounds(f"stage {name!r}", bounds)
        return v


class NativeConfig(Section):
    """Native (sparse exponential) histograms, served on the protobuf exposition (docs/scale.md)."""

    protobuf: bool = Field(
        True, description="Answer a scraper that prefers the protobuf exposition (Prometheus with "
        "--enable-feature=native-histograms) in protobuf; false: text formats only.",
    )
    bucket_schema: int | None = Field(
        3, ge=-4, le=6, description="Native histogram schema: 2^bucket_schema buckets per power of two (3: each bucket "
        "9 % wide, quantiles within about 4 %); null keeps classic buckets alone, also on the protobuf exposition.",
    )
    classic_families: list[str] = Field(
        default_factory=list,
        description="Histogram families whose classic buckets the protobuf exposition carries as well as the "
        "native histogram (text and OpenMetrics always carry them). Families: " + ", ".join(CONFIGURABLE_HISTOGRAMS)
        + ".",
    )

    @field_validator("classic_families")
    @classmethod
    def _classic(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in CONFIGURABLE_HISTOGRAMS:
                raise ValueError(f"{name!r} is not a histogram the aggregator keeps; use one of "
                                 f"{', '.join(CONFIGURABLE_HISTOGRAMS)}")
        return v


class AggregateConfig(Section):
    """How the aggregator buckets what it receives."""

    buckets: BucketsConfig = Field(default_factory=BucketsConfig)
    native: NativeConfig = Field(default_factory=NativeConfig)

"""Push the sidecar's metrics over OTLP/HTTP (protobuf).

The same prometheus_client metric families that ``/metrics`` serves are
converted to OTLP and POSTed to an OpenTelemetry Collector (or any OTLP/HTTP
receiver) every ``interval_s`` seconds, on a background thread:

- :mod:`.convert`: Prometheus families -> an OTLP export request;
- :mod:`.env`: the OTEL_* environment variables, validated strictly;
- :mod:`.pusher`: the thread that collects, converts and POSTs.

``docs/otlp.md`` describes the mapping field by field.
"""

from inferwatch_sidecar.export.otlp.convert import ConversionStats, families_to_request, prometheus_unit_to_ucum
from inferwatch_sidecar.export.otlp.env import (
    OtlpConfigError,
    endpoint_from_env,
    parse_key_value_list,
    resource_from_env,
    settings_from_env,
)
from inferwatch_sidecar.export.otlp.pusher import FAILURE_REASONS, OtlpMetricsPusher

__all__ = [
    "FAILURE_REASONS",
    "ConversionStats",
    "OtlpConfigError",
    "OtlpMetricsPusher",
    "endpoint_from_env",
    "families_to_request",
    "parse_key_value_list",
    "prometheus_unit_to_ucum",
    "resource_from_env",
    "settings_from_env",
]

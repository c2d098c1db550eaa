"""OTEL_* environment variables, read the way the OTel spec defines them for OTLP/HTTP."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.metrics_core import CounterMetricFamily

from inferwatch_sidecar.export.otlp import OtlpConfigError, OtlpMetricsPusher, endpoint_from_env
from tests.export.otlp.conftest import OtlpReceiver, attrs, metrics_by_name


def _collect() -> list[CounterMetricFamily]:
    c = CounterMetricFamily("inferwatch_requests", "Requests.", labels=["service"])
    c.add_metric(["api"], 5.0)
    return [c]


def _from_env(env: dict[str, str], resource: dict[str, str] | None = None) -> OtlpMetricsPusher:
    p = OtlpMetricsPusher.from_env(_collect, resource or {}, environ=env)
    assert p is not None
    return p


def test_from_env_returns_none_without_an_endpoint_variable() -> None:
    assert OtlpMetricsPusher.from_env(_collect, {"service.name": "api"}, environ={}) is None
    # Empty means unset (spec), and other OTEL_* variables alone do not enable the push.
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_SERVICE_NAME": "api", "OTEL_EXPORTER_OTLP_HEADERS": "a=b"}
    assert OtlpMetricsPusher.from_env(_collect, {}, environ=env) is None


@pytest.mark.parametrize("env", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_METRICS_EXPORTER": "none"}])
def test_from_env_honours_the_standard_off_switches(env: dict[str, str]) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", **env}
    assert OtlpMetricsPusher.from_env(_collect, {}, environ=env) is None


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/metrics"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/metrics"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw.example/otlp"}, "https://gw.example/otlp/v1/metrics"),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/custom/path"}, "http://c:4318/custom/path"),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318"}, "http://c:4318/"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/x"},
            "http://m/x",
        ),
    ],
)
def test_endpoint_resolution_follows_the_spec(env: dict[str, str], url: str) -> None:
    assert endpoint_from_env(env) == url


def test_generic_endpoint_gets_v1_metrics_appended_on_the_wire(receiver: OtlpReceiver) -> None:
    p = _from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url + "/prefix"})
    assert p.push_once()
    assert receiver.wait_for(1)[0].path == "/prefix/v1/metrics"


def test_metrics_endpoint_is_used_as_is_on_the_wire(receiver: OtlpReceiver) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",  # would fail: the specific one must win
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.base_url + "/ingest/otlp",
    }
    assert _from_env(env).push_once()
    assert receiver.wait_for(1)[0].path == "/ingest/otlp"


def test_headers_compression_and_resource_come_from_env(receiver: OtlpReceiver) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-generic=ignored",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "Authorization=Basic%20dXNlcjpwdw==,X-Tenant=a%2Cb",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=from-attrs,k8s.pod.name=p-1",
        "OTEL_SERVICE_NAME": "from-service-name",
    }
    p = _from_env(env, {"inferwatch.model": "xgb", "service.version": ""})
    assert p.push_once()
    got = receiver.wait_for(1)[0]
    assert got.headers["authorization"] == "Basic dXNlcjpwdw=="
    assert got.headers["x-tenant"] == "a,b"
    assert "x-generic" not in got.headers  # the metrics-specific list replaces the generic one
    assert got.headers["content-encoding"] == "gzip"
    assert attrs(got.request.resource_metrics[0].resource.attributes) == {
        "deployment.environment": "prod",
        "service.name": "from-service-name",  # OTEL_SERVICE_NAME beats OTEL_RESOURCE_ATTRIBUTES
        "k8s.pod.name": "p-1",
        "inferwatch.model": "xgb",  # the empty service.version was not added
    }
    assert metrics_by_name(got.request)["inferwatch_requests"].sum.data_points[0].as_double == 5.0
    assert p.status()["headers"] == ["authorization", "x-tenant"]  # names only, never values


def test_explicit_resource_overrides_env_and_service_name_has_a_default() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SERVICE_NAME": "env-svc"}
    assert _from_env(env, {"service.name": "cfg-svc"}).resource == {"service.name": "cfg-svc"}
    assert _from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).resource == {"service.name": "unknown_service"}


def test_timeouts_and_interval_are_milliseconds_with_metrics_specific_winning() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "30000",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2500",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
    }
    p = _from_env(env)
    assert p.timeout_s == 2.5 and p.interval_s == 5.0
    # Overrides from the sidecar's own config win over the environment.
    q = OtlpMetricsPusher.from_env(_collect, {}, environ=env, interval_s=1.0)
    assert q is not None and q.interval_s == 1.0
    r = _from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert r.timeout_s == 10.0 and r.interval_s == 15.0 and r.compression == "none"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ["OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"]),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"}, ["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"]),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, ["OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"]),
        ({"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "10s"}, ["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "milliseconds"]),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, ["OTEL_EXPORTER_OTLP_TIMEOUT"]),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "0"}, ["OTEL_METRIC_EXPORT_INTERVAL"]),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "api-key"}, ["OTEL_EXPORTER_OTLP_HEADERS", "entry 1", "key=value"]),
        ({"OTEL_RESOURCE_ATTRIBUTES": "a=1,=2"}, ["OTEL_RESOURCE_ATTRIBUTES", "entry 2"]),
        ({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, ["OTEL_EXPORTER_OTLP_CERTIFICATE", "no such file"]),
        ({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "weekly"}, ["TEMPORALITY_PREFERENCE", "cumulative"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, ["OTEL_EXPORTER_OTLP_ENDPOINT", "http://"]),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "ftp://c/x"}, ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:99999"}, ["OTEL_EXPORTER_OTLP_ENDPOINT"]),
    ],
)
def test_bad_env_values_fail_with_a_message_naming_the_variable(env: dict[str, str], names: list[str]) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **env}
    with pytest.raises(OtlpConfigError) as err:
        OtlpMetricsPusher.from_env(_collect, {}, environ=env)
    for name in names:
        assert name in str(err.value)


def test_header_values_never_appear_in_config_errors() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS": "ok=1,SuperSecretToken"}
    with pytest.raises(OtlpConfigError) as err:
        OtlpMetricsPusher.from_env(_collect, {}, environ=env)
    assert "SuperSecretToken" not in str(err.value)


def test_delta_temporality_preference_warns_and_stays_cumulative(caplog: pytest.LogCaptureFixture) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"}
    with caplog.at_level(logging.WARNING, logger="inferwatch.sidecar.otlp"):
        assert _from_env(env) is not None
    assert "cumulative" in caplog.text


@pytest.mark.parametrize(
    "kwargs",
    [{"interval_s": 0}, {"timeout_s": -1}, {"compression": "brotli"}, {"endpoint": "localhost:4318"}],
)
def test_bad_constructor_arguments_raise_config_errors(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"endpoint": "http://c:4318/v1/metrics", **kwargs}
    with pytest.raises(OtlpConfigError):
        OtlpMetricsPusher(_collect, **args)  # type: ignore[arg-type]


def test_every_public_name_resolves() -> None:
    import inferwatch_sidecar.export.otlp as otlp

    assert all(hasattr(otlp, name) for name in otlp.__all__)

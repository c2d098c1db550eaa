"""https endpoints: the CA variable is honoured and a certificate problem is a counted 'tls' failure."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily

from inferwatch_sidecar.export.otlp import OtlpMetricsPusher
from tests.export.otlp.conftest import OtlpReceiver, metrics_by_name


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not on PATH; it is needed only to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


@pytest.fixture
def tls_receiver(self_signed: tuple[Path, Path]) -> Iterator[OtlpReceiver]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*self_signed)
    r = OtlpReceiver(tls=ctx)
    try:
        yield r
    finally:
        r.close()


def _collect() -> list[GaugeMetricFamily]:
    return [GaugeMetricFamily("inferwatch_up", "Up.", value=1.0)]


def test_https_endpoint_verified_with_the_certificate_variable(
    tls_receiver: OtlpReceiver, self_signed: tuple[Path, Path]
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": tls_receiver.base_url, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(self_signed[0])}
    p = OtlpMetricsPusher.from_env(_collect, {}, environ=env)
    assert p is not None and p.push_once() is True
    got = tls_receiver.wait_for(1)[0]
    assert metrics_by_name(got.request)["inferwatch_up"].gauge.data_points[0].as_double == 1.0


def test_untrusted_certificate_is_a_counted_tls_failure(tls_receiver: OtlpReceiver) -> None:
    p = OtlpMetricsPusher(_collect, endpoint=tls_receiver.base_url + "/v1/metrics", timeout_s=2.0)
    assert p.push_once() is False
    assert p.status()["failures"] == {"tls": 1}
    assert "certificate" in p.status()["last_error"].lower()

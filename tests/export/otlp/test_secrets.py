"""Issue 28: exporter secrets never reach /v1/status, and a user:password@ endpoint pushes."""

from __future__ import annotations

import base64
import json

from tests.export.otlp.conftest import Answer, OtlpReceiver
from tests.export.otlp.test_lifecycle import _pusher, _registry


def test_an_error_body_echoing_the_headers_is_redacted(receiver: OtlpReceiver) -> None:
    secret = "sk-live-0123456789abcdef"
    receiver.answer = Answer(status=401, body=(f"denied: Authorization=Bearer {secret}; x-api-key: other-key-42; "
                                               f"tenant=acme-secret-tenant").encode())
    reg, _ = _registry()
    p = _pusher(receiver.base_url + "/v1/metrics", reg.collect,
                headers={"Authorization": f"Bearer {secret}", "X-Tenant": "acme-secret-tenant"})
    assert p.push_once() is False
    shown = json.dumps(p.status())
    assert "401" in shown and "denied" in shown
    for s in (secret, "other-key-42", "acme-secret-tenant"):
        assert s not in shown, s
    # A partial success message is redacted the same way.
    assert p.redact(f"token={secret}&x=1") == "token=<redacted>&x=1"


def test_userinfo_in_the_endpoint_becomes_basic_auth(receiver: OtlpReceiver) -> None:
    reg, _ = _registry()
    url = receiver.base_url.replace("http://", "http://alice:p%40ss@") + "/v1/metrics"
    p = _pusher(url, reg.collect)
    assert p.push_once() is True, p.status()["last_error"]
    got = receiver.wait_for(1)[0]
    assert got.headers["authorization"] == "Basic " + base64.b64encode(b"alice:p@ss").decode()
    st = json.dumps(p.status())
    assert "alice" not in st and "p%40ss" not in st and "p@ss" not in st

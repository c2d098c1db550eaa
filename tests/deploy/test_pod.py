"""The pod in deploy/k8s, run for real without Kubernetes.

One sidecar process is started the way the pod starts it: the image's
ENTRYPOINT (deploy/Dockerfile) with the container's args, the ConfigMap's file
at the mounted path, and the container's env. Each volume is a temporary
directory; paths under a mount are mapped into it. Two things differ from the
cluster, both because the test shares its machine: HTTP binds 127.0.0.1 on a
free port, and the socket and checkpoint live in the temporary volumes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import dockerfile as df
from tests.deploy.k8s import (
    DOCKERFILE,
    DOCS,
    MODEL_CONTAINER,
    SIDECAR_CONTAINER,
    TEST_SECRET,
    configmap_for,
    container,
    mount_for,
    pod_spec,
    resolve_env,
    sidecar_config_text,
)
from tests.helpers.net import free_port

START_TIMEOUT_S = 60.0  # a sidecar imports numpy, scipy and pydantic; the CI machine is shared


@dataclass
class Pod:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    socket: Path | None = None  # where the sidecar binds, on the socket volume

    def host_path(self, c: dict[str, Any], container_path: str) -> Path:
        m, rest = mount_for(c, container_path)
        return self.root / m["name"] / rest

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _entrypoint() -> list[str]:
    stages = df.parse(DOCKERFILE)
    entry = stages[-1].last("ENTRYPOINT")
    assert entry is not None
    argv = entry.exec_form()
    assert argv is not None and argv[0] == "inferwatch"
    return [sys.executable, "-m", "inferwatch", *argv[1:]]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_", "NVIDIA_"))}


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    from inferwatch_sidecar.config import load_config

    root = Path(tempfile.mkdtemp(prefix="iwpod-", dir="/tmp"))  # short: Unix socket paths are limited to 107 bytes
    try:
        spec = pod_spec()
        for v in spec["volumes"]:
            d = root / v["name"]
            d.mkdir()
            if "emptyDir" in v:
                d.chmod(0o2777)  # as kubelet makes one: root-owned, world-writable, setgid for the fsGroup
            if "configMap" in v:
                for key, text in configmap_for(v["name"])["data"].items():
                    (d / key).write_text(text, encoding="utf-8")
        side = container(SIDECAR_CONTAINER)
        port = free_port()
        probe = Pod(root, port, None, root / "sidecar.log")  # type: ignore[arg-type]
        args = [str(probe.host_path(side, a)) if a.startswith("/") else a for a in side.get("args", [])]
        cfg_path, _ = sidecar_config_text()
        cfg = load_config(probe.host_path(side, cfg_path), environ=resolve_env(side))
        side_env = resolve_env(side)
        for k, v in side_env.items():  # paths on a volume (TMPDIR) point into the temporary volumes
            if v.startswith("/") and any(v == m["mountPath"] or v.startswith(m["mountPath"].rstrip("/") + "/")
                                         for m in side.get("volumeMounts", [])):
                side_env[k] = str(probe.host_path(side, v))
        env = {
            **_clean_env(),
            **side_env,
            "INFERWATCH_HTTP__HOST": "127.0.0.1",
            "INFERWATCH_HTTP__PORT": str(port),
            "INFERWATCH_INGEST__SOCKET": str(probe.host_path(side, cfg.ingest.socket or "")),
        }
        if cfg.drift.checkpoint_path:
            env["INFERWATCH_DRIFT__CHECKPOINT_PATH"] = str(probe.host_path(side, cfg.drift.checkpoint_path))
        with probe.log.open("wb") as log:
            proc = subprocess.Popen([*_entrypoint(), *args], env=env, stdout=log, stderr=subprocess.STDOUT)
        p = Pod(root, port, proc, probe.log, Path(env["INFERWATCH_INGEST__SOCKET"]))
        ready = side["readinessProbe"]["httpGet"]["path"]
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the sidecar exited with {proc.returncode}:\n{p.log.read_text(errors='replace')}")
            try:
                if _http(p.url(ready))[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the sidecar was not ready after {START_TIMEOUT_S} s:\n{p.log.read_text(errors='replace')}")
            time.sleep(0.1)
        yield p
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _healthcheck_cmd() -> list[str]:
    stages = df.parse(DOCKERFILE)
    hc = stages[-1].last("HEALTHCHECK")
    assert hc is not None
    _, rest = hc.flags_and_rest()
    cmd = df.Instruction("CMD", rest[4:], hc.line).exec_form()
    assert cmd is not None and cmd[0] == "python"
    return [sys.executable, *cmd[1:]]


def _healthcheck(port: int) -> int:
    env = {**_clean_env(), "INFERWATCH_HTTP__PORT": str(port), "HTTP_PROXY": "http://127.0.0.1:9"}
    return subprocess.run(_healthcheck_cmd(), env=env, capture_output=True, timeout=30).returncode


def _sample(pod: Pod, name: str, labels: dict[str, str]) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    status, body = _http(pod.url("/metrics"))
    assert status == 200
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return None


def _wait_sample(pod: Pod, name: str, labels: dict[str, str], want: float, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = _sample(pod, name, labels)
        if got == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{name}{labels} = {got}, expected {want}")


def test_probes_answer_on_the_paths_and_port_the_manifest_names(pod):
    side = container(SIDECAR_CONTAINER)
    for probe in ("readinessProbe", "livenessProbe"):
        status, _ = _http(pod.url(side[probe]["httpGet"]["path"]))
        assert status == 200, probe


def test_the_configmap_settings_reach_the_running_daemon(pod):
    status, body = _http(pod.url("/v1/status"))
    assert status == 200
    st = json.loads(body)
    assert st["ready"] is True
    assert st["components"]["gpu"]["backend"] == "nvml"
    assert st["listen"]["socket"] == str(pod.socket)


def test_image_healthcheck_command_passes_on_a_live_sidecar_and_fails_without_one(pod):
    # HTTP_PROXY is set to a dead proxy: the check must not go through it.
    assert _healthcheck(pod.port) == 0
    assert _healthcheck(free_port()) != 0


def _docs_curl_example() -> tuple[str, dict[str, Any], dict[str, Any]]:
    text = DOCS.read_text(encoding="utf-8")
    m = re.search(r"curl [^\n]*?(http://127\.0\.0\.1:(\d+)(/v1/events))[^\n]*<<'EOF'\n(.*?)\nEOF\n", text, re.S)
    assert m, "docs/deploy.md has no curl example posting to /v1/events"
    answer = re.search(r"The answer is `(\{.*?\})`", text[m.end():])
    assert answer, "the docs do not say what the example answers"
    assert int(m.group(2)) == 9464, "the example posts to the sidecar's default port"
    return m.group(3), json.loads(m.group(4)), json.loads(answer.group(1))


def test_the_docs_curl_example_is_accepted_as_documented(pod):
    path, body, documented = _docs_curl_example()
    status, raw = _http(pod.url(path), json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer == documented
    assert answer["accepted"] == len(body["events"]) and answer["rejected"] == 0
    ctx = {k: body[k] for k in ("service", "model", "model_version")}
    _wait_sample(pod, "inferwatch_requests_total", {**ctx, "outcome": "ok"}, 1.0)
    _wait_sample(pod, "inferwatch_batch_size_count", ctx, 1.0)


def test_the_sdk_in_the_model_server_reaches_the_sidecar_through_the_shared_volume(pod):
    from inferwatch._env import parse_address

    model = container(MODEL_CONTAINER)
    env = resolve_env(model)
    addr = parse_address(env["INFERWATCH_SIDECAR"])
    assert isinstance(addr.target, str)
    env["INFERWATCH_SIDECAR"] = "unix://" + str(pod.host_path(model, addr.target))
    code = (
        "import inferwatch\n"
        "assert inferwatch.configure() is True\n"
        "for i in range(3):\n"
        "    with inferwatch.request():\n"
        "        with inferwatch.stage('inference'):\n"
        "            pass\n"
        "        inferwatch.record(prediction='cat', confidence=0.9, features={'age': 31.0 + i})\n"
        "assert inferwatch.shutdown() is True\n"
    )
    run = subprocess.run([sys.executable, "-c", code], env={**_clean_env(), **env},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    ctx = {"service": env["INFERWATCH_SERVICE"], "model": env["INFERWATCH_MODEL"],
           "model_version": env["INFERWATCH_MODEL_VERSION"]}
    _wait_sample(pod, "inferwatch_requests_total", {**ctx, "outcome": "ok"}, 3.0)
    _wait_sample(pod, "inferwatch_stage_duration_seconds_count", {**ctx, "stage": "inference"}, 3.0)


def test_admin_routes_take_the_token_from_the_secret(pod):
    status, body = _http(pod.url("/admin/"), headers={"Authorization": f"Bearer {TEST_SECRET}"})
    assert status == 200, body
    assert "routes" in json.loads(body)
    status, _ = _http(pod.url("/admin/"), headers={"Authorization": "Bearer wrong-token-0123456789"})
    assert status in (401, 403)


def test_sigterm_stops_the_sidecar_within_the_grace_period(pod):
    """Last in this module: it stops the shared sidecar."""
    grace = pod_spec()["terminationGracePeriodSeconds"]
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.proc.wait(timeout=grace) == 0, pod.log.read_text(errors="replace")
    assert _healthcheck(pod.port) != 0
    assert pod.socket is not None and not pod.socket.exists(), "the sidecar removes its socket on shutdown"

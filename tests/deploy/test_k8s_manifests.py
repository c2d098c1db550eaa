"""deploy/k8s, checked without a cluster: YAML, schema basics, and the pod's internal consistency."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.deploy import dockerfile as df
from tests.deploy.k8s import (
    DOCKERFILE,
    K8S,
    MODEL_CONTAINER,
    SIDECAR_CONTAINER,
    base_resources,
    container,
    find,
    kustomize,
    kustomize_files,
    load_documents,
    manifest_files,
    mount_for,
    overlay_with,
    pod_spec,
    recognized_by_sidecar,
    resolve_env,
    resources,
    sidecar_config_text,
    sidecar_env_names,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # IANA_SVC_NAME, at most 15
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
#: The volume sources the pod may use (exactly one per volume).
VOLUME_SOURCES = {"emptyDir", "configMap", "secret", "persistentVolumeClaim", "projected", "hostPath", "csi"}
#: Labels the Prometheus Operator sets on every target.
OPERATOR_TARGET_LABELS = {"namespace", "service", "pod", "container", "endpoint", "job", "instance"}


def _config():
    """The sidecar's effective config in the pod: ConfigMap file + the container's env, via the real loader."""
    from inferwatch_sidecar.config import load_config

    _path, text = sidecar_config_text()
    return load_config_text(text, resolve_env(container(SIDECAR_CONTAINER)), load_config)


def load_config_text(text: str, environ: dict[str, str], loader: Any) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "sidecar.yaml"
        p.write_text(text, encoding="utf-8")
        return loader(p, environ=environ)


# ---------------------------------------------------------------------------
# YAML and schema basics


def test_every_manifest_parses_and_names_its_kind():
    files = manifest_files()
    assert len(files) >= 6
    for p in files:
        docs = load_documents(p)
        assert docs, f"{p} is empty"
        for d in docs:
            assert isinstance(d, dict), f"{p}: a document is not a mapping"
            assert isinstance(d.get("apiVersion"), str) and "/" in d["apiVersion"] or d.get("apiVersion") == "v1", p
            assert isinstance(d.get("kind"), str) and d["kind"][0].isupper(), f"{p}: kind missing"
            if d["kind"] in ("Kustomization", "Component"):
                assert d["apiVersion"].startswith("kustomize.config.k8s.io/"), p
                continue
            name = d.get("metadata", {}).get("name")
            assert isinstance(name, str) and DNS_SUBDOMAIN.match(name) and len(name) <= 253, f"{p}: metadata.name {name!r}"
            for k, v in d["metadata"].get("labels", {}).items():
                assert isinstance(v, str) and LABEL_VALUE.match(v) and len(v) <= 63, f"{p}: label {k}={v!r}"


def test_api_versions_are_the_ones_the_kinds_live_in():
    expected = {
        "Deployment": "apps/v1", "Service": "v1", "ConfigMap": "v1",
        "ServiceMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
    }
    kinds = {}
    for p, d in resources():
        if d["kind"] in expected:
            assert d["apiVersion"] == expected[d["kind"]], f"{p}: {d['kind']} is {expected[d['kind']]}"
            kinds[d["kind"]] = p
    assert set(kinds) == set(expected), f"missing kinds: {set(expected) - set(kinds)}"


def test_kustomization_lists_existing_files_and_includes_the_prometheus_rule():
    kust = load_documents(K8S / "kustomization.yaml")[0]
    listed = kust["resources"]
    assert "prometheusrule.yaml" in listed
    for rel in listed:
        assert (K8S / rel).is_file(), f"kustomization.yaml lists {rel}, which does not exist (alerts/ generates prometheusrule.yaml)"
    loose = {p.name for p in K8S.glob("*.yaml")} - set(listed) - {"kustomization.yaml"}
    assert not loose, f"manifests not in kustomization.yaml: {sorted(loose)}"
    rule = find("PrometheusRule")
    groups = rule["spec"]["groups"]
    assert groups and all(g.get("rules") for g in groups), "the PrometheusRule has no rules"
    for comp in kustomize_files():
        doc = load_documents(comp)[0]
        for patch in doc.get("patches", []):
            assert (comp.parent / patch["path"]).is_file(), f"{comp}: patch {patch['path']} is missing"


def test_the_deployment_selects_its_own_pods_and_the_service_selects_them_too():
    dep = find("Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel.items() <= pod_labels.items(), "spec.selector must match the pod template's labels"
    svc = find("Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items(), "the Service selects no pod of the Deployment"


def test_containers_are_well_formed():
    spec = pod_spec()
    names = [c["name"] for c in spec["containers"]]
    assert len(set(names)) == len(names) and {MODEL_CONTAINER, SIDECAR_CONTAINER} <= set(names)
    for c in spec["containers"]:
        assert DNS_LABEL.match(c["name"]) and len(c["name"]) <= 63
        assert isinstance(c.get("image"), str) and c["image"], f"{c['name']}: image"
        ports = c.get("ports", [])
        assert len({p["name"] for p in ports}) == len(ports)
        for p in ports:
            assert PORT_NAME.match(p["name"]) and len(p["name"]) <= 15, f"{c['name']}: port name {p['name']!r}"
            assert 1 <= int(p["containerPort"]) <= 65535
        env_names = [e["name"] for e in c.get("env", [])]
        assert len(set(env_names)) == len(env_names), f"{c['name']}: duplicate env names"
        for e in c.get("env", []):
            assert ENV_NAME.match(e["name"]), e["name"]
            assert ("value" in e) != ("valueFrom" in e), f"{c['name']}: {e['name']} needs value xor valueFrom"
            if "value" in e:
                assert isinstance(e["value"], str), f"{c['name']}: {e['name']} must be a string (quote it)"
            else:
                assert len(e["valueFrom"]) == 1
        for section in ("requests", "limits"):
            for k, v in c.get("resources", {}).get(section, {}).items():
                assert QUANTITY.match(str(v)), f"{c['name']}: resources.{section}.{k}={v!r}"
        port_names = {p["name"] for p in ports}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in c:
                port = c[probe]["httpGet"]["port"]
                assert port in port_names or isinstance(port, int), f"{c['name']}: {probe} port {port!r}"


def test_volumes_have_one_source_and_every_mount_names_a_declared_volume():
    spec = pod_spec()
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert len(volumes) == len(spec["volumes"]), "duplicate volume names"
    for v in spec["volumes"]:
        sources = set(v) - {"name"}
        assert len(sources) == 1 and sources <= VOLUME_SOURCES, f"volume {v['name']}: {sorted(sources)}"
        if "configMap" in v:
            find("ConfigMap", v["configMap"]["name"])
    used = set()
    for c in spec["containers"]:
        paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
        assert len(set(paths)) == len(paths), f"{c['name']}: two mounts at one path"
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{c['name']} mounts undeclared volume {m['name']!r}"
            assert PurePosixPath(m["mountPath"]).is_absolute()
            used.add(m["name"])
    assert used == set(volumes), f"declared but unused volumes: {set(volumes) - used}"


# ---------------------------------------------------------------------------
# the pod: socket, config, ports, GPU, security


def test_both_containers_mount_the_socket_volume_at_the_configured_socket_directory():
    from inferwatch._env import parse_address

    cfg = _config()
    assert cfg.ingest.socket, "the pod's sidecar must listen on a Unix socket"
    side_mount, side_rest = mount_for(container(SIDECAR_CONTAINER), cfg.ingest.socket)
    model_env = resolve_env(container(MODEL_CONTAINER))
    addr = parse_address(model_env["INFERWATCH_SIDECAR"], "INFERWATCH_SIDECAR")
    assert addr.kind == "unix" and isinstance(addr.target, str)
    model_mount, model_rest = mount_for(container(MODEL_CONTAINER), addr.target)
    assert side_mount["name"] == model_mount["name"], "the two containers must share the socket's volume"
    assert side_rest == model_rest == PurePosixPath(cfg.ingest.socket).name, "the SDK must send where the sidecar binds"
    vol = next(v for v in pod_spec()["volumes"] if v["name"] == side_mount["name"])
    assert "emptyDir" in vol
    assert not side_mount.get("readOnly") and not model_mount.get("readOnly"), "binding and sending need write access"


def test_senders_can_write_to_the_socket():
    """With a socket mode closed to others, every container must share the socket's group (the pod's fsGroup)."""
    cfg = _config()
    spec = pod_spec()
    if cfg.ingest.socket_mode & 0o002:
        return
    assert cfg.ingest.socket_mode & 0o020, "the socket must be group-writable at least"
    side_gid = container(SIDECAR_CONTAINER)["securityContext"].get("runAsGroup")
    assert side_gid is not None and spec["securityContext"].get("fsGroup") == side_gid, (
        "socket_mode closes the socket to others: the sidecar's runAsGroup must be the pod's fsGroup"
    )


def test_the_sidecar_reads_its_config_from_the_configmap_and_writes_only_to_volumes():
    c = container(SIDECAR_CONTAINER)
    cfg = _config()
    path, _text = sidecar_config_text()
    cm_mount, _ = mount_for(c, path)
    assert cm_mount.get("readOnly") is True
    assert c["securityContext"].get("readOnlyRootFilesystem") is True
    assert cfg.drift.checkpoint_path, "a checkpoint lets a restarted container resume its drift windows"
    tmpdir = resolve_env(c).get("TMPDIR")
    assert tmpdir, "with a read-only root filesystem, TMPDIR must point at a writable volume"
    for p in (cfg.ingest.socket, cfg.drift.checkpoint_path, tmpdir + "/x"):
        m, _ = mount_for(c, p)
        assert not m.get("readOnly"), f"{p} must be on a writable volume"
        vol = next(v for v in pod_spec()["volumes"] if v["name"] == m["name"])
        assert "emptyDir" in vol, f"{p} is written at run time: it belongs on an emptyDir"


def test_configmap_config_is_valid_for_the_real_loader_and_fit_for_a_pod():
    cfg = _config()
    assert cfg.http.host == "0.0.0.0", "a pod must bind every interface to be scraped"
    assert cfg.gpu.enabled and cfg.gpu.backend == "nvml"
    assert cfg.http.admin_token is not None and cfg.http.admin_token.get_secret_value().startswith("test-admin")


def test_configmap_config_passes_inferwatch_sidecar_check_config(tmp_path):
    _path, text = sidecar_config_text()
    f = tmp_path / "sidecar.yaml"
    f.write_text(text, encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", **resolve_env(container(SIDECAR_CONTAINER))}
    run = subprocess.run([sys.executable, "-m", "inferwatch", "sidecar", "--check-config", str(f)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "configuration is valid" in run.stdout


def test_a_broken_configmap_is_rejected_by_the_same_check():
    """The loader check can fail: a misspelt field in the ConfigMap stops start-up."""
    from inferwatch_sidecar.config import ConfigError, load_config

    _path, text = sidecar_config_text()
    broken = text.replace("checkpoint_interval_s:", "checkpoint_intervall_s:")
    assert broken != text
    with pytest.raises(ConfigError, match="checkpoint_intervall_s"):
        load_config_text(broken, {}, load_config)


def test_every_inferwatch_variable_in_the_manifests_is_one_its_reader_knows():
    from inferwatch._env import ENV_VARS

    sidecar_names = sidecar_env_names()
    assert "INFERWATCH_HTTP__PORT" in sidecar_names and "INFERWATCH_GPU__DETECTOR__Z" in sidecar_names
    seen = {MODEL_CONTAINER: 0, SIDECAR_CONTAINER: 0}
    for c in pod_spec()["containers"]:
        for e in c.get("env", []):
            name = e["name"]
            if not name.startswith("INFERWATCH_"):
                continue
            seen[c["name"]] = seen.get(c["name"], 0) + 1
            if c["name"] == SIDECAR_CONTAINER:
                # The sidecar ignores the SDK's variables: one there is a mistake.
                assert recognized_by_sidecar(name, sidecar_names), f"sidecar env {name} is not a config field"
            else:
                assert name in ENV_VARS, f"{c['name']} env {name} is not an SDK variable (inferwatch._env)"
    assert seen[MODEL_CONTAINER] and seen[SIDECAR_CONTAINER], "both containers carry INFERWATCH_* settings"
    assert not recognized_by_sidecar("INFERWATCH_HTTP__PROT", sidecar_names)


def test_the_model_server_env_is_a_valid_sdk_configuration():
    from inferwatch._runtime import configure

    env = resolve_env(container(MODEL_CONTAINER))
    # enabled=False parses and validates every variable, then stays off.
    assert configure(env=env, enabled=False) is False
    with pytest.raises(ValueError, match="INFERWATCH_SIDECAR"):
        configure(env={**env, "INFERWATCH_SIDECAR": "tcp://nowhere"}, enabled=False)


def test_ports_agree_between_config_container_service_and_servicemonitor():
    cfg = _config()
    side = container(SIDECAR_CONTAINER)
    side_ports = {p["name"]: p["containerPort"] for p in side["ports"]}
    metrics_name = next(n for n, port in side_ports.items() if port == cfg.http.port)
    all_ports = {p["name"]: p["containerPort"] for c in pod_spec()["containers"] for p in c.get("ports", [])}
    svc = find("Service")
    svc_ports = {}
    for p in svc["spec"]["ports"]:
        target = p.get("targetPort", p["port"])
        assert target in all_ports or target in all_ports.values(), f"Service port {p['name']} targets {target!r}"
        svc_ports[p["name"]] = all_ports.get(target, target)
    assert cfg.http.port in svc_ports.values(), "the Service does not expose the sidecar's HTTP port"
    sm = find("ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(), (
        "the ServiceMonitor does not select the Service"
    )
    endpoints = sm["spec"]["endpoints"]
    ours = [e for e in endpoints if svc_ports.get(e["port"]) == cfg.http.port]
    assert len(ours) == 1, "one ServiceMonitor endpoint must scrape the sidecar's port"
    assert ours[0].get("path", "/metrics") == "/metrics"
    assert side["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": metrics_name}
    assert side["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": metrics_name}


def test_servicemonitor_honors_our_labels_where_they_collide_with_target_labels():
    from inferwatch_sidecar.components.registry import CATALOG

    ours = {label for m in CATALOG.all_metrics() for label in m.labels}
    clash = ours & OPERATOR_TARGET_LABELS
    assert "service" in clash  # the catalog's context label; if it is renamed, revisit honorLabels
    ep = next(e for e in find("ServiceMonitor")["spec"]["endpoints"] if e["port"] == "metrics")
    assert ep.get("honorLabels") is True, f"labels {sorted(clash)} would become exported_* without honorLabels"


def _operator_job(sm: dict[str, Any], ep: dict[str, Any], svc: dict[str, Any]) -> str:
    """The job label the Prometheus Operator gives the endpoint's targets."""
    job = svc["metadata"]["labels"].get(sm["spec"].get("jobLabel", ""), svc["metadata"]["name"])
    for r in ep.get("relabelings", []):
        if r.get("targetLabel") == "job" and not r.get("sourceLabels") and r.get("action", "replace") == "replace":
            job = r["replacement"]
    return str(job)


def test_the_scrape_job_is_the_one_the_alert_rules_select():
    sm = find("ServiceMonitor")
    ep = next(e for e in sm["spec"]["endpoints"] if e["port"] == "metrics")
    job = _operator_job(sm, ep, find("Service"))
    rule_text = yaml.safe_dump(find("PrometheusRule")["spec"])
    selected = set(re.findall(r'job\s*=\s*\\?"([^"\\]+)\\?"', rule_text))
    assert selected, "no alert selects the sidecar's scrape job (sidecar down / absent)"
    assert selected == {job}, f"the rules select job {sorted(selected)}, the ServiceMonitor produces job={job!r}"


def test_prometheus_selects_the_servicemonitor_and_the_rule_alike():
    """kube-prometheus-stack selects both kinds by its release label: they must carry the same one."""
    sm = find("ServiceMonitor")["metadata"]["labels"]
    rule = find("PrometheusRule")["metadata"]["labels"]
    assert sm.get("release") == rule.get("release")


def test_gpu_goes_to_the_model_server_and_nvml_visibility_to_the_sidecar():
    model = container(MODEL_CONTAINER)
    side = container(SIDECAR_CONTAINER)
    assert int(model["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert "nvidia.com/gpu" not in side["resources"].get("limits", {}), "the device plugin gives a GPU to one container"
    env = resolve_env(side)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES", "")
    assert "utility" in caps.split(",") or caps == "all", "NVML comes with the 'utility' capability"


def test_host_pid_is_documented_in_the_deployment_and_available_as_a_component():
    text = (K8S / "deployment.yaml").read_text(encoding="utf-8")
    assert re.search(r"^\s*#\s*hostPID: true", text, re.M), "the commented hostPID option is missing"
    assert "hostPID" not in pod_spec(), "the base must not need privileged pod security"
    comp_dir = K8S / "components" / "host-pid"
    comp = load_documents(comp_dir / "kustomization.yaml")[0]
    assert comp["kind"] == "Component"
    patch = load_documents(comp_dir / comp["patches"][0]["path"])[0]
    assert patch["kind"] == "Deployment" and patch["metadata"]["name"] == find("Deployment")["metadata"]["name"]
    assert patch["spec"]["template"]["spec"]["hostPID"] is True


def test_security_context_is_non_root_and_matches_the_image_user():
    spec = pod_spec()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec.get("automountServiceAccountToken") is False
    sc = container(SIDECAR_CONTAINER)["securityContext"]
    stages = df.parse(DOCKERFILE)
    user = stages[-1].last("USER")
    assert user is not None
    uid, _, gid = user.args.partition(":")
    assert sc["runAsUser"] == int(uid) and sc["runAsGroup"] == int(gid or uid)
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    for c in spec["containers"]:
        assert c["securityContext"].get("allowPrivilegeEscalation") is False, c["name"]
        assert c.get("resources", {}).get("requests"), f"{c['name']} has no resource requests"
        assert c["resources"].get("limits", {}).get("memory"), f"{c['name']} has no memory limit"


def test_admin_token_comes_from_a_secret():
    env = {e["name"]: e for e in container(SIDECAR_CONTAINER)["env"]}
    ref = env["INFERWATCH_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] and ref["key"]
    _path, text = sidecar_config_text()
    assert "admin_token" not in (yaml.safe_load(text).get("http") or {}), "never put the token in the ConfigMap"


def test_grace_period_outlasts_the_sidecar_shutdown():
    cfg = _config()
    assert pod_spec()["terminationGracePeriodSeconds"] > cfg.shutdown_timeout_s


def test_kustomize_renders_the_base_and_the_host_pid_component(tmp_path, kubectl):
    """The real kustomize build (kubectl's), of the base and of an overlay that adds the component."""
    kinds = sorted(d["kind"] for d in kustomize(kubectl, K8S))
    assert kinds == sorted(d["kind"] for d in base_resources())
    overlay = overlay_with(tmp_path / "overlay", [K8S / "components" / "host-pid"])
    dep = next(d for d in kustomize(kubectl, overlay) if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["hostPID"] is True

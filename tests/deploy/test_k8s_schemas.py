"""Every Kubernetes manifest, validated against the Kubernetes API schemas (kubernetes-validate --strict).

Validated: each resource file of deploy/k8s as committed, the base as ``kubectl kustomize`` renders it,
the base with each component, the ConfigMaps deploy/grafana/dashboard_configmaps.py prints, and the
Kubernetes objects in docs/deploy.md; each against the oldest and the newest Kubernetes version that
kubernetes-validate knows. Strict mode rejects any field the schema does not define, so a misspelt
key (``hostPid``) fails here instead of being dropped, or refused, by the API server.

kubernetes-validate has no schema for the Prometheus Operator's kinds (:data:`NO_SCHEMA`); their
structure is checked in test_k8s_manifests.py, and the rules they carry by promtool (tests/alerts).
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, all_versions

from tests.deploy.k8s import (
    DOCS,
    K8S,
    ROOT,
    base_resources,
    component_dirs,
    kustomize,
    kustomize_files,
    load_documents,
    manifest_files,
    overlay_with,
    patch_files,
)
from tests.deploy.k8s import resources as k8s_resources

#: (apiVersion, kind) that kubernetes-validate has no schema for.
NO_SCHEMA = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"),
             ("keda.sh/v1alpha1", "ScaledObject")}
#: The oldest and the newest Kubernetes release that kubernetes-validate carries schemas for.
VERSIONS = sorted({all_versions()[0], all_versions()[-1]})


def _errors(objects: list[dict[str, Any]], version: str) -> list[str]:
    """What ``kubernetes-validate --strict -k version`` reports for ``objects``; an unexpected missing schema counts."""
    out = []
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        name = f"{obj['kind']}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            out.append(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
        except SchemaNotFoundError as e:
            if key not in NO_SCHEMA:
                out.append(f"{name}: {e.message}")
    return out


def test_every_file_under_deploy_k8s_is_a_kustomization_a_patch_or_a_resource():
    resources = {(k.parent / rel).resolve() for k in kustomize_files() for rel in load_documents(k)[0].get("resources", [])}
    known = {p.resolve() for p in kustomize_files()} | patch_files() | resources
    assert {p.resolve() for p in manifest_files()} == known


@pytest.mark.parametrize("version", VERSIONS)
def test_each_resource_file_validates_strictly(version):
    files = [p for p in manifest_files() if p not in kustomize_files() and p.resolve() not in patch_files()]
    assert len(files) >= 5
    errors = [f"{p.relative_to(ROOT)}: {e}" for p in files for e in _errors(load_documents(p), version)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_kustomize_output_validates_strictly(kubectl, version):
    objects = kustomize(kubectl, K8S)
    assert sorted(o["kind"] for o in objects) == sorted(o["kind"] for o in base_resources())
    assert not _errors(objects, version), "\n".join(_errors(objects, version))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("component", component_dirs(), ids=lambda p: p.name)
def test_the_base_with_each_component_validates_strictly(kubectl, tmp_path, component, version):
    """A component's patches are partial objects: what counts is the object they produce."""
    rendered = kustomize(kubectl, overlay_with(tmp_path / "overlay", [component]))
    assert rendered != kustomize(kubectl, K8S), f"{component.name} changes nothing"
    errors = _errors(rendered, version)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_dashboard_configmaps_validate_strictly(version):
    script = ROOT / "deploy" / "grafana" / "dashboard_configmaps.py"
    run = subprocess.run([sys.executable, str(script), "--namespace", "monitoring"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    objects = [d for d in yaml.safe_load_all(run.stdout) if d is not None]
    assert len(objects) >= 3 and {o["kind"] for o in objects} == {"ConfigMap"}
    errors = _errors(objects, version)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_objects_in_the_deploy_docs_validate_strictly(version):
    text = DOCS.read_text(encoding="utf-8")
    blocks = re.findall(r"^[ ]*```yaml\n(.*?)^[ ]*```", text, re.S | re.M)
    docs = [d for b in blocks for d in yaml.safe_load_all(_dedent(b))]
    objects = [d for d in docs if isinstance(d, dict) and {"apiVersion", "kind", "metadata"} <= set(d)]
    assert [o["kind"] for o in objects] == ["NetworkPolicy"]
    errors = _errors(objects, version)
    assert not errors, "\n".join(errors)


def _dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return "\n".join(x[indent:] for x in lines) + "\n"


def test_a_misspelt_field_fails_strict_validation():
    """The checks above can fail: strict mode rejects a key the schema lacks, and a wrong type."""
    dep = next(d for d in base_resources() if d["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["hostPid"] = True
    assert any("hostPid" in e for e in _errors([dep], VERSIONS[-1])), _errors([dep], VERSIONS[-1])
    dep = next(d for d in base_resources() if d["kind"] == "Deployment")
    dep["spec"]["replicas"] = "two"
    assert any("replicas" in e for e in _errors([dep], VERSIONS[-1]))


def test_the_kinds_without_a_schema_still_have_none():
    """When kubernetes-validate gains a schema for one of them, drop it from NO_SCHEMA so it is validated."""
    for api_version, kind in sorted(NO_SCHEMA):
        with pytest.raises(SchemaNotFoundError):
            kubernetes_validate.validate({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}},
                                         VERSIONS[-1], strict=True)


def test_no_schema_lists_only_kinds_the_manifests_have():
    kinds = {(o["apiVersion"], o["kind"]) for o in base_resources()}
    kinds |= {(o["apiVersion"], o["kind"]) for _, o in k8s_resources()}  # the components' too
    assert kinds >= NO_SCHEMA, f"NO_SCHEMA lists kinds deploy/k8s no longer has: {NO_SCHEMA - kinds}"

"""Helpers for the deploy tests: load the manifests, resolve a container's environment.

Kept free of pytest so the helpers can be imported by every test module.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCS = ROOT / "docs" / "deploy.md"

SIDECAR_CONTAINER = "inferwatch"
MODEL_CONTAINER = "model-server"
#: The value a test substitutes for a secretKeyRef (long enough for http.admin_token).
TEST_SECRET = "test-admin-token-0123456789abcdef"


def manifest_files() -> list[Path]:
    """Every YAML file under deploy/k8s, sorted."""
    return sorted(p for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``path`` (yaml.safe_load_all). A deep copy: callers may change it."""
    return copy.deepcopy(_load(path, path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _load(path: Path, _mtime: int) -> list[dict[str, Any]]:
    # CSafeLoader is the same safe loader in C; the PrometheusRule is large enough to notice.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.load_all(f, Loader=loader) if d is not None]


def kustomize_files() -> list[Path]:
    return [p for p in manifest_files() if p.name in ("kustomization.yaml", "kustomization.yml")]


def resources() -> list[tuple[Path, dict[str, Any]]]:
    """(file, object) for every Kubernetes object in deploy/k8s (kustomize files excluded)."""
    out = []
    for p in manifest_files():
        if p in kustomize_files():
            continue
        out += [(p, d) for d in load_documents(p)]
    return out


def base_resources() -> list[dict[str, Any]]:
    """The objects the base kustomization lists, in order."""
    kust = load_documents(K8S / "kustomization.yaml")[0]
    out = []
    for rel in kust.get("resources", []):
        out += load_documents(K8S / rel)
    return out


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``) that the base kustomization includes."""
    hits = [d for d in base_resources() if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected exactly one {kind} {name or ''} in deploy/k8s, found {len(hits)}"
    return hits[0]


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = find("Deployment")["spec"]["template"]["spec"]
    return spec


def container(name: str) -> dict[str, Any]:
    hits = [c for c in pod_spec()["containers"] if c["name"] == name]
    assert len(hits) == 1, f"the Deployment needs exactly one container named {name!r}"
    return hits[0]


def configmap_for(volume_name: str) -> dict[str, Any]:
    """The ConfigMap a configMap volume of the pod refers to."""
    vol = next(v for v in pod_spec()["volumes"] if v["name"] == volume_name)
    return find("ConfigMap", vol["configMap"]["name"])


def mount_for(c: dict[str, Any], container_path: str) -> tuple[dict[str, Any], str]:
    """The volumeMount of ``c`` whose mountPath holds ``container_path``, and the path inside the volume."""
    best = None
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        under = container_path == mp or container_path.startswith(mp + "/")
        if under and (best is None or len(mp) > len(best["mountPath"].rstrip("/"))):
            best = m
    assert best is not None, f"{container_path} is on no volume mounted in container {c['name']!r}"
    rest = container_path[len(best["mountPath"].rstrip("/")):].lstrip("/")
    return best, rest


def sidecar_config_text() -> tuple[str, str]:
    """(container path, YAML text) of the config file the sidecar container's args name."""
    c = container(SIDECAR_CONTAINER)
    args = c.get("args", [])
    assert "--config" in args, "the sidecar container must pass --config FILE"
    path = args[args.index("--config") + 1]
    m, rest = mount_for(c, path)
    cm = configmap_for(m["name"])
    assert rest in cm["data"], f"ConfigMap {cm['metadata']['name']} has no key {rest!r} for {path}"
    return path, cm["data"][rest]


_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def resolve_env(c: dict[str, Any], fields: dict[str, str] | None = None) -> dict[str, str]:
    """A container's environment the way the kubelet builds it, with test values for references.

    ``value`` is used as is with ``$(VAR)`` expanded from variables defined earlier in the list
    (Kubernetes' rule); ``fieldRef`` takes ``fields[fieldPath]``; ``secretKeyRef`` takes
    :data:`TEST_SECRET`.
    """
    fields = fields or {"metadata.name": "model-server-7d9f8-abcde", "metadata.namespace": "default"}
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = _REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(e["value"]))
        else:
            src = e["valueFrom"]
            if "fieldRef" in src:
                env[e["name"]] = fields[src["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in src:
                env[e["name"]] = TEST_SECRET
            else:
                raise AssertionError(f"unsupported valueFrom in {e['name']}: {src}")
    return env


def sidecar_env_names() -> set[str]:
    """Every INFERWATCH_<SECTION>__<FIELD> name the sidecar's config model has (plus the token)."""
    from inferwatch_sidecar.config import SidecarConfig

    names = {"INFERWATCH_ADMIN_TOKEN"}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for fname, f in model.model_fields.items():
            ann = f.annotation
            options = [a for a in (get_args(ann) or (ann,)) if a is not type(None)]
            sub = next((a for a in options if isinstance(a, type) and issubclass(a, BaseModel)), None)
            name = f"{prefix}{fname.upper()}"
            if sub is not None:
                walk(sub, name + "__")
            elif any(get_origin(a) is dict for a in options):
                names.add(name + "__*")  # a mapping: any key
            else:
                names.add(name)

    walk(SidecarConfig, "INFERWATCH_")
    return names


def recognized_by_sidecar(name: str, names: set[str]) -> bool:
    """Whether the sidecar's config loader maps ``name`` to a field (``names`` from :func:`sidecar_env_names`)."""
    return name in names or any(n.endswith("__*") and name.startswith(n[:-1]) for n in names)


def kustomize(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` renders."""
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {directory}:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def component_dirs() -> list[Path]:
    """Every kustomize Component under deploy/k8s."""
    return sorted(p.parent for p in kustomize_files() if load_documents(p)[0]["kind"] == "Component")


def overlay_with(directory: Path, components: list[Path]) -> Path:
    """Write a kustomization in ``directory`` that takes the base plus ``components``, as a user's overlay would."""
    directory.mkdir(parents=True, exist_ok=True)
    kust = {"resources": [os.path.relpath(K8S, directory)],
            "components": [os.path.relpath(c, directory) for c in components]}
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kust), encoding="utf-8")
    return directory


def patch_files() -> set[Path]:
    """The strategic-merge patch files the kustomizations under deploy/k8s apply (partial objects)."""
    out = set()
    for k in kustomize_files():
        for patch in load_documents(k)[0].get("patches", []):
            if "path" in patch:
                out.add((k.parent / patch["path"]).resolve())
    return out

#!/usr/bin/env python3
"""Turn the Grafana dashboards in ``dashboards/`` into Kubernetes ConfigMaps.

kustomize cannot do this itself: a ``configMapGenerator`` may only read files
under its own root (``deploy/k8s``), and the dashboards live in
``dashboards/`` where their generator writes them. Copying them would let the
copies go stale, so this script reads them where they are and prints one
ConfigMap per dashboard, labelled for the Grafana dashboard sidecar that
kube-prometheus-stack and the Grafana Helm chart run (it loads every
ConfigMap with the label ``grafana_dashboard: "1"``)::

    python deploy/grafana/dashboard_configmaps.py --namespace monitoring \\
        | kubectl apply --server-side -f -

``--server-side`` because a client-side apply stores the whole object in an
annotation limited to 256 KiB, which a large dashboard exceeds. Grafana
without that sidecar uses the file provisioning in ``dashboards/`` instead
(docs/deploy.md).

Only the standard library and PyYAML (part of the sidecar extra) are needed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

#: Where the dashboards generator writes its JSON, relative to the repo root.
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "dashboards"
#: A ConfigMap holds at most 1 MiB of data (etcd's object size limit).
CONFIGMAP_LIMIT = 1024 * 1024
#: kubectl's client-side apply annotation limit.
CLIENT_APPLY_LIMIT = 256 * 1024


class DashboardError(Exception):
    """A dashboard file that cannot be turned into a ConfigMap; the message says why."""


def find_dashboards(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every Grafana dashboard JSON under ``root``, sorted by path.

    A JSON file counts as a dashboard when it is an object with a ``uid`` and
    ``panels``; other JSON files (provisioning, fixtures) are skipped.

    Args:
        root: the directory to search recursively.

    Raises:
        DashboardError: ``root`` is not a directory, a ``.json`` file is not
            valid JSON, or two dashboards share a ``uid``.
    """
    if not root.is_dir():
        raise DashboardError(f"{root}: not a directory (generate the dashboards first, or pass --dashboards DIR)")
    found: list[tuple[Path, dict[str, Any]]] = []
    seen: dict[str, Path] = {}
    for path in sorted(root.rglob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DashboardError(f"{path}: not readable JSON ({e})") from None
        if not (isinstance(doc, dict) and isinstance(doc.get("uid"), str) and isinstance(doc.get("panels"), list)):
            continue
        uid = doc["uid"]
        if uid in seen:
            raise DashboardError(f"{path}: uid {uid!r} is also used by {seen[uid]}; dashboard uids must be unique")
        seen[uid] = path
        found.append((path, doc))
    return found


def configmap_name(uid: str, prefix: str = "inferwatch-dashboard-") -> str:
    """A valid ConfigMap name (DNS subdomain) derived from a dashboard uid."""
    slug = re.sub(r"[^a-z0-9-]+", "-", uid.lower()).strip("-") or "dashboard"
    return (prefix + slug)[:253].rstrip("-")


def build_configmaps(
    dashboards: list[tuple[Path, dict[str, Any]]],
    namespace: str | None = None,
    label: str = "grafana_dashboard=1",
    folder: str | None = "inferwatch",
) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard, holding the file's JSON under its file name.

    Args:
        dashboards: from :func:`find_dashboards`.
        namespace: metadata.namespace, or None to leave it to kubectl.
        label: ``KEY=VALUE`` label the Grafana sidecar selects on.
        folder: value of the ``grafana_folder`` annotation, or None for none.
            The Grafana chart's sidecar files the dashboard in that folder when
            its ``sidecar.dashboards.folderAnnotation`` is ``grafana_folder``.

    Raises:
        DashboardError: the label is malformed or a dashboard exceeds the
            1 MiB ConfigMap limit.
    """
    key, sep, value = label.partition("=")
    if not sep or not key:
        raise DashboardError(f"--label {label!r}: expected KEY=VALUE, e.g. grafana_dashboard=1")
    out = []
    for path, doc in dashboards:
        # The file as its generator wrote it, byte for byte (a diff against the cluster stays readable).
        text = path.read_text(encoding="utf-8")
        size = len(text.encode("utf-8"))
        if size > CONFIGMAP_LIMIT:
            raise DashboardError(f"{path}: {size} bytes is more than a ConfigMap can hold (1 MiB)")
        if size > CLIENT_APPLY_LIMIT:
            print(f"note: {path.name} is {size} bytes; apply with `kubectl apply --server-side`", file=sys.stderr)
        meta: dict[str, Any] = {"name": configmap_name(doc["uid"])}
        if namespace:
            meta["namespace"] = namespace
        meta["labels"] = {key: value, "app.kubernetes.io/part-of": "inferwatch"}
        if folder:
            meta["annotations"] = {"grafana_folder": folder}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {path.name: text}})
    return out


def _block_dumper(yaml: Any) -> Any:
    """A SafeDumper that writes multi-line strings as ``|`` blocks, so the JSON stays readable."""

    class BlockDumper(yaml.SafeDumper):
        pass

    def str_repr(dumper: Any, data: str) -> Any:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    BlockDumper.add_representer(str, str_repr)
    return BlockDumper


def main(argv: list[str] | None = None) -> int:
    """Print the ConfigMaps as multi-document YAML; return the exit status."""
    p = argparse.ArgumentParser(
        description="Print one Kubernetes ConfigMap per Grafana dashboard in dashboards/, for the Grafana "
        "dashboard sidecar (kube-prometheus-stack). Pipe into `kubectl apply --server-side -f -`.",
    )
    p.add_argument("--dashboards", type=Path, default=DEFAULT_DIR, metavar="DIR",
                   help=f"directory searched for dashboard JSON (default: {DEFAULT_DIR})")
    p.add_argument("--namespace", "-n", help="namespace of the ConfigMaps (usually Grafana's)")
    p.add_argument("--label", default="grafana_dashboard=1", metavar="KEY=VALUE",
                   help="label the Grafana sidecar watches (default grafana_dashboard=1)")
    p.add_argument("--folder", default="inferwatch", help="grafana_folder annotation ('' for none)")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    args = p.parse_args(argv)
    try:
        import yaml
    except ImportError:
        print('dashboard_configmaps: PyYAML is missing: pip install "inferwatch[sidecar]"', file=sys.stderr)
        return 2
    try:
        dashboards = find_dashboards(args.dashboards)
        if not dashboards:
            raise DashboardError(f"{args.dashboards}: no dashboard JSON found (files with a uid and panels)")
        docs = build_configmaps(dashboards, args.namespace, args.label, args.folder or None)
    except DashboardError as e:
        print(f"dashboard_configmaps: {e}", file=sys.stderr)
        return 1
    text = yaml.dump_all(docs, Dumper=_block_dumper(yaml), sort_keys=False, width=1 << 20)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {len(docs)} ConfigMap(s) to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

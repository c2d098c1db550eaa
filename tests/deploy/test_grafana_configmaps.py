"""deploy/grafana/dashboard_configmaps.py: dashboards/ -> ConfigMaps for Grafana's dashboard sidecar."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.deploy.k8s import DEPLOY, ROOT
from tests.helpers.imports import load_file

SCRIPT = DEPLOY / "grafana" / "dashboard_configmaps.py"


@pytest.fixture(scope="module")
def mod() -> ModuleType:
    return load_file(SCRIPT)


def _dash(uid: str, title: str) -> dict:
    return {"uid": uid, "title": title, "panels": [{"id": 1, "type": "timeseries", "title": "QPS"}]}


def _write(d: Path, name: str, doc: object) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps(doc), encoding="utf-8")


def test_one_configmap_per_dashboard_with_the_json_intact(tmp_path):
    _write(tmp_path, "overview.json", _dash("inferwatch-overview", "Overview"))
    _write(tmp_path / "more", "gpu.json", _dash("Inferwatch_GPU", "GPU"))
    _write(tmp_path / "provisioning", "datasource.json", {"apiVersion": 1})  # not a dashboard
    run = subprocess.run([sys.executable, str(SCRIPT), "--dashboards", str(tmp_path), "-n", "monitoring"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    docs = list(yaml.safe_load_all(run.stdout))
    assert [d["metadata"]["name"] for d in docs] == ["inferwatch-dashboard-inferwatch-gpu",
                                                     "inferwatch-dashboard-inferwatch-overview"]
    for d in docs:
        assert d["apiVersion"] == "v1" and d["kind"] == "ConfigMap"
        assert d["metadata"]["namespace"] == "monitoring"
        assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert d["metadata"]["annotations"] == {"grafana_folder": "inferwatch"}
        (key, text), = d["data"].items()
        assert key.endswith(".json")
    assert json.loads(docs[0]["data"]["gpu.json"]) == _dash("Inferwatch_GPU", "GPU")


def test_bad_input_stops_with_a_message_naming_the_file(tmp_path, mod):
    _write(tmp_path, "a.json", _dash("same", "A"))
    _write(tmp_path, "b.json", _dash("same", "B"))
    with pytest.raises(mod.DashboardError, match="uid 'same' is also used by"):
        mod.find_dashboards(tmp_path)
    (tmp_path / "b.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(mod.DashboardError, match=r"b\.json: not readable JSON"):
        mod.find_dashboards(tmp_path)
    run = subprocess.run([sys.executable, str(SCRIPT), "--dashboards", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "not a directory" in run.stderr


def test_a_dashboard_too_large_for_a_configmap_is_refused(tmp_path, mod):
    big = _dash("big", "Big")
    big["description"] = "x" * (mod.CONFIGMAP_LIMIT + 1)
    _write(tmp_path, "big.json", big)
    with pytest.raises(mod.DashboardError, match="more than a ConfigMap can hold"):
        mod.build_configmaps(mod.find_dashboards(tmp_path))


def test_the_repository_dashboards_all_fit(mod):
    dashboards = mod.find_dashboards(ROOT / "dashboards")
    assert dashboards, "dashboards/ holds no dashboard JSON (run the dashboards generator)"
    cms = mod.build_configmaps(dashboards, namespace="monitoring")
    names = [c["metadata"]["name"] for c in cms]
    assert len(set(names)) == len(names)
    for c in cms:
        assert len(c["metadata"]["name"]) <= 253
        (text,) = c["data"].values()
        assert len(text.encode()) <= mod.CONFIGMAP_LIMIT

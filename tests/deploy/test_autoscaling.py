"""The autoscaling components (docs/capacity.md): KEDA's ScaledObject and the HPA through prometheus-adapter.

Their schemas are checked with the other manifests (test_k8s_schemas.py: the HPA and the ConfigMap strictly,
the ScaledObject has no published schema); here: they target the base's Deployment, agree with each other,
read catalog metrics, and KEDA's query computes what the comment says, evaluated by promtool on series.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from inferwatch_sidecar.components.registry import CATALOG
from tests.deploy.k8s import K8S, find, kustomize, load_documents, overlay_with

KEDA = K8S / "components" / "autoscale-keda"
HPA = K8S / "components" / "autoscale-hpa"


def _one(path: Path) -> dict[str, Any]:
    (doc,) = load_documents(path)
    return doc


def test_both_scale_the_base_deployment_the_same_way() -> None:
    so, hpa = _one(KEDA / "scaledobject.yaml"), _one(HPA / "hpa.yaml")
    dep = find("Deployment")["metadata"]["name"]
    assert so["spec"]["scaleTargetRef"] == hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": dep}
    assert so["spec"]["minReplicaCount"] == hpa["spec"]["minReplicas"] >= 2
    assert so["spec"]["maxReplicaCount"] == hpa["spec"]["maxReplicas"]
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]
    (trig,) = so["spec"]["triggers"]
    assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
    (metric,) = hpa["spec"]["metrics"]
    # the same target: 30% below the knee
    assert float(trig["metadata"]["threshold"]) == 0.7
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "700m"}
    rules = yaml.safe_load(_one(HPA / "adapter-rules.yaml")["data"]["config.yaml"])["rules"]
    (rule,) = rules
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    for name in ("inferwatch_capacity_headroom_ratio", "inferwatch_capacity_knee_concurrency"):
        assert name in CATALOG.by_name()
    assert "inferwatch_capacity_headroom_ratio" in trig["metadata"]["query"]
    assert "inferwatch_capacity_headroom_ratio" in rule["seriesQuery"]


def test_keda_query_is_the_summed_load_on_the_knee(tmp_path: Path, promtool: str) -> None:
    query = _one(KEDA / "scaledobject.yaml")["spec"]["triggers"][0]["metadata"]["query"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "keda", "rules": [{"record": "keda:query", "expr": query}]}]}))
    h = 'inferwatch_capacity_headroom_ratio{service="model-server",model="m",model_version="v1",pod="%s"}'
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": [
            {"series": h % "a", "values": "0.2x5"}, {"series": h % "b", "values": "0.4x5"},
            {"series": 'up{job="inferwatch",pod="a"}', "values": "1x5"},
            {"series": 'up{job="inferwatch",pod="b"}', "values": "1x5"}],
         # 0.8 + 0.6 = 1.4 over 2 replicas: 0.7 each, the threshold: no change
         "promql_expr_test": [{"expr": "keda:query", "eval_time": "2m", "exp_samples": [{"labels": "keda:query",
                                                                                       "value": 1.4}]}]},
        {"interval": "1m", "input_series": [{"series": f'up{{job="inferwatch",pod="{p}"}}', "values": "1x5"}
                                            for p in "abcd"],
         # no knee yet: 4 replicas x 0.7 holds the 4 replicas
         "promql_expr_test": [{"expr": "keda:query", "eval_time": "2m", "exp_samples": [{"labels": "keda:query",
                                                                                       "value": 2.8}]}]},
    ]}
    (tmp_path / "keda.test.yml").write_text(yaml.safe_dump(tests))
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "keda.test.yml")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_kustomize_renders_each_autoscaler_over_the_base(tmp_path: Path, kubectl: str) -> None:
    for comp, kinds in ((KEDA, {"ScaledObject"}), (HPA, {"HorizontalPodAutoscaler", "ConfigMap"})):
        objs = kustomize(kubectl, overlay_with(tmp_path / comp.name, [comp]))
        got = {o["kind"] for o in objs if o["metadata"].get("labels", {}).get("app.kubernetes.io/component")
               == "autoscaling"}
        assert got == kinds, (comp.name, got)
        assert any(o["kind"] == "Deployment" for o in objs)

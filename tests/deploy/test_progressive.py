"""deploy/progressive: the Argo Rollouts AnalysisTemplate and the Flagger Canary that gate on the canary judge.

Neither CRD has a schema in kubernetes-validate, so their structure is checked here; what they read is checked
against a real judgement: the AnalysisTemplate's jsonPath resolves in the /v1/status of a daemon whose judge
failed a canary, to a list holding the fields its conditions compare, and the Flagger webhook's command is the
real CLI, whose exit status is what Flagger acts on.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from inferwatch_sidecar.cli import build_parser
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.canary.component import CanaryComponent
from inferwatch_sidecar.components.canary.config import CanaryConfig
from tests.components.canary.helpers import traffic

DIR = Path(__file__).resolve().parents[2] / "deploy" / "progressive"


def _doc(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]
    return doc  # type: ignore[no-any-return]


def _status() -> dict[str, Any]:
    """/v1/status's shape with a real judgement: v2 (3x P99) fails against v1."""
    rng = np.random.default_rng(11)
    c = CanaryComponent(CanaryConfig(fail_after_s=0), ComponentContext(clock=lambda: 1000.0, monotonic=lambda: 1000.0))
    c.handle(0, 0, traffic(rng, "v1", 9500) + traffic(rng, "v2", 2000, tail_factor=3.0))
    c.drain(1000.0)
    c.evaluate(1000.0)
    return {"components": {"canary": {"state": "running", **c.status()}}}


def test_argo_analysis_template_reads_the_verdict_of_the_named_canary() -> None:
    t = _doc("argo-analysistemplate.yaml")
    assert (t["apiVersion"], t["kind"]) == ("argoproj.io/v1alpha1", "AnalysisTemplate")
    args = {a["name"] for a in t["spec"]["args"]}
    (m,) = t["spec"]["metrics"]
    web = m["provider"]["web"]
    assert web["url"] == "{{args.sidecar-url}}/v1/status"
    # Every {{args.X}} the metric uses is declared.
    used = set(re.findall(r"\{\{args\.([a-z-]+)\}\}", yaml.safe_dump(m)))
    assert used and used <= args
    path = re.fullmatch(r"\{\$((?:\.[a-z_]+)+)\}", web["jsonPath"])
    assert path, web["jsonPath"]
    result: Any = _status()
    for key in path.group(1).strip(".").split("."):
        result = result[key]
    (j,) = result
    assert j["verdict"] == "fail" and j["canary_version"] == "v2" and j["model"] == "m"
    for cond, verdict in ((m["successCondition"], "pass"), (m["failureCondition"], "fail")):
        fields = set(re.findall(r"\.([a-z_]+) ==", cond))
        assert fields == {"model", "canary_version", "verdict"} and fields <= set(j)
        assert f'.verdict == "{verdict}"' in cond


def test_flagger_canary_webhook_runs_the_real_cli() -> None:
    c = _doc("flagger-canary.yaml")
    assert (c["apiVersion"], c["kind"]) == ("flagger.app/v1beta1", "Canary")
    (hook,) = c["spec"]["analysis"]["webhooks"]
    assert hook["type"] == "rollout" and hook["metadata"]["type"] == "cmd"
    argv = shlex.split(hook["metadata"]["cmd"])
    assert argv[:2] == ["inferwatch", "canary"]
    args = build_parser().parse_args(argv[1:])  # the flags exist and parse
    assert args.sidecar.startswith("http://") and args.model == "resnet"

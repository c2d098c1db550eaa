"""The Grafana dashboards: generated JSON, conventions, PromQL validity and the catalog."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dashboards.src import common

from dashboards import generate as dash

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING = ROOT / "dashboards" / "provisioning"

#: Pinned: links, bookmarks and provisioning depend on these never changing.
UIDS = {
    "overview.json": "inferwatch-overview",
    "stages.json": "inferwatch-stages",
    "queue.json": "inferwatch-queue",
    "llm.json": "inferwatch-llm",
    "gpu.json": "inferwatch-gpu",
    "drift.json": "inferwatch-drift",
    "sidecar.json": "inferwatch-sidecar",
    "triton.json": "inferwatch-triton",
    "vllm.json": "inferwatch-vllm",
    "saturation.json": "inferwatch-saturation",
}

#: What each dashboard must show, as the series its queries must read.
REQUIRED_SERIES = {
    "inferwatch-overview": {"inferwatch_requests_total", "inferwatch_request_errors_total",
                            "inferwatch_request_duration_seconds_bucket", "inferwatch_request_duration_seconds",
                            # issue 27: 4xx and shed by route, load amplification, give-ups and their wait
                            "inferwatch_http_requests_total", "inferwatch_request_attempts_total",
                            "inferwatch_request_retries_total", "inferwatch_client_giveups_total",
                            "inferwatch_client_giveup_wait_seconds_bucket"},
    "inferwatch-stages": {"inferwatch_stage_duration_seconds_bucket", "inferwatch_stage_duration_seconds_sum"},
    "inferwatch-queue": {"inferwatch_queue_wait_seconds_bucket", "inferwatch_queue_depth",
                         "inferwatch_batch_size_bucket"},
    "inferwatch-llm": {"inferwatch_time_to_first_token_seconds_bucket", "inferwatch_inter_token_latency_seconds_bucket",
                       "inferwatch_generated_tokens_total"},
    "inferwatch-gpu": {"inferwatch_gpu_memory_used_bytes", "inferwatch_gpu_process_memory_used_bytes",
                       "inferwatch_gpu_leak_detected", "inferwatch_gpu_leak_rate_bytes_per_second",
                       "inferwatch_gpu_leak_time_to_oom_seconds", "inferwatch_gpu_device_time_to_oom_seconds",
                       "inferwatch_gpu_allocator_fragmentation_ratio",
                       "inferwatch_gpu_allocator_alloc_retries_total", "inferwatch_gpu_allocator_ooms_total",
                       "inferwatch_gpu_process_non_allocator_memory_bytes", "inferwatch_gpu_utilization_ratio",
                       "inferwatch_gpu_collector_up", "inferwatch_gpu_duplicate_model_copies",
                       "inferwatch_gpu_duplicate_model_extra_bytes"},
    "inferwatch-drift": {"inferwatch_drift_feature_score", "inferwatch_drift_prediction_class_ratio",
                         "inferwatch_drift_bin_events_total", "inferwatch_drift_confidence_mean",
                         "inferwatch_drift_estimated_accuracy_ratio", "inferwatch_drift_accuracy_ratio",
                         "inferwatch_drift_canary_drifted_ratio"},
    "inferwatch-sidecar": {"inferwatch_ingest_events_total", "inferwatch_ingest_dropped_total",
                           "inferwatch_sdk_dropped_events_total", "inferwatch_label_overflow_total", "up"},
    "inferwatch-triton": {"nv_inference_request_success", "nv_inference_request_failure",
                          "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
                          "nv_inference_pending_request_count", "inferwatch_stage_duration_seconds_sum",
                          "inferwatch_requests_total"},
    "inferwatch-vllm": {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
                        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                        "inferwatch_time_to_first_token_seconds_bucket", "inferwatch_requests_total"},
}


def _load() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}


def test_committed_json_matches_the_generator():
    files = dash.render()
    stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"stale dashboards {stale}: run `python dashboards/generate.py`"
    assert set(_load()) == {p.name for p in files}


def test_check_mode_exits_zero_when_up_to_date():
    r = subprocess.run([sys.executable, str(ROOT / "dashboards" / "generate.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_uids_are_stable_and_unique():
    boards = _load()
    assert {name: b["uid"] for name, b in boards.items()} == UIDS


def test_datasource_is_a_template_variable_not_inputs():
    for name, b in _load().items():
        assert "__inputs" not in b and "DS_PROMETHEUS" not in json.dumps(b), name
        variables = {v["name"]: v for v in b["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for p in b["panels"]:
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), (name, p["title"])
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${datasource}", (name, v["name"])


@pytest.mark.parametrize("uid", ["inferwatch-overview", "inferwatch-stages", "inferwatch-queue", "inferwatch-llm",
                                 "inferwatch-drift"])
def test_model_dashboards_have_model_and_version_variables_that_the_queries_use(uid):
    b = next(b for b in _load().values() if b["uid"] == uid)
    names = {v["name"] for v in b["templating"]["list"]}
    assert {"model", "version"} <= names
    if uid != "inferwatch-drift":  # drift metrics carry no service label
        assert "service" in names
    exprs = [t["expr"] for p in b["panels"] if p["type"] != "row" for t in p["targets"]]
    filtered = [e for e in exprs if "$model" in e and "$version" in e]
    assert len(filtered) >= len(exprs) * 0.8, "most panels must follow the model/version variables"


def test_every_panel_has_a_unit_thresholds_and_a_description():
    for name, b in _load().items():
        ids = [p["id"] for p in b["panels"]]
        assert len(ids) == len(set(ids)), name
        for p in b["panels"]:
            if p["type"] == "row":
                continue
            d = p["fieldConfig"]["defaults"]
            assert d["unit"], (name, p["title"])
            assert d["thresholds"]["steps"][0] == {"color": "green", "value": None}, (name, p["title"])
            assert p["description"], (name, p["title"])
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24, (name, p["title"])


def test_stage_latency_panels_have_exemplars_on():
    b = next(b for b in _load().values() if b["uid"] == "inferwatch-stages")
    latency = [p for p in b["panels"] if p["title"] in ("Stage P50", "Stage P99", "Stage P999")]
    assert len(latency) == 3
    assert all(t.get("exemplar") is True for p in latency for t in p["targets"])


def test_panel_thresholds_come_from_the_alert_thresholds():
    from alerts import source

    err = next(t.value for a in source.ALERTS if a.name == "InferwatchHighErrorRate" for t in a.thresholds)
    b = next(b for b in _load().values() if b["uid"] == "inferwatch-overview")
    panel = next(p for p in b["panels"] if p["title"] == "Error ratio")
    assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"][-1] == {"color": "red", "value": err}


@pytest.mark.parametrize("uid", sorted(REQUIRED_SERIES))
def test_each_dashboard_shows_what_the_issue_asks_for(uid):
    from alerts import promql

    read = set()
    for q in dash.panel_queries():
        if q.dashboard == uid:
            read |= promql.series_names(q.expr)
    missing = REQUIRED_SERIES[uid] - read
    assert not missing, f"{uid} shows none of {sorted(missing)}"


def _panels_reading(uid: str, series: str, pattern: str = "") -> list[str]:
    """Titles of ``uid``'s panels with a query that reads ``series`` and matches the regex ``pattern``."""
    import re

    from alerts import promql

    return sorted({q.panel for q in dash.panel_queries() if q.dashboard == uid
                   and series in promql.series_names(q.expr) and re.search(pattern, q.expr, re.S)})


def test_the_overload_panels_show_4xx_and_shed_amplification_and_give_ups():
    """Issue 27's panels, each pinned by what it computes: removing or emptying one fails here."""
    ov = "inferwatch-overview"
    shed = r'outcome=~"client_error\|shed"'
    assert _panels_reading(ov, "inferwatch_http_requests_total", shed + r".*by \(route, outcome\)|by \(route, "
                           r"outcome\).*" + shed) == ["4xx and shed by route"]
    assert _panels_reading(ov, "inferwatch_requests_total", shed) == ["4xx and shed ratio"]
    # attempts / (attempts - retries): attempts per unique request
    amp = r"inferwatch_request_attempts_total.*\n/\n\(.*inferwatch_request_attempts_total.*- .*" \
          r"inferwatch_request_retries_total"
    assert _panels_reading(ov, "inferwatch_request_retries_total", amp) == [
        "Load amplification (attempts per unique request)"]
    assert _panels_reading(ov, "inferwatch_client_giveups_total") == ["Client give-ups per second"]
    # the give-up wait's median beside the server's, the latter classic or native
    assert _panels_reading(ov, "inferwatch_client_giveup_wait_seconds_bucket", r"histogram_quantile\(0\.5") == \
        _panels_reading(ov, "inferwatch_request_duration_seconds", r"histogram_quantile\(0\.5, sum \(rate") == \
        ["Client give-up wait vs server latency (P50)"]


def test_the_gpu_dashboard_shows_the_device_time_to_oom():
    """Issue 29: the device's time to OOM at the growth of every process, not one process's own."""
    assert _panels_reading("inferwatch-gpu", "inferwatch_gpu_device_time_to_oom_seconds", r"min by \(gpu\)") == [
        "Device time to OOM"]


def test_every_panel_query_names_only_catalog_series_and_their_labels():
    problems = dash.check_all()
    assert not problems, "\n".join(problems)


def test_every_panel_query_is_valid_promql(promtool, tmp_path):
    queries = dash.panel_queries()
    assert len(queries) >= 60
    rules = [{"record": f"panel_query_{i}", "expr": dash.substitute(q.expr)} for i, q in enumerate(queries)]
    path = tmp_path / "panel-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules)} rules found" in r.stdout


def test_panel_queries_match_the_json():
    listed = {(q.dashboard, q.panel, q.expr) for q in dash.panel_queries()}
    in_json = {(b["uid"], p["title"], t["expr"]) for b in _load().values() for p in b["panels"]
               if p["type"] != "row" for t in p["targets"]}
    assert listed == in_json


def test_substitute_replaces_grafana_variables():
    expr = 'rate(x{model=~"$model", version=~"${version}"}[$__rate_interval]) / increase(y[$__range])'
    assert dash.substitute(expr, rate_interval="2s", range_="1m", variables={"model": "iris"}) == \
        'rate(x{model=~"iris", version=~".*"}[2s]) / increase(y[1m])'


def test_generation_refuses_a_query_on_a_renamed_metric(monkeypatch):
    real = dash.dashboards

    def broken() -> list:
        boards = real()
        boards[0].panels.append(common.timeseries(title="ghost", description="",
                                                  targets=[common.target("rate(inferwatch_requests_count[5m])")]
                                                  ).build())
        return boards

    monkeypatch.setattr(dash, "dashboards", broken)
    with pytest.raises(SystemExit, match="unknown series 'inferwatch_requests_count'"):
        dash.render()


def test_provisioning_points_grafana_at_the_dashboards_and_links_exemplars_to_traces():
    providers = yaml.safe_load((PROVISIONING / "dashboards.yaml").read_text())["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"]
    sources = yaml.safe_load((PROVISIONING / "datasources.yaml").read_text())["datasources"]
    prom = next(s for s in sources if s["type"] == "prometheus")
    dest = {d["name"]: d for d in prom["jsonData"]["exemplarTraceIdDestinations"]}
    assert set(dest) == {"trace_id", "request_id"}  # the exemplar labels the sidecar writes
    tempo = next(s for s in sources if s["type"] == "tempo")
    assert dest["trace_id"]["datasourceUid"] == tempo["uid"]
    assert "$${__value.raw}" in dest["request_id"]["url"]  # $$: not expanded by Grafana's env interpolation


def test_panel_needs_name_existing_panels_and_documented_needs():
    titles = {(q.dashboard, q.panel) for q in dash.panel_queries()}
    refs = {(q.dashboard, q.panel, q.ref) for q in dash.panel_queries()}
    for key, need in dash.PANEL_NEEDS.items():
        assert key in (titles if len(key) == 2 else refs), f"PANEL_NEEDS names no panel: {key}"
        assert need in dash.NEEDS, key
    needs = {q.needs for q in dash.panel_queries()}
    assert needs - {None} == set(dash.NEEDS)
    # most panels fill with plain traffic: the exceptions are the list above, not the rule
    assert sum(q.needs is None for q in dash.panel_queries()) >= 60


def test_runbooks_name_only_dashboards_and_panels_that_exist():
    import re

    titles = set()
    for d in dash.dashboards():
        titles.add(d.title.split(" / ", 1)[1])
        titles |= {it.title for it in d.panels}
    text = (ROOT / "docs" / "runbooks.md").read_text()
    named = set(re.findall(r"(?<![*\w])\*([A-Z][^*\n]+?)\*(?!\*)", text))
    assert named, "the runbooks point to no dashboard panel"
    assert named <= titles, f"runbooks name panels that do not exist: {sorted(named - titles)}"

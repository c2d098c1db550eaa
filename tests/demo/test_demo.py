"""``inferwatch demo`` as a new user runs it: a real subprocess, then its summary and exit status.

The scenario itself (servers, sidecar, faults, detection) is shared with tests/e2e; here we check the
command: it runs on its embedded defaults with no config and no GPU, prints the URLs, detects every
injected fault, lists the notifications Alertmanager delivered for them, exits 0, and leaves no child
process behind; with ``--engine triton`` Triton does the serving and the same faults are detected.
Plus the cheap pieces of the scenario (model, fault file, histogram quantiles, argument checks)
without starting anything.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from inferwatch_sidecar.demo import faults as fl
from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.demo import promtext
from inferwatch_sidecar.demo.alertmanager import alertmanager_binary
from tests.conftest import IN_CI
from tests.demo.helpers import CMD, run_demo


def _children(pid: int) -> set[int]:
    """PIDs of every descendant of ``pid`` (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _assert_every_fault_detected(out: str) -> dict[str, re.Match[str]]:
    """The summary says PASS with all five faults injected at 12 s and detected after it; returns the rows."""
    assert "PASS: 5 of 5 injected faults detected" in out, out
    rows = {m.group(1).strip(): m for m in re.finditer(
        r"^(.{46}) +(\d+\.\d)s +(\d+\.\d)s +(\d+\.\d)s  (.*)$", out, re.M)}
    assert len(rows) == 5, out
    for m in rows.values():
        injected, detected, after = float(m.group(2)), float(m.group(3)), float(m.group(4))
        assert 11 <= injected <= 14 and detected >= injected and abs(detected - injected - after) < 0.11
    leak = next(m for t, m in rows.items() if t.startswith("GPU memory leak"))
    rate = float(re.search(r"(\d+\.\d) MiB/s", leak.group(5)).group(1))  # type: ignore[union-attr]
    assert 55 <= rate <= 75  # the scripted 64 MiB/s
    return rows


def _accuracy_evidence(rows: dict[str, re.Match[str]]) -> tuple[dict[str, float], float | None]:
    """The confidence fault's numbers (estimate, interval, reference, mean confidence, polls) and the labelled
    accuracy (None without labels)."""
    ev = next(m for t, m in rows.items() if t.startswith("accuracy drop")).group(5)
    m = re.search(r"estimated accuracy (\d\.\d+) \(95% (\d\.\d+)-(\d\.\d+), calibrated\) vs reference (\d\.\d+); "
                  r"labelled (\d\.\d+|-); mean confidence (\d\.\d+) vs reference (\d\.\d+) \(mean of (\d+) polls\)", ev)
    assert m is not None, ev
    est, lo, hi, ref, lab, conf, ref_conf, polls = m.groups()
    return ({"estimate": float(est), "lower": float(lo), "upper": float(hi), "reference": float(ref),
             "confidence": float(conf), "reference_confidence": float(ref_conf), "polls": float(polls)},
            None if lab == "-" else float(lab))


def _assert_calibrated_estimate_falls(rows: dict[str, re.Match[str]], labelled: bool) -> None:
    """The overconfident model on hard traffic: the calibrated estimate falls with the accuracy, not the confidence."""
    v, lab = _accuracy_evidence(rows)
    ref, est, conf = v["reference"], v["estimate"], v["confidence"]
    assert v["polls"] >= 10  # averaged over the polls whose 10 s window holds only faulty traffic
    assert ref == pytest.approx(0.865, abs=0.01)  # the labelled training data's accuracy
    assert v["reference_confidence"] == pytest.approx(0.982, abs=0.005)  # overconfident: 0.12 above it
    # The hard segment's labelled accuracy is about 0.63: the estimate falls by 0.2, its interval below the reference.
    assert 0.58 <= est <= 0.70 and v["upper"] < ref, v
    # The mean confidence barely moves (less than the 0.1 of InferwatchConfidenceDrop, which stays quiet).
    assert conf > 0.9 and v["reference_confidence"] - conf < 0.1, v
    if labelled:
        # The labels agree: inside the 95% interval, and within 0.06 (about 900 labels: 0.016 of noise).
        assert lab is not None and v["lower"] <= lab <= v["upper"] and abs(est - lab) <= 0.06, (v, lab)
        assert conf - lab > 0.2, (v, lab)  # what mean confidence would have claimed
    else:
        assert lab is None


#: The demo's alerts without a model label: alerts/alertmanager.yml sends them to the platform's tickets.
PLATFORM_ALERTS = {"InferwatchGPUMemoryLeak"}


@pytest.mark.slow
def test_demo_detects_every_injected_fault_lists_their_notifications_and_exits_0() -> None:
    from alerts import source
    from inferwatch_sidecar.demo.config import FAULTS
    from inferwatch_sidecar.demo.judge import allowed_alert_names, expected_alert_names

    am_on_path = alertmanager_binary() is not None
    assert am_on_path or not IN_CI, "CI installs prometheus-alertmanager"
    # 65 s: the estimate is below InferwatchEstimatedAccuracyLow's floor once the 10 s window holds only faulty
    # traffic (about 22 s), its `for:` ends 30 s later, then Alertmanager groups; about 10 s to spare.
    out, err = run_demo("--duration", "65", "--inject-at", "12", "--no-ui")
    # The URLs a user opens.
    assert re.search(r"metrics\s+http://127\.0\.0\.1:\d+/metrics", out), out
    assert re.search(r"status\s+http://127\.0\.0\.1:\d+/v1/status", out), out
    assert re.search(r"^  status page\s+http://127\.0\.0\.1:\d+/$", out, re.M), out
    # The summary: every fault injected and detected, with the evidence.
    rows = _assert_every_fault_detected(out)
    _assert_calibrated_estimate_falls(rows, labelled=True)
    # The canary judge: pass while v2 was healthy, fail once it turned bad (latency is critical).
    canary = next(m for t, m in rows.items() if t.startswith("canary")).group(5)
    assert re.search(r"canary judge FAIL \d+/100 \(failing: [^)]*\blatency\b", canary), canary
    assert "before the fault: canary judge PASS" in canary, canary
    if not am_on_path:
        assert "alertmanager is not on PATH" in err, err
        return
    assert re.search(r"alertmanager\s+http://127\.0\.0\.1:\d+$", out, re.M), out
    # Every alert the faults must fire arrived, as firing, at the receiver its route names, with its runbook.
    section = out[out.index("notifications (Alertmanager):"):]
    got = {(m.group(2), m.group(1)): (m.group(3), m.group(4)) for m in re.finditer(
        r"^  (\S+) +(Inferwatch\w+) +([\w/]+) +runbook (\S+)$", section, re.M)}
    runbooks = {a.name: a.runbook_url for a in source.ALERTS}
    critical = {a.name for a in source.ALERTS if a.severity == "critical"}
    want = {(name, "ml-platform-tickets" if name in PLATFORM_ALERTS else "credit-risk-team")
            for name in expected_alert_names(FAULTS)}
    # A failing canary is the demo's only critical alert: it pages too (and reaches the model's team).
    want |= {(name, "oncall-pager") for name in expected_alert_names(FAULTS) & critical}
    assert want <= set(got), f"missing {want - set(got)}\n{out}"
    # Nothing else was delivered: no other alert, and no other page (but the headroom alert the latency fault may
    # bring, judge.MAY_FIRE, to the model's team).
    may = {(name, "credit-risk-team") for name in allowed_alert_names(FAULTS) - expected_alert_names(FAULTS)}
    assert set(got) - may == want, f"unexpected {set(got) - want - may}\n{out}"
    assert ("InferwatchCanaryFailing", "oncall-pager") in want
    for (name, _), (status, runbook) in got.items():
        # A drift alert may resolve before the end (its window moves on): it arrived firing first.
        assert status in ("firing", "firing/resolved") and runbook == runbooks[name], (name, status, runbook)


@pytest.mark.slow
def test_long_inputs_make_the_tail_attribution_name_the_queue_and_the_input_length(tmp_path: Path) -> None:
    """The latency fault's variant: 5% of notes are long and wait in the queue for a padded batch of them."""
    from inferwatch_sidecar.demo import server
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.scenario import Scenario

    # Bounded: 45 s and 50 requests/s at most; it stops at the first 15 s tail window that shows the fault.
    with Scenario(ScenarioConfig(duration_s=45, inject_at_s=12, faults=("long_inputs",),
                                 workdir=str(tmp_path / "demo"))) as sc:
        sc.start(timeout=90)
        snap = sc.run(until=lambda s: sc.all_detected())
    st = sc.faults["long_inputs"]
    assert st.detected_at is not None and st.injected_at is not None, st
    assert st.detected_at - st.injected_at < 32  # within two tail windows
    m = re.fullmatch(r"tail of v1: queue is (\d+)% of the slowest 1%; slow requests have input_tokens "
                     r"(\d+\.\d)x the median", st.detail)
    assert m is not None, st.detail
    assert int(m.group(1)) >= 70 and float(m.group(2)) >= 20, st.detail  # notes of 1500-2500 vs 8-48 words
    p99 = snap.tail[(mdl.NAME, mdl.STABLE)]["tails"]["p99"]
    assert p99["culprit"] == "queue" and p99["requests"] >= 5
    queue = next(x for x in p99["stages"] if x["stage"] == "queue")
    assert queue["excess_share"] > 0.7 and queue["seconds"] > 0.5 * server.LONG_WAIT_S, queue
    tokens = next(f for f in p99["features"] if f["feature"] == "input_tokens")
    assert tokens["distinguishes"] and tokens["p_adjusted"] < 0.01 and tokens["rest_median"] <= 48, tokens


def test_retry_storm_clients_give_up_and_retry_with_the_same_id(tmp_path: Path) -> None:
    """Issue 27: every batch slower than the clients' 0.5 s timeout; they hang up and send the same request again."""
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.scenario import Scenario

    # Bounded: 40 s and 50 requests/s at most; it stops at the first poll that shows retries and give-ups.
    with Scenario(ScenarioConfig(duration_s=40, inject_at_s=10, faults=("retry_storm",),
                                 workdir=str(tmp_path / "demo"))) as sc:
        sc.start(timeout=90)
        sc.run(until=lambda s: sc.all_detected())
        counts = dict(sc.loadgen.counts) if sc.loadgen is not None else {}
    st = sc.faults["retry_storm"]
    assert st.detected_at is not None and st.injected_at is not None, st
    m = re.fullmatch(r"(\d+) retries of (\d+) attempts \((\d+\.\d+) per unique request\), (\d+) clients gave up",
                     st.detail)
    assert m is not None, st.detail
    retries, attempts, giveups = int(m.group(1)), int(m.group(2)), int(m.group(4))
    assert retries > 0 and giveups > 0 and attempts > retries, st.detail
    # The sidecar counts no more retries than the clients sent (the window errs low, never high).
    assert retries <= counts.get("retries", 0), (st.detail, counts)


@pytest.mark.slow
def test_retry_storm_fires_its_alerts_end_to_end_in_the_demo_command() -> None:
    """Issue 27 item 3: ``inferwatch demo --faults retry_storm`` with Prometheus (and Alertmanager): the fault is
    detected, InferwatchRetryStorm and InferwatchTimeoutMismatch reach firing for v1 (the fast rules: 5 s and
    15 s windows, ``for:`` 5 s and 10 s), and Alertmanager delivers both to the model's team with runbooks."""
    from alerts import source
    from tests.conftest import require_binary

    require_binary("prometheus")
    out, err = run_demo("--faults", "retry_storm", "--duration", "50", "--inject-at", "10", "--no-ui", timeout=170)
    assert "PASS: 1 of 1 injected faults detected" in out, out
    row = re.search(r"^retry storm: clients time out at 0\.5 s.*$", out, re.M)
    assert row is not None and re.search(r"(\d+) retries of (\d+) attempts", row.group(0)), out
    for alert in ("InferwatchRetryStorm", "InferwatchTimeoutMismatch"):
        assert re.search(rf"^ +alert {alert}: firing$", out, re.M), f"{alert} did not fire\n{out}\n{err}"
    if alertmanager_binary() is None:
        assert not IN_CI, "CI installs prometheus-alertmanager"
        return
    section = out[out.index("notifications (Alertmanager):"):]
    runbooks = {a.name: a.runbook_url for a in source.ALERTS}
    for alert in ("InferwatchRetryStorm", "InferwatchTimeoutMismatch"):
        m = re.search(rf"^  credit-risk-team +{alert} +firing\S* +runbook (\S+)$", section, re.M)
        assert m is not None and m.group(1) == runbooks[alert], section


#: PyTriton pins numpy<2: scripts/test builds its venv from tests/traces/triton-requirements.txt.
TRITON_PYTHON = Path(__file__).resolve().parents[2] / ".venv-triton" / "bin" / "python"


def _triton_python_or_skip() -> None:
    if not TRITON_PYTHON.is_file():
        msg = f"{TRITON_PYTHON} missing: scripts/test builds it from tests/traces/triton-requirements.txt"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.mark.slow
def test_triton_server_starts_afresh_when_a_model_instance_loses_pytritons_handshake_race(tmp_path: Path) -> None:
    """CI saw PyTriton's start-up race once (an instance refused by the handshake socket): the server restarts."""
    from inferwatch_sidecar.demo.loadgen import triton_body
    from inferwatch_sidecar.demo.supervise import _package_dirs
    from tests.helpers.net import free_port

    _triton_python_or_skip()
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INFERWATCH_"))}
    env["PYTHONPATH"] = os.pathsep.join(_package_dirs())
    driver = Path(__file__).with_name("triton_race_driver.py")
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as fo, err.open("w") as fe:
        p = subprocess.Popen([str(TRITON_PYTHON), str(driver), "--role", "stable", "--sidecar-url",
                              "http://127.0.0.1:9", "--http-port", str(http), "--grpc-port", str(grpc),
                              "--metrics-port", str(metrics)], stdout=fo, stderr=fe, env=env, start_new_session=True)
    body = json.dumps(triton_body(mdl.sample(1, np.random.default_rng(0)), 0)).encode()
    answer = None
    try:
        deadline = time.monotonic() + 150
        while answer is None and p.poll() is None and time.monotonic() < deadline:
            if "starting Triton again" in err.read_text():
                req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/{mdl.NAME}/versions/1/infer", body,
                                             {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        answer = json.load(r)
                except OSError:
                    pass
            time.sleep(0.5)
        assert answer is not None, f"exit {p.poll()}\nstdout:\n{out.read_text()}\nstderr:\n{err.read_text()}"
        assert sorted(o["name"] for o in answer["outputs"]) == ["confidence", "prediction"], answer
        p.send_signal(signal.SIGTERM)  # the same PID serves after the restart: the supervisor's signal reaches it
        assert p.wait(timeout=60) == 0, err.read_text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    log = err.read_text()
    # The patch raises after the first run; on a loaded machine the real race can beat it inside that run
    # (CI saw it: the restart, and no "RAISING"), and a later start can lose it again (rare since the demo
    # server turned PyTriton's tensor store off). Either way: restarts, and a fresh start serves once.
    assert log.count("RAISING the handshake race") <= 1, log
    assert "(attempt 1 of 4); starting Triton again" in log, log
    assert out.read_text().count("READY") == 1, out.read_text()


def test_triton_server_retries_only_the_handshake_race_and_only_up_to_its_attempts() -> None:
    """Any other load failure, or the race on the last attempt, is raised (no re-execution)."""
    from inferwatch_sidecar.demo.supervise import _package_dirs

    _triton_python_or_skip()
    check = (
        "import os\n"
        "from inferwatch_sidecar.demo import triton_server as ts\n"
        "race = RuntimeError(\"[400] load failed for model 'credit-risk': ... get_config_from_handshake_server ... "
        "ConnectionRefusedError\")\n"
        "other = RuntimeError(\"[400] load failed for model 'credit-risk': ModuleNotFoundError: numpy\")\n"
        "assert ts.handshake_race(race) and not ts.handshake_race(other)\n"
        "assert not ts.handshake_race(RuntimeError('handshake timed out'))\n"
        "ts.restart_on_handshake_race(other, ['--role', 'stable'])\n"
        "os.environ[ts.ATTEMPT_ENV] = str(ts.START_ATTEMPTS)\n"
        "ts.restart_on_handshake_race(race, ['--role', 'stable'])\n"
        "print('RETURNED')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INFERWATCH_"))}
    env["PYTHONPATH"] = os.pathsep.join(_package_dirs())
    r = subprocess.run([str(TRITON_PYTHON), "-c", check], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "RETURNED", r.stdout + r.stderr
    assert "starting Triton again" not in r.stderr, r.stderr


@pytest.mark.slow
def test_demo_with_triton_serving_detects_every_injected_fault() -> None:
    _triton_python_or_skip()
    # Without Prometheus: detection comes from the sidecar's own signals (the run takes about a minute).
    out, err = run_demo("--engine", "triton", "--triton-python", str(TRITON_PYTHON), "--duration", "32",
                         "--inject-at", "12", "--no-ui", "--no-prometheus", timeout=120)
    assert re.search(r"model server\s+http://127\.0\.0\.1:\d+/v2/models/credit-risk/infer$", out, re.M), out
    assert re.search(r"triton metrics\s+http://127\.0\.0\.1:\d+/metrics$", out, re.M), out
    assert "starting Triton" in err, err
    rows = _assert_every_fault_detected(out)
    # Triton's records carry no request ID to join labels by: the estimate alone shows the drop.
    _assert_calibrated_estimate_falls(rows, labelled=False)
    # The latency spike is seen in Triton's own compute time (its spans' inference stage).
    latency = next(m for t, m in rows.items() if t.startswith("latency spike"))
    assert float(re.search(r"P99\.9 (\d+\.\d+)s", latency.group(5)).group(1)) > 2.5  # type: ignore[union-attr]
    # The canary judge on Triton's versions 2 vs 1 (its spans): pass while the canary served the stable model,
    # fail once its fault made it 30 ms slower. Its records (v2) differ in their mix.
    canary = next(m for t, m in rows.items() if t.startswith("canary")).group(5)
    assert canary.startswith("v2 vs v1: prediction mix differs"), canary
    # Triton's 3 s spikes queue both versions' requests, so the end-to-end latency may not show the canary's 30 ms;
    # its compute stage does, and the inference stage's latency is critical in the demo.
    assert re.search(r"; canary judge FAIL \d+/100 \(failing: [^)]*\bstage_latency\[inference\][^)]*\); "
                     r"before the fault: canary judge PASS \d+/100$", canary), canary


def test_triton_scenario_has_prometheus_scrape_both_tritons_metrics_and_judge_their_versions() -> None:
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.judge import canary_verdict
    from inferwatch_sidecar.demo.observe import Snapshot
    from inferwatch_sidecar.demo.scenario import Scenario

    with Scenario(ScenarioConfig(engine="triton")) as sc:
        metrics = [f"127.0.0.1:{sc.triton_ports[r][1]}" for r in ("stable", "canary")]
        assert sc.scrape_targets() == [f"127.0.0.1:{sc.sidecar_port}", *metrics]
        assert len(set(sc.scrape_targets())) == 3
    with Scenario(ScenarioConfig()) as fastapi:
        assert fastapi.scrape_targets() == [f"127.0.0.1:{fastapi.sidecar_port}"]

    def judgement(canary: str, baseline: str) -> dict[str, object]:
        return {"model": mdl.NAME, "canary_version": canary, "baseline_version": baseline, "verdict": "pass",
                "score": 98.0, "metrics": [{"name": "latency", "stage": None, "result": "pass"}]}

    # Triton's spans name the versions 1 and 2, the SDK v1 and v2: either pair is the canary against the stable.
    for canary, baseline in (("2", "1"), ("v2", "v1")):
        assert canary_verdict(Snapshot(t=1.0, phase="baseline", canary=[judgement(canary, baseline)])) == \
            "canary judge PASS 98/100"
    # The stable version judged against the canary (a wrong baseline) is no verdict on the canary.
    assert canary_verdict(Snapshot(t=1.0, phase="baseline", canary=[judgement("1", "2")])) == ""


def test_demo_with_triton_says_what_to_install_when_pytriton_is_missing() -> None:
    r = subprocess.run([*CMD, "demo", "--engine", "triton", "--triton-python", sys.executable],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{sys.executable} cannot import PyTriton" in r.stderr, r.stderr
    assert "-m pip install" in r.stderr and "nvidia-pytriton" in r.stderr, r.stderr


@pytest.mark.slow
def test_demo_stops_every_child_on_sigterm() -> None:
    p = subprocess.Popen([*CMD, "demo", "--duration", "120", "--no-ui", "--no-prometheus"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Wait until the URLs are printed: every child is up.
        assert p.stdout is not None
        deadline = time.monotonic() + 90
        lines = []
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            lines.append(line)
            if "faults at t=" in line:
                break
        else:
            pytest.fail("".join(lines))
        kids = _children(p.pid)
        assert len(kids) >= 4, kids  # sidecar, two servers (3 workers) at least
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, rest
    assert "stopped early by SIGTERM" in rest
    assert not [k for k in kids if _alive(k)], "children left running"


def test_demo_rejects_bad_arguments_with_a_message() -> None:
    r = subprocess.run([*CMD, "demo", "--faults", "drift,bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "unknown fault(s) bogus" in r.stderr
    r = subprocess.run([*CMD, "demo", "--duration", "10"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "at least 30 seconds" in r.stderr
    r = subprocess.run([*CMD, "demo", "--faults", "latency,long_inputs"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "long_inputs replaces latency: inject one of them" in r.stderr, r.stderr


def test_scenario_config_rejects_a_variant_with_its_fault_and_long_inputs_without_the_batcher() -> None:
    from inferwatch_sidecar.demo.config import ScenarioConfig

    assert ScenarioConfig(faults=("long_inputs", "drift")).faults == ("long_inputs", "drift")
    with pytest.raises(ValueError, match="'long_inputs' replaces 'latency'"):
        ScenarioConfig(faults=("latency", "long_inputs"))
    with pytest.raises(ValueError, match="FastAPI server's batcher"):
        ScenarioConfig(faults=("long_inputs",), engine="triton")
    with pytest.raises(ValueError, match="unknown fault 'slow'"):
        ScenarioConfig(faults=("slow",))


def test_models_are_deterministic_and_the_canary_predicts_a_different_mix() -> None:
    a, data = mdl.train(0)
    b, _ = mdl.train(0)
    assert np.array_equal(a.w, b.w) and np.array_equal(a.b, b.b)
    pred, conf = a.predict(data.numeric, data.region)
    acc = np.mean([x == y for x, y in zip(pred, data.label, strict=True)])
    assert 0.8 < acc < 0.95  # good, not perfect: labels are sampled
    # Overconfident, as a boosted model is: the mean confidence overstates the accuracy by more than 0.1.
    assert float(conf.mean()) - acc > 0.1
    healthy_pred, healthy_conf = a.healthy_canary().predict(data.numeric, data.region)
    assert a.healthy_canary().version == "v2" and healthy_pred == pred and np.array_equal(healthy_conf, conf)
    canary_pred, _ = a.canary().predict(data.numeric, data.region)
    share = {c: pred.count(c) / len(pred) for c in mdl.CLASSES}
    canary_share = {c: canary_pred.count(c) / len(pred) for c in mdl.CLASSES}
    assert canary_share["decline"] > share["decline"] + 0.15
    # The fault file's temperature knob lowers confidence without changing the predicted classes.
    hot_pred, hot_conf = a.predict(data.numeric, data.region, temperature=60.0)
    assert hot_pred == pred and hot_conf.mean() < conf.mean() - 0.2


def test_hard_segment_drops_accuracy_while_the_calibrated_estimate_follows_and_confidence_stays_high() -> None:
    """The confidence fault offline: covariate shift to the hard segment, judged against the labelled reference."""
    from inferwatch_sidecar.components.drift import performance

    model, data = mdl.train(0)
    pred, conf = model.predict(data.numeric, data.region)
    perf = performance.fit(pred, conf, data.label, label="label")
    rng = np.random.default_rng(11)
    for drift in (False, True):
        hard = mdl.sample(20000, rng, drift=drift, hard=1.0)
        hp, hc = model.predict(hard.numeric, hard.region)
        acc = float(np.mean([x == y for x, y in zip(hp, hard.label, strict=True)]))
        win = performance.PerformanceWindow(perf, 1)
        win.update(hp, hc)
        est = win.estimate
        assert est is not None
        assert 0.6 < acc < 0.68 and perf.reference_accuracy - acc > 0.18, (drift, acc)
        assert abs(est.accuracy - acc) < 0.03, (drift, est, acc)
        # Mean confidence: still above 0.9, off by about 0.3.
        assert float(hc.mean()) > 0.92 and float(hc.mean()) - acc > 0.25, (drift, float(hc.mean()))
    # A share of the rows: the rest come from the healthy distribution.
    half = mdl.sample(20000, rng, hard=0.5)
    hp, _ = model.predict(half.numeric, half.region)
    acc_half = float(np.mean([x == y for x, y in zip(hp, half.label, strict=True)]))
    assert 0.72 < acc_half < 0.8


def test_drifted_inputs_move_only_the_shifted_features() -> None:
    rng = np.random.default_rng(5)
    healthy = mdl.sample(20000, rng)
    drifted = mdl.sample(20000, rng, drift=True)
    for j, name in enumerate(mdl.NUMERIC_NAMES):
        sd = mdl.NUMERIC[name][1]
        moved = (drifted.numeric[:, j].mean() - healthy.numeric[:, j].mean()) / sd
        assert moved == pytest.approx(mdl.DRIFT_SHIFT.get(name, 0.0), abs=0.05), name
    west = [r.count("west") / len(r) for r in (healthy.region, drifted.region)]
    assert west[0] == pytest.approx(0.1, abs=0.01) and west[1] == pytest.approx(0.5, abs=0.02)


def test_reference_profile_is_built_from_the_training_data(tmp_path: Path) -> None:
    from inferwatch_sidecar.components.drift import profile as prof

    info = mdl.build_reference(str(tmp_path / "ref.json"), seed=0)
    p = prof.load(str(tmp_path / "ref.json"))
    assert p.rows == info["rows"] == 5000
    assert p.prediction is not None and p.prediction.name == "prediction"
    assert p.confidence is not None and p.confidence.name == "confidence"
    assert {c.name for c in p.features} == {*mdl.NUMERIC_NAMES, mdl.CATEGORICAL_NAME}
    assert json.loads((tmp_path / "ref.json").read_text())["columns"]
    # The training labels calibrate the accuracy estimate (as `reference build --label` does).
    assert p.performance is not None and p.performance.label == "label" and p.performance.rows == 5000
    assert p.performance.reference_accuracy == info["train_accuracy"] == pytest.approx(0.8646)
    assert info["confidence_mean"] == pytest.approx(0.982, abs=0.001)
    assert info["calibration"] == p.performance.calibration.method in ("isotonic", "binned")


def test_fault_file_round_trips_and_rejects_bad_values(tmp_path: Path) -> None:
    path = str(tmp_path / "faults.json")
    r = fl.FaultReader(path, check_s=0)
    assert r.get() == fl.Faults()
    f = fl.Faults(latency_stage="inference", latency_share=0.1, latency_delay_s=3.0, confidence_temperature=6.0)
    fl.write(path, f)
    assert r.get() == f
    with pytest.raises(ValueError, match="unknown fault field"):
        fl.Faults.from_json({"latency_shares": 1})
    with pytest.raises(ValueError, match="between 0 and 1"):
        fl.Faults.from_json({"latency_share": 2})
    # A bad file keeps the last good state.
    Path(path).write_text("{not json")
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert r.get() == f


def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    # 100 observations: 50 in (0, 0.1], 40 in (0.1, 0.5], 10 in (0.5, 1].
    b = {0.1: 50.0, 0.5: 90.0, 1.0: 100.0, float("inf"): 100.0}
    assert promtext.quantile(0.5, b) == pytest.approx(0.1)
    assert promtext.quantile(0.7, b) == pytest.approx(0.1 + 0.4 * 20 / 40)
    assert promtext.quantile(0.99, b) == pytest.approx(0.5 + 0.5 * 9 / 10)
    # Ranks in the +Inf bucket return the largest finite bound, as Prometheus does.
    assert promtext.quantile(0.99, {1.0: 90.0, float("inf"): 100.0}) == 1.0
    assert promtext.quantile(0.5, {1.0: 0.0, float("inf"): 0.0}) is None
    # Deltas between scrapes; a counter reset starts over.
    assert promtext.delta({1.0: 5, float("inf"): 7}, {1.0: 2, float("inf"): 3}) == {1.0: 3, float("inf"): 4}
    assert promtext.delta({1.0: 1, float("inf"): 1}, {1.0: 2, float("inf"): 3}) == {1.0: 1, float("inf"): 1}


def test_sidecar_config_passes_the_sidecars_own_validation(tmp_path: Path) -> None:
    """The generated config uses only keys the sidecar accepts, and scripts the leak on the chosen worker."""
    from inferwatch_sidecar.config import load_config
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.scenario import Scenario

    sc = Scenario(ScenarioConfig(duration_s=60, inject_at_s=20, workdir=str(tmp_path)))
    sc.worker_pids = {"stable": [101, 102], "canary": [103]}
    sc.leak_pid = 101
    path = tmp_path / "sidecar.yaml"
    import yaml

    path.write_text(yaml.safe_dump(sc.sidecar_config(str(tmp_path / "reference.json"))))
    cfg = load_config(path, environ={})
    assert cfg.gpu.backend == "fake" and cfg.http.host == "127.0.0.1" and cfg.http.port == sc.sidecar_port
    assert cfg.http.admin_token is not None and cfg.http.admin_token.get_secret_value() == sc.token
    procs = {p.pid: p for p in cfg.gpu.fake.processes}
    assert set(procs) == {101, 102, 103}
    assert procs[101].leak_mib_per_s == 64 and procs[101].leak_start_s == 20
    assert procs[102].leak_mib_per_s == procs[103].leak_mib_per_s == 0
    # No two workers hold a similar amount: however long the demo runs, no duplicated model copies.
    from inferwatch_sidecar.components.gpu.duplicates import find_copies

    assert [procs[p].base_gib for p in (101, 102, 103)] == [4.75, 5.462, 6.282]
    assert find_copies({p: procs[p].base_gib * 2**30 for p in procs}, cfg.gpu.duplicates) is None
    assert cfg.drift.reference == str(tmp_path / "reference.json") and cfg.drift.window_seconds == 10
    assert cfg.ingest.socket == sc.socket_path
    # The canary judge compares v2 with the busiest version (v1) over the drift windows' 10 s.
    assert cfg.canary.enabled and cfg.canary.baselines == {} and cfg.canary.window_seconds == 10
    assert cfg.canary.min_requests == 50 and cfg.canary.evaluate_interval_s == 1
    assert cfg.tail.enabled and cfg.tail.window_seconds == 15 and cfg.tail.min_tail_requests == 5


def test_server_predicts_and_applies_the_faults_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo server app in-process (SDK disabled, lifespan run by hand), fault file in tmp_path."""
    import asyncio

    import httpx

    monkeypatch.setenv("INFERWATCH_ENABLED", "false")
    monkeypatch.setenv("INFERWATCH_DEMO_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("INFERWATCH_DEMO_ADMIN_TOKEN", "t" * 32)
    monkeypatch.setenv("INFERWATCH_DEMO_ERROR_SHARE", "0")
    monkeypatch.setenv("INFERWATCH_DEMO_WAIT_SOCKET_S", "0")
    from inferwatch_sidecar.demo import server

    row = mdl.sample(1, np.random.default_rng(0)).row(0)
    auth = {"Authorization": "Bearer " + "t" * 32}

    async def scenario() -> dict[str, httpx.Response]:
        out: dict[str, httpx.Response] = {}
        async with server.lifespan(server.app):
            transport = httpx.ASGITransport(app=server.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://demo") as c:
                out["ok"] = await c.post("/predict", json={"features": row})
                out["bad"] = await c.post("/predict", json={"features": {**row, "age": "old"}})
                out["noauth"] = await c.put("/admin/faults", json={})
                out["hot_set"] = await c.put("/admin/faults", json={"confidence_temperature": 60.0}, headers=auth)
                out["hot"] = await c.post("/predict", json={"features": row})
                out["bad_fault"] = await c.put("/admin/faults", json={"latency_share": 3}, headers=auth)
                out["stream"] = await c.post("/generate", json={"prompt": "hi", "max_tokens": 5})
                # A long note waits in its bucket for a batch of long notes (none come): LONG_WAIT_S. A short
                # request sent meanwhile is not held up behind it.
                long_note = " ".join(["income"] * 2000)

                async def timed(key: str, note: str, delay: float) -> None:
                    await asyncio.sleep(delay)
                    sent[key] = time.monotonic()
                    out[key] = await c.post("/predict", json={"features": row, "note": note})
                    done[key] = time.monotonic()

                await asyncio.gather(timed("long", long_note, 0.0), timed("short", "rent paid", 0.1))
        return out

    sent: dict[str, float] = {}
    done: dict[str, float] = {}

    r = asyncio.run(scenario())
    assert r["ok"].status_code == 200, r["ok"].text
    body = r["ok"].json()
    assert body["prediction"] in mdl.CLASSES and body["model_version"] == "v1"
    model, _ = mdl.train(0)
    pred, conf = model.predict(np.array([[row[n] for n in mdl.NUMERIC_NAMES]]), [row["region"]])
    assert body["prediction"] == pred[0] and body["confidence"] == pytest.approx(conf[0], abs=1e-4)
    # Bad input is a clear 422, not a 500.
    assert r["bad"].status_code == 422 and "age" in r["bad"].text
    # Admin routes need the token; a valid change lands in the shared fault file.
    assert r["noauth"].status_code == 401
    assert r["hot_set"].status_code == 200, r["hot_set"].text
    assert fl.read(str(tmp_path / "faults.json")).confidence_temperature == 60.0
    hot = r["hot"].json()
    assert hot["prediction"] == body["prediction"] and hot["confidence"] < body["confidence"] - 0.1
    assert r["bad_fault"].status_code == 422 and "between 0 and 1" in r["bad_fault"].text
    assert r["stream"].status_code == 200 and len(r["stream"].text.split()) == 5
    assert r["long"].status_code == r["short"].status_code == 200
    assert r["long"].json()["prediction"] == r["short"].json()["prediction"] == body["prediction"]
    # Order, not durations (a loaded machine stretches both): the long note is held for its bucket's
    # deadline at least, and the short one, sent after it, is served before that deadline.
    assert list(done) == ["short", "long"], (sent, done)
    assert done["long"] - sent["long"] >= server.LONG_WAIT_S, (sent, done)
    assert done["short"] < sent["long"] + server.LONG_WAIT_S, (sent, done)
    # Every worker writes its PID file (the scenario reads them to script the fake GPU processes).
    assert (tmp_path / "pids" / f"stable-{os.getpid()}").exists()


def test_live_view_renders_latency_gpu_drift_faults_and_alerts(tmp_path: Path) -> None:
    from rich.console import Console

    from inferwatch_sidecar.demo.alertmanager import Notification, WebhookReceiver
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.inject import FaultState
    from inferwatch_sidecar.demo.model import NAME as MODEL
    from inferwatch_sidecar.demo.observe import Snapshot
    from inferwatch_sidecar.demo.scenario import Scenario
    from inferwatch_sidecar.demo.view import progress_line, render

    sc = Scenario(ScenarioConfig(duration_s=60, inject_at_s=20, workdir=str(tmp_path)))
    sc.worker_pids = {"stable": [101, 102], "canary": [103]}
    sc.prometheus_url = "http://127.0.0.1:9"
    runbook = "https://example.test/runbooks.md#inferwatchgpumemoryleak"
    note = {"alerts": [{"status": "firing", "labels": {"alertname": "InferwatchGPUMemoryLeak"},
                        "annotations": {"runbook_url": runbook}}]}
    leak = {"verdict": "leak", "rate_bytes_per_s": 64 * 2**20, "time_to_oom_s": 1000.0}
    snap = Snapshot(
        t=42.0, phase="faults",
        stages={"inference": {0.5: 0.0004, 0.99: 2.9, 0.999: 4.97, "rate": 30.0}},
        gpu={"devices": [{"gpu": "0", "used_bytes": 16 * 2**30, "total_bytes": 80 * 2**30, "leak": leak,
                          "processes": [{"pid": 101, "used_bytes": 6 * 2**30, **leak}]}]},
        drift={(MODEL, "v1"): {"features": {"income": {"drifted": True, "scores": {"wasserstein_norm": 1.23}}},
                               "confidence": [0.65, 0.84], "drifted_ratio": 0.67, "estimated_accuracy": 0.64,
                               "calibrated": True, "estimated_interval": {"lower": 0.58, "upper": 0.7},
                               "reference_accuracy": 0.865}},
        faults={"gpu_leak": FaultState("gpu_leak", injected_at=20.0, detected_at=29.0, detail="pid 101: leak")},
        canary=[{"model": MODEL, "canary_version": "v2", "baseline_version": "v1", "verdict": "fail", "score": 35.0,
                 "canary_requests": 130, "baseline_requests": 310,
                 "reasons": ["latency: auc_shift 0.42 beyond tolerance 0.05"], "metrics": []}],
        tail={(MODEL, "v1"): {"tails": {"p99": {"status": "ok", "culprit": "queue", "features": [],
                                                "summary": "queue is 94% of the slowest 1%"}}}},
        alerts={"InferwatchGPUMemoryLeak": "firing"},
        load={"predict_stable": 900, "predict_canary": 300, "generate": 100, "labels": 500},
        notifications=[Notification("ml-platform-tickets", note)] * 2,
    )
    import io

    con = Console(width=200, record=True, file=io.StringIO())
    con.print(render(snap, sc))
    first = con.export_text(clear=False)
    assert "Alertmanager notifications" not in first  # no receiver attached: no panel
    assert "capacity (live knee of v1): not identified yet" in first
    # The live knee's headroom (issue 26): the scenario's trace of the sidecar's gauges, as the requests pile up.
    for t, flight, head in ((30.0, 1.5, 0.4), (40.0, 2.2, 0.1), (50.0, 4.0, -0.6)):
        sc.capacity.observe(t, promtext.Scrape(
            f'inferwatch_capacity_knee_concurrency{{model="{MODEL}",model_version="v1"}} 2.5\n'
            f'inferwatch_capacity_headroom_ratio{{model="{MODEL}",model_version="v1"}} {head}\n'
            f'inferwatch_capacity_in_flight{{model="{MODEL}",model_version="v1"}} {flight}\n', t))
    with WebhookReceiver() as hook:
        sc.attach_alertmanager(hook)
        con.print(render(snap, sc))
    text = con.export_text()
    for want in ("inference", "4.97s", "LEAK", "64.0 MiB/s", "16.7min", "1.23 *", "0.650 (0.840)", "67.0%",
                 "GPU memory leak in one worker", "29s (+9s)", "InferwatchGPUMemoryLeak (firing)", "pid 101 v1",
                 "Alertmanager notifications", runbook, "64.0% [58.0%-70.0%] (86.5%)",
                 "v1: queue is 94% of the slowest 1%", "latency: auc_shift 0.42 beyond tolerance 0.05",
                 "130 vs 310", "knee 2.50 requests in flight; now 4.00 in flight, headroom -60%",
                 "headroom fell from 40% at 30s to -60% at 50s as requests in flight rose from 1.50 to 4.00"):
        assert want in text, want
    assert re.search(r"ml-platform-tickets +│ InferwatchGPUMemoryLeak +│ firing", text), text
    assert re.search(r"v2 vs v1 +│ FAIL +│ 35/100", text), text
    line = progress_line(snap)
    assert " canary judge FAIL 35/100 detected: " in line
    # The stable version judged against the canary is no verdict on the canary: the line names the canary's.
    snap.canary.insert(0, {"model": MODEL, "canary_version": "v1", "baseline_version": "v2", "verdict": "pass",
                           "score": 99.0, "metrics": []})
    assert " canary judge FAIL 35/100 detected: " in progress_line(snap)
    snap.canary = snap.canary[:1]
    assert "canary" not in progress_line(snap)
    assert "gpu_leak+" in line and "firing: InferwatchGPUMemoryLeak" in line and "p99.9=4.97s" in line
    assert line.endswith("notifications: 2")


class _IdleLoad:
    """A load generator that sends nothing (the scenario's loop only starts, polls and stops it)."""

    def __init__(self) -> None:
        import threading

        self.finished = threading.Event()

    def start(self) -> _IdleLoad:
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self.finished.set()


def test_faults_switch_on_at_their_time_while_a_poll_takes_seconds(tmp_path: Path) -> None:
    """A loaded machine makes a poll take seconds (the vLLM scenario scrapes two servers): the faults still
    switch on at their time, and the poll that was under way then is still judged as baseline."""
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.observe import Snapshot
    from inferwatch_sidecar.demo.scenario import Scenario

    sc = Scenario(ScenarioConfig(duration_s=4.0, inject_at_s=1.0, faults=("drift",), workdir=str(tmp_path)))
    switched: list[float] = []
    polls: list[tuple[float, float, float | None]] = []  # (start, end, injected_at as the poll was judged)

    def slow_poll() -> Snapshot:
        start = sc.now()
        time.sleep(1.6)  # the poll that starts at 0 s is still running at the injection time
        polls.append((start, sc.now(), sc.faults["drift"].injected_at))
        return Snapshot(t=start)

    sc.load_generator = lambda plan: _IdleLoad()  # type: ignore[method-assign]
    sc.inject = lambda: switched.append(sc.now())  # type: ignore[method-assign]
    sc.poll = slow_poll  # type: ignore[method-assign]
    sc.t0 = time.monotonic()
    snap = sc.run()
    # Once, on time: while the poll that began at 0 s still ran (the old loop switched after it, at 1.6 s).
    assert len(switched) == 1 and 1.0 <= switched[0] < polls[0][1], (switched, polls)
    at = sc.faults["drift"].injected_at
    assert at is not None and abs(at - switched[0]) < 0.01, (at, switched)
    first = polls[0]
    assert first[0] < at < first[1] and first[2] is None, polls  # under way at the switch: baseline
    assert all(p[2] == at for p in polls[1:]) and len(polls) >= 2, polls
    assert snap.phase == "done"


def test_a_fault_switch_that_fails_in_the_timer_fails_the_run_with_its_error(tmp_path: Path) -> None:
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.observe import Snapshot
    from inferwatch_sidecar.demo.scenario import Scenario

    sc = Scenario(ScenarioConfig(duration_s=5.0, inject_at_s=0.3, faults=("drift",), workdir=str(tmp_path)))
    calls: list[float] = []

    def broken_inject() -> None:
        calls.append(sc.now())
        raise OSError("PUT /admin/faults: connection refused")

    sc.load_generator = lambda plan: _IdleLoad()  # type: ignore[method-assign]
    sc.inject = broken_inject  # type: ignore[method-assign]
    sc.poll = lambda: Snapshot(t=sc.now())  # type: ignore[method-assign]
    sc.t0 = time.monotonic()
    with pytest.raises(OSError, match="connection refused"):
        sc.run()
    assert len(calls) == 1 and sc.now() < 3.0, calls  # tried once, and the run stopped at the next tick, not at 5 s
    assert sc.faults["drift"].injected_at is None

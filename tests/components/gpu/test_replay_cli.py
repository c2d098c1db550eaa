"""nvidia-smi CSV replay and ``inferwatch gpu analyze``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.gpu.component import build
from inferwatch_sidecar.components.gpu.config import GpuConfig
from inferwatch_sidecar.components.gpu.replay import LogError, ReplaySampler, parse_bytes, parse_log, parse_timestamp

UUID = "GPU-5d1c4e2a-7f3b-11ee-b962-0242ac120002"

# Written by hand from nvidia-smi's documented CSV output.
GPU_WITH_UNITS = f"""timestamp, index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]
2024/01/31 12:00:00.123, 0, {UUID}, 81559 MiB, 1024 MiB, 80535 MiB
2024/01/31 12:00:01.124, 0, {UUID}, 81559 MiB, 1030 MiB, 80529 MiB
2024/01/31 12:00:02.125, 0, {UUID}, 81559 MiB, [N/A], [N/A]
"""
GPU_NOUNITS = f"""timestamp, index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]
2024/01/31 12:00:00.123, 0, {UUID}, 81559, 1024, 80535
"""
GPU_BARE_HEADER = f"""timestamp, index, uuid, memory.total, memory.used, memory.free
2024/01/31 12:00:00.123, 0, {UUID}, 81559 MiB, 2048 MiB, 79511 MiB
"""
APPS = f"""timestamp, gpu_uuid, pid, used_gpu_memory [MiB]
2024/01/31 12:00:00.123, {UUID}, 4242, 20480 MiB
2024/01/31 12:00:00.123, {UUID}, 4243, 512 MiB
"""


def write(tmp: Path, name: str, text: str) -> str:
    p = tmp / name
    p.write_text(text)
    return str(p)


def test_parse_units_missing_values_and_timestamps() -> None:
    assert parse_bytes("81559 MiB") == 81559 * 2**20
    assert parse_bytes("81559") == 81559 * 2**20
    assert parse_bytes("2 GiB") == 2**31
    assert parse_bytes("[N/A]") is None and parse_bytes("[Not Supported]") is None
    with pytest.raises(ValueError):
        parse_bytes("12 parsecs")
    assert parse_timestamp("2024/01/31 12:00:00.123") == pytest.approx(
        datetime(2024, 1, 31, 12, 0, 0, 123000, tzinfo=timezone.utc).timestamp())


@pytest.mark.parametrize("text", [GPU_WITH_UNITS, GPU_NOUNITS, GPU_BARE_HEADER])
def test_gpu_query_formats_parse(tmp_path: Path, text: str) -> None:
    log = parse_log(write(tmp_path, "g.csv", text))
    assert log.kind == "gpu"
    r = log.rows[0]
    assert r.device == "0" and r.uuid == UUID and r.total == 81559 * 2**20 and r.pid is None
    assert r.used in (1024 * 2**20, 2048 * 2**20)
    assert r.stamp == "2024/01/31 12:00:00.123"


def test_missing_values_are_kept_as_none(tmp_path: Path) -> None:
    log = parse_log(write(tmp_path, "g.csv", GPU_WITH_UNITS))
    assert [r.used for r in log.rows] == [1024 * 2**20, 1030 * 2**20, None]


def test_compute_apps_format_and_noheader(tmp_path: Path) -> None:
    log = parse_log(write(tmp_path, "a.csv", APPS))
    assert log.kind == "apps" and [(r.pid, r.used) for r in log.rows] == [(4242, 20 * 2**30), (4243, 512 * 2**20)]
    noheader = "\n".join(APPS.splitlines()[1:]) + "\n"
    log2 = parse_log(write(tmp_path, "b.csv", noheader))
    assert log2.kind == "apps" and len(log2.rows) == 2


def test_bad_rows_are_counted_and_repeated_headers_skipped(tmp_path: Path) -> None:
    text = GPU_WITH_UNITS + GPU_WITH_UNITS.splitlines()[0] + "\nnot, a, row\n2024/13/99 xx, 0, u, 1, 1, 1\n"
    log = parse_log(write(tmp_path, "g.csv", text))
    assert len(log.rows) == 3
    assert dict(log.bad_rows) == {"wrong_column_count": 1, "bad_timestamp": 1}


def test_unparseable_file_raises_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no nvidia-smi rows"):
        parse_log(write(tmp_path, "x.csv", "hello world\nfoo\n"))
    with pytest.raises(LogError, match="cannot read"):
        parse_log(str(tmp_path / "missing.csv"))


def test_replay_sampler_joins_processes_to_devices(tmp_path: Path) -> None:
    logs = [parse_log(write(tmp_path, "g.csv", GPU_WITH_UNITS)), parse_log(write(tmp_path, "a.csv", APPS))]
    s = ReplaySampler(logs)
    snap = s.sample()
    assert [d.gpu for d in snap.devices] == ["0"]
    assert sorted(p.pid for p in snap.devices[0].processes or []) == [4242, 4243]
    comp = build(GpuConfig(backend="replay", replay={"files": [logs[0].path, logs[1].path]},
                           resolve_containers=False), ComponentContext())
    comp.tick()
    st = comp.status()
    assert st["backend"] == "replay" and st["memory_info_version"] == "nvidia-smi"
    assert {p["pid"] for p in st["devices"][0]["processes"]} == {4242, 4243}


def leaking_logs(tmp: Path, seconds: int = 3600, leak_mib_per_s: float = 1.0, onset: int = 1200,
                 units: bool = True) -> tuple[str, str]:
    """An hour of 1 s samples: device flat at 30 GiB, pid 4242 leaking after ``onset``."""
    t0 = datetime(2024, 1, 31, 12, 0, 0)
    u = " MiB" if units else ""
    g = ["timestamp, index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]"]
    a = ["timestamp, gpu_uuid, pid, used_gpu_memory [MiB]"]
    for i in range(seconds):
        ts = (t0 + timedelta(seconds=i)).strftime("%Y/%m/%d %H:%M:%S.") + "123"
        leak = int(leak_mib_per_s * max(0, i - onset))
        used = 30720 + (i * 7919 % 5)  # a little noise
        g.append(f"{ts}, 0, {UUID}, 81559{u}, {used}{u}, {81559 - used}{u}")
        a.append(f"{ts}, {UUID}, 4242, {20480 + leak}{u}")
        a.append(f"{ts}, {UUID}, 4243, {1024 + (i % 3) * 2}{u}")
    return write(tmp, "gpu.csv", "\n".join(g) + "\n"), write(tmp, "apps.csv", "\n".join(a) + "\n")


def test_analyze_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = leaking_logs(tmp_path)
    assert main(["gpu", "analyze", g, a, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    res = {(r["device"], r["pid"]): r for r in out["results"]}
    # Process rows name the device by the index the GPU log joins to their UUID.
    assert set(res) == {("0", None), ("0", 4242), ("0", 4243)}
    assert {r["uuid"] for r in out["results"]} == {UUID}
    for r in out["results"]:
        assert set(r) >= {"device", "pid", "verdict", "leak_rate_bytes_per_s", "time_to_oom_s", "detected_at"}
        assert r["verdict"] in ("leak", "no_leak", "insufficient_data")
    leak = res[("0", 4242)]
    assert leak["verdict"] == "leak"
    assert leak["leak_rate_bytes_per_s"] == pytest.approx(2**20, rel=0.05)
    # Detected within 15 minutes of the onset at 12:20:00, stamped with the log's own timestamp.
    det = datetime.strptime(leak["detected_at"], "%Y/%m/%d %H:%M:%S.%f")
    assert datetime(2024, 1, 31, 12, 20) < det <= datetime(2024, 1, 31, 12, 35)
    free = (81559 - 30720 - 4) * 2**20
    assert leak["time_to_oom_s"] == pytest.approx(free / leak["leak_rate_bytes_per_s"], rel=0.01)
    assert res[("0", None)]["verdict"] == "no_leak" and res[("0", None)]["detected_at"] is None
    assert res[("0", 4243)]["verdict"] == "no_leak" and res[("0", 4243)]["time_to_oom_s"] is None


def restart_logs(tmp: Path) -> tuple[str, str]:
    """Two hours at 5 s: pid 4242 leaks 2 MiB/s from 12:20 until a restart at 13:00 replaces it by pid 4300."""
    t0 = datetime(2024, 1, 31, 12, 0, 0)
    g = ["timestamp, index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]"]
    a = ["timestamp, gpu_uuid, pid, used_gpu_memory [MiB]"]
    for i in range(0, 7200, 5):
        ts = (t0 + timedelta(seconds=i)).strftime("%Y/%m/%d %H:%M:%S.") + "000"
        saw = (i % 90) * 8  # a 720 MiB allocator sawtooth with a 90 s period
        if i < 3600:
            proc, pid = 20480 + saw + 2 * max(0, i - 1200), 4242
        else:
            proc, pid = 20480 + saw, 4300
        used = 1024 + proc
        g.append(f"{ts}, 0, {UUID}, 81559 MiB, {used} MiB, {81559 - used} MiB")
        a.append(f"{ts}, {UUID}, {pid}, {proc} MiB")
    return write(tmp, "gpu.csv", "\n".join(g) + "\n"), write(tmp, "apps.csv", "\n".join(a) + "\n")


def test_analyze_lists_an_episode_that_a_restart_ended(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = restart_logs(tmp_path)
    assert main(["gpu", "analyze", g, a, "--json"]) == 0
    res = {(r["device"], r["pid"]): r for r in json.loads(capsys.readouterr().out)["results"]}
    fmt = "%Y/%m/%d %H:%M:%S.%f"
    # The device is judged on the memory no process accounts for (as the live sidecar judges it): the
    # process's leak is reported once, in the process's row, not again with a false "released" at the restart.
    dev = res[("0", None)]
    assert dev["series"] == "nvml_unattributed" and dev["verdict"] == "no_leak" and dev["episodes"] == []
    # The leaking process vanished from the log with the restart: its episode ends with its last row, it
    # keeps its last episode's verdict with ``ended``, and it has no time to OOM any more.
    old = res[("0", 4242)]
    assert old["verdict"] == "leak" and old["ended"] == "2024/01/31 12:59:55.000"
    assert old["time_to_oom_s"] is None and old["device_time_to_oom_s"] is None
    assert [e["end"] for e in old["episodes"]] == ["series_ended"]
    ep = old["episodes"][0]
    assert ep["cleared_at"] == "2024/01/31 12:59:55.000" and old["detected_at"] == ep["detected_at"]
    onset, det = datetime.strptime(ep["onset_estimate"], fmt), datetime.strptime(ep["detected_at"], fmt)
    assert datetime(2024, 1, 31, 12, 15) <= onset <= datetime(2024, 1, 31, 12, 25)
    assert datetime(2024, 1, 31, 12, 20) < det <= datetime(2024, 1, 31, 12, 35)
    assert ep["rate_bytes_per_s"] == pytest.approx(2 * 2**20, rel=0.2)
    lo, hi = ep["rate_ci_bytes_per_s"]
    assert lo <= ep["rate_bytes_per_s"] <= hi and ep["kind"] is None
    assert res[("0", 4300)]["ended"] is None
    assert res[("0", 4300)]["episodes"] == []


def test_analyze_short_log_is_insufficient_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = write(tmp_path, "g.csv", GPU_WITH_UNITS)
    assert main(["gpu", "analyze", g, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["results"][0]
    assert r["verdict"] == "insufficient_data" and r["leak_rate_bytes_per_s"] is None


def test_analyze_window_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = leaking_logs(tmp_path, seconds=1500, onset=300, units=False)
    assert main(["gpu", "analyze", a, "--json", "--window", "480:10", "--warmup", "0"]) == 0
    res = {r["pid"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert res[4242]["verdict"] == "leak"
    assert main(["gpu", "analyze", a, "--window", "abc"]) == 2
    assert "--window" in capsys.readouterr().err


def test_analyze_text_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = leaking_logs(tmp_path)
    assert main(["gpu", "analyze", g, a]) == 0
    out = capsys.readouterr().out
    assert "4242" in out and "leak" in out and "Leak episodes" in out and "still leaking" in out


def test_analyze_unreadable_file_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu", "analyze", str(tmp_path / "nope.csv")]) == 1
    assert "cannot read" in capsys.readouterr().err
    bad = write(tmp_path, "bad.csv", "\x00\x01garbage\n")
    assert main(["gpu", "analyze", bad, "--json"]) == 1
    assert "no nvidia-smi rows" in capsys.readouterr().err


def test_analyze_as_a_real_subprocess(tmp_path: Path) -> None:
    g, a = leaking_logs(tmp_path, seconds=1500, onset=300)
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    p = subprocess.run([sys.executable, "-m", "inferwatch_sidecar.cli", "gpu", "analyze", a, "--json",
                        "--window", "480:10", "--warmup", "0", "--progress", "always"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    res = {r["pid"]: r for r in json.loads(p.stdout)["results"]}
    assert res[4242]["verdict"] == "leak" and res[4243]["verdict"] == "no_leak"
    p2 = subprocess.run([sys.executable, "-m", "inferwatch_sidecar.cli", "gpu", "analyze", str(tmp_path / "x")],
                        capture_output=True, text=True, timeout=60)
    assert p2.returncode == 1 and "cannot read" in p2.stderr


def test_analyze_reports_progress_up_to_the_total_size(tmp_path: Path) -> None:
    from inferwatch_sidecar.components.gpu.analysis import analyze

    g, a = leaking_logs(tmp_path, seconds=6000)
    seen: list[int] = []
    out = analyze([g, a], progress=seen.append)
    total = os.path.getsize(g) + os.path.getsize(a)
    assert seen == sorted(seen) and seen[-1] == total and len(seen) > 2
    assert [f["rows"] for f in out["files"]] == [6000, 12000]

"""``gpu analyze`` with allocator files beside nvidia-smi logs: allocator first, and each episode's cause named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.gpu.allocator_log import CAUSES, is_allocator_log, parse_allocator_log
from inferwatch_sidecar.components.gpu.analysis import analyze, stamp
from inferwatch_sidecar.components.gpu.replay import LogError

UUID = "GPU-5d1c4e2a-7f3b-11ee-b962-0242ac120002"
MiB = 2**20
T0 = 1706702400.0


def scenario(tmp: Path, cause: str, seed: int) -> tuple[str, str]:
    """Three hours at 10 s of one process (pid 4242) with a growth of ``cause`` from hour 1: the NVML log
    and the allocator file."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, 3 * 3600, 10.0)
    rate = rng.uniform(1.5, 4) * 1024 * MiB / 3600
    grow = rate * np.clip(t - 3600, 0, None)
    period = rng.uniform(60, 300)
    cache = rng.uniform(0.3, 1.5) * 1024 * MiB * ((t % period) / period)  # the cache sawtooth
    allocated = rng.uniform(8, 20) * 1024 * MiB + rng.normal(0, 4 * MiB, len(t))
    outside = rng.uniform(300, 900) * MiB + np.zeros(len(t))
    split = np.full(len(t), 50.0 * MiB)
    retries = np.zeros(len(t))
    reserved_extra = np.zeros(len(t))
    if cause == "tensor":
        allocated = allocated + grow
    elif cause in ("allocator_cache", "fragmentation"):
        reserved_extra = grow
        if cause == "fragmentation":
            split = split + 0.6 * grow
            retries = np.floor(np.clip(t - 3600, 0, None) / 600)
    elif cause == "outside_allocator":
        outside = outside + grow
    reserved = allocated + cache + reserved_extra + 64 * MiB
    used = reserved + outside + rng.normal(0, 8 * MiB, len(t))
    apps = ["timestamp, gpu_uuid, pid, used_gpu_memory [MiB]"]
    apps += [f"{stamp(T0 + a)}, {UUID}, 4242, {int(u // MiB)} MiB" for a, u in zip(t, used, strict=True)]
    p_apps = tmp / f"{cause}-apps.csv"
    p_apps.write_text("\n".join(apps) + "\n")
    lines = ["# inferwatch allocator samples"]
    for i, a in enumerate(t):
        lines.append(json.dumps({"t": T0 + a + 0.5, "pid": 4242, "device": 0,
                                 "allocated_bytes": int(max(0, allocated[i])), "reserved_bytes": int(reserved[i]),
                                 "inactive_split_bytes": int(split[i]), "num_alloc_retries": int(retries[i])}))
    p_alloc = tmp / f"{cause}-alloc.jsonl"
    p_alloc.write_text("\n".join(lines) + "\n")
    return str(p_apps), str(p_alloc)


@pytest.mark.parametrize(("cause", "seed"), [("tensor", 1), ("allocator_cache", 2), ("fragmentation", 3),
                                             ("outside_allocator", 4), ("tensor", 5), ("outside_allocator", 6)])
def test_each_episode_names_its_cause(tmp_path: Path, cause: str, seed: int) -> None:
    apps, alloc = scenario(tmp_path, cause, seed)
    res = analyze([apps, alloc])
    nvml = [r for r in res["results"] if r["series"] == "nvml" and r["pid"] == 4242]
    assert len(nvml) == 1 and nvml[0]["episodes"], "the NVML series must show the leak"
    assert [e["kind"] for e in nvml[0]["episodes"]] == [cause] * len(nvml[0]["episodes"])
    # Allocator first: the allocated floor carries a tensor leak (and only a tensor leak).
    al = [r for r in res["results"] if r["series"] == "allocator_allocated"]
    assert len(al) == 1 and al[0]["pid"] == 4242
    if cause == "tensor":
        assert al[0]["episodes"] and all(e["kind"] == "tensor" for e in al[0]["episodes"])
    else:
        assert al[0]["episodes"] == []
    assert sorted(f["kind"] for f in res["files"])[0] == "allocator" and len(res["files"]) == 2


def test_without_allocator_data_kind_is_none(tmp_path: Path) -> None:
    apps, _ = scenario(tmp_path, "tensor", 3)
    res = analyze([apps])
    eps = [e for r in res["results"] for e in r["episodes"]]
    assert eps and all(e["kind"] is None for e in eps)


def test_allocator_file_format_errors_are_counted_and_an_empty_one_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"t": 1.0, "pid": 1, "device": 0, "allocated_bytes": 5, "reserved_bytes": 9}\n'
                 'not json\n[1, 2]\n{"t": 2.0, "pid": "x", "allocated_bytes": 5, "reserved_bytes": 9}\n'
                 '{"t": 3.0, "pid": 1, "allocated_bytes": -5, "reserved_bytes": 9}\n\n')
    assert is_allocator_log(str(p))
    log = parse_allocator_log(str(p))
    assert len(log.rows) == 1 and log.rows[0].reserved == 9 and log.rows[0].split == 0
    assert dict(log.bad_rows) == {"not_json": 1, "not_an_object": 1, "bad_pid": 1, "bad_allocated_bytes": 1}
    q = tmp_path / "b.jsonl"
    q.write_text("{}\n")
    with pytest.raises(LogError, match="no allocator sample"):
        parse_allocator_log(str(q))
    assert set(CAUSES) >= {"tensor", "allocator_cache", "fragmentation", "outside_allocator"}


def test_cli_json_lists_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    apps, alloc = scenario(tmp_path, "fragmentation", 4)
    assert main(["gpu", "analyze", "--json", apps, alloc]) == 0
    out = json.loads(capsys.readouterr().out)
    kinds = [e["kind"] for r in out["results"] if r["series"] == "nvml" for e in r["episodes"]]
    assert kinds and set(kinds) == {"fragmentation"}
    assert main(["gpu", "analyze", apps, alloc]) == 0
    assert "fragmentation" in capsys.readouterr().out


def test_a_leak_on_one_of_two_gpus_in_one_jittered_log_with_missing_rows(tmp_path: Path) -> None:
    """One nvidia-smi GPU log of two devices, sampled every 5 s +- 1.5 s with 4% of the passes missing:
    the leaking device (2 GiB/h from minute 60 under a 90 s sawtooth) is found within 15 minutes, the
    other stays quiet."""
    rng = np.random.default_rng(11)
    rows = ["timestamp, index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]"]
    onset, rate = 3600.0, 2 * 1024 * MiB / 3600
    t = 0.0
    while t < 2 * 3600:
        t += 5 + rng.uniform(-1.5, 1.5)
        if rng.random() < 0.04:
            continue
        for g in (0, 1):
            v = 30 * 1024 * MiB + 800 * MiB * ((t + 17 * g) % 90) / 90 + rng.normal(0, 20 * MiB)
            v += rate * max(0.0, t - onset) if g == 1 else 0.0
            used = int(v // MiB)
            rows.append(f"{stamp(T0 + t + 0.003 * g)}, {g}, GPU-{g:08d}-aaaa-bbbb-cccc-000000000000, 81559 MiB, "
                        f"{used} MiB, {81559 - used} MiB")
    p = tmp_path / "two.csv"
    p.write_text("\n".join(rows) + "\n")
    res = analyze([str(p)])
    by_dev = {r["device"]: r for r in res["results"]}
    assert by_dev["0"]["episodes"] == []
    eps = by_dev["1"]["episodes"]
    assert len(eps) == 1 and eps[0]["kind"] is None
    assert stamp(T0 + onset) <= eps[0]["detected_at"] <= stamp(T0 + onset + 15 * 60)


def test_episodes_show_the_sites_captured_during_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Site lines (the probe's second stage) beside the samples: each episode of the process shows the newest
    capture taken during it; a capture long before the onset, or of another process, is not shown."""
    apps, alloc = scenario(tmp_path, "tensor", 7)
    leak = {"file": "/srv/app/cache.py", "line": 42, "function": "remember", "bytes": 900 * MiB, "count": 30}
    lines = [
        {"t": T0 + 600.0, "pid": 4242, "device": 0, "sites": [{**leak, "file": "/srv/app/warm.py", "line": 3}]},
        {"t": T0 + 7200.0, "pid": 4242, "device": 0,
         "sites": [{"file": "/srv/app/model.py", "line": 17, "function": "forward", "bytes": 64 * MiB, "count": 2},
                   leak]},
        {"t": T0 + 7300.0, "pid": 99, "device": 0, "sites": [leak]},
        {"t": T0 + 7400.0, "pid": 4242, "device": 0, "sites": [{"file": "x.py", "line": -4}]},
        {"t": T0 + 7500.0, "pid": 4242, "device": 0, "sites": "everywhere"},
    ]
    sites_file = tmp_path / "sites.jsonl"
    sites_file.write_text("".join(json.dumps(d) + "\n" for d in lines))
    log = parse_allocator_log(str(sites_file))  # captures alone make a valid file
    assert log.rows == [] and log.captures == 3 and dict(log.bad_rows) == {"bad_sites": 2}
    assert main(["gpu", "analyze", "--json", apps, alloc, str(sites_file)]) == 0
    out = json.loads(capsys.readouterr().out)
    want = {"captured_at": T0 + 7200.0, "sites": [leak, {"file": "/srv/app/model.py", "line": 17,
                                                        "function": "forward", "bytes": 64 * MiB, "count": 2}]}
    for series in ("nvml", "allocator_allocated"):
        (r,) = [r for r in out["results"] if r["series"] == series and r["pid"] == 4242]
        assert r["episodes"] and r["episodes"][-1]["sites"] == want, series
    assert main(["gpu", "analyze", apps, alloc, str(sites_file)]) == 0
    text = capsys.readouterr().out
    assert "Allocation sites" in text and "/srv/app/cache.py:42 (remember)" in text and "warm.py" not in text
    # Without site lines the key is there, empty.
    res = analyze([apps, alloc])
    assert all(e["sites"] is None for r in res["results"] if r["pid"] is not None for e in r["episodes"])

"""``gpu analyze``: device names on process rows, the device-wide time to OOM, duplicates and ``--plot``."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from inferwatch_sidecar.cli import main
from inferwatch_sidecar.components.gpu import plot

UUID = "GPU-5d1c4e2a-7f3b-11ee-b962-0242ac120002"
NAME = "NVIDIA H100 80GB HBM3"
MiB = 2**20
TOTAL = 81559


def logs(tmp: Path, procs: dict[int, object], seconds: int = 5400, step: int = 5,
         row_ms: int = 0) -> tuple[str, str]:
    """A GPU log with the device name and a compute-apps log; ``procs`` maps pid -> f(second) in MiB.

    ``row_ms``: each compute-apps row of a pass is stamped this many milliseconds after the one before, as
    nvidia-smi does.
    """
    t0 = datetime(2024, 1, 31, 12, 0, 0)
    g = ["timestamp, index, name, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]"]
    a = ["timestamp, gpu_uuid, pid, used_gpu_memory [MiB]"]

    def ts(i: int, ms: int = 0) -> str:
        return (t0 + timedelta(seconds=i, milliseconds=ms)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    for i in range(0, seconds, step):
        vals = {pid: int(f(i)) for pid, f in procs.items()}  # type: ignore[operator]
        used = 1024 + sum(vals.values())
        g.append(f"{ts(i)}, 0, {NAME}, {UUID}, {TOTAL} MiB, {used} MiB, {TOTAL - used} MiB")
        a += [f"{ts(i, k * row_ms)}, {UUID}, {pid}, {v} MiB" for k, (pid, v) in enumerate(vals.items())]
    (tmp / "gpu.csv").write_text("\n".join(g) + "\n")
    (tmp / "apps.csv").write_text("\n".join(a) + "\n")
    return str(tmp / "gpu.csv"), str(tmp / "apps.csv")


def two_growing(tmp: Path) -> tuple[str, str]:
    """pid 4242 grows 1 MiB/s from 12:20, pid 4243 0.5 MiB/s from 12:30, pid 4244 stays flat."""
    return logs(tmp, {
        4242: lambda i: 20480 + 1.0 * max(0, i - 1200) + i * 7919 % 7,
        4243: lambda i: 10240 + 0.5 * max(0, i - 1800) + i * 104729 % 5,
        4244: lambda i: 4096 + (i % 3) * 2,
    })


def analyze_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["gpu", "analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_device_time_to_oom_sums_the_rates_of_every_growing_process(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = two_growing(tmp_path)
    out = analyze_json(capsys, g, a)
    res = {r["pid"]: r for r in out["results"]}
    r1, r2 = res[4242]["leak_rate_bytes_per_s"], res[4243]["leak_rate_bytes_per_s"]
    assert res[4242]["verdict"] == res[4243]["verdict"] == "leak" and res[4244]["verdict"] == "no_leak"
    assert r1 == pytest.approx(MiB, rel=0.05) and r2 == pytest.approx(0.5 * MiB, rel=0.05)
    last = (tmp_path / "gpu.csv").read_text().splitlines()[-1].split(", ")
    free = int(last[-1].split()[0]) * MiB
    for pid in (4242, 4243, 4244, None):
        assert res[pid]["device_time_to_oom_s"] == pytest.approx(free / (r1 + r2), rel=1e-12), pid
    assert res[None]["series"] == "nvml_unattributed" and res[None]["verdict"] == "no_leak"
    # Against the true rates (1.5 MiB/s together), within the rates' precision.
    assert res[4242]["device_time_to_oom_s"] == pytest.approx(free / (1.5 * MiB), rel=0.05)
    # Each process's own figure stays beside it: its free memory over its own rate, later than the device's.
    assert res[4242]["time_to_oom_s"] == pytest.approx(free / r1, rel=1e-12)
    assert res[4243]["time_to_oom_s"] == pytest.approx(free / r2, rel=1e-12)
    assert res[4244]["time_to_oom_s"] is None


def test_process_rows_carry_the_device_index_and_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = two_growing(tmp_path)
    out = analyze_json(capsys, g, a)
    for r in out["results"]:
        assert (r["device"], r["name"], r["uuid"]) == ("0", NAME, UUID), r["pid"]
    assert main(["gpu", "analyze", g, a]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if "4243" in line]
    assert rows and all(f"0 {NAME}" in line for line in rows)
    assert "GPU-5d1c" not in text and "device OOM (all" in text


def test_compute_apps_log_alone_names_the_device_by_its_whole_uuid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _g, a = two_growing(tmp_path)
    out = analyze_json(capsys, a)
    assert {(r["device"], r["name"]) for r in out["results"]} == {(UUID, None)}
    assert all(r["device_time_to_oom_s"] is None for r in out["results"])  # no free memory without a GPU log


def test_gpu_log_without_the_name_column_and_noheader_with_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    g, a = two_growing(tmp_path)
    lines = Path(g).read_text().splitlines()
    (tmp_path / "noheader.csv").write_text("\n".join(lines[1:]) + "\n")
    out = analyze_json(capsys, str(tmp_path / "noheader.csv"), a)
    assert {r["name"] for r in out["results"]} == {NAME}
    unnamed = [", ".join(c for k, c in enumerate(line.split(", ")) if k != 2) for line in lines]
    (tmp_path / "unnamed.csv").write_text("\n".join(unnamed) + "\n")
    out = analyze_json(capsys, str(tmp_path / "unnamed.csv"), a)
    assert {(r["device"], r["name"]) for r in out["results"]} == {("0", None)}


def four_workers(tmp: Path, sizes: tuple[int, ...] = (14336, 14400, 14300, 14350), grow: int | None = None,
                 seconds: int = 1800, step: int = 5, row_ms: int = 0) -> tuple[str, str]:
    """gunicorn with four workers loading one model: each loads for 60 s, then holds its size (MiB); worker
    ``grow`` keeps growing by 4 MiB/s after loading (1.2 GiB per 5 minutes, over 5% of its size)."""
    def worker(size: int, k: int) -> object:
        def f(i: int) -> float:
            v = size * min(1.0, i / 60) + (i * (7 + k) % 9)
            return v + (4.0 * max(0, i - 60) if k == grow else 0.0)
        return f
    return logs(tmp, {5000 + k: worker(s, k) for k, s in enumerate(sizes)}, seconds=seconds, step=step,
                row_ms=row_ms)


def test_analyze_reports_duplicated_model_copies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = four_workers(tmp_path)
    out = analyze_json(capsys, g, a)
    [dup] = out["duplicate_model_copies"]
    assert dup["device"] == "0" and dup["name"] == NAME and dup["uuid"] == UUID
    assert dup["copies"] == 4 and dup["pids"] == [5000, 5001, 5002, 5003]
    assert dup["copy_bytes"] == min(dup["used_bytes"])
    assert dup["extra_bytes"] == sum(dup["used_bytes"]) - min(dup["used_bytes"])
    assert dup["extra_bytes"] == pytest.approx((14336 + 14400 + 14350) * MiB, rel=0.002)
    # Loaded at 12:01, flat for flat_s (5 min) afterwards: found from 12:06, still there at the end.
    assert "2024/01/31 12:06:00" <= dup["first_seen"] <= "2024/01/31 12:06:30"
    assert dup["at_end"] is True and "Triton" in dup["fix"]
    assert main(["gpu", "analyze", g, a]) == 0
    text = capsys.readouterr().out
    assert "Duplicated model copies" in text and "5000 5001 5002 5003" in text


@pytest.mark.parametrize("step", [1, 10, 20, 60])
def test_analyze_finds_copies_whose_rows_are_stamped_apart_at_any_sampling_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], step: int) -> None:
    # 7 ms between rows of one pass: the four rows span 21 ms, and the next pass starts ``step`` s later.
    g, a = four_workers(tmp_path, step=step, row_ms=7)
    [dup] = analyze_json(capsys, g, a)["duplicate_model_copies"]
    assert dup["copies"] == 4 and dup["pids"] == [5000, 5001, 5002, 5003]
    assert dup["extra_bytes"] == pytest.approx((14336 + 14400 + 14350) * MiB, rel=0.002)
    # Loaded at 12:01 and flat for flat_s (5 min): found within a sample and a judging step (15 s) of 12:06.
    latest = datetime(2024, 1, 31, 12, 6, 0) + timedelta(seconds=step + 15)
    assert "2024/01/31 12:06:00" <= dup["first_seen"] <= latest.strftime("%Y/%m/%d %H:%M:%S.999")
    assert dup["at_end"] is True


def test_analyze_finds_no_copies_of_different_sizes_and_skips_a_growing_worker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = four_workers(tmp_path, sizes=(4096, 8192, 12288, 16384))
    assert analyze_json(capsys, g, a)["duplicate_model_copies"] == []
    g, a = four_workers(tmp_path, grow=2)
    [dup] = analyze_json(capsys, g, a)["duplicate_model_copies"]
    assert dup["pids"] == [5000, 5001, 5003] and dup["copies"] == 3  # 5002 is never flat


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def test_plot_html_draws_one_titled_panel_per_series(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = two_growing(tmp_path)
    out = tmp_path / "leaks.html"
    assert main(["gpu", "analyze", g, a, "--plot", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    labels = [f"GPU 0 ({NAME})", *(f"GPU 0 ({NAME}) pid {p}" for p in (4242, 4243, 4244))]
    assert page.count("<svg ") == 4
    for label in labels:
        assert f'data-series="{label}"' in page and f"<h2>{label}</h2>" in page
    panels = page.split('<section class="series">')[1:]
    assert [p.count('class="release floor"') for p in panels] == [1, 1, 1, 1]
    assert [p.count('class="trend"') for p in panels] == [1, 1, 1, 1]
    # Detection points: one per episode (4242, 4243 leak; 4244 does not; the device is judged on the memory
    # no process accounts for, which is flat: the processes' leaks are not reported twice).
    assert [p.count('<circle class="detected"') for p in panels] == [0, 1, 1, 0]
    # The projected OOM (7.4 h after a 1.5 h log) lies beyond the plot: named in the notes instead.
    assert "device OOM (all growing processes): 2024/01/31 2" in panels[0] and "beyond the plot" in panels[0]
    assert "judged on the memory no process accounts for" in panels[0]
    assert "device OOM (all growing processes)" in panels[3]
    # The strict policy of every inferwatch page (export/htmlsafe.py): no script may run, nothing loads.
    meta = page.split("<head>", 1)[1].split(">", 1)[0]
    assert meta.startswith('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; script-src \'none\';')
    assert "<script" not in page and "frame-ancestors 'none'" in meta and "unsafe-eval" not in meta


def test_plot_marks_a_projected_oom_within_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 46.9 GiB leaking 8 MiB/s from 12:20: 14 GiB free at 13:00, the device is full 30 minutes later.
    g, a = logs(tmp_path, {4242: lambda i: 46900 + 8 * max(0, i - 1200) + (i % 120) * 4}, seconds=3600)
    out = tmp_path / "oom.html"
    assert main(["gpu", "analyze", g, a, "--plot", str(out)]) == 0
    page = out.read_text()
    proc = page.split(f"<h2>GPU 0 ({NAME}) pid 4242</h2>")[1]
    assert proc.count('<line class="projected OOM"') == 1 and 'class="projected trend"' in proc
    assert 'class="memory full"' in proc and "beyond the plot" not in proc
    assert "projected OOM: 2024/01/31 13:2" in proc or "projected OOM: 2024/01/31 13:3" in proc


def test_plot_png_is_a_png_with_one_panel_per_series(tmp_path: Path) -> None:
    g, a = two_growing(tmp_path)
    out = tmp_path / "leaks.png"
    assert main(["gpu", "analyze", g, a, "--plot", str(out)]) == 0
    panels = 4
    assert png_size(out) == (plot.PNG_WIDTH_IN * plot.PNG_DPI,
                             (plot.PNG_HEAD_IN + plot.PNG_PANEL_IN * panels) * plot.PNG_DPI)
    g1 = tmp_path / "one"
    g1.mkdir()
    _g, a1 = logs(g1, {4242: lambda i: 20480.0}, seconds=600)
    assert main(["gpu", "analyze", a1, "--plot", str(g1 / "one.png")]) == 0
    assert png_size(g1 / "one.png")[1] == (plot.PNG_HEAD_IN + plot.PNG_PANEL_IN) * plot.PNG_DPI


def test_plot_png_without_matplotlib_fails_before_reading_the_logs(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from inferwatch_sidecar.cli import main\n"
            f"sys.exit(main(['gpu', 'analyze', {str(tmp_path / 'missing.csv')!r}, '--plot', "
            f"{str(tmp_path / 'x.png')!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert 'pip install "inferwatch[plot]"' in p.stderr and "FILE.html" in p.stderr
    assert not (tmp_path / "x.png").exists()


def test_plot_bad_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g, a = two_growing(tmp_path)
    assert main(["gpu", "analyze", g, "--plot", str(tmp_path / "x.svg")]) == 2
    assert "must end in .png or .html" in capsys.readouterr().err
    assert main(["gpu", "analyze", g, "--plot", str(tmp_path / "no" / "dir" / "x.html")]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_release_floor_is_the_lowest_sample_of_each_release() -> None:
    # A 2 GiB saw with a 120 s period on a floor climbing 1 MiB/s, sampled every second for 2 hours.
    t = [float(i) for i in range(7200)]
    v = [10 * 2**30 + MiB * i + (i % 120) / 120 * 2 * 2**30 for i in range(7200)]
    xs, ys = plot.release_floor(t, v)
    assert xs == [float(i) for i in range(120, 7200, 120)]  # every release, at its lowest sample
    assert ys == [10 * 2**30 + MiB * x for x in xs]
    # Without releases (a flat series, or growth without a sawtooth) it is the lower envelope: the lowest of
    # each 7.2 s bucket.
    flat_t = [float(i) for i in range(7200)]
    xs, ys = plot.release_floor(flat_t, [5 * 2**30 + (i % 3) * MiB for i in range(len(flat_t))])
    assert len(xs) <= plot.BUCKETS + 2 and set(ys) == {5 * 2**30}


def test_plot_draws_at_most_max_panels_leaking_and_fastest_growing_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 28 processes: 3 leak from 12:10 (1, 2 and 0.5 MiB/s), 25 hold 1 to 25 GiB with noise. With the device,
    # 29 series: 5 more than a plot draws.
    procs: dict[int, object] = {
        6000 + k: (lambda i, r=r: 8192 + r * max(0, i - 600) + i * 7919 % 7) for k, r in enumerate((1.0, 2.0, 0.5))}
    procs |= {6100 + k: (lambda i, k=k: 1024 * (k + 1) + i * (104729 + k) % 5) for k in range(25)}
    g, a = logs(tmp_path, procs, seconds=3600)
    results = analyze_json(capsys, g, a)["results"]
    assert len(results) == 29 and plot.MAX_PANELS == 24
    out = tmp_path / "many.html"
    assert main(["gpu", "analyze", g, a, "--plot", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"--plot {out}: 5 more series left out: 24 panels at most, the leaking ones first" in err, err
    page = out.read_text()
    assert page.count("<svg ") == 24 and "5 more series left out" in page
    drawn = {f"GPU 0 ({NAME})" + ("" if r["pid"] is None else f" pid {r['pid']}"): r for r in results}
    shown = [label for label in drawn if f'data-series="{label}"' in page]
    left = page.split('<section class="left-out"><h2>Left out (5)</h2><ul>')[1].split("</ul>")[0]
    left_labels = [li.removesuffix("</li>") for li in left.split("<li>")[1:]]
    assert len(shown) == 24 and len(left_labels) == 5 and set(shown) | set(left_labels) == set(drawn)
    for pid in (6000, 6001, 6002):
        assert f"GPU 0 ({NAME}) pid {pid}" in shown
    # Every series left out is quiet and grows no faster than any quiet series drawn.
    quiet_shown = [drawn[label]["leak_rate_bytes_per_s"] for label in shown if drawn[label]["verdict"] != "leak"]
    assert all(drawn[label]["verdict"] != "leak" for label in left_labels)
    assert max(drawn[label]["leak_rate_bytes_per_s"] for label in left_labels) <= min(quiet_shown)

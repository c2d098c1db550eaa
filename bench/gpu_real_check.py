"""Real-GPU check (needs an NVIDIA GPU, nvidia-ml-py and torch): NVML sampling, leak verdict, copies.

Starts a PyTorch child process that leaks 64 MiB per second for two minutes and
two "worker" children that each hold the same 2 GiB for the whole run (one model
loaded twice), runs the gpu component on the real ``pynvml`` next to them (1 s
interval, a short detector scale and a 30 s flatness window so two minutes are
enough), feeds it the leaking child's allocator stats the way the SDK's torch
probe would, and prints the per-process series, the verdict, the classification
(expected: tensor), the device-wide time to OOM (free memory over the summed
rates of the leaking processes) beside the process's own, and the duplicated
copies figure (expected: the two workers, 2 copies, about 2 GiB beyond one).

Then two checks of the allocator-first path: the leaking child's allocator samples, written as an
allocator file (``$OUT/allocator.jsonl``, the format of docs/gpu.md), go through ``gpu analyze``
(expected: an episode on the allocated floor, kind tensor); and the torch probe's second stage
(``inferwatch._torch.HistoryCapture``) records a child's memory history for 5 s on the real
``torch.cuda.memory._record_memory_history`` / ``_snapshot`` while it leaks from one line and
frees its temporaries: the top site must be that line. Nothing needs GPM (the GPU performance
monitoring counters that MIG slices and older boards lack): NVML memory info, the process list and
torch's allocator are all it reads.

Last, the GPM check (``--gpm-only`` runs it alone, about 40 s): a bandwidth-bound GEMV child and a
compute-bound GEMM child in turn, sampled through ``components/gpu/gpm.py`` on the real nvidia-ml-py;
the first must read higher DRAM bandwidth and lower SM occupancy and tensor activity than the second
(``$OUT/gpm_check.json`` holds the figures, the saturation ratios and the sampler's CPU per pass).

Usage (on the GPU machine, from the repository root):
    python bench/gpu_real_check.py [--seconds 120] [--out DIR] [--history-only] [--gpm-only]

Not run in CI: this project's CI has no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

CHILD = r"""
import json, sys, time, torch
keep = []
t_end = time.time() + float(sys.argv[1])
torch.cuda.init()
while time.time() < t_end:
    keep.append(torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"))  # the leak: 64 MiB/s
    s = torch.cuda.memory_stats()
    print(json.dumps([time.time_ns(), torch.cuda.current_device(), s.get("allocated_bytes.all.current", 0),
                      s.get("reserved_bytes.all.current", 0), s.get("active_bytes.all.current", 0),
                      s.get("inactive_split_bytes.all.current", 0), s.get("num_alloc_retries", 0),
                      s.get("num_ooms", 0)]), flush=True)
    time.sleep(1.0)
"""

#: A worker holding one copy of a "model" (2 GiB) until killed.
HOLDER = r"""
import sys, time, torch
weights = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("loaded", flush=True)
time.sleep(float(sys.argv[1]))
"""

#: The second stage on a real allocator: leak from one marked line, free temporaries elsewhere.
HISTORY_CHILD = r"""
import json, sys, time, torch
from inferwatch._torch import HistoryCapture
torch.cuda.init()
torch.empty(1, device="cuda")
cap = HistoryCapture(seconds=5.0, max_entries=5000, torch_module=torch)
assert cap.start(), cap.last_error
keep = []
t_end = time.monotonic() + 6.0
while time.monotonic() < t_end:
    tmp = torch.empty(8 * 2**20, dtype=torch.uint8, device="cuda")  # freed at the next pass
    keep.append(torch.empty(4 * 2**20, dtype=torch.uint8, device="cuda"))  # LEAK-SITE
    del tmp
    time.sleep(0.05)
    sites = cap.poll()
    if sites is not None:
        break
print(json.dumps({"sites": cap.sites, "state": cap.state, "error": cap.last_error,
                  "leaked_bytes": 4 * 2**20 * len(keep)}), flush=True)
"""


def history_check(out: str) -> bool:
    """Run HISTORY_CHILD; True when the top growing site is its LEAK-SITE line."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "sdk"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", HISTORY_CHILD], capture_output=True, text=True, env=env, timeout=120)
    if r.returncode != 0:
        print("history check: the child failed:", r.stderr[-2000:], file=sys.stderr)
        return False
    got = json.loads(r.stdout.strip().splitlines()[-1])
    line = next(i for i, ln in enumerate(HISTORY_CHILD.splitlines(), start=1) if "LEAK-SITE" in ln)
    with open(os.path.join(out, "gpu_real_history.json"), "w") as f:
        json.dump({"expected_line": line, **got}, f, indent=1)
    top = got["sites"][0] if got["sites"] else None
    print("history sites:", json.dumps(got["sites"][:3]), "state:", got["state"], got["error"])
    ok = top is not None and top["file"] == "<string>" and top["line"] == line
    print("RESULT:", f"second stage named the leaking line {line}" if ok else f"SECOND STAGE MISSED line {line}")
    return ok and sites_to_sidecar(got["sites"], line)


def sites_to_sidecar(sites: list[dict[str, Any]], line: int) -> bool:
    """The real capture's sites as the probe sends them (EV_ALLOC_SITE over the wire) and as the sidecar keeps
    them for /v1/status: the top site must still be the leaking line."""
    from inferwatch._torch import site_events
    from inferwatch.wire import Decoder, Encoder
    from inferwatch_sidecar.components.gpu.sites import SiteCaptures, site_of

    dec = Decoder()
    recs = [r for fr in Encoder(1, 2).encode(site_events(time.time_ns(), sites)) for r in dec.decode(fr).records]
    caps = SiteCaptures()
    for r in recs:
        t_ns, dev, site = site_of(r)
        caps.add(4242, t_ns, dev, site)
    shown = caps.latest(4242)
    ok = bool(shown and shown["sites"] and shown["sites"][0]["line"] == line)
    print("RESULT:", "the sites reach the sidecar's status" if ok else f"SITES LOST ON THE WAY: {shown}")
    return ok


def allocator_file_check(samples: list[list[float]], out: str) -> bool:
    """Write the child's allocator samples as an allocator file and run gpu analyze on it."""
    from inferwatch_sidecar.components.gpu.analysis import analyze
    from inferwatch_sidecar.components.gpu.config import DetectorConfig

    path = os.path.join(out, "allocator.jsonl")
    with open(path, "w") as f:
        for ts, pid, dev, alloc, res, _active, split, retries in samples:
            f.write(json.dumps({"t": ts / 1e9, "pid": int(pid), "device": int(dev), "allocated_bytes": int(alloc),
                                "reserved_bytes": int(res), "inactive_split_bytes": int(split),
                                "num_alloc_retries": int(retries)}) + "\n")
    res = analyze([path], DetectorConfig(scales=[(64.0, 4.0)], confirm_s=8))
    kinds = [e["kind"] for r in res["results"] if r["series"] == "allocator_allocated" for e in r["episodes"]]
    ok = "tensor" in kinds
    print("RESULT:", "allocator file: tensor leak on the allocated floor" if ok else f"ALLOCATOR FILE: kinds {kinds}")
    return ok


GPM_CHILD = r"""
import sys, time, torch
phase, seconds = sys.argv[1], float(sys.argv[2])
dev = torch.device("cuda")
if phase == "decode":   # bandwidth-bound: one pass over a 4 GiB weight per step, batch 1 (GEMV)
    w = torch.randn(32768, 65536, dtype=torch.float16, device=dev)
    x = torch.randn(65536, 1, dtype=torch.float16, device=dev)
else:                   # compute-bound: square GEMMs that reuse every operand many times
    w = torch.randn(8192, 8192, dtype=torch.float16, device=dev)
    x = torch.randn(8192, 8192, dtype=torch.float16, device=dev)
print("READY", flush=True)
t_end = time.time() + seconds
while time.time() < t_end:
    for _ in range(20):
        y = w @ x
    torch.cuda.synchronize()
"""


def gpm_check(out: str, seconds: float = 12.0) -> bool:
    """GPM on the real nvidia-ml-py path: a bandwidth-bound and a compute-bound phase must read as such.

    Expected on Hopper: fidelity gpm; the decode-like phase with DRAM bandwidth above the GEMM phase's and
    SM occupancy / tensor activity below it, while nvidia-smi's utilization is near 100% in both; the
    saturation ratios name memory_bandwidth and compute; the sampler's CPU per pass (for the 2% bar).
    """
    import pynvml

    from inferwatch_sidecar.components.gpu.gpm import GpmSampler
    from inferwatch_sidecar.components.saturation.rules import Inputs, ratios

    s = GpmSampler(pynvml)
    result: dict[str, object] = {}
    ok = True
    for phase in ("decode", "prefill"):
        child = subprocess.Popen([sys.executable, "-c", GPM_CHILD, phase, str(seconds + 4)], stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout is not None
            child.stdout.readline()  # READY
            time.sleep(2.0)
            acts, cpu = [], []
            t_end = time.time() + seconds
            while time.time() < t_end:
                c0 = time.thread_time()
                a, _h = s.sample()
                cpu.append(time.thread_time() - c0)
                acts.extend(x for x in a if x.gpu == "0")
                time.sleep(1.0)
        finally:
            child.kill()
            child.wait()

        def mean(attr: str, acts: list = acts) -> float | None:
            vals = [getattr(x, attr) for x in acts if getattr(x, attr) is not None]
            return sum(vals) / len(vals) if vals else None

        row = {k: mean(k) for k in ("sm_util", "sm_occupancy", "tensor_active", "dram_bw_util", "kernel_active",
                                    "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")}
        row["fidelity"] = sorted({x.fidelity for x in acts})
        row["intervals"] = len(acts)
        row["sampler_cpu_ms_per_pass"] = 1e3 * sorted(cpu)[len(cpu) // 2] if cpu else None
        x = Inputs(t=0, fidelity=acts[-1].fidelity if acts else "none", sm_util=row["sm_util"],  # type: ignore[arg-type]
                   sm_occupancy=row["sm_occupancy"], tensor_active=row["tensor_active"],  # type: ignore[arg-type]
                   dram_bw_util=row["dram_bw_util"], kernel_active=row["kernel_active"])  # type: ignore[arg-type]
        row["ratios"] = ratios(x)
        result[phase] = row
        print(f"GPM {phase}:", json.dumps(row, default=str))
    _a, healths = s.sample()
    result["health"] = [h.__dict__ for h in healths]
    result["faults"] = {f"{op}/{r}": n for (op, r), n in s.faults.items()}
    s.shutdown()
    d, p = result["decode"], result["prefill"]
    assert isinstance(d, dict) and isinstance(p, dict)
    try:
        ok = (d["fidelity"] == ["gpm"] and d["dram_bw_util"] > p["dram_bw_util"]
              and d["sm_occupancy"] < p["sm_occupancy"] and d["tensor_active"] < p["tensor_active"])
    except TypeError:  # a counter missing (None)
        ok = False
    with open(os.path.join(out, "gpm_check.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    print("RESULT:", "GPM tells decode from prefill" if ok else "GPM CHECK FAILED", json.dumps(result["faults"]))
    return ok


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--history-only", action="store_true", help="run the second-stage check alone")
    ap.add_argument("--gpm-only", action="store_true", help="run the GPM check alone (about 40 s)")
    return ap.parse_args()


def start_holders(seconds: float, holders: list[subprocess.Popen[str]]) -> bool:
    """Two processes that each load the same 2 GiB "model" (appended to ``holders``); False: one did not load."""
    for _ in range(2):
        holders.append(subprocess.Popen([sys.executable, "-c", HOLDER, str(seconds + 10)],
                                        stdout=subprocess.PIPE, text=True))
    for h in holders:
        assert h.stdout is not None
        # "loaded": both copies are on the device before the leak starts.
        if h.stdout.readline().strip() != "loaded":
            print(f"gpu_real_check: holder {h.pid} exited ({h.wait()}) before loading its 2 GiB", file=sys.stderr)
            return False
    return True


def follow_child(comp: Any, child: subprocess.Popen[str], series: list[tuple[Any, ...]],
                 alloc_samples: list[list[float]]) -> None:
    """Hand the leaking child's allocator samples to the component and log its verdict after each one."""
    from inferwatch.wire import EV_ALLOC

    assert child.stdout is not None
    for line in child.stdout:
        ts, dev, alloc, res, active, split, retries, ooms = json.loads(line)
        alloc_samples.append([ts, child.pid, dev, alloc, res, active, split, retries])
        comp.handle(child.pid, 1, [(EV_ALLOC, ts, dev, alloc, res, active, split, retries, ooms, 0)])
        st = comp.status()
        procs = [p for d in st["devices"] for p in d["processes"] if p["pid"] == child.pid]
        if procs:
            p = procs[0]
            dup = [c["copies"] for c in st["duplicate_model_copies"]]
            series.append((round(time.time(), 1), p["used_bytes"], p["verdict"], p.get("kind"),
                           p["device_time_to_oom_s"], dup))
            print(f"t={series[-1][0]} pid={child.pid} nvml_used={p['used_bytes'] / 2**20:.0f} MiB "
                  f"allocated={alloc / 2**20:.0f} MiB verdict={p['verdict']} kind={p.get('kind')} "
                  f"rate={(p['rate_bytes_per_s'] or 0) / 2**20:.1f} MiB/s ttoom={p['time_to_oom_s']} "
                  f"device_ttoom={p['device_time_to_oom_s']} duplicate_copies={dup}", flush=True)


def report(st: dict[str, Any], series: list[tuple[Any, ...]], child_pid: int, holder_pids: set[int]) -> bool:
    """Print what the component found; True when the leak, its time to OOM and the duplicate copies were."""
    print(json.dumps({k: st[k] for k in ("backend", "driver_version", "nvml_version", "memory_info_version",
                                         "leaks", "episodes", "duplicate_model_copies", "faults")},
                     indent=1, default=str))
    ok = any(x["pid"] == child_pid and x["kind"] == "tensor" for x in st["leaks"]) or any(
        s[2] == "leak" for s in series)
    ttoom = [s[4] for s in series if s[4] is not None]
    print("RESULT:", "leak detected" if ok else "NO LEAK DETECTED")
    print("device-wide time to OOM (last while leaking):", f"{ttoom[-1]:.0f} s" if ttoom else "none")
    copies = st["duplicate_model_copies"]
    dup_ok = any(holder_pids <= set(c["pids"]) for c in copies)
    for c in copies:
        print(f"duplicate copies on GPU {c['gpu']}: {c['copies']} (pids {c['pids']}), "
              f"{c['extra_bytes'] / 2**30:.2f} GiB beyond one copy")
    print("RESULT:", "duplicate copies found" if dup_ok else f"NO DUPLICATE COPIES FOUND for pids {holder_pids}")
    return bool(ok and dup_ok and ttoom)


def main() -> int:
    args = parse_args()
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("gpu_real_check: torch is not installed (pip install torch with CUDA); nothing was run",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    if args.history_only:
        return 0 if history_check(args.out) else 1
    if args.gpm_only:
        return 0 if gpm_check(args.out) else 1
    from inferwatch_sidecar.components.base import ComponentContext
    from inferwatch_sidecar.components.gpu.component import build
    from inferwatch_sidecar.components.gpu.config import GpuConfig

    cfg = GpuConfig(backend="nvml", interval_s=1.0, detector={"scales": [[64, 4]], "confirm_s": 8},
                    duplicates={"flat_s": 30.0})
    comp = build(cfg, ComponentContext())
    comp.tick()
    first = comp.status()
    if not first["devices"]:
        print("gpu_real_check: NVML gave no devices:", json.dumps(first["faults"], indent=1), file=sys.stderr)
        return 2
    print(f"NVML ok: driver {first['driver_version']}, NVML {first['nvml_version']}, "
          f"memory info {first['memory_info_version']}, devices {[d['name'] for d in first['devices']]}")
    holders: list[subprocess.Popen[str]] = []
    child: subprocess.Popen[str] | None = None
    series: list[tuple[Any, ...]] = []
    alloc_samples: list[list[float]] = []
    try:
        if not start_holders(args.seconds, holders):
            return 2
        comp.start()
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(args.seconds)], stdout=subprocess.PIPE, text=True)
        follow_child(comp, child, series, alloc_samples)
        child.wait()
        time.sleep(1.5)
        st = comp.status()
    finally:
        # Every child goes, whatever failed: each holder keeps 2 GiB of the device while it lives.
        for proc in [*holders, *([child] if child is not None else [])]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        comp.stop(5.0)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_real_check.json"), "w") as f:
        json.dump({"status": st, "series": series}, f, indent=1, default=str)
    assert child is not None
    found = report(st, series, child.pid, {h.pid for h in holders})
    alloc_ok = allocator_file_check(alloc_samples, args.out)
    hist_ok = history_check(args.out)
    gpm_ok = gpm_check(args.out)
    return 0 if found and alloc_ok and hist_ok and gpm_ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""``inferwatch gpu analyze``: run the leak detector over recorded nvidia-smi logs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``inferwatch gpu ...`` to the CLI."""
    p = subparsers.add_parser("gpu", help="GPU memory tools (offline leak analysis of nvidia-smi logs)")
    sub = p.add_subparsers(dest="gpu_command", metavar="GPU_COMMAND")
    a = sub.add_parser(
        "analyze",
        help="detect memory leaks in nvidia-smi CSV logs",
        description=(
            "Run the sidecar's leak detector over logs recorded with\n"
            "  nvidia-smi --query-gpu=timestamp,index,name,uuid,memory.total,memory.used,memory.free "
            "--format=csv -l 1\n"
            "  nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,used_memory --format=csv -l 1\n"
            "and report a verdict and every leak episode per device and per process, the time to OOM\n"
            "(the series' own and the device's, with every growing process together) and duplicated\n"
            "model copies (several processes each holding a similar, large, flat amount).\n"
            "Allocator files (JSON lines of the torch probe's samples: t, pid, device, allocated_bytes,\n"
            "reserved_bytes, inactive_split_bytes, num_alloc_retries; docs/gpu.md) given beside them\n"
            "are judged first (the allocated floor) and name each episode's cause (kind): tensor,\n"
            "allocator_cache, fragmentation, outside_allocator or unknown. Their site lines (t, pid,\n"
            "device, sites: the torch probe's second stage) show the allocation sites whose live bytes\n"
            "grew on the episode they were captured in.\n"
            "Exit status 0 whatever the verdicts; 1 when a file cannot be read or parsed\n"
            "or the plot cannot be written; 2 for bad options (or --plot FILE.png without matplotlib)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument("files", nargs="+", metavar="FILE", help="nvidia-smi CSV logs (GPU and/or compute-apps queries) and allocator JSON-lines files")
    a.add_argument("--json", action="store_true", help="print one JSON object with a 'results' list")
    a.add_argument(
        "--window", action="append", metavar="SECONDS[:BIN_S]",
        help="detector window (repeatable; bin defaults to window/90). "
             "Default: 900:10, 1800:15, 3600:30, 7200:60, 14400:120",
    )
    a.add_argument("--warmup", type=float, default=None, metavar="SECONDS",
                   help="optional blind period at the start of each series (default 0: warm-up plateaus "
                        "are recognised from the data)")
    a.add_argument("--plot", metavar="FILE",
                   help="draw every series (release floor, trend, detections, projected OOM) into FILE.html "
                        '(standard library) or FILE.png (needs matplotlib: pip install "inferwatch[plot]")')
    a.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help="progress bar on stderr (auto: on a terminal, for files over 1 MB)")
    a.set_defaults(func=_analyze)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _scales(specs: list[str]) -> list[tuple[float, float]]:
    out = []
    for s in specs:
        w, _, b = s.partition(":")
        try:
            wf = float(w)
            bf = float(b) if b else wf / 90
        except ValueError:
            raise ValueError(f"--window {s!r}: expected SECONDS or SECONDS:BIN_SECONDS, e.g. 720:10") from None
        out.append((wf, bf))
    return out


def _analyze(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from inferwatch_sidecar.components.gpu import plot
    from inferwatch_sidecar.components.gpu.analysis import run
    from inferwatch_sidecar.components.gpu.config import DetectorConfig
    from inferwatch_sidecar.components.gpu.replay import LogError, file_size

    try:
        kw: dict[str, Any] = {}
        if args.window:
            kw["scales"] = _scales(args.window)
        if args.warmup is not None:
            kw["warmup_s"] = args.warmup
        cfg = DetectorConfig(**kw)
        if args.plot:
            plot.check_target(args.plot)
    except (ValueError, ValidationError) as e:
        msg = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        print(f"inferwatch gpu analyze: {msg}", file=sys.stderr)
        return 2
    total = sum(file_size(f) for f in args.files)
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty() and total > 1_000_000)
    try:
        if show:
            from rich.progress import Progress

            with Progress(transient=True, console=_stderr_console()) as prog:
                task = prog.add_task("reading logs", total=total)
                found = run(args.files, cfg, progress=lambda done: prog.update(task, completed=done),
                            keep_series=bool(args.plot))
        else:
            found = run(args.files, cfg, keep_series=bool(args.plot))
        if args.plot:
            left = plot.write(args.plot, found.series)
            if left:
                print(f"inferwatch gpu analyze: --plot {args.plot}: "
                      f"{plot.left_out_note(len(found.series) - len(left), len(left))}", file=sys.stderr)
    except (LogError, plot.PlotError) as e:
        print(f"inferwatch gpu analyze: {e}", file=sys.stderr)
        return 1
    result = found.result
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _table(result)
    return 0


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _fmt_bytes(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 2**20:,.2f} MiB/s" if abs(v) >= 2**20 else f"{v / 2**10:,.1f} KiB/s"


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 86400:
        return f"{v / 86400:.1f} d"
    if v >= 3600:
        return f"{v / 3600:.1f} h"
    return f"{v / 60:.0f} min"


def _fmt_size(v: float) -> str:
    return f"{v / 2**30:,.2f} GiB"


def _device(r: dict[str, Any]) -> str:
    """``0 NVIDIA H100 80GB HBM3``: the index (the whole UUID when no GPU log names one) and the name."""
    return f"{r['device']} {r['name']}" if r.get("name") else str(r["device"])


def _sites_table(result: dict[str, Any]) -> None:
    """The allocation sites captured during episodes (once per process and capture)."""
    from datetime import datetime, timezone

    from rich.console import Console
    from rich.table import Table

    t = Table(title="Allocation sites whose live bytes grew (torch probe, during the episode)")
    for col in ("device", "pid", "captured at", "site", "live bytes", "allocations"):
        t.add_column(col, overflow="fold")
    seen = set()
    for r in result["results"]:
        for ep in r["episodes"]:
            cap = ep.get("sites")
            if not cap or (r["pid"], cap["captured_at"]) in seen:
                continue
            seen.add((r["pid"], cap["captured_at"]))
            at = datetime.fromtimestamp(cap["captured_at"], tz=timezone.utc).strftime("%Y/%m/%d %H:%M:%S")
            for st in cap["sites"]:
                t.add_row(_device(r), str(r["pid"]), at, f"{st['file']}:{st['line']} ({st['function']})",
                          _fmt_size(st["bytes"]), str(st["count"]))
    if seen:
        Console(width=160).print(t)


def _table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="GPU memory leak analysis")
    for col in ("device", "pid", "verdict", "rate", "95% CI", "time to OOM", "device OOM (all growing)",
                "detected at", "samples"):
        t.add_column(col, overflow="fold")
    for r in result["results"]:
        ci = r.get("leak_rate_ci_bytes_per_s")
        t.add_row(
            _device(r), "-" if r["pid"] is None else str(r["pid"]),
            r["verdict"] + (f" (ended {r['ended']})" if r.get("ended") else ""),
            _fmt_bytes(r["leak_rate_bytes_per_s"]),
            f"{_fmt_bytes(ci[0])} .. {_fmt_bytes(ci[1])}" if ci else "-",
            _fmt_s(r["time_to_oom_s"]), _fmt_s(r["device_time_to_oom_s"]), r["detected_at"] or "-",
            str(r["samples"]),
        )
    Console(width=160).print(t)
    e = Table(title="Leak episodes")
    for col in ("device", "pid", "series", "onset (est.)", "detected at", "cleared at", "rate", "95% CI", "kind"):
        e.add_column(col, overflow="fold")
    n = 0
    for r in result["results"]:
        for ep in r["episodes"]:
            n += 1
            ci = ep["rate_ci_bytes_per_s"]
            cleared = ep["cleared_at"] or "still leaking"
            e.add_row(_device(r), "-" if r["pid"] is None else str(r["pid"]), r.get("series", "nvml"),
                      ep["onset_estimate"], ep["detected_at"], cleared if not ep["end"] else f"{cleared} ({ep['end']})",
                      _fmt_bytes(ep["rate_bytes_per_s"]), f"{_fmt_bytes(ci[0])} .. {_fmt_bytes(ci[1])}",
                      ep.get("kind") or "-")
    if n:
        Console(width=160).print(e)
        _sites_table(result)
    if result["duplicate_model_copies"]:
        d = Table(title="Duplicated model copies (several processes each holding a similar, flat amount)")
        for col in ("device", "copies", "pids", "each", "beyond one copy", "first seen", "last seen"):
            d.add_column(col, overflow="fold")
        for c in result["duplicate_model_copies"]:
            d.add_row(_device(c), str(c["copies"]), " ".join(map(str, c["pids"])), _fmt_size(c["copy_bytes"]),
                      _fmt_size(c["extra_bytes"]), c["first_seen"],
                      "still at the end of the log" if c["at_end"] else c["last_seen"])
        Console(width=160).print(d)
        print(f"Fix: {result['duplicate_model_copies'][0]['fix']}")
    for f in result["files"]:
        if f["skipped_rows"]:
            print(f"{f['path']}: skipped rows {f['skipped_rows']}", file=sys.stderr)

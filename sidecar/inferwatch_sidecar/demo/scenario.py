"""The demo scenario: real processes on loopback, a fault timeline, and detection.

One :class:`Scenario` is shared by ``inferwatch demo`` and the end-to-end test:

1. :meth:`Scenario.start` trains the model and writes its reference profile
   (calibrated on the training labels), starts the stable model server (uvicorn, two workers) and the canary
   server (one worker), waits for their worker PIDs, writes the sidecar's
   config (short drift windows, the fake NVML backend scripting a leak in one
   stable worker, an admin token) and starts ``inferwatch sidecar``
   (:mod:`.supervise`). With ``engine="triton"`` one PyTriton process
   (:mod:`.triton_server`) serves both models instead, tracing to the sidecar;
2. a Prometheus can be attached (:meth:`Scenario.attach_prometheus`), for alert states, and the
   webhook receiver of an Alertmanager behind it (:meth:`Scenario.attach_alertmanager`), for the
   notifications;
3. :meth:`Scenario.run` starts the bounded load (:mod:`.loadgen`), injects
   every fault at the injection time (:mod:`.inject`) and polls ``/metrics``,
   ``/v1/status`` and Prometheus (:mod:`.observe`) until the duration ends
   (or ``until`` says so), judging each fault's detection (:mod:`.judge`);
4. :meth:`Scenario.stop` stops every child process (also on errors and signals).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from inferwatch_sidecar.demo import faults as fl
from inferwatch_sidecar.demo import inject, judge, report
from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.demo import supervise as sv
from inferwatch_sidecar.demo.alertmanager import WebhookReceiver
from inferwatch_sidecar.demo.config import ScenarioConfig
from inferwatch_sidecar.demo.inject import FaultState
from inferwatch_sidecar.demo.loadgen import LoadGenerator, LoadPlan
from inferwatch_sidecar.demo.observe import Observer, Snapshot

log = logging.getLogger("inferwatch.demo")


class Scenario:
    """The whole demo stack; see the module docstring.

    Args:
        cfg: the scenario's knobs.
    """

    #: Fault -> its detection signal, the alerts it must fire, and its title in the summary.
    signals: dict[str, judge.Signal] = judge.SIGNALS
    expected_alerts: dict[str, judge.Alerts] = judge.EXPECTED_ALERTS
    titles: dict[str, str] = report.FAULT_TITLES

    def __init__(self, cfg: ScenarioConfig | None = None) -> None:
        self.cfg = cfg or ScenarioConfig()
        self._own_workdir = self.cfg.workdir is None
        self.workdir = Path(self.cfg.workdir or tempfile.mkdtemp(prefix="iw-demo-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.workdir / "state"
        self.state_dir.mkdir(exist_ok=True)
        self.socket_path = str(self.workdir / "ingest.sock")
        self.token = secrets.token_hex(16)
        self.sidecar_port = sv.free_port()
        self.stable_port = sv.free_port()
        self.canary_port = sv.free_port()
        self.sidecar_url = f"http://127.0.0.1:{self.sidecar_port}"
        self.stable_url = f"http://127.0.0.1:{self.stable_port}"
        self.canary_url = f"http://127.0.0.1:{self.canary_port}"
        #: Role -> Triton's gRPC and metrics ports (the engine ``triton`` only).
        self.triton_ports = ({r: (sv.free_port(), sv.free_port()) for r in ("stable", "canary")}
                             if self.cfg.engine == "triton" else {})
        self.procs: dict[str, sv.Process] = {}
        self.prometheus_url: str | None = None
        self.receiver: WebhookReceiver | None = None
        self.loadgen: LoadGenerator | None = None
        self.t0: float | None = None
        self.worker_pids: dict[str, list[int]] = {}
        self.leak_pid: int | None = None
        self.faults = {f: FaultState(f) for f in self.cfg.faults}
        #: The model servers' faults once switched on (the saturation fault's second phase changes them).
        self.server_faults: fl.Faults | None = None
        self._cpu_phase = False
        #: The stable version's live knee and headroom at each poll (the summary's capacity line).
        self.capacity = judge.CapacityTrace(self.cfg.injection_time())
        self.observer = Observer(self.sidecar_url)

    # -- URLs -----------------------------------------------------------------------------------
    @property
    def sidecar_target(self) -> str:
        """``host:port`` of the sidecar's /metrics, for a Prometheus scrape config."""
        return f"127.0.0.1:{self.sidecar_port}"

    def scrape_targets(self) -> list[str]:
        """``host:port`` of every /metrics Prometheus scrapes: the sidecar's, and each Triton's (their engine's)."""
        return [self.sidecar_target, *(f"127.0.0.1:{metrics}" for _, metrics in self.triton_ports.values())]

    @property
    def fault_file(self) -> str:
        """The fault switches every model server reads."""
        return str(self.state_dir / "faults.json")

    def urls(self) -> dict[str, str]:
        out = {"status page": f"{self.sidecar_url}/", "metrics": f"{self.sidecar_url}/metrics",
               "status": f"{self.sidecar_url}/v1/status"}
        if self.cfg.engine == "triton":
            out["model server"] = f"{self.stable_url}/v2/models/{mdl.NAME}/infer"
            out["canary"] = f"{self.canary_url}/v2/models/{mdl.NAME}/infer"
            out["triton metrics"] = f"http://127.0.0.1:{self.triton_ports['stable'][1]}/metrics"
        else:
            out["model server"] = f"{self.stable_url}/predict"
            out["canary"] = f"{self.canary_url}/predict"
        if self.prometheus_url:
            out["prometheus"] = self.prometheus_url
        return out

    # -- start ----------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0, progress: Callable[[str], None] | None = None) -> None:
        """Build the reference, start the servers and the sidecar, and wait until all are ready.

        Raises:
            supervise.ProcessError: a process exited or did not become ready; the message includes its log.
        """
        say = progress or (lambda s: log.info("%s", s))
        deadline = time.monotonic() + timeout
        say("training the model and building its reference profile")
        ref_path = str(self.workdir / "reference.json")
        mdl.build_reference(ref_path, self.cfg.seed)
        fl.write(self.fault_file, fl.Faults())
        if self.cfg.engine == "triton":
            python = self.cfg.triton_python or sv.default_triton_python()
            say(f"starting Triton (PyTriton, with {python}): {mdl.NAME} version 1, and the canary's version 2")
            # One after the other, each ready before the sidecar starts: Triton takes seconds to load (the
            # scenario's clock and the fake NVML's leak script start with the sidecar), and PyTriton's model
            # instances give up on their first instance's handshake after a second when starved of CPU.
            for role, port, url in (("stable", self.stable_port, self.stable_url),
                                    ("canary", self.canary_port, self.canary_url)):
                grpc, metrics = self.triton_ports[role]
                self.procs[role] = sv.start_triton_server(
                    python, role, http_port=port, grpc_port=grpc, metrics_port=metrics, sidecar_url=self.sidecar_url,
                    socket_path=self.socket_path, state_dir=self.state_dir, seed=self.cfg.seed, log_dir=self.workdir)
                sv.wait_ready(self.procs[role], f"{url}/v2/models/{mdl.NAME}/ready", deadline, watch=self.procs.values())
            self.worker_pids = sv.wait_worker_pids(self.state_dir / "pids", {"stable": 1, "canary": 1}, self.procs,
                                                   deadline)
        else:
            say("starting the model servers (uvicorn: v1 with 2 workers, canary v2 with 1)")
            for role, version, port, workers in (("stable", mdl.STABLE, self.stable_port, 2),
                                                 ("canary", mdl.CANARY, self.canary_port, 1)):
                self.procs[role] = sv.start_model_server(role, version, port, workers, socket_path=self.socket_path,
                                                         state_dir=self.state_dir, seed=self.cfg.seed,
                                                         token=self.token, log_dir=self.workdir)
            self.worker_pids = sv.wait_worker_pids(self.state_dir / "pids", {"stable": 2, "canary": 1}, self.procs,
                                                   deadline)
        self.leak_pid = self.worker_pids["stable"][0]
        cfg_path = self.workdir / "sidecar.yaml"
        cfg_path.write_text(yaml.safe_dump(self.sidecar_config(ref_path)))
        say("starting the sidecar")
        self.t0 = time.monotonic()
        self.procs["sidecar"] = sv.start_sidecar(cfg_path, self.workdir)
        ready = [("sidecar", f"{self.sidecar_url}/readyz")]
        if self.cfg.engine == "fastapi":
            ready += [("stable", f"{self.stable_url}/healthz"), ("canary", f"{self.canary_url}/healthz")]
        for name, url in ready:
            sv.wait_ready(self.procs[name], url, deadline, watch=self.procs.values())
        say("all processes are ready")

    def sidecar_config(self, reference: str) -> dict[str, Any]:
        """The sidecar's config, with a fake NVML process per model-server worker and the scripted leak."""
        doc = sv.sidecar_config(socket_path=self.socket_path, port=self.sidecar_port, token=self.token,
                                reference=reference, seed=self.cfg.seed,
                                gpu_processes=inject.fake_gpu_processes(self.cfg, self.worker_pids, self.leak_pid))
        if "saturation" in self.cfg.faults:
            doc.update(sv.saturation_config(f"{self.stable_url}/engine/metrics", mdl.NAME, mdl.STABLE))
        return doc

    def attach_prometheus(self, url: str) -> None:
        """Read alert states from this Prometheus (which scrapes :attr:`sidecar_target`)."""
        self.prometheus_url = url.rstrip("/")

    def attach_alertmanager(self, receiver: WebhookReceiver) -> None:
        """Show the notifications ``receiver`` gets (from an Alertmanager behind the attached Prometheus)."""
        self.receiver = receiver

    # -- run ------------------------------------------------------------------------------------
    def now(self) -> float:
        assert self.t0 is not None, "start() first"
        return time.monotonic() - self.t0

    def run(self, on_tick: Callable[[Snapshot], None] | None = None,
            until: Callable[[Snapshot], bool] | None = None, stop: Callable[[], bool] | None = None,
            stop_load: bool = True, linger_s: float = 60.0) -> Snapshot:
        """Run the load and the fault timeline; returns the last snapshot.

        Args:
            on_tick: called with every snapshot (the live view).
            until: stop early once this returns True (after the injection).
            stop: polled; True stops at once (signals).
            stop_load: stop the load generator at the end. With False the load goes on (at most
                ``linger_s`` more seconds) so that a caller can check the live windows, then call
                :meth:`stop_load`.
            linger_s: see ``stop_load``.

        Raises:
            supervise.ProcessError: a child process exited.
        """
        c = self.cfg
        plan = LoadPlan(rate_per_s=c.rate_per_s, max_requests=c.max_requests,
                        max_seconds=c.duration_s + (5 if stop_load else linger_s), threads=32, label_share=1.0,
                        seed=c.seed + 1)
        self.loadgen = self.load_generator(plan).start()
        # The faults switch on at their time from a timer: a tick's poll can take seconds on a loaded machine
        # (the vLLM scenario scrapes two servers), and injecting only between ticks would land late. The fault
        # states are still marked only here, before a poll, so every poll is judged against one consistent
        # phase: a scrape that began before the switch is never judged as after it.
        switch = _Switch(self.inject, self.now)
        timer = threading.Timer(max(0.0, c.injection_time() - self.now()), switch.fire)
        timer.daemon = True
        timer.start()
        injected = False
        try:
            while True:
                tick_start = time.monotonic()
                sv.check_all(self.procs.values())
                t = self.now()
                if not injected and t >= c.injection_time():
                    switch.fire()  # idempotent: the timer may not have run yet on a starved machine
                if switch.error is not None:
                    raise switch.error  # the switch failed (in the timer's thread or here): the run fails with it
                if not injected and switch.fired_at is not None:
                    self.mark_injected(switch.fired_at)
                    injected = True
                self.loadgen.rate_scale = c.load_scale(t)
                if injected and switch.fired_at is not None:
                    self.advance(t - switch.fired_at)
                snap = self.poll()
                snap.phase = "faults" if injected else "baseline"
                if on_tick is not None:
                    on_tick(snap)
                if t >= c.duration_s or (stop is not None and stop()):
                    break
                if injected and until is not None and until(snap):
                    break
                if self.loadgen.finished.is_set():
                    snap.errors.append("the load generator reached its request bound")
                    break
                time.sleep(max(0.0, c.tick_s - (time.monotonic() - tick_start)))
        finally:
            timer.cancel()
        if stop_load:
            self.stop_load()
        snap.phase = "done"
        return snap

    def load_generator(self, plan: LoadPlan) -> LoadGenerator:
        """The load generator :meth:`run` starts (the vLLM scenario streams completions instead)."""
        canary = self.canary_url if "canary" in self.cfg.faults else None
        lg = LoadGenerator(self.stable_url, canary, self.sidecar_url, plan, model=mdl.NAME, engine=self.cfg.engine)
        lg.rate_scale = self.cfg.load_scale(0.0)
        if canary is not None:
            # The canary serves v2 healthy until its fault (the judge reads pass), so it gets its share from the start.
            lg.canary_share = self.cfg.canary_share
        return lg

    def stop_load(self) -> None:
        """Stop the load generator (and post its pending labels)."""
        if self.loadgen is not None:
            self.loadgen.stop()

    def inject(self) -> None:
        """Switch every configured fault on (:meth:`run` calls it once, at the injection time)."""
        assert self.loadgen is not None, "run() starts the load first"
        triton = self.cfg.engine == "triton"
        self.server_faults = inject.switch_on(self.cfg, server_url=None if triton else self.stable_url, token=self.token,
                         loadgen=self.loadgen, leak_pid=self.leak_pid, fault_file=self.fault_file if triton else None)

    def advance(self, since_injection: float) -> None:
        """Later phases of a fault: the ``saturation`` fault turns from KV cache to host CPU after its first phase."""
        if ("saturation" in self.cfg.faults and not self._cpu_phase and self.server_faults is not None
                and since_injection >= fl.SATURATION_PHASE_S):
            self._cpu_phase = True
            inject.saturation_cpu_phase(self.server_faults, server_url=self.stable_url, token=self.token)

    def mark_injected(self, t: float) -> None:
        """Record that every fault was switched on at scenario time ``t`` (detection delays count from it)."""
        for st in self.faults.values():
            st.injected_at = t

    def poll(self) -> Snapshot:
        """Scrape the sidecar (and Prometheus), update detection, and return a snapshot."""
        snap, scrape = self.observer.poll(self.now(), self.faults, self.loadgen, self.prometheus_url,
                                           self.receiver)
        if scrape is not None:
            judge.judge(self.faults, snap, scrape, self.leak_pid, self.signals, self.expected_alerts)
            self.capacity.observe(snap.t, scrape)
        return snap

    # -- results --------------------------------------------------------------------------------
    def all_detected(self) -> bool:
        """True when every configured fault was injected and detected."""
        return all(st.detected for st in self.faults.values())

    def expected_alert_names(self) -> set[str]:
        return judge.expected_alert_names(self.faults, self.expected_alerts)

    def allowed_alert_names(self) -> set[str]:
        """The alerts the faults must fire, and those they may fire as a consequence."""
        return judge.allowed_alert_names(self.faults, self.expected_alerts)

    def unexpected_alerts(self) -> dict[str, set[str]]:
        """Alerts seen pending or firing that no injected fault explains."""
        return judge.unexpected_alerts(self.observer.alerts_seen, self.faults, self.expected_alerts)

    def summary_lines(self) -> list[str]:
        """The end-of-run summary, one fault per line, then the verdict."""
        return report.summary_lines(self.faults, self.cfg.injection_time(),
                                    self.unexpected_alerts() if self.prometheus_url else None,
                                    self.receiver.notifications() if self.receiver is not None else None,
                                    titles=self.titles, passed=self.all_detected(),
                                    extra=self.capacity.lines())

    # -- stop -----------------------------------------------------------------------------------
    def stop(self) -> dict[str, int | None]:
        """Stop the load, the servers and the sidecar (in that order); returns their exit statuses."""
        if self.loadgen is not None:
            self.loadgen.stop(timeout=5.0)
        codes = sv.stop_all(self.procs)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return codes

    def __enter__(self) -> Scenario:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Switch:
    """Calls ``action`` once, from whichever thread comes first, and records the scenario time it did.

    An exception from ``action`` is kept in :attr:`error` (for the run loop to raise on its own thread),
    not raised in the timer's thread, where it would only be printed.
    """

    def __init__(self, action: Callable[[], None], clock: Callable[[], float]) -> None:
        self._action = action
        self._clock = clock
        self._lock = threading.Lock()
        #: Scenario time the action started; None until it succeeded.
        self.fired_at: float | None = None
        #: What the action raised, if it did.
        self.error: Exception | None = None

    def fire(self) -> None:
        with self._lock:
            if self.fired_at is not None or self.error is not None:
                return
            t = self._clock()
            try:
                self._action()
            except Exception as e:  # noqa: BLE001 - handed to the run loop, which raises it
                self.error = e
                return
            self.fired_at = t

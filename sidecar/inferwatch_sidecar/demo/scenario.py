"""The demo scenario: real processes on loopback, a fault timeline, and detection.

One :class:`Scenario` is shared by ``inferwatch demo`` and the end-to-end test:

1. :meth:`Scenario.start` trains the model and writes its reference profile,
   starts the stable model server (uvicorn, two workers) and the canary
   server (one worker), waits for their worker PIDs, writes the sidecar's
   config (short drift windows, the fake NVML backend scripting a leak in one
   stable worker, an admin token) and starts ``inferwatch sidecar``;
2. a Prometheus can be attached (:meth:`attach_prometheus`), for alert states;
3. :meth:`Scenario.run` starts the bounded load, injects every fault at
   ``inject_at_s`` and polls ``/metrics``, ``/v1/status`` and Prometheus until
   the duration ends (or ``until`` says so), judging each fault's detection;
4. :meth:`Scenario.stop` stops every child process (also on errors and signals).

A fault counts as *detected* when the sidecar's own signal shows it:

========== =====================================================================
latency    the stage's P99.9 over the last 10 s exceeds the P999 latency target
drift      ``inferwatch_drift_dataset_drifted`` = 1 for the stable version
confidence reference mean confidence - current mean > 0.1 (the alert's threshold)
gpu_leak   ``inferwatch_gpu_leak_detected`` = 1 for the leaking worker's PID
canary     ``inferwatch_drift_canary_feature_drifted{feature="prediction"}`` = 1 for the canary
========== =====================================================================

With Prometheus attached, :data:`EXPECTED_ALERTS` names the alerts each fault
must fire; every other alert must stay quiet.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inferwatch_sidecar.demo import faults as fl
from inferwatch_sidecar.demo import model as mdl
from inferwatch_sidecar.demo import promtext
from inferwatch_sidecar.demo.loadgen import LoadGenerator, LoadPlan

log = logging.getLogger("inferwatch.demo")

SERVICE = "demo-credit"
MODEL = "credit-risk"
STABLE, CANARY = "v1", "v2"
STAGES = ("ingress", "preprocess", "queue", "inference", "postprocess")
MiB = 2**20

#: The faults the demo injects by default, in display order.
FAULTS = ("latency", "drift", "confidence", "gpu_leak", "canary")
#: Every fault the scenario knows; ``bad_events`` (a client posting malformed JSON events) is opt-in.
ALL_FAULTS = (*FAULTS, "bad_events")
FAULT_TITLES = {
    "latency": "latency spike in the inference stage",
    "drift": "feature drift (6 of 9 inputs shifted)",
    "confidence": "confidence drop (model temperature x6)",
    "gpu_leak": "GPU memory leak in one worker (fake NVML)",
    "canary": "canary v2 with a different prediction mix",
    "bad_events": "a client posting malformed JSON events",
}
#: The alerts each fault must bring to ``firing`` (with the labels that must match).
EXPECTED_ALERTS: dict[str, list[tuple[str, dict[str, str]]]] = {
    "latency": [("InferwatchStageLatencyP999BudgetBurn", {"stage": "inference"})],
    "drift": [("InferwatchFeatureDrift", {"model_version": STABLE}),
              ("InferwatchPredictionDrift", {"model_version": STABLE})],
    "confidence": [("InferwatchConfidenceDrop", {"model_version": STABLE}),
                   ("InferwatchEstimatedAccuracyLow", {"model_version": STABLE})],
    "gpu_leak": [("InferwatchGPUMemoryLeak", {})],
    "canary": [("InferwatchCanaryDiverging", {"model_version": CANARY})],
    "bad_events": [("InferwatchIngestDecodeErrors", {"scope": "json"})],
}

#: The P999 latency objective's target (alerts/source.py LATENCY_OBJECTIVES): slower calls burn its budget.
P999_TARGET_S = 2.5
CONFIDENCE_DROP = 0.1


class ScenarioError(RuntimeError):
    """A part of the scenario failed to start; the message says which and shows its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ScenarioConfig:
    """Every knob of the scenario; the defaults are the demo's embedded configuration.

    Attributes:
        duration_s: how long the load runs (from the sidecar's start).
        inject_at_s: when every fault is injected (from the sidecar's start); None: 30% of the duration,
            at least 12 s.
        rate_per_s: total request rate of the load generator.
        max_requests: request bound of the load generator.
        latency_share / latency_delay_s: share of inference batches slowed, and by how much.
        temperature: the confidence fault's logit temperature.
        canary_share: share of predictions routed to the canary once injected.
        leak_mib_per_s: the fake NVML leak's rate.
        faults: which faults to inject (a subset of :data:`FAULTS`).
        seed: dataset seed.
        workdir: where configs and logs go (a fresh temporary directory by default, removed at stop).
        tick_s: how often the runner polls.
    """

    duration_s: float = 90.0
    inject_at_s: float | None = None
    rate_per_s: float = 50.0
    max_requests: int = 50_000
    latency_share: float = 0.08
    latency_delay_s: float = 3.0
    temperature: float = 6.0
    canary_share: float = 0.4
    leak_mib_per_s: float = 64.0
    faults: tuple[str, ...] = FAULTS
    seed: int = 0
    workdir: str | None = None
    tick_s: float = 0.5

    def injection_time(self) -> float:
        if self.inject_at_s is not None:
            return self.inject_at_s
        return max(12.0, 0.3 * self.duration_s)


@dataclass
class FaultState:
    """What happened to one fault."""

    name: str
    injected_at: float | None = None
    detected_at: float | None = None
    detail: str = ""
    alerts: dict[str, str] = field(default_factory=dict)

    @property
    def detected(self) -> bool:
        return self.detected_at is not None

    @property
    def latency_s(self) -> float | None:
        if self.detected_at is None or self.injected_at is None:
            return None
        return self.detected_at - self.injected_at


@dataclass
class Snapshot:
    """What the runner saw at one poll (what the live view shows).

    Attributes:
        t: seconds since the sidecar started.
        stages: stage -> {0.5, 0.99, 0.999: seconds or None, "rate": calls/s} over the last 10 s.
        gpu: devices and processes from /v1/status, with leak verdicts.
        drift: (model, version) -> {"features": {name: (score, drifted)}, "confidence": (cur, ref), ...}.
        faults: fault name -> FaultState.
        alerts: alert name -> state ("pending"/"firing"), from Prometheus.
        load: the load generator's counters.
        phase: "baseline", "faults" or "done".
    """

    t: float
    stages: dict[str, dict[Any, Any]] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    drift: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    faults: dict[str, FaultState] = field(default_factory=dict)
    alerts: dict[str, str] = field(default_factory=dict)
    alert_items: list[dict[str, Any]] = field(default_factory=list)
    load: dict[str, int] = field(default_factory=dict)
    phase: str = "baseline"
    errors: list[str] = field(default_factory=list)


class _Proc:
    """A child process in its own session, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        # A new session: a Ctrl-C in the terminal reaches only the runner, which stops children in order.
        self.p = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.p.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait()
        else:
            # The leader exited; make sure no worker it left behind survives.
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._log.close()
        return self.p.returncode


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _put_json(url: str, body: dict[str, Any], token: str) -> None:
    import json

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


class Scenario:
    """The whole demo stack; see the module docstring.

    Args:
        cfg: the scenario's knobs.
    """

    def __init__(self, cfg: ScenarioConfig | None = None) -> None:
        self.cfg = cfg or ScenarioConfig()
        for f in self.cfg.faults:
            if f not in ALL_FAULTS:
                raise ValueError(f"unknown fault {f!r}; known: {', '.join(ALL_FAULTS)}")
        self._own_workdir = self.cfg.workdir is None
        self.workdir = Path(self.cfg.workdir or tempfile.mkdtemp(prefix="iw-demo-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.workdir / "state"
        self.state_dir.mkdir(exist_ok=True)
        self.socket_path = str(self.workdir / "ingest.sock")
        self.token = secrets.token_hex(16)
        self.sidecar_port = free_port()
        self.stable_port = free_port()
        self.canary_port = free_port()
        self.sidecar_url = f"http://127.0.0.1:{self.sidecar_port}"
        self.stable_url = f"http://127.0.0.1:{self.stable_port}"
        self.canary_url = f"http://127.0.0.1:{self.canary_port}"
        self.procs: dict[str, _Proc] = {}
        self.prometheus_url: str | None = None
        self.prom_scraped_at: float | None = None
        self.loadgen: LoadGenerator | None = None
        self.t0: float | None = None
        self.reference_info: dict[str, Any] = {}
        self.worker_pids: dict[str, list[int]] = {}
        self.leak_pid: int | None = None
        self.faults = {f: FaultState(f) for f in self.cfg.faults}
        self.alerts_seen: dict[str, set[str]] = {}
        self._prev: list[promtext.Scrape] = []
        self.last: Snapshot | None = None

    # -- URLs -----------------------------------------------------------------------------------
    @property
    def sidecar_target(self) -> str:
        """``host:port`` of the sidecar's /metrics, for a Prometheus scrape config."""
        return f"127.0.0.1:{self.sidecar_port}"

    def urls(self) -> dict[str, str]:
        out = {"metrics": f"{self.sidecar_url}/metrics", "status": f"{self.sidecar_url}/v1/status",
               "model server": f"{self.stable_url}/predict", "canary": f"{self.canary_url}/predict"}
        if self.prometheus_url:
            out["prometheus"] = self.prometheus_url
        return out

    # -- start ----------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0, progress: Callable[[str], None] | None = None) -> None:
        """Build the reference, start the servers and the sidecar, and wait until all are ready.

        Raises:
            ScenarioError: a process exited or did not become ready; the message includes its log.
        """
        say = progress or (lambda s: log.info("%s", s))
        deadline = time.monotonic() + timeout
        say("training the model and building its reference profile")
        ref_path = str(self.workdir / "reference.json")
        self.reference_info = mdl.build_reference(ref_path, self.cfg.seed)
        fl.write(str(self.state_dir / "faults.json"), fl.Faults())
        say("starting the model servers (uvicorn: v1 with 2 workers, canary v2 with 1)")
        self._start_server("stable", STABLE, self.stable_port, 2)
        self._start_server("canary", CANARY, self.canary_port, 1)
        pids = self._wait_pids({"stable": 2, "canary": 1}, deadline)
        self.worker_pids = pids
        self.leak_pid = pids["stable"][0]
        cfg_path = self.workdir / "sidecar.yaml"
        cfg_path.write_text(yaml.safe_dump(self.sidecar_config(ref_path)))
        say("starting the sidecar")
        env = self._env()
        self.t0 = time.monotonic()
        self.procs["sidecar"] = _Proc(
            "sidecar", [sys.executable, "-m", "inferwatch_sidecar.cli", "sidecar", "--config", str(cfg_path)],
            env, self.workdir / "sidecar.log")
        self._wait_http("sidecar", f"{self.sidecar_url}/readyz", deadline)
        self._wait_http("stable", f"{self.stable_url}/healthz", deadline)
        self._wait_http("canary", f"{self.canary_url}/healthz", deadline)
        say("all processes are ready")

    def sidecar_config(self, reference: str) -> dict[str, Any]:
        """The sidecar's YAML config: short windows, fake NVML with the scripted leak, admin token."""
        c = self.cfg
        procs = []
        from inferwatch_sidecar.demo.server import ALLOC_BASE, ALLOC_CACHE, CONTEXT

        base_gib = (ALLOC_BASE + ALLOC_CACHE + CONTEXT) / 2**30
        for pid in [*self.worker_pids.get("stable", []), *self.worker_pids.get("canary", [])]:
            p: dict[str, Any] = {"pid": pid, "base_gib": round(base_gib, 3)}
            if pid == self.leak_pid and "gpu_leak" in c.faults:
                p["leak_mib_per_s"] = c.leak_mib_per_s
                p["leak_start_s"] = c.injection_time()
            procs.append(p)
        return {
            "ingest": {"socket": self.socket_path, "queue_stages": ["queue"]},
            "http": {"host": "127.0.0.1", "port": self.sidecar_port, "admin_token": self.token},
            "shutdown_timeout_s": 10,
            "gpu": {
                "enabled": True, "backend": "fake", "interval_s": 0.25, "pid_ttl_s": 30,
                # Second-scale detector windows: a 64 MiB/s leak is confirmed about 10 s after it starts.
                "detector": {"scales": [[8.0, 0.5]], "warmup_s": 0, "confirm_s": 1, "clear_s": 5},
                "fake": {"devices": 1, "total_gib": 80, "processes": procs, "seed": c.seed},
            },
            "drift": {
                "enabled": True, "reference": reference, "window_seconds": 10, "subwindows": 5,
                "evaluate_interval_s": 1, "min_samples": 100,
            },
        }

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _start_server(self, role: str, version: str, port: int, workers: int) -> None:
        env = self._env()
        env.update({
            "INFERWATCH_SIDECAR": f"unix://{self.socket_path}",
            "INFERWATCH_SERVICE": SERVICE,
            "INFERWATCH_MODEL": MODEL,
            "INFERWATCH_MODEL_VERSION": version,
            "INFERWATCH_DEMO_STATE_DIR": str(self.state_dir),
            "INFERWATCH_DEMO_ROLE": role,
            "INFERWATCH_DEMO_SEED": str(self.cfg.seed),
            "INFERWATCH_DEMO_ADMIN_TOKEN": self.token,
        })
        argv = [sys.executable, "-m", "uvicorn", "inferwatch_sidecar.demo.server:app", "--host", "127.0.0.1",
                "--port", str(port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"]
        self.procs[role] = _Proc(role, argv, env, self.workdir / f"{role}.log")

    def _check_alive(self) -> None:
        for p in self.procs.values():
            if not p.alive():
                raise ScenarioError(f"{p.name} exited with status {p.p.returncode}:\n{p.log_tail()}")

    def _wait_pids(self, want: dict[str, int], deadline: float) -> dict[str, list[int]]:
        d = self.state_dir / "pids"
        while True:
            self._check_alive()
            got: dict[str, list[int]] = {r: [] for r in want}
            if d.is_dir():
                for f in sorted(d.iterdir()):
                    role, _, pid = f.name.partition("-")
                    if role in got and pid.isdigit():
                        got[role].append(int(pid))
            if all(len(got[r]) >= n for r, n in want.items()):
                return got
            if time.monotonic() > deadline:
                raise ScenarioError(f"model server workers did not start in time (have {got}):\n"
                                    + "\n".join(self.procs[r].log_tail() for r in want))
            time.sleep(0.1)

    def _wait_http(self, name: str, url: str, deadline: float) -> None:
        while True:
            self._check_alive()
            try:
                if _get(url) == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ScenarioError(f"{name} did not become ready at {url}:\n{self.procs[name].log_tail()}")
            time.sleep(0.1)

    def attach_prometheus(self, url: str) -> None:
        """Read alert states from this Prometheus (which scrapes :attr:`sidecar_target`)."""
        self.prometheus_url = url.rstrip("/")

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
        """
        c = self.cfg
        plan = LoadPlan(rate_per_s=c.rate_per_s, max_requests=c.max_requests,
                        max_seconds=c.duration_s + (5 if stop_load else linger_s), threads=32, seed=c.seed + 1)
        canary = self.canary_url if "canary" in c.faults else None
        self.loadgen = LoadGenerator(self.stable_url, canary, self.sidecar_url, plan, model=MODEL).start()
        inject_at = c.injection_time()
        injected = False
        snap = Snapshot(self.now())
        while True:
            tick_start = time.monotonic()
            self._check_alive()
            t = self.now()
            if not injected and t >= inject_at:
                self.inject()
                injected = True
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
        if stop_load:
            self.stop_load()
        snap.phase = "done"
        self.last = snap
        return snap

    def stop_load(self) -> None:
        """Stop the load generator (and post its pending labels)."""
        if self.loadgen is not None:
            self.loadgen.stop()

    def inject(self) -> None:
        """Switch every configured fault on."""
        c = self.cfg
        t = self.now()
        f = fl.Faults()
        if "latency" in c.faults:
            f.latency_stage, f.latency_share, f.latency_delay_s = "inference", c.latency_share, c.latency_delay_s
        if "confidence" in c.faults:
            f.confidence_temperature = c.temperature
        if "gpu_leak" in c.faults:
            # The sidecar's fake NVML scripts the device side from its config; the allocator side follows here.
            f.leak_pid, f.leak_rate_bytes_per_s = self.leak_pid, c.leak_mib_per_s * MiB
            f.leak_start_unix = time.time()
        f.feature_drift = "drift" in c.faults
        f.canary_share = c.canary_share if "canary" in c.faults else 0.0
        f.injected_unix = {name: time.time() for name in c.faults}
        _put_json(f"{self.stable_url}/admin/faults", f.to_json(), self.token)
        assert self.loadgen is not None
        self.loadgen.drift = "drift" in c.faults
        self.loadgen.canary_share = f.canary_share
        self.loadgen.bad_events = "bad_events" in c.faults
        for st in self.faults.values():
            st.injected_at = t

    # -- observation ----------------------------------------------------------------------------
    def poll(self) -> Snapshot:
        """Scrape the sidecar (and Prometheus), update detection, and return a snapshot."""
        t = self.now()
        snap = Snapshot(t, faults=self.faults)
        try:
            scrape = promtext.Scrape(promtext.fetch(f"{self.sidecar_url}/metrics"), t)
            status = promtext.fetch_json(f"{self.sidecar_url}/v1/status")
        except (OSError, ValueError) as e:
            snap.errors.append(f"sidecar: {e}")
            return snap
        self._prev.append(scrape)
        # Keep about 10 s of scrapes: quantiles are over the last 10 s, like a rate()[10s].
        while len(self._prev) > 2 and self._prev[1].t <= t - 10.0:
            self._prev.pop(0)
        old = self._prev[0] if len(self._prev) > 1 else None
        snap.stages = self._stage_quantiles(scrape, old)
        snap.gpu = (status.get("components") or {}).get("gpu") or {}
        snap.drift = self._drift(scrape)
        if self.loadgen is not None:
            snap.load = self.loadgen.snapshot()
        snap.load["producers"] = int(scrape.value("inferwatch_producers", 0) or 0)
        if self.prometheus_url and self.prom_scraped_at is None:
            # Until the first scrape (and the evaluation after it), absent(up) alerts are pending by
            # construction: not a finding.
            try:
                up = promtext.fetch_json(f"{self.prometheus_url}/api/v1/query?query=up")["data"]["result"]
                if any(r["value"][1] == "1" for r in up):
                    self.prom_scraped_at = t
            except (OSError, ValueError, KeyError) as e:
                snap.errors.append(f"prometheus: {e}")
        if self.prometheus_url and self.prom_scraped_at is not None and t - self.prom_scraped_at >= 3.0:
            try:
                items = promtext.fetch_json(f"{self.prometheus_url}/api/v1/alerts")["data"]["alerts"]
                snap.alert_items = items
                for a in items:
                    name = a["labels"]["alertname"]
                    self.alerts_seen.setdefault(name, set()).add(a["state"])
                    if snap.alerts.get(name) != "firing":
                        snap.alerts[name] = a["state"]
            except (OSError, ValueError, KeyError) as e:
                snap.errors.append(f"prometheus: {e}")
        self._judge(snap, scrape)
        self.last = snap
        return snap

    @staticmethod
    def _stage_quantiles(scrape: promtext.Scrape, old: promtext.Scrape | None) -> dict[str, dict[Any, Any]]:
        name = "inferwatch_stage_duration_seconds"
        new_b = scrape.buckets(name, "stage")
        old_b = old.buckets(name, "stage") if old is not None else {}
        out: dict[str, dict[Any, Any]] = {}
        for stage, b in sorted(new_b.items()):
            d = promtext.delta(b, old_b.get(stage))
            q: dict[Any, Any] = dict(promtext.quantiles(d))
            dt = scrape.t - old.t if old is not None else 0.0
            q["rate"] = (max(d.values()) / dt) if dt > 0 and d else None
            out[stage] = q
        return out

    @staticmethod
    def _drift(scrape: promtext.Scrape) -> dict[tuple[str, str], dict[str, Any]]:
        out: dict[tuple[str, str], dict[str, Any]] = {}

        def entry(lab: dict[str, str]) -> dict[str, Any]:
            return out.setdefault((lab.get("model", ""), lab.get("model_version", "")),
                                  {"features": {}, "confidence": [None, None]})

        for lab, v in scrape.get("inferwatch_drift_feature_drifted"):
            e = entry(lab)
            e["features"].setdefault(lab["feature"], {})["drifted"] = v == 1.0
        for lab, v in scrape.get("inferwatch_drift_feature_score"):
            entry(lab)["features"].setdefault(lab["feature"], {}).setdefault("scores", {})[lab["measure"]] = v
        for lab, v in scrape.get("inferwatch_drift_feature_p_value"):
            entry(lab)["features"].setdefault(lab["feature"], {})["p"] = v
        for lab, v in scrape.get("inferwatch_drift_confidence_mean"):
            entry(lab)["confidence"][0 if lab.get("window") == "current" else 1] = v
        for lab, v in scrape.get("inferwatch_drift_dataset_drifted"):
            entry(lab)["dataset_drifted"] = v == 1.0
        for lab, v in scrape.get("inferwatch_drift_dataset_drifted_ratio"):
            entry(lab)["drifted_ratio"] = v
        for lab, v in scrape.get("inferwatch_drift_canary_drifted_ratio"):
            entry(lab)["canary_ratio"] = v
        for lab, v in scrape.get("inferwatch_drift_canary_feature_drifted"):
            entry(lab).setdefault("canary_columns", {})[lab["feature"]] = v == 1.0
        for lab, v in scrape.get("inferwatch_drift_estimated_accuracy_ratio"):
            entry(lab)["estimated_accuracy"] = v
        for lab, v in scrape.get("inferwatch_drift_accuracy_ratio"):
            entry(lab)["accuracy"] = v
        for lab, v in scrape.get("inferwatch_drift_window_events"):
            entry(lab)["window_events"] = v
        for lab, v in scrape.get("inferwatch_drift_prediction_class_ratio"):
            entry(lab).setdefault("classes", {})[lab["class"]] = v
        return out

    def _judge(self, snap: Snapshot, scrape: promtext.Scrape) -> None:
        t = snap.t
        for name, st in self.faults.items():
            if st.injected_at is None:
                continue
            ok, detail = self._signal(name, snap, scrape)
            if ok and st.detected_at is None:
                st.detected_at = t
            if ok or not st.detail:
                st.detail = detail
            for alert, match in EXPECTED_ALERTS.get(name, []):
                st.alerts[alert] = self._alert_state(snap, alert, match)

    def _signal(self, name: str, snap: Snapshot, scrape: promtext.Scrape) -> tuple[bool, str]:
        if name == "latency":
            q = snap.stages.get("inference", {})
            p999 = q.get(0.999)
            return (p999 is not None and p999 > P999_TARGET_S,
                    f"inference P99.9 {_fmt_s(p999)} (target {P999_TARGET_S:g}s)")
        stable = snap.drift.get((MODEL, STABLE), {})
        if name == "drift":
            ratio = stable.get("drifted_ratio")
            flagged = [f for f, d in stable.get("features", {}).items() if d.get("drifted")
                       and f not in ("prediction", "confidence")]
            return bool(stable.get("dataset_drifted")), (
                f"{len(flagged)} inputs drifted ({', '.join(sorted(flagged)) or '-'}), share "
                f"{ratio:.0%}" if ratio is not None else "no drift evaluation yet")
        if name == "confidence":
            cur, ref = stable.get("confidence", [None, None])
            if cur is None or ref is None:
                return False, "no confidence window yet"
            return ref - cur > CONFIDENCE_DROP, f"mean confidence {cur:.3f} vs reference {ref:.3f}"
        if name == "gpu_leak":
            for dev in snap.gpu.get("devices", []):
                for p in dev.get("processes", []):
                    if p.get("pid") == self.leak_pid:
                        v = p.get("verdict")
                        rate = p.get("rate_bytes_per_s")
                        tto = p.get("time_to_oom_s")
                        return v == "leak", (f"pid {self.leak_pid}: {v}, {_fmt_rate(rate)}, "
                                             f"OOM in {_fmt_dur(tto)}")
            return False, f"pid {self.leak_pid} not sampled yet"
        if name == "canary":
            can = snap.drift.get((MODEL, CANARY), {})
            cols = can.get("canary_columns")
            if cols is None:
                return False, "no canary comparison yet"
            differ = sorted(c for c, d in cols.items() if d)
            return cols.get("prediction", False), (
                f"{CANARY} vs {STABLE}: prediction mix differs" if cols.get("prediction") else
                f"{CANARY} vs {STABLE}: prediction mix the same") + (f"; differing: {', '.join(differ)}"
                                                                     if differ else "")
        if name == "bad_events":
            n = scrape.value("inferwatch_ingest_decode_errors_total", 0.0, scope="json") or 0.0
            return n > 0, f"{n:.0f} malformed JSON events counted and dropped"
        return False, ""

    @staticmethod
    def _alert_state(snap: Snapshot, alert: str, match: dict[str, str]) -> str:
        best = "inactive"
        for a in snap.alert_items:
            lab = a.get("labels", {})
            if lab.get("alertname") != alert or any(lab.get(k) != v for k, v in match.items()):
                continue
            if a.get("state") == "firing":
                return "firing"
            best = a.get("state", best)
        return best

    # -- results --------------------------------------------------------------------------------
    def all_detected(self) -> bool:
        """True when every configured fault was injected and detected."""
        return all(st.detected for st in self.faults.values())

    def expected_alert_names(self) -> set[str]:
        return {a for f in self.cfg.faults for a, _ in EXPECTED_ALERTS.get(f, [])}

    def unexpected_alerts(self) -> dict[str, set[str]]:
        """Alerts seen pending or firing that no injected fault explains."""
        want = self.expected_alert_names()
        return {n: s for n, s in self.alerts_seen.items() if n not in want}

    def summary_lines(self) -> list[str]:
        """The end-of-run summary, one fault per line, then the verdict."""
        lines = ["fault                                          injected  detected  after   evidence"]
        for name in ALL_FAULTS:
            st = self.faults.get(name)
            if st is None:
                continue
            inj = f"{st.injected_at:6.1f}s" if st.injected_at is not None else "     -"
            det = f"{st.detected_at:6.1f}s" if st.detected_at is not None else "    NO"
            after = f"{st.latency_s:5.1f}s" if st.latency_s is not None else "    -"
            lines.append(f"{FAULT_TITLES[name]:<46} {inj}   {det}  {after}  {st.detail}")
            if self.prometheus_url:
                for alert, state in st.alerts.items():
                    lines.append(f"{'':<46} alert {alert}: {state}")
        if self.prometheus_url:
            extra = self.unexpected_alerts()
            lines.append("other alerts: " + (", ".join(f"{n} ({'/'.join(sorted(s))})" for n, s in
                                                      sorted(extra.items())) or "none (all quiet)"))
        injected = [st for st in self.faults.values() if st.injected_at is not None]
        if not injected:
            lines.append(f"NOT RUN: stopped before the faults were injected (t={self.cfg.injection_time():.0f}s)")
            return lines
        n = sum(st.detected for st in injected)
        verdict = "PASS" if self.all_detected() else "FAIL"
        lines.append(f"{verdict}: {n} of {len(injected)} injected faults detected")
        return lines

    # -- stop -----------------------------------------------------------------------------------
    def stop(self) -> dict[str, int | None]:
        """Stop the load, the servers and the sidecar (in that order); returns their exit statuses."""
        if self.loadgen is not None:
            self.loadgen.stop(timeout=5.0)
        codes: dict[str, int | None] = {}
        for name in ("stable", "canary", "sidecar"):
            p = self.procs.pop(name, None)
            if p is not None:
                codes[name] = p.stop()
        for name in list(self.procs):
            codes[name] = self.procs.pop(name).stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return codes

    def __enter__(self) -> Scenario:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _fmt_s(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * 1000:.1f}ms" if v < 1 else f"{v:.2f}s"


def _fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v / MiB:.1f} MiB/s"


def _fmt_dur(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 3600:
        return f"{v / 3600:.1f}h"
    if v >= 60:
        return f"{v / 60:.1f}min"
    return f"{v:.0f}s"

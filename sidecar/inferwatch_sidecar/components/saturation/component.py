"""The saturation component: samples GPU activity (GPM) and health, joins it with the engines' state
and the serving process's CPU, and judges one binding resource per model version.

It reads the ``engines`` component (``connect``); without engines targets there is no model version
to judge and it exports the GPU activity only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.engines.component import EnginesComponent, labels_of
from inferwatch_sidecar.components.gpu.gpm import THROTTLE_REASONS, Activity, GpmSampler, Health
from inferwatch_sidecar.components.periodic import PeriodicComponent
from inferwatch_sidecar.components.saturation.config import GpmConfig, SaturationConfig
from inferwatch_sidecar.components.saturation.rules import RESOURCES, Inputs, Judge, Thresholds
from inferwatch_sidecar.metrics import saturation as sm
from inferwatch_sidecar.metrics.samples import Samples

Key = tuple[str, str, str]


def _fake_nvml(cfg: GpmConfig, monotonic: Callable[[], float]) -> Any:
    from inferwatch_sidecar.components.gpu import fake_gpm
    from inferwatch_sidecar.components.gpu.fake_nvml import FakeDevice

    start = monotonic()
    phases = sorted(cfg.fake, key=lambda p: p.until_s)
    period = phases[-1].until_s

    def workload(t: float) -> fake_gpm.Phase:
        t = t % period
        for p in phases:
            if t < p.until_s:
                return fake_gpm.Phase(p.busy, p.prefill)
        return fake_gpm.Phase(phases[-1].busy, phases[-1].prefill)

    return fake_gpm.FakeGpmNvml([FakeDevice()], clock=lambda: monotonic() - start, workloads={0: workload},
                                gpm=cfg.fake_gpm)


def _merge(acts: list[Activity]) -> Activity | None:
    """One reading for the GPUs a model runs on: the busiest value of each counter (the fullest GPU binds)."""
    if not acts:
        return None
    out = Activity("+".join(a.gpu for a in acts), "gpm" if all(a.fidelity == "gpm" for a in acts) else "coarse",
                   min(a.t0 for a in acts), max(a.t1 for a in acts))
    for attr in ("sm_util", "sm_occupancy", "tensor_active", "dram_bw_util", "kernel_active"):
        vals = [getattr(a, attr) for a in acts if getattr(a, attr) is not None]
        setattr(out, attr, max(vals) if vals else None)
    return out


class SaturationComponent(PeriodicComponent):
    """GPU activity, health and the saturation verdict (one subclass of the shared base)."""

    name = "saturation"
    metrics = sm.METRICS
    immediate = True

    def __init__(self, config: SaturationConfig, ctx: ComponentContext, sampler: GpmSampler | None) -> None:
        super().__init__(ctx, interval_s=config.gpm.interval_s)
        self.cfg = config
        self.sampler = sampler
        self.th = Thresholds(config.enter, config.exit, config.enter_hold_s, config.exit_hold_s,
                             config.smoothing_s, config.switch_margin)
        self.engines: EnginesComponent | None = None
        self.judges: dict[Key, Judge] = {}
        self.activity: dict[str, Activity] = {}
        self.health: dict[str, Health] = {}
        self._running = False

    def connect(self, peers: Any) -> None:
        """Read the engines component's targets (``peers`` is the daemon's Peers, or a dict in tests)."""
        eng = peers.get("engines") if isinstance(peers, dict) else peers.first(EnginesComponent)
        self.engines = eng if isinstance(eng, EnginesComponent) else None

    def on_start(self) -> None:
        self._running = True

    def on_stop(self) -> None:
        self._running = False
        if self.sampler is not None:
            self.sampler.shutdown()

    def tick(self) -> bool | None:
        """One pass: sample the GPUs, read the engines, judge, publish (tests call it directly)."""
        c0 = time.thread_time()
        acts, healths = self.sampler.sample() if self.sampler is not None else ([], [])
        now = self.ctx.monotonic()
        with self._state_lock:
            for a in acts:
                self.activity[a.gpu] = a
            for h in healths:
                self.health[h.gpu] = h
            self._judge(now)
            samples = self._samples()
        self.publish_pass(samples, c0)
        return None

    def _judge(self, now: float) -> None:
        eng = self.engines
        if eng is None:
            return
        with eng._state_lock:
            for t in eng.targets:
                tc = eng.cfg_of(t)
                gpus = [self.activity[g] for g in (tc.gpus or [g for g in self.activity if "/" not in g])
                        if g in self.activity]
                act = _merge(gpus)
                for key, st in t.models.items():
                    lab = labels_of(tc, key)
                    x = Inputs(t=now, cpu_budget=tc.cpu_cores)
                    if act is not None:
                        x.fidelity = act.fidelity
                        x.sm_util, x.sm_occupancy, x.tensor_active = act.sm_util, act.sm_occupancy, act.tensor_active
                        x.dram_bw_util, x.kernel_active = act.dram_bw_util, act.kernel_active
                    if t.up:
                        mr = st.reading
                        x.kv_usage, x.waiting, x.running = mr.kv_usage, mr.waiting, mr.running
                        if st.last is not None:
                            x.preemptions = st.last.preemptions
                            x.queue_share, x.prefill_share = st.last.queue_share, st.last.prefill_share
                        x.cpu_cores, x.host_cpu_ratio = t.cpu_cores, t.host_cpu_ratio
                    j = self.judges.get(lab)
                    if j is None:
                        j = self.judges[lab] = Judge(self.th)
                    j.update(x)

    def _samples(self) -> Samples:
        out = Samples()
        for lab, j in self.judges.items():
            for r in RESOURCES:
                if r in j.smooth:
                    out.put(sm.SATURATION_RATIO, (*lab, r), j.smooth[r])
            for r in (*RESOURCES, "none"):
                out.put(sm.SATURATION_BOUND, (*lab, r), 1.0 if j.bound == r else 0.0)
        for g, a in self.activity.items():
            out.put(sm.GPU_SM_UTILIZATION_RATIO, (g, a.fidelity), a.sm_util)
            out.put(sm.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO, (g, a.fidelity), a.dram_bw_util)
            out.put(sm.GPU_SM_OCCUPANCY_RATIO, (g,), a.sm_occupancy)
            out.put(sm.GPU_TENSOR_ACTIVE_RATIO, (g,), a.tensor_active)
            out.put(sm.GPU_PCIE_TX_BYTES_PER_SECOND, (g,), a.pcie_tx_bytes_per_s)
            out.put(sm.GPU_PCIE_RX_BYTES_PER_SECOND, (g,), a.pcie_rx_bytes_per_s)
        for g, h in self.health.items():
            for reason, _ in THROTTLE_REASONS:
                if reason in h.throttle:
                    out.put(sm.GPU_THROTTLE_ACTIVE, (g, reason), 1.0 if h.throttle[reason] else 0.0)
            out.put(sm.GPU_CLOCK_HERTZ, (g, "sm"), h.sm_clock_hz)
            out.put(sm.GPU_CLOCK_HERTZ, (g, "memory"), h.mem_clock_hz)
            out.put(sm.GPU_ECC_ERRORS_TOTAL, (g, "corrected"), h.ecc_corrected)
            out.put(sm.GPU_ECC_ERRORS_TOTAL, (g, "uncorrected"), h.ecc_uncorrected)
        if self.sampler is not None:
            for (g, code), n in self.sampler.xids.items():
                out.put(sm.GPU_XID_ERRORS_TOTAL, (g, code), float(n))
            for (op, reason), n in self.sampler.faults.items():
                out.put(sm.SATURATION_GPU_FAULTS_TOTAL, (op, reason), float(n))
        return out

    def status(self) -> dict[str, Any]:
        with self._state_lock:
            models = []
            rows = []
            for (service, model, version), j in sorted(self.judges.items()):
                text = j.sentence()
                models.append({"service": service, "model": model, "model_version": version, "bound": j.bound,
                               "since_s": None if j.since is None else round(self.ctx.monotonic() - j.since, 1),
                               "sentence": text,
                               "ratios": {r: round(v, 3) for r, v in j.smooth.items()}})
                if j.bound != "none":
                    # since_unix: when this bound began (the status summary's since-when, the judge's own).
                    since = None if j.since is None else self.ctx.clock() - (self.ctx.monotonic() - j.since)
                    rows.append({"subject": f"{service}/{model}/{version}", "verdict": f"{j.bound}-bound",
                                 "severity": "warn", "detail": text, "alert": "InferwatchSaturated",
                                 "since_unix": since})
            gpus = {g: {"fidelity": a.fidelity, "sm_util": a.sm_util, "sm_occupancy": a.sm_occupancy,
                        "tensor_active": a.tensor_active, "dram_bw_util": a.dram_bw_util,
                        "kernel_active": a.kernel_active} for g, a in sorted(self.activity.items())}
            throttled = {g: [r for r, on in h.throttle.items() if on and r != "idle"]
                         for g, h in self.health.items()}
        out: dict[str, Any] = {
            "state": "running" if self._running else "built",
            "sentence": "; ".join(f"{m['service']}/{m['model']}: {m['sentence']}" for m in models)
            or ("no model version to judge: add engines targets (--engine-metrics URL)" if self.engines is None
                or not self.engines.targets else "no engine reading yet"),
            "models": models, "gpus": gpus, "verdicts": rows,
            "gpm_backend": self.cfg.gpm.backend, "sampler_cpu_s": round(self.cpu_s, 6),
        }
        if any(throttled.values()):
            out["throttled"] = {g: r for g, r in throttled.items() if r}
        if self.sampler is not None and self.sampler.last_fault:
            out["last_gpu_fault"] = self.sampler.last_fault
        return out


def build(config: SaturationConfig, ctx: ComponentContext, sampler: GpmSampler | None = None) -> SaturationComponent:
    """The component; the GPU sampler per ``gpm.backend`` unless one is given (tests)."""
    if sampler is None and config.gpm.backend != "off":
        if config.gpm.backend == "fake":
            sampler = GpmSampler(_fake_nvml(config.gpm, ctx.monotonic), monotonic=ctx.monotonic)
        else:
            try:
                import pynvml
            except ImportError:
                if config.gpm.backend == "nvml":
                    raise ValueError('gpm.backend is nvml but nvidia-ml-py is not installed: '
                                     'pip install "inferwatch[sidecar]"') from None
            else:
                sampler = GpmSampler(pynvml, monotonic=ctx.monotonic)
    return SaturationComponent(config, ctx, sampler)

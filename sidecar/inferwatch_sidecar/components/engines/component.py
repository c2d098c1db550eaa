"""The engines component: scrapes each configured engine endpoint on its own thread.

The neutral series carry the target's configured labels (service, model, model_version),
so one dashboard and one alert work across vLLM, SGLang, Triton and TensorRT-LLM.
"""

from __future__ import annotations

import time
from typing import Any

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.engines.config import EnginesConfig, EngineTarget
from inferwatch_sidecar.components.engines.target import REASONS, Target
from inferwatch_sidecar.components.periodic import PeriodicComponent
from inferwatch_sidecar.metrics import engines as em
from inferwatch_sidecar.metrics.samples import Samples


def labels_of(tc: EngineTarget, key: tuple[str, str]) -> tuple[str, str, str]:
    """(service, model, model_version) of one engine model of a target: the config's, else the engine's."""
    model = tc.model or key[0]
    version = tc.model_version or key[1]
    return tc.service or tc.name, model, version


class EnginesComponent(PeriodicComponent):
    """Scrapes engines; exports the neutral set and the scrape outcomes (one subclass of the shared base)."""

    name = "engines"
    metrics = em.METRICS
    immediate = True

    def __init__(self, config: EnginesConfig, ctx: ComponentContext, targets: list[Target] | None = None) -> None:
        super().__init__(ctx, interval_s=config.interval_s)
        self.cfg = config
        self.targets = targets if targets is not None else [
            Target(t.url, t.name, t.kind, config.timeout_s, config.max_body_bytes,
                   1 if t.model else config.max_models, monotonic=ctx.monotonic) for t in config.targets]
        self.target_cfg = {t.name: t for t in config.targets}
        self._running = False

    def start(self) -> None:
        """Start scraping; without targets there is nothing to do and no thread."""
        if self.targets:
            self._running = True
            super().start()

    def on_stop(self) -> None:
        self._running = False

    def tick(self) -> bool | None:
        """Scrape every target once and publish (the worker's pass; tests call it directly)."""
        c0 = time.thread_time()
        with self._state_lock:
            for t in self.targets:
                t.scrape()
            samples = self._samples()
        self.publish_pass(samples, c0)
        return None

    def cfg_of(self, t: Target) -> EngineTarget:
        return self.target_cfg.get(t.name) or EngineTarget(url=t.url, name=t.name)

    def _samples(self) -> Samples:
        out = Samples()
        for t in self.targets:
            tc = self.cfg_of(t)
            kind = t.kind if t.kind != "auto" else (t.detected or "unknown")
            out.put(em.ENGINE_UP, (t.name, kind), 1.0 if t.up else 0.0)
            for r in REASONS:
                out.put(em.ENGINE_SCRAPES_TOTAL, (t.name, r), float(t.results.get(r, 0)))
            out.put(em.ENGINE_SCRAPE_DURATION_SECONDS, (t.name,), t.scrape_seconds)
            for key, st in t.models.items():
                lab = labels_of(tc, key)
                mr = st.reading
                # combine: two engine models folded into one configured label set add (counts) or keep the max.
                out.combine(em.ENGINE_REQUESTS_RUNNING, lab, mr.running)
                out.combine(em.ENGINE_REQUESTS_WAITING, lab, mr.waiting)
                out.combine(em.ENGINE_KV_CACHE_USAGE_RATIO, lab, mr.kv_usage)
                if mr.preemptions is not None:
                    out.combine(em.ENGINE_PREEMPTIONS_TOTAL, lab, st.preemptions_total)
                out.combine(em.ENGINE_PREFIX_CACHE_HIT_RATIO, lab, st.prefix_hit_ratio)
                if st.last is not None:
                    out.combine(em.ENGINE_QUEUE_TIME_SHARE_RATIO, lab, st.last.queue_share)
        return out

    def status(self) -> dict[str, Any]:
        with self._state_lock:
            targets = [t.status() for t in self.targets]
        down = [t["url"] for t in targets if not t["up"]]
        return {"state": "running" if self._running else ("idle" if not self.targets else "built"),
                "targets": targets, "down": down, "scrape_cpu_s": round(self.cpu_s, 6), "passes": self.passes}


def build(config: EnginesConfig, ctx: ComponentContext) -> EnginesComponent:
    """The component; without targets it runs no thread and exports nothing."""
    return EnginesComponent(config, ctx)

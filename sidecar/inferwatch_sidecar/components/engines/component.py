"""The engines component: scrapes each configured engine endpoint on its own thread.

The neutral series carry the target's configured labels (service, model, model_version),
so one dashboard and one alert work across vLLM, SGLang, Triton and TensorRT-LLM.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from inferwatch_sidecar.components.base import ComponentContext
from inferwatch_sidecar.components.engines.config import EnginesConfig, EngineTarget
from inferwatch_sidecar.components.engines.target import REASONS, Target
from inferwatch_sidecar.components.worker import PeriodicWorker
from inferwatch_sidecar.metrics import engines as em
from inferwatch_sidecar.metrics import families


def labels_of(tc: EngineTarget, key: tuple[str, str]) -> tuple[str, str, str]:
    """(service, model, model_version) of one engine model of a target: the config's, else the engine's."""
    model = tc.model or key[0]
    version = tc.model_version or key[1]
    return tc.service or tc.name, model, version


class EnginesComponent:
    """Scrapes engines; exports the neutral set and the scrape outcomes."""

    name = "engines"
    record_types: frozenset[int] = frozenset()

    def __init__(self, config: EnginesConfig, ctx: ComponentContext, targets: list[Target] | None = None) -> None:
        self.cfg = config
        self.ctx = ctx
        self.targets = targets if targets is not None else [
            Target(t.url, t.name, t.kind, config.timeout_s, config.max_body_bytes,
                   1 if t.model else config.max_models) for t in config.targets]
        self.target_cfg = {t.name: t for t in config.targets}
        self._lock = threading.Lock()
        self._worker: PeriodicWorker | None = None
        self.passes = 0
        self.cpu_s = 0.0

    def tick(self) -> None:
        """Scrape every target once (the worker's pass; tests call it directly)."""
        c0 = time.thread_time()
        for t in self.targets:
            with self._lock:
                t.scrape()
        self.passes += 1
        self.cpu_s += time.thread_time() - c0

    def start(self) -> None:
        if self._worker is None and self.targets:
            self._worker = PeriodicWorker("inferwatch-engines", self.cfg.interval_s, self._pass, self._failed)
            self._worker.start()

    def _pass(self) -> bool:
        self.tick()
        return False

    def _failed(self, e: Exception) -> None:
        self.ctx.logger.exception("engine scrape pass failed", exc_info=e)

    def stop(self, timeout: float) -> None:
        if self._worker is not None:
            self._worker.stop(timeout)
            self._worker = None

    def handle(self, pid: int, producer_id: int, records: list[tuple[Any, ...]]) -> None:
        return None

    def cfg_of(self, t: Target) -> EngineTarget:
        return self.target_cfg.get(t.name) or EngineTarget(url=t.url, name=t.name)

    def collect(self) -> Iterable[Any]:
        running, waiting = families.gauge(em.ENGINE_REQUESTS_RUNNING), families.gauge(em.ENGINE_REQUESTS_WAITING)
        kv, pre = families.gauge(em.ENGINE_KV_CACHE_USAGE_RATIO), families.counter(em.ENGINE_PREEMPTIONS_TOTAL)
        hit, qs = families.gauge(em.ENGINE_PREFIX_CACHE_HIT_RATIO), families.gauge(em.ENGINE_QUEUE_TIME_SHARE_RATIO)
        up, scrapes = families.gauge(em.ENGINE_UP), families.counter(em.ENGINE_SCRAPES_TOTAL)
        dur = families.gauge(em.ENGINE_SCRAPE_DURATION_SECONDS)
        with self._lock:
            for t in self.targets:
                tc = self.cfg_of(t)
                kind = t.kind if t.kind != "auto" else (t.detected or "unknown")
                up.add_metric([t.name, kind], 1.0 if t.up else 0.0)
                for r in REASONS:
                    scrapes.add_metric([t.name, r], float(t.results.get(r, 0)))
                dur.add_metric([t.name], t.scrape_seconds)
                for key, st in t.models.items():
                    lab = list(labels_of(tc, key))
                    mr = st.reading
                    if mr.running is not None:
                        running.add_metric(lab, mr.running)
                    if mr.waiting is not None:
                        waiting.add_metric(lab, mr.waiting)
                    if mr.kv_usage is not None:
                        kv.add_metric(lab, mr.kv_usage)
                    if mr.preemptions is not None:
                        pre.add_metric(lab, st.preemptions_total)
                    if st.prefix_hit_ratio is not None:
                        hit.add_metric(lab, st.prefix_hit_ratio)
                    if st.last is not None and st.last.queue_share is not None:
                        qs.add_metric(lab, st.last.queue_share)
        return [running, waiting, kv, pre, hit, qs, up, scrapes, dur]

    def status(self) -> dict[str, Any]:
        with self._lock:
            targets = [t.status() for t in self.targets]
        down = [t["url"] for t in targets if not t["up"]]
        return {"state": "running" if self._worker is not None else ("idle" if not self.targets else "built"), "targets": targets,
                "down": down, "scrape_cpu_s": round(self.cpu_s, 6), "passes": self.passes}


def build(config: EnginesConfig, ctx: ComponentContext) -> EnginesComponent:
    """The component; without targets it runs no thread and exports only nothing."""
    return EnginesComponent(config, ctx)

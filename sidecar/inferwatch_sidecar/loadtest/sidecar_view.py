"""``--sidecar URL``: each step joined with what the sidecar saw over the same seconds.

Before and after a step the sidecar's ``/metrics`` is scraped; the differences give the server-side mean of
each stage (and of the queue wait) over the step, the stage that grew most since the first step (queue or
compute), the GPU memory peak (polled once a second during the step) and any saturation verdict.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import defaultdict
from typing import Any

from inferwatch_sidecar.loadtest.runner import Step

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, timeout: float = 5.0) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as r:
        text = r.read().decode("utf-8", "replace")
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _sum_by(m: Samples, name: str, key: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (n, labels), v in m.items():
        if n == name:
            out[dict(labels).get(key, "")] += v
    return out


def stage_means(before: Samples, after: Samples) -> dict[str, float]:
    """Mean seconds per stage (and "queue_wait", "request") over the interval between two scrapes."""
    out: dict[str, float] = {}
    for metric, key in (("inferwatch_stage_duration_seconds", "stage"), ("inferwatch_queue_wait_seconds", ""),
                        ("inferwatch_request_duration_seconds", "")):
        s1, c1 = _sum_by(after, metric + "_sum", key), _sum_by(after, metric + "_count", key)
        s0, c0 = _sum_by(before, metric + "_sum", key), _sum_by(before, metric + "_count", key)
        for k, c in c1.items():
            dc = c - c0.get(k, 0.0)
            if dc > 0:
                name = k if key else ("queue_wait" if "queue" in metric else "request")
                out[name] = (s1.get(k, 0.0) - s0.get(k, 0.0)) / dc
    return out


def gpu_used(m: Samples) -> float:
    return sum(v for (n, _), v in m.items() if n == "inferwatch_gpu_memory_used_bytes")


def saturation(m: Samples) -> str:
    """Any saturation verdict the sidecar exports (a gauge whose name says saturation), as text."""
    hits = []
    for (n, labels), v in m.items():
        if "saturation" in n and v:
            lab = dict(labels)
            what = lab.get("verdict") or lab.get("resource") or lab.get("stage") or ""
            hits.append(f"{n.removeprefix('inferwatch_')}{'[' + what + ']' if what else ''}={v:g}")
    return ", ".join(sorted(hits)[:3])


class SidecarView:
    def __init__(self, url: str) -> None:
        self.url = url if "://" in url else "http://" + url
        self.first: dict[str, float] | None = None
        self._before: Samples = {}
        self._peak = 0.0
        self._poll: asyncio.Task[None] | None = None

    async def _get(self) -> Samples:
        return await asyncio.get_running_loop().run_in_executor(None, scrape, self.url)

    async def check(self) -> None:
        try:
            await self._get()
        except Exception as e:  # noqa: BLE001 - any failure is the same clear message
            raise ValueError(f"--sidecar {self.url}: cannot read its /metrics ({e})") from None

    async def _poll_gpu(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self._peak = max(self._peak, gpu_used(await self._get()))
            except Exception:  # noqa: BLE001,S112 - a missed poll only lowers the peak's resolution
                continue

    async def around(self, step: Step, before: bool) -> None:
        if before:
            self._before = await self._get()
            self._peak = gpu_used(self._before)
            self._poll = asyncio.get_running_loop().create_task(self._poll_gpu())
            return
        if self._poll:
            self._poll.cancel()
        await asyncio.sleep(0.3)  # let the sidecar aggregate the step's last events
        after = await self._get()
        self._peak = max(self._peak, gpu_used(after))
        means = stage_means(self._before, after)
        view: dict[str, Any] = {"stages_s": means, "gpu_memory_peak_bytes": self._peak or None,
                                "saturation": saturation(after)}
        parts = [", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in sorted(means.items())) or "no requests seen"]
        if self.first is None and means:
            self.first = means
        elif self.first:
            grew = {k: v - self.first.get(k, 0.0) for k, v in means.items() if k not in ("request",)}
            if grew:
                k = max(grew, key=lambda s: grew[s])
                if grew[k] > 0:
                    kind = "queue" if "queue" in k else "compute"
                    view["grew"] = k
                    parts.append(f"grew most: {k} (+{grew[k] * 1e3:.3g} ms, {kind})")
        if self._peak:
            parts.append(f"GPU memory peak {self._peak / 2**30:.2f} GiB")
        if view["saturation"]:
            parts.append(f"saturation: {view['saturation']}")
        view["summary"] = "; ".join(parts)
        step.server = view

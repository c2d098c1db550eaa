"""Duplicated model copies: several processes on one GPU, each holding a similar, large, flat amount.

The usual cause is a multi-process server (gunicorn or uvicorn ``--workers 4``) whose every worker loads
the same model: the GPU holds four copies of the weights and runs out at start-up or under load.
``--preload`` does not help, since CUDA memory is never shared across a fork. docs/gpu.md and the
runbook of ``InferwatchGPUDuplicateModelCopies`` give the fixes.

Used by the live component (per sampling pass) and by ``gpu analyze`` (per nvidia-smi pass), with the same
thresholds (:class:`~inferwatch_sidecar.components.gpu.config.DuplicatesConfig`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from inferwatch_sidecar.components.gpu.config import DuplicatesConfig

#: Bins per ``flat_s`` window: a tracker holds at most BINS + 1 of them, whatever the sampling rate.
BINS = 20

#: What to do, for /v1/status and ``gpu analyze`` (the runbook has the details).
FIX = ("one process per GPU with threads or async workers (gunicorn --preload does not share CUDA memory), "
       "or serve the model from Triton or vLLM and scale with model instances instead of processes; "
       "see docs/runbooks.md#inferwatchgpuduplicatemodelcopies")


class FlatTracker:
    """The range of one process's memory over the last ``flat_s`` seconds, in bounded memory.

    Samples go into bins of ``flat_s / BINS`` seconds (per-bin lowest and highest); the range is
    read over the bins that overlap the last ``flat_s`` seconds, so it covers between ``flat_s`` and
    ``flat_s`` plus one bin.

    Args:
        flat_s: the window.
    """

    __slots__ = ("_bin_s", "_bins", "first_t", "last_t", "last")

    def __init__(self, flat_s: float) -> None:
        self._bin_s = flat_s / BINS
        self._bins: deque[list[float]] = deque(maxlen=BINS + 1)  # [key, lowest, highest]
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.last: float | None = None

    def update(self, t: float, v: float) -> None:
        """Feed one sample (seconds, bytes); out-of-order and NaN samples are ignored."""
        if math.isnan(v) or (self.last_t is not None and t < self.last_t):
            return
        key = math.floor(t / self._bin_s)
        if self._bins and self._bins[-1][0] == key:
            b = self._bins[-1]
            b[1], b[2] = min(b[1], v), max(b[2], v)
        else:
            self._bins.append([key, v, v])
        if self.first_t is None:
            self.first_t = t
        self.last_t, self.last = t, v

    def flat_level(self, now: float, cfg: DuplicatesConfig) -> float | None:
        """The latest value when the series was seen for ``flat_s`` and stayed flat over it, else None."""
        if self.first_t is None or self.last is None or now - self.first_t < cfg.flat_s:
            return None
        oldest = math.floor((now - cfg.flat_s) / self._bin_s)
        live = [b for b in self._bins if b[0] >= oldest]
        if not live:
            return None
        lo, hi = min(b[1] for b in live), max(b[2] for b in live)
        return self.last if hi > 0 and hi - lo < cfg.flat_ratio * hi else None


@dataclass(frozen=True)
class Copies:
    """A set of similar, large, flat processes on one GPU.

    Attributes:
        pids: the processes, ascending.
        sizes: their memory, bytes, in the order of ``pids``.
        copy_bytes: one copy: the smallest of the set.
        extra_bytes: what the set holds beyond one copy (sum minus the smallest).
    """

    pids: tuple[int, ...]
    sizes: tuple[float, ...]
    copy_bytes: float
    extra_bytes: float

    @property
    def copies(self) -> int:
        return len(self.pids)


def find_copies(levels: dict[int, float], cfg: DuplicatesConfig) -> Copies | None:
    """The largest set of similar copies among the flat levels of one GPU's processes, or None.

    Args:
        levels: pid -> flat level (bytes) of every process that is flat now.
        cfg: the thresholds.

    Returns:
        The set with the most members (ties: the most extra bytes) whose largest and smallest differ by
        at most ``cfg.similarity`` of the largest, each at least ``cfg.min_bytes``; None when the largest
        has fewer than ``cfg.min_copies`` members.
    """
    cand = sorted((v, pid) for pid, v in levels.items() if v >= cfg.min_bytes)
    best: tuple[int, float, int, int] | None = None  # (members, extra bytes, lo, hi) of cand[lo:hi]
    lo = 0
    total = 0.0
    for hi in range(len(cand)):
        total += cand[hi][0]
        while cand[hi][0] - cand[lo][0] > cfg.similarity * cand[hi][0]:
            total -= cand[lo][0]
            lo += 1
        key = (hi - lo + 1, total - cand[lo][0], lo, hi + 1)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None or best[0] < cfg.min_copies:
        return None
    members = sorted(cand[best[2]:best[3]], key=lambda x: x[1])
    return Copies(tuple(p for _, p in members), tuple(v for v, _ in members), min(v for v, _ in members),
                  best[1])

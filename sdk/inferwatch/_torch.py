"""The optional PyTorch CUDA caching-allocator probe.

It runs on the sender thread, never on the request path, at a low rate
(every 10 s by default). It never imports torch: it samples only when the
serving process has already imported torch and initialised CUDA, so it can
neither slow start-up nor create a CUDA context (hundreds of MB of device
memory) in a process that did not ask for one.

Each sample becomes one ``EV_ALLOC`` event per device: allocated, reserved,
active and inactive-split bytes, the cumulative ``num_alloc_retries`` and
``num_ooms``, and whether ``expandable_segments`` is on. The sidecar uses
them to tell tensor leaks, allocator cache growth and fragmentation, and
native leaks apart.

Turned on where torch is not installed, the probe says so once, when it is
built (at ``configure()``): otherwise it would send nothing without a word.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from inferwatch.wire import EV_ALLOC

logger = logging.getLogger("inferwatch")

#: The one line logged when the probe is on and torch is not installed.
NO_TORCH_NOTICE = (
    "inferwatch: the torch allocator probe is on (torch_probe=True or INFERWATCH_TORCH_PROBE) but torch is not "
    "installed here, so it sends nothing; install torch or turn the probe off"
)

#: ``() -> {device_index: memory_stats mapping}``; what ``torch_stats_source`` must be.
StatsSource = Callable[[], Mapping[int, Mapping[str, Any]]]

#: memory_stats() keys sent, in EV_ALLOC order.
STAT_KEYS = (
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
)


def expandable_segments_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the allocator config in the environment turns on expandable segments."""
    env = os.environ if environ is None else environ
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""
    for part in conf.split(","):
        key, _, value = part.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip().lower() == "true"
    return False


def torch_installed() -> bool:
    """Whether torch is loaded or could be imported, found without importing it."""
    return sys.modules.get("torch") is not None or importlib.util.find_spec("torch") is not None


def torch_stats() -> dict[int, Mapping[str, Any]]:
    """Stats of every CUDA device, when torch is loaded and CUDA is initialised; else ``{}``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    cuda = torch.cuda
    if not cuda.is_available() or not cuda.is_initialized():
        return {}
    return {i: cuda.memory_stats(i) for i in range(cuda.device_count())}


class AllocatorProbe:
    """Samples allocator stats at a fixed interval.

    Args:
        interval_s: seconds between samples.
        source: the stats source; default :func:`torch_stats`.
        clock: wall-clock nanoseconds for the sample time.
    """

    def __init__(
        self, interval_s: float, source: StatsSource | None = None, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.interval_s = interval_s
        if source is None and not torch_installed():
            logger.warning(NO_TORCH_NOTICE)
        self.source: StatsSource = source or torch_stats
        self.clock = clock
        self.next_due = 0.0
        self.samples = 0
        self.errors = 0
        self.last_error = ""

    def due(self, now: float) -> bool:
        """True when a sample is due at monotonic time ``now`` (and schedules the next)."""
        if now < self.next_due:
            return False
        self.next_due = now + self.interval_s
        return True

    def sample(self) -> list[tuple[Any, ...]]:
        """One EV_ALLOC event per device. Never raises; failures set ``last_error``."""
        self.last_error = ""
        try:
            stats = self.source()
            t = self.clock()
            out: list[tuple[Any, ...]] = []
            default_exp = None
            for dev, st in stats.items():
                vals = [_int(st.get(k, 0)) for k in STAT_KEYS]
                exp = st.get("expandable_segments")
                if exp is None:
                    if default_exp is None:
                        default_exp = expandable_segments_from_env()
                    exp = default_exp
                out.append((EV_ALLOC, t, int(dev), *vals, bool(exp)))
            self.samples += len(out)
            return out
        except Exception as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return []


def _int(v: Any) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError, OverflowError):
        return 0
    return n if n > 0 else 0

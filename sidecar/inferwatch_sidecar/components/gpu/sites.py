"""Allocation sites from the torch probe's second stage, kept per process and device, bounded.

The SDK's probe, once it suspects a tensor leak, records the allocator's history for a bounded time and
sends the sites whose allocations stayed live (``EV_ALLOC_SITE`` records: file, line, function, live bytes,
count; every site of one capture carries the capture's time). The sidecar keeps the last
:data:`MAX_CAPTURES_PER_KEY` captures of each (pid, device) and shows them in ``/v1/status`` beside the
process and on the leak episodes they fall in; ``gpu analyze`` reads the same captures from an allocator
file (``allocator_log``). Sites name code (file:line), so they are never metric labels.

Bounds: at most :data:`MAX_SITES` sites per capture (the probe sends 10), :data:`MAX_CAPTURES_PER_KEY`
captures per (pid, device), :data:`MAX_KEYS` (pid, device) pairs (the oldest forgotten first), and each
string is the wire's (at most 255 bytes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from inferwatch.wire import EV_ALLOC_SITE

#: Sites kept per capture (the probe sends its top 10, most bytes first).
MAX_SITES = 32
#: Captures kept per (pid, device): the probe records at most once an hour.
MAX_CAPTURES_PER_KEY = 4
#: (pid, device) pairs kept; the least recently updated is forgotten first.
MAX_KEYS = 256
#: A capture is shown on an episode when it was taken from this long before the episode's onset estimate
#: (the probe's own suspicion can precede the detector's onset fit) until the episode cleared.
BEFORE_ONSET_S = 900.0


class Capture:
    """One recording's sites: ``at`` (seconds since the epoch) and the sites, most bytes first."""

    __slots__ = ("at", "sites")

    def __init__(self, at: float) -> None:
        self.at = at
        self.sites: list[dict[str, Any]] = []

    def as_dict(self) -> dict[str, Any]:
        ranked = sorted(self.sites, key=lambda s: (-s["bytes"], s["file"], s["line"]))
        return {"captured_at": self.at, "sites": ranked}


def site_of(r: tuple[Any, ...]) -> tuple[int, int, dict[str, Any]]:
    """(capture time ns, device, site) of an ``EV_ALLOC_SITE`` event.

    Raises:
        ValueError: ``bad_layout`` (not such an event) or ``bad_value`` (a field of the wrong type or sign).
    """
    if len(r) != 8 or r[0] != EV_ALLOC_SITE:
        raise ValueError("bad_layout")
    _, t_ns, dev, file, line, function, nbytes, count = r
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (t_ns, dev, line, nbytes, count)):
        raise ValueError("bad_value")
    if not all(x is None or isinstance(x, str) for x in (file, function)):
        raise ValueError("bad_value")
    return t_ns, dev, {"file": file or "?", "line": line, "function": function or "?", "bytes": nbytes,
                       "count": count}


class SiteCaptures:
    """The captures of every (pid, device), bounded (module docstring). Not thread-safe: the caller locks."""

    def __init__(self, max_keys: int = MAX_KEYS, per_key: int = MAX_CAPTURES_PER_KEY) -> None:
        self.max_keys = max_keys
        self.per_key = per_key
        self._by_key: OrderedDict[tuple[int, int], list[Capture]] = OrderedDict()

    def add(self, pid: int, t_ns: int, device: int, site: dict[str, Any]) -> None:
        """Add one site of the capture taken at ``t_ns`` by process ``pid`` on ``device``."""
        key = (pid, device)
        caps = self._by_key.get(key)
        if caps is None:
            caps = self._by_key[key] = []
            if len(self._by_key) > self.max_keys:
                self._by_key.popitem(last=False)
        else:
            self._by_key.move_to_end(key)
        at = t_ns / 1e9
        cap = next((c for c in caps if c.at == at), None)
        if cap is None:
            cap = Capture(at)
            caps.append(cap)
            caps.sort(key=lambda c: c.at)
            del caps[:-self.per_key]
            if cap not in caps:
                return  # older than every capture kept
        if len(cap.sites) < MAX_SITES:
            cap.sites.append(site)

    def of(self, pid: int, device: int | None = None) -> list[Capture]:
        """The captures of ``pid`` on ``device`` (None: on any device), oldest first."""
        if device is not None:
            return list(self._by_key.get((pid, device), ()))
        out = [c for (p, _d), caps in self._by_key.items() if p == pid for c in caps]
        return sorted(out, key=lambda c: c.at)

    def latest(self, pid: int, device: int | None = None) -> dict[str, Any] | None:
        """The newest capture of ``pid`` (on ``device``) as a dict, or None."""
        caps = self.of(pid, device)
        return caps[-1].as_dict() if caps else None

    def keep(self, pids: Iterable[int]) -> None:
        """Forget the captures of every process not in ``pids``."""
        live = set(pids)
        for key in [k for k in self._by_key if k[0] not in live]:
            del self._by_key[key]

    def devices(self, pid: int) -> list[int]:
        """The devices ``pid`` has captures on."""
        return sorted(d for (p, d) in self._by_key if p == pid)

    def __len__(self) -> int:
        return len(self._by_key)


def in_episode(caps: list[Capture], onset: float, cleared: float | None) -> dict[str, Any] | None:
    """The newest capture taken during an episode (from BEFORE_ONSET_S before its onset estimate to its
    clearing, or to now while it lasts), as a dict; None when there is none."""
    hit = [c for c in caps if c.at >= onset - BEFORE_ONSET_S and (cleared is None or c.at <= cleared)]
    return hit[-1].as_dict() if hit else None

"""The loads a GPU memory series has shown, for the GLR's null (:mod:`.glr`): a model loaded into a running
process brings a warm-up of its own, so the null holds a shift at each remembered load with a warm-up from it
(``glr._load_warm_sse``). De-stepping finds the loads (:func:`origins`); the series remembers them for as long
as a warm-up from them can still rise (:func:`remember`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from inferwatch_sidecar.components.gpu.glr import OLD

#: The null holds the own warm-ups of at most this many of the latest loads.
MAX_ORIGINS = 4


#: A level shift this large at least is a load (a model's weights and buffers, a cache filled by traffic)
#: that may bring a warm-up of its own; a smaller one is noise or a creep's change taken for a shift.
LOAD_MIN = 256 * 2**20


def origins(ft: np.ndarray, jump: np.ndarray, removed: np.ndarray, fy: np.ndarray | None = None,
            undo_s: float = 0.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The times of the latest MAX_ORIGINS loads de-stepping found (the first floor sample after each), and of
    the rises that were undone.

    ``jump[i]``: a shift between floor samples i and i+1 (adjacent ones are one shift); ``removed``: what
    de-stepping took out of the floor up to each sample (the floor minus the de-stepped floor). A shift counts
    from LOAD_MIN; the newest one, with no floor change after it yet, does not (its next change may still show
    it a creep's, ``shifts._creeps_on``, and a remembered origin stays for hours).

    A rise that the floor ``fy`` gives back (half of it at least) within ``undo_s`` seconds is no load: it is a
    floor sample misread (a random sawtooth's flat top taken for its trough after a release that was a free) or
    something loaded for minutes, with no warm-up worth a null of its own. Those come second, for the log to
    forget (:func:`remember`): the rise was remembered before its fall was seen.
    """
    idx = np.flatnonzero(jump)
    if not len(idx):
        return (), ()
    ends, undone = [], []
    for r in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1):
        lo, end = int(r[0]), int(r[-1]) + 1
        rise = float(removed[end] - removed[lo]) if end < len(jump) else 0.0
        if rise < LOAD_MIN:
            continue
        if fy is not None and undo_s > 0:
            after = (ft > ft[end]) & (ft <= ft[end] + undo_s)
            if after.any() and float(fy[after].min()) <= float(fy[end]) - rise / 2:
                undone.append(float(ft[end]))
                continue
        ends.append(end)
    return tuple(float(ft[i]) for i in ends[-MAX_ORIGINS:]), tuple(undone)


#: A rise given back within this long (at most; two release windows, at least MERGE_S) is no load.
UNDO_MAX_S = 1200.0


def undo_window(release_window: float) -> float:
    """Seconds within which a rise that falls back is taken for no load (:func:`origins`): two of the
    sawtooth's release windows (a flat top misread lasts until the next release), MERGE_S to UNDO_MAX_S."""
    return max(MERGE_S, min(UNDO_MAX_S, 2 * release_window))


#: Two shifts found this close together (by scales with different bins) are one load.
MERGE_S = 300.0


def remember(log: deque[float], found: tuple[float, ...], now: float, tau_max: float,
             forget: tuple[float, ...] = ()) -> tuple[float, ...]:
    """Add the shifts ``found`` by one scale to the series' ``log`` and return the latest MAX_ORIGINS of them.

    A scale sees a load only while it lies within its two windows: the shortest (15 minutes) loses it well
    before the load's warm-up is over, and would judge what is left of that warm-up as a creep. The log keeps
    every load for as long as a warm-up from it can still rise (OLD x tau_max); shifts found within MERGE_S of
    each other are one load, dated at the earliest (the first floor sample after it, on the finest bins).
    ``forget``: rises found undone (:func:`origins`); a load within MERGE_S of one leaves the log.
    """
    kept = sorted(x for x in log if not any(abs(x - u) <= MERGE_S for u in forget))
    for o in found:
        near = [x for x in kept if abs(x - o) <= MERGE_S]
        if not near or o < min(near):
            kept = sorted([x for x in kept if x not in near] + [o])
    log.clear()
    log.extend(x for x in kept if x >= now - OLD * tau_max)  # the deque's maxlen keeps the latest
    return tuple(log)[-MAX_ORIGINS:]

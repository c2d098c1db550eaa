"""An independent family of GPU memory traces for the leak detector, every parameter drawn at random per trace.

The family was written after the detector; variants of the detector have been measured on it since
(docs/benchmarks.md), and the warm-up shapes were added afterwards to check how far it generalizes. It
is described in docs/gpu.md ("The test family"). Per trace (one GPU, 80 GiB):

- 1 to 3 processes (a leak is in one of them); each loads its weights (2-30 GiB) at its start;
- warm-up that plateaus: 0.5-6 GiB with a time constant tau of 1-20 min (log-uniform), its shape drawn
  from ``WARM_SHAPES``: ``exp`` (1 - exp(-x/tau): a cache that fills at a falling rate), ``s_curve``
  (1 - (1 + x/tau) exp(-x/tau): traffic that ramps up before the cache fills) and ``root``
  (sqrt(x / 4 tau) up to its plateau at 4 tau: shapes and buffers seen for the first time, fewer and
  fewer new ones);
- allocator sawtooth while busy: amplitude 0-3 GiB, period 20 s-10 min (log-uniform), shape saw,
  square or random release times (exponential gaps);
- busy/idle swings (half the processes): idle 10-120 min with the cache emptied, busy 20-240 min, the
  cache (0.5-3 GiB) filled within 30-60 s when traffic arrives;
- a daily traffic cycle (half the traces) that scales the sawtooth between 20% and 100%;
- model loads and unloads (a third of the processes): about two a day, steps of 0.5-8 GiB;
- 90% preallocation (one process in seven): the pool is taken at start, then flat;
- per-sample Gaussian noise 0-80 MiB on each process; sampling every 1, 5 or 10 s; 0-5% of samples
  missing plus gaps of up to 2 min, 0-2% duplicated (one NVML poll reads every process at once);
  values in 2 MiB granules;
- leaks of a given rate from a random onset, a quarter of them at process start; a quarter of the
  leaks of 0.5 GiB/h and faster stop with a restart of the process: it exits (its memory is freed) and a
  new process (a new PID) loads again from scratch.

A trace renders what NVML reports: each process's used memory (``procs``: one series per PID, NaN
while the PID does not exist) and the device's (their sum plus 600 MiB of driver and contexts). A draw
whose device memory would exceed the GPU's is redrawn: a GPU cannot hold it (it is an OOM at start-up,
not a trace to judge).

``effective_onset``: a leak that starts during its process's warm-up is counted from the end of the
warm-up plateau, the time when less than 64 MiB of the warm-up is still to come.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MiB = 2**20
GiB = 2**30
TOTAL = 80 * GiB
DAY = 86400.0
#: The warm-up counts as over once less than this much of it is still to come.
WARMUP_LEFT = 64 * MiB
#: Warm-up shapes (``warm_shape``), each a rise from 0 to 1 over x = time since start, with time constant tau.
WARM_SHAPES = ("exp", "s_curve", "root")


@dataclass
class Proc:
    """One process's drawn parameters."""

    weights: float
    warm_amp: float
    warm_tau: float
    saw_amp: float
    saw_period: float
    saw_shape: str
    busy_idle: bool
    cache: float
    loads: bool
    prealloc: bool
    start: float = 0.0
    warm_shape: str = "exp"


@dataclass
class Trace:
    """A rendered trace and its truth.

    Attributes:
        t: sample times (s), non-decreasing (duplicates included).
        used: device memory, bytes.
        procs: per-PID used memory, one row per PID, NaN where the PID does not exist (aligned with ``t``).
        leaker: the row of ``procs`` that leaks (None for a leak-free trace); a restart ends that PID,
            the restarted process is another row.
        rate: leak rate, bytes/s (0 for a leak-free trace).
        onset: leak onset (s) or None.
        stop: when a restart ended the leak (s) or None.
        effective_onset: onset, or the end of the leaking process's warm-up if later.
        desc: the drawn parameters, for the benchmark's listing.
        leak_proc: the leaking process's parameters (None for a leak-free trace).
    """

    t: np.ndarray
    used: np.ndarray
    rate: float
    onset: float | None
    stop: float | None
    effective_onset: float | None
    procs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    leaker: int | None = None
    desc: dict[str, object] = field(default_factory=dict)
    #: the leaking process's drawn parameters (None for a leak-free trace), for the oracle
    leak_proc: Proc | None = None
    #: per row of ``procs``, torch's allocated bytes as the SDK's probe samples them (every ALLOC_INTERVAL
    #: seconds, NaN between; weights, the tensor share of the warm-up, loads, a tensor leak, activations)
    alloc: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_proc(rng: np.random.Generator) -> Proc:
    prealloc = rng.random() < 1 / 7
    return Proc(
        weights=rng.uniform(2, 30) * GiB,
        warm_amp=rng.uniform(0.5, 6) * GiB,
        warm_tau=_loguniform(rng, 60, 1200),
        saw_amp=0.0 if prealloc else rng.uniform(0, 3) * GiB,
        saw_period=_loguniform(rng, 20, 600),
        saw_shape=str(rng.choice(["saw", "square", "random"])),
        busy_idle=bool(rng.random() < 0.5) and not prealloc,
        cache=rng.uniform(0.5, 3) * GiB,
        loads=bool(rng.random() < 1 / 3) and not prealloc,
        prealloc=prealloc,
        warm_shape=str(rng.choice(WARM_SHAPES)),
    )


def warm_rise(shape: str, x: np.ndarray, tau: float) -> np.ndarray:
    """The warm-up's share reached ``x`` seconds after the start (0 to 1), for a ``WARM_SHAPES`` shape."""
    u = np.maximum(0.0, x) / tau
    if shape == "exp":
        return 1.0 - np.exp(-u)
    if shape == "s_curve":
        return 1.0 - (1.0 + u) * np.exp(-u)
    if shape == "root":
        return np.minimum(1.0, np.sqrt(u / 4.0))
    raise ValueError(f"unknown warm-up shape {shape!r}; expected one of {WARM_SHAPES}")


def warmup_end(p: Proc) -> float:
    """Time (s) when less than WARMUP_LEFT of the process's warm-up is still to come."""
    if p.warm_amp <= WARMUP_LEFT:
        return p.start
    left = WARMUP_LEFT / p.warm_amp
    if p.warm_shape == "exp":
        u = math.log(1 / left)
    elif p.warm_shape == "root":
        u = 4.0 * (1.0 - left) ** 2
    else:
        # (1 + u) exp(-u) = left: it falls for every u > 0, so bisect.
        lo, hi = 0.0, 64.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (1 + mid) * math.exp(-mid) > left else (lo, mid)
        u = hi
    return p.start + p.warm_tau * u


def _sawtooth(p: Proc, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if p.saw_amp <= 0:
        return np.zeros(len(t))
    if p.saw_shape == "random":
        n_rel = int((t[-1] - t[0]) / p.saw_period * 2) + 10
        rel = t[0] - p.saw_period + np.cumsum(rng.exponential(p.saw_period, n_rel))
        last = rel[np.maximum(0, np.searchsorted(rel, t, side="right") - 1)]
        return p.saw_amp * np.minimum(1.0, (t - last) / p.saw_period)
    phase = ((t + rng.uniform(0, p.saw_period)) % p.saw_period) / p.saw_period
    if p.saw_shape == "square":
        return p.saw_amp * (phase >= 0.5)
    return p.saw_amp * phase


def _busy(p: Proc, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """1 while busy (the cache filled within 30-60 s of traffic arriving), 0 while idle."""
    if not p.busy_idle:
        return np.ones(len(t))
    out = np.zeros(len(t))
    pos = t[0] - rng.uniform(0, 3600)
    while pos < t[-1]:
        idle = rng.uniform(10, 120) * 60
        work = rng.uniform(20, 240) * 60
        fill = rng.uniform(30, 60)
        a, b = pos + idle, pos + idle + work
        m = (t >= a) & (t < b)
        out[m] = np.minimum(1.0, (t[m] - a) / fill)
        pos = b
    return out


def _loads(p: Proc, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    out = np.zeros(len(t))
    if not p.loads:
        return out
    loaded: list[float] = []
    span = t[-1] - t[0]
    for s in np.sort(rng.uniform(t[0], t[-1], size=rng.poisson(2 * span / DAY + 0.5))):
        if loaded and rng.random() < 0.5:
            out[t >= s] -= loaded.pop()
        else:
            size = rng.uniform(0.5, 8) * GiB
            loaded.append(size)
            out[t >= s] += size
    return out


def _process(p: Proc, t: np.ndarray, rng: np.random.Generator, daily: np.ndarray,
             tensors: list[np.ndarray] | None = None) -> np.ndarray:
    """One process's memory over ``t`` (zero before its start), without any leak.

    ``tensors``: when given, the part of it that live tensors hold (weights, the tensor share of the
    warm-up, loaded models: what torch's ``allocated_bytes`` shows, without the cache) is appended; it
    draws nothing from ``rng``, so the traces are the same with or without it.
    """
    el = np.maximum(0.0, t - p.start)
    on = t >= p.start
    y = p.weights * np.clip(el / 20.0, 0, 1)
    if p.prealloc:
        if tensors is not None:
            tensors.append(np.where(on, y, 0.0))
        y = np.maximum(y, 0.9 * TOTAL * np.clip(el / 60.0, 0, 1) - 0.0)
        return np.where(on, y, 0.0)
    warm = p.warm_amp * warm_rise(p.warm_shape, el, p.warm_tau)
    busy = _busy(p, t, rng)
    loads = _loads_after(p, t, rng, busy, daily)
    if tensors is not None:
        tensors.append(np.where(on, y + ALLOC_WARM_SHARE * warm + loads[1], 0.0))
    return np.where(on, y + warm + loads[0], 0.0)


#: The share of a warm-up that live tensors hold (the rest is the allocator's cache filling).
ALLOC_WARM_SHARE = 0.5


def _loads_after(p: Proc, t: np.ndarray, rng: np.random.Generator, busy: np.ndarray,
                 daily: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cache, sawtooth and loads of a process (in the family's draw order): (all of it, the loads alone)."""
    cache = busy * (p.cache + daily * _sawtooth(p, t, rng))
    loads = _loads(p, t, rng)
    return cache + loads, loads


#: The shapes the family adds to its base draw (``make_trace(..., shape=)``), each described in general:
#:
#: - ``jitter``: sampled every 5 s with a jitter of up to +-1.5 s per sample and 2-6% of rows missing
#:   (a logger on a busy host);
#: - ``swap``: the leaking process swaps its model (the old weights unloaded, new ones of another size
#:   loaded, the cache emptied and warmed up again with a new warm-up) 30 min to 3 h in, and the leak
#:   starts 0-10 min after the swap (the new model leaks); it counts from the end of the new warm-up;
#: - ``second_model`` (leak-free): a second model is loaded and unloaded every 1.5-3 h (held 20-90 min,
#:   2-12 GiB of weights with its own warm-up and sawtooth), half the time by a new process each time,
#:   half by one process that stays (its memory steps up and down);
#: - several GPUs in one log are drawn by the benchmark as independent traces of one length, a leak on
#:   one of them (``bench/leak_detection.py``).
SHAPES = ("base", "jitter", "swap", "second_model")


def make_trace(rng: np.random.Generator, rate_gib_h: float, duration: float | None = None,
               shape: str = "base") -> Trace:
    """Draw one trace; ``rate_gib_h`` 0 gives a leak-free day (or ``duration`` seconds).

    ``shape``: one of ``SHAPES`` (``base``: the family as first drawn; the others add one shape to it).
    Draws whose device memory would exceed the GPU's are redrawn (see the module docstring).
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown trace shape {shape!r}; expected one of {SHAPES}")
    while True:
        tr = _draw(rng, rate_gib_h, duration, shape)
        if tr is not None:
            return tr


def _swap(rng: np.random.Generator, p: Proc, at: float) -> tuple[Proc, float]:
    """The model loaded by a swap at ``at``: (its process parameters from ``at``, the weights' change)."""
    new = Proc(**{**p.__dict__, "start": at, "weights": rng.uniform(2, 30) * GiB,
                  "warm_amp": rng.uniform(0.5, 6) * GiB, "warm_tau": _loguniform(rng, 60, 1200),
                  "warm_shape": str(rng.choice(WARM_SHAPES))})
    return new, new.weights - p.weights


def _second_model(rng: np.random.Generator, t: np.ndarray, daily: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Rows (NVML, allocated) of a second model loaded and unloaded every 1.5-3 h."""
    same_pid = rng.random() < 0.5
    rows: list[np.ndarray] = []
    tens: list[np.ndarray] = []
    pos = t[0] + rng.uniform(0, 3600)
    while pos < t[-1]:
        hold = rng.uniform(20, 90) * 60
        p = draw_proc(rng)
        p.weights, p.prealloc, p.busy_idle, p.loads = rng.uniform(2, 12) * GiB, False, False, False
        p.start = pos
        m = (t >= pos) & (t < pos + hold)
        y = np.full(len(t), np.nan)
        ti: list[np.ndarray] = []
        y[m] = _process(p, t[m], rng, daily[m], ti)
        a = np.full(len(t), np.nan)
        a[m] = ti[0]
        rows.append(y)
        tens.append(a)
        pos += rng.uniform(1.5, 3) * 3600
    if same_pid and rows:
        # One process that stays: 300 MiB of context between loads, each load on top of it.
        none = np.isnan(np.array(rows)).all(axis=0)
        y = np.nansum(np.array(rows), axis=0) + 300 * MiB
        a = np.where(none, 0.0, np.nansum(np.array(tens), axis=0))
        return [y], [a]
    return rows, tens


def _draw(rng: np.random.Generator, rate_gib_h: float, duration: float | None, shape: str = "base") -> Trace | None:
    # The helpers draw from ``rng`` in the order this function always did: a seed gives the same trace.
    dt = float(rng.choice([1.0, 5.0, 10.0]))
    if shape == "jitter":
        dt = 5.0
    n_proc = int(rng.choice([1, 1, 2, 3]))
    procs = [draw_proc(rng) for _ in range(n_proc)]
    rate = rate_gib_h * GiB / 3600
    leaker = 0
    onset, stop, swap, leak_end = _leak_timing(rng, procs, leaker, rate, rate_gib_h, shape)
    duration = leak_end if leak_end is not None else duration if duration is not None else DAY
    t = np.arange(0.0, duration, dt)
    daily = np.ones(len(t))
    if rng.random() < 0.5:
        daily = 0.6 + 0.4 * np.sin(2 * math.pi * t / DAY + rng.uniform(0, 2 * math.pi))
    noise = rng.uniform(0, 80) * MiB
    rows: list[np.ndarray] = []
    tens: list[np.ndarray] = []
    for i, p in enumerate(procs):
        ti: list[np.ndarray] = []
        y = _process(p, t, rng, daily, ti)
        if i == leaker and swap is not None:
            y = _swapped(p, t, y, ti, swap)
        if i == leaker and rate > 0:
            assert onset is not None
            y = _leaking(rng, p, t, daily, y, ti, rate, onset, stop, rows, tens)
        rows.insert(i, y)
        tens.insert(i, ti[0])
    if shape == "second_model":
        r2, t2 = _second_model(rng, t, daily)
        rows.extend(r2)
        tens.extend(t2)
        procs.extend(draw_proc(rng) for _ in r2)  # the allocator's activations of each row
    on = np.array(rows)
    on[:, :] = np.where(np.isnan(on), np.nan, on + rng.normal(0, noise, on.shape))
    on = np.where(np.isnan(on), np.nan, np.round(np.clip(on, 0, None) / (2 * MiB)) * 2 * MiB)
    used = 600.0 * MiB + np.nansum(on, axis=0)  # CUDA contexts and driver outside the processes
    if used.max() > TOTAL:
        return None
    keep, idx, t = _polls(rng, t, duration, shape)
    used, on = used[keep][idx], on[:, keep][:, idx]
    alloc = _allocated(np.array(tens)[:, keep][:, idx], t, dt, procs, noise)
    leak_proc = procs[leaker] if rate > 0 else None
    if swap is not None:
        leak_proc = swap[1]
    eff = None if onset is None else max(onset, warmup_end(swap[1] if swap is not None else procs[leaker]))
    desc = {"dt": dt, "procs": n_proc, "saw_amp_gib": round(procs[leaker].saw_amp / GiB, 2),
            "saw_period_s": round(procs[leaker].saw_period), "shape": procs[leaker].saw_shape,
            "busy_idle": procs[leaker].busy_idle, "loads": procs[leaker].loads,
            "prealloc": procs[leaker].prealloc, "warm_tau_s": round(procs[leaker].warm_tau),
            "warm_shape": procs[leaker].warm_shape,
            "noise_mib": round(noise / MiB), "trace_shape": shape}
    return Trace(t, used, rate, onset, stop, eff, on, leaker if rate > 0 else None, desc, leak_proc, alloc)


def _leak_timing(rng: np.random.Generator, procs: list[Proc], leaker: int, rate: float, rate_gib_h: float,
                 shape: str) -> tuple[float | None, float | None, tuple[float, Proc, float] | None, float | None]:
    """A leak's onset, the restart that stops it (or None), the model swap (``swap`` shape) and the trace's end.

    All None for a leak-free trace (``rate`` 0), which draws nothing here.
    """
    if rate <= 0:
        return None, None, None, None
    stop: float | None = None
    swap: tuple[float, Proc, float] | None = None
    at_start = rng.random() < 0.25 and shape != "swap"
    onset = 0.0 if at_start else rng.uniform(1800, 3 * 3600)
    if shape == "swap":
        procs[leaker].prealloc = False
        new, dw = _swap(rng, procs[leaker], onset)
        swap = (onset, new, dw)
        onset = onset + rng.uniform(0, 600)
    if at_start:
        procs[leaker].prealloc = False
    # Long enough to reach the slow-leak target (the time to grow 256 MiB) from the end of the warm-up, twice.
    grow = 256 * MiB / rate
    if rate_gib_h >= 0.5 and rng.random() < 0.25:
        stop = onset + rng.uniform(40, 120) * 60
    warm_end = warmup_end(swap[1] if swap is not None else procs[leaker])
    end = (stop + 1800) if stop is not None else max(onset, warm_end) + max(3600, 2 * grow)
    return onset, stop, swap, end


def _swapped(p: Proc, t: np.ndarray, y: np.ndarray, ti: list[np.ndarray],
             swap: tuple[float, Proc, float]) -> np.ndarray:
    """The swap: the old model's weights and warmed-up cache give way to the new model's (``ti[0]`` too)."""
    at, new, dw = swap
    after = t >= at
    rise_old = p.warm_amp * warm_rise(p.warm_shape, t - p.start, p.warm_tau)
    rise_new = new.warm_amp * warm_rise(new.warm_shape, t - at, new.warm_tau)
    delta = np.where(after, dw - rise_old + rise_new, 0.0)
    y = y + delta
    ti[0] = ti[0] + np.where(after, dw + ALLOC_WARM_SHARE * (rise_new - rise_old), 0.0)
    return y


def _leaking(rng: np.random.Generator, p: Proc, t: np.ndarray, daily: np.ndarray, y: np.ndarray,
             ti: list[np.ndarray], rate: float, onset: float, stop: float | None, rows: list[np.ndarray],
             tens: list[np.ndarray]) -> np.ndarray:
    """The leaker's memory with its leak (``ti[0]`` too); a restart appends the new process to ``rows``/``tens``."""
    end_leak = stop if stop is not None else math.inf
    growth = rate * np.clip(np.minimum(t, end_leak) - onset, 0, None) * (t < end_leak)
    y = y + growth
    ti[0] = ti[0] + growth  # a tensor leak: live tensors that are never freed
    if stop is not None:
        # The restart: the process exits, a new one (another PID) loads again from scratch.
        again = Proc(**{**p.__dict__, "start": stop + 5.0, "warm_tau": _loguniform(rng, 60, 1200)})
        after = t >= stop
        y2 = np.full(len(t), np.nan)
        t2: list[np.ndarray] = []
        y2[after] = _process(again, t[after], rng, daily[after], t2)
        y2[t < again.start] = np.nan
        a2 = np.full(len(t), np.nan)
        a2[after] = t2[0]
        a2[t < again.start] = np.nan
        y[after] = np.nan
        ti[0][after] = np.nan
        rows.append(y2)
        tens.append(a2)
    return y


def _polls(rng: np.random.Generator, t: np.ndarray, duration: float, shape: str
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Missing samples, gaps and duplicates: one NVML poll reads the device and every process.

    Returns (the samples kept, then the index of each poll into them: duplicates repeat one, the polls' times).
    """
    keep = rng.random(len(t)) >= (rng.uniform(0.02, 0.06) if shape == "jitter" else rng.uniform(0, 0.05))
    for g in rng.uniform(0, duration, size=rng.poisson(duration / DAY * 6)):
        keep &= ~((t >= g) & (t < g + rng.uniform(10, 120)))
    t = t[keep]
    if shape == "jitter":
        # Each sample is taken up to 1.5 s off its 5 s tick (the order is kept).
        t = t + rng.uniform(-1.5, 1.5, len(t))
        t = np.maximum.accumulate(t)
    dup = rng.random(len(t)) < rng.uniform(0, 0.02)
    idx = np.sort(np.r_[np.arange(len(t)), np.flatnonzero(dup)])
    return keep, idx, t[idx]


#: The torch probe's interval: the allocator series is sampled this often (at the first NVML poll of each).
ALLOC_INTERVAL = 10.0


def _allocated(tensors: np.ndarray, t: np.ndarray, dt: float, procs: list[Proc], noise: float) -> np.ndarray:
    """What the torch probe would report as ``allocated_bytes`` per row (NaN between its samples).

    The live tensors plus the transient activations of the requests in flight (0 to a third of the
    process's cache, a fresh draw per sample: a sample at a quiet moment shows the floor) and 2 MiB of
    noise. Drawn from a generator of its own, seeded by the trace, so the NVML series stay as they were.
    """
    side = np.random.default_rng([len(t), int(noise), int(dt)])
    out = np.full(tensors.shape, np.nan)
    probe = np.r_[True, np.diff(np.floor(t / ALLOC_INTERVAL)) > 0]
    for r in range(tensors.shape[0]):
        cache = procs[min(r, len(procs) - 1)].cache
        act = side.uniform(0, 1 / 3) * cache * side.random(len(t)) ** 2
        v = tensors[r] + act + side.normal(0, 2 * MiB, len(t))
        out[r] = np.where(probe & ~np.isnan(tensors[r]), np.round(np.clip(v, 0, None) / (2 * MiB)) * 2 * MiB, np.nan)
    return out

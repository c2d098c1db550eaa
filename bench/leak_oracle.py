"""What the data allows: the earliest time an oracle could tell each drawn leak from leak-free memory.

The oracle knows the leaking process's floor curve (its warm-up and the leak: the level memory returns
to once the allocator releases its cache) and sees that floor once per floor interval ``P`` with
``NOISE`` of Gaussian noise. Its time ``t_or`` is the earliest time at which a likelihood-ratio test of
the true floor against its nearest leak-free alternative, at one-sided z ``Z_ALPHA``, has ``POWER``:
for two Gaussian hypotheses that means a distance ``||f - g|| / sigma >= z_alpha + z_beta`` (6.395).
The alternatives (docs/gpu.md, "What the data allows"):

- any family warm-up from process start (``WARM_SHAPES``, tau in ``TAU_RANGE``) with a free
  amplitude (at least 0) and a free offset;
- one level shift of any size at any time, with a free offset.

The nearest alternative of each kind is the least-squares projection of the floor samples onto it, so
the distance is the residual sum of squares, computed from cumulative sums at every candidate time.
"""

from __future__ import annotations

import math

import numpy as np

from leak_family import GiB, MiB, Proc, Trace, warm_rise

#: One-sided z of the oracle's test and its power (z_beta for 95%).
Z_ALPHA = 4.75
Z_BETA = 1.645
#: Noise of the floor as the oracle sees it.
NOISE = 20 * MiB
#: A sawtooth at least this large hides the floor between its releases.
SAW_VISIBLE = 128 * MiB
#: Regime A: the floor shows at least this often (seconds).
REGIME_A_P = 120.0
#: Warm-up alternatives: the family's shapes and time constants (log grid).
TAU_RANGE = (60.0, 1200.0)
TAU_GRID = 24
WARM_SHAPES = ("exp", "s_curve", "root")
#: At most this many candidate times for the step and for t_or (the sums stay exact; only the grid is coarse).
GRID = 1200


def floor_period(p: Proc, dt: float) -> float:
    """Seconds between sightings of the floor: the sawtooth's period (mean gap for random releases)
    when it is at least SAW_VISIBLE, else the sampling interval."""
    if p.prealloc or p.saw_amp < SAW_VISIBLE:
        return dt
    return max(dt, p.saw_period)


def regime(period: float) -> str:
    """``A`` when the floor shows at least every REGIME_A_P seconds, else ``B``."""
    return "A" if period <= REGIME_A_P else "B"


def target_delay(rate_gib_h: float) -> float:
    """The regime-A deadline after the effective onset: 15 min at 1 GiB/h and faster, else the time to grow 256 MiB."""
    return 15 * 60.0 if rate_gib_h >= 1 else 256 * MiB / (rate_gib_h * GiB / 3600)


def deadline(tr: Trace, rate_gib_h: float, period: float) -> float:
    """Absolute deadline: effective onset + target (regime B: the later of that and onset + 5 P)."""
    assert tr.effective_onset is not None
    d = target_delay(rate_gib_h)
    if regime(period) == "B":
        d = max(d, 5 * period)
    return tr.effective_onset + d


def _ss(c1: np.ndarray, c2: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sum of squares about the mean of samples a..b-1 from cumulative sums (c[0] = 0)."""
    n = (b - a).astype(float)
    s1 = c1[b] - c1[a]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (c2[b] - c2[a]) - s1 * s1 / np.maximum(n, 1), 0.0)


def distance2(f: np.ndarray, start_t: np.ndarray, taus: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Squared distance (in f's units) of the samples 0..k-1 of ``f`` from the nearest alternative, at grid points k.

    Args:
        f: the floor at the oracle's sample times.
        start_t: those times minus the process start, seconds.
        taus: warm-up time constants tried (default: the TAU_RANGE grid).

    Returns:
        (k, distance squared) for the grid of sample counts k.
    """
    n = len(f)
    ks = np.unique(np.linspace(3, n, min(GRID, max(1, n - 2))).astype(np.int64))
    ks = ks[ks >= 3]
    if not len(ks):
        return ks, np.zeros(0)
    f = f - f[0]
    c1 = np.r_[0.0, np.cumsum(f)]
    c2 = np.r_[0.0, np.cumsum(f * f)]
    zero = np.zeros(len(ks), dtype=np.int64)
    ss_f = _ss(c1, c2, zero, ks)
    # One level shift at any u (grid), the best u for each k: SS(0, u) + SS(u, k).
    us = np.unique(np.r_[ks, ks - 1, 1])
    us = us[(us >= 1) & (us < n)]
    best_step = ss_f.copy()
    for lo in range(0, len(ks), 256):
        kk = ks[lo:lo + 256]
        uu, kg = np.meshgrid(us, kk)
        sse = _ss(c1, c2, np.zeros_like(uu), uu) + _ss(c1, c2, uu, kg)
        sse = np.where(uu < kg, sse, np.inf)
        best_step[lo:lo + 256] = np.minimum(best_step[lo:lo + 256], sse.min(axis=1))
    # A warm-up from process start: f ~ b + a * phi, a >= 0.
    best_warm = ss_f.copy()
    taus = np.exp(np.linspace(*np.log(TAU_RANGE), TAU_GRID)) if taus is None else taus
    idx = np.arange(1, n + 1)
    for shape in WARM_SHAPES:
        for tau in taus:
            phi = warm_rise(shape, start_t, float(tau))
            p1 = np.cumsum(phi)[ks - 1]
            p2 = np.cumsum(phi * phi)[ks - 1]
            fp = np.cumsum(f * phi)[ks - 1]
            m = idx[ks - 1].astype(float)
            sfp = fp - p1 * c1[ks] / m
            spp = p2 - p1 * p1 / m
            with np.errstate(invalid="ignore", divide="ignore"):
                gain = np.where((spp > 0) & (sfp > 0), sfp * sfp / np.where(spp > 0, spp, 1.0), 0.0)
            best_warm = np.minimum(best_warm, ss_f - gain)
    return ks, np.maximum(0.0, np.minimum(best_step, best_warm))


def own_noise(tr: Trace, period: float) -> float:
    """The noise of the leaking process's floor as its own samples show it, MiB: the SD of the minimum of the
    samples of one floor interval (``period / dt`` of them; the order statistic of its Gaussian noise) and,
    under a visible saw or random-release sawtooth, the phase of the first sample after each release, which
    the tooth has already lifted by up to its slope x dt (SD slope x dt / sqrt 12). A lower bound still:
    missing and jittered samples, loads and busy/idle swings add more."""
    from inferwatch_sidecar.components.gpu.trend import min_sd

    p = tr.leak_proc
    assert p is not None
    dt = float(tr.desc["dt"])  # type: ignore[arg-type]
    sample = float(tr.desc["noise_mib"]) * min_sd(max(1.0, period / dt))  # type: ignore[arg-type]
    phase = 0.0
    if period > dt and p.saw_shape in ("saw", "random") and p.saw_period > 0:
        phase = (p.saw_amp / MiB) / p.saw_period * dt / math.sqrt(12)
    return math.hypot(sample, phase)


def oracle_time(tr: Trace, until: float, noise_mib: float = NOISE / MiB) -> tuple[float, float]:
    """(t_or, P) of a leak trace: the earliest time the oracle separates the leak (inf: not by ``until``),
    seeing the floor with ``noise_mib`` of noise (default NOISE, the issue's; :func:`own_noise` for the trace's)."""
    p = tr.leak_proc
    assert p is not None and tr.onset is not None
    period = floor_period(p, float(tr.desc["dt"]))
    end = min(until, tr.stop if tr.stop is not None else math.inf)
    ts = np.arange(p.start + period, end + 1e-9, period)
    if len(ts) < 3:
        return math.inf, period
    el = ts - p.start
    f = (p.warm_amp * warm_rise(p.warm_shape, el, p.warm_tau) + tr.rate * np.clip(ts - tr.onset, 0, None)) / MiB
    # The null holds every family warm-up, the leaking process's own among them (a grid alone would
    # leave the true warm-up's misfit, which enough samples would "separate" before the onset).
    taus = np.r_[np.exp(np.linspace(*np.log(TAU_RANGE), TAU_GRID)), p.warm_tau]
    ks, d2 = distance2(f, el, taus)
    need = ((Z_ALPHA + Z_BETA) * max(noise_mib, 1e-9)) ** 2
    ok = np.flatnonzero(d2 >= need)
    return (float(ts[ks[ok[0]] - 1]) if len(ok) else math.inf), period

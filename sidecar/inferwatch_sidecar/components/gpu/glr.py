"""One generalized likelihood-ratio test of a leak's creep against a composite leak-free null.

Data: the de-stepped release-floor blocks of a scale (times ``t``, floors ``y``). Both hypotheses have
Gaussian noise of one SD and a free offset:

- **null** (leak-free), the best of: a constant; one level shift of any size at any block boundary,
  abrupt or spread over up to RAMP_BLOCKS blocks and RAMP_MAX_S seconds (a cache filled within a minute,
  a load straddling blocks); a saturating warm-up ``a (1 - exp(-(t - t0) / tau))`` (or its S-shaped form) from the
  series' start ``t0`` with ``a >= 0`` and ``tau <= tau_max`` (its slope decays at least as fast as
  ``exp(-t / tau_max)``); the shift and the warm-up together (a load at the start, a cache filled on
  top of the warm-up); and, after each of the loads the detector remembers (``loadlog.origins``,
  ``loadlog.remember``), a shift at the load with a warm-up of its own from it (:func:`_load_warm_sse`).
  The shift with the warm-up is fitted over the TOP_WARM warm-ups that fit best alone, and, where the
  statistic passes ``exact_above`` (the threshold, until an episode opens), over every one of them with
  ramps up to RAMP_MAX_S whatever the block spacing (while the warm-up prior is live);
- **alternative** (a leak): the null's best warm-up (or none) plus a hinge creep ``r max(0, t - c)``,
  ``r > 0``, maximised over the knot ``c`` (a rise over at least the last MIN_TAIL floor samples).

The warm-up's tau is continuous; the fits take it on a log grid (TAU_GRID points), and where the statistic
passes ``exact_above`` both hypotheses refit their best warm-ups on a grid FINE times finer around them.

The products are ``np.einsum`` (numpy's own loops), never ``@``: a matrix product goes to BLAS, whose
worker threads, for matrices this small, burned more CPU than the product itself (process time 1.7x the
wall time; 22x the trend test's instructions under callgrind, where idle threads spin).

Every fit has at most three columns and is solved in closed form (projections of the centred data,
one after the other), for a batch of series at once: the detector calls it on one series, the Monte
Carlo (``bench/leak_glr_threshold.py``) on hundreds of thousands.

The statistic is ``(SSE_null - SSE_alt) / s^2``: twice the log-likelihood ratio, with ``s`` the scale's
robust block noise, or the alternative's residual SD when that is wider (a floor that wanders is judged
at its own scale, an F-like ratio). Its threshold is the ``1 - ALPHA`` quantile of the same statistic
under pure noise, from the Monte Carlo with a generalized Pareto tail (scipy); docs/gpu.md turns the
per-judgement ALPHA into a false-alarm rate per series-day.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: Warm-up time constants: a log grid of TAU_GRID points from TAU_MIN_SHARE x tau_max to tau_max.
TAU_MIN_SHARE = 1 / 64
TAU_GRID = 49
#: Where the statistic passes its threshold, the TOP_FINE best warm-ups of each hypothesis are refitted on a
#: grid this much finer between their two neighbours (:func:`_near`). 9% apart in tau, a warm-up of several GiB
#: with a few MiB of noise misfits by many SDs, which the hinge took up (seed 14's trace 117: a 2.1 GiB root
#: warm-up, tau 435 s, 15 MiB of block noise, scored 7.4 against 5.5; refitted, 4.1); 8 times finer still scored
#: 11.0 on a 4.9 GiB exponential one (tau 630 s, 3 MiB of noise), 16 times 0.0 (tests/.../test_glr_warmups.py).
FINE = 16
TOP_FINE = 3
#: ... each with the shifts (or knots) that fit best with it on the grid, this many of them.
TOP_COLS = 8
#: At most this many level-shift positions (a grid over the block boundaries).
MAX_STEPS = 32
#: A level shift of the null may take up to this many block spacings, and no longer than RAMP_MAX_S: a load and
#: its cache fill are over within a few minutes, so a shift spreads over several floor samples only where they
#: come faster than that. (Three spacings of release-aligned floors under a 5-minute sawtooth are 15 minutes: a
#: "shift" that slow is a creep, and the null took the first quarter hour of every slow-sawtooth leak.)
RAMP_BLOCKS = 3
RAMP_MAX_S = 240.0
#: The hinge's knot leaves at least this many floor samples after it. (A share of the span, a quarter
#: before, kept a leak that began in the last quarter of a long window out of the knots: the best
#: allowed hinge then started hours early at a third of the rate. A rise over the last few samples is
#: no leak unless it beats the null's shift spread over up to RAMP_BLOCKS blocks.)
MIN_TAIL = 4
#: A column whose centred sum of squares is below this share of n carries no information (a warm-up
#: that is flat over the data): it is left out.
FLAT = 1e-9

#: The null's shift is fitted jointly with this many of the best-fitting warm-ups (per series).
TOP_WARM = 6

#: The creep's rate is taken net of a warm-up (:func:`creep_rate`) only where the warm-up, fitted over every block,
#: leaves the blocks after the knot fitted no worse than their own line by more than this many noise variances:
#: the 99th percentile of chi-squared with two degrees of freedom (the warm-up's amplitude and tau). A warm-up of
#: another shape than the prior's (a logistic, a ramp that stops) is extrapolated past the knot wrongly, and the
#: rate net of it was worse than the slope after the knot alone (bench/leak_rate_shapes.py).
POST_MISFIT = 9.21
#: Per-judgement false-alarm probability of the threshold table.
ALPHA = 1e-6
#: Monte Carlo thresholds ``(n blocks, threshold)`` at ALPHA, from ``python bench/leak_glr_threshold.py
#: --draws 40000`` (40,000 pure-noise draws per n and layout, the exceedances over the 99.5th percentile
#: fitted by an exponential tail, the larger layout's kept, made non-increasing in n; 94 s); interpolated
#: linearly in n, flat beyond the ends.
THRESHOLDS: tuple[tuple[int, float], ...] = ((8, 5.54), (12, 5.54), (16, 5.54), (24, 5.54), (32, 5.54),
                                             (48, 5.54), (64, 5.39))


#: Warm-up shapes of the null, each a rise from 0 to 1 over u = age / tau: ``exp`` (1 - exp(-u), a cache
#: filling at a falling rate), ``s_curve`` (1 - (1 + u) exp(-u), traffic ramping up first) and ``root``
#: (sqrt(u / 4) up to its plateau at u = 4: ever fewer new shapes and buffers seen for the first time).
#: Each is flat (or within exp(-12) of its plateau) 12 tau after the start.
SHAPES = ("exp", "s_curve", "root")


def _rise(shape: str, u: np.ndarray) -> np.ndarray:
    out: np.ndarray
    if shape == "exp":
        out = 1.0 - np.exp(-u)
    elif shape == "root":
        out = np.minimum(1.0, np.sqrt(u / 4.0))
    else:
        out = 1.0 - (1.0 + u) * np.exp(-u)
    return out


def threshold(n: int) -> float:
    """The statistic's threshold for ``n`` blocks (THRESHOLDS, interpolated)."""
    ns = [a for a, _ in THRESHOLDS]
    vs = [b for _, b in THRESHOLDS]
    return float(np.interp(n, ns, vs))


def _centre(m: np.ndarray) -> np.ndarray:
    out: np.ndarray = m - m.mean(axis=-1, keepdims=True)
    return out


def _fit1(cols: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gain in SS and coefficient of the centred data ``y`` (B x n) on each centred column (K x n): B x K each."""
    cc = np.einsum("kn,kn->k", cols, cols)
    ok = cc > FLAT * cols.shape[1]
    cy = np.einsum("bn,kn->bk", y, cols)
    with np.errstate(invalid="ignore", divide="ignore"):
        beta = np.where(ok, cy / np.where(ok, cc, 1.0), 0.0)
    return beta * cy, beta


#: The step and hinge columns by their layout (the block positions over the span): a series judged at
#: regular blocks reuses them from one judgement to the next; the warm-up's columns are recomputed while
#: the series is young (its age over the span changes every judgement).
_CACHE: dict[bytes, dict[str, np.ndarray]] = {}
CACHE_SIZE = 256
#: A warm-up that started more than this many tau_max before the data is flat over it (what is left of an
#: exponential one is exp(-10) of it, of an S-shaped one 11 exp(-10): under 3 MiB of a 6 GiB warm-up).
OLD = 10.0


def designs(t: np.ndarray, t0: float, tau_max: float, cache: bool = True) -> dict[str, np.ndarray]:
    """The centred columns of every hypothesis for blocks at ``t`` of a series that started at ``t0``.

    ``cache`` False: the layout is not kept (release-aligned floor times are irregular and never repeat).
    """
    span = float(t[-1] - t[0])
    x = np.round((t - t[0]) / span, 6)
    spacing = float(np.median(np.diff(t))) if len(t) > 1 else span
    ramps = max(1, min(RAMP_BLOCKS, int(RAMP_MAX_S / spacing) if spacing > 0 else RAMP_BLOCKS))
    key = x.tobytes() + bytes([ramps])
    fixed = _CACHE.get(key) if cache else _fixed(x, ramps)
    if fixed is None:
        if len(_CACHE) >= CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        fixed = _CACHE[key] = _fixed(x, ramps)
    return {"warm": warm_columns(t, t0, tau_max), "step": fixed["step"], "hinge": fixed["hinge"],
            "knots": t[0] + fixed["knots"] * span}


def _long_steps(t: np.ndarray, tau_max: float) -> np.ndarray | None:
    """The shift columns with ramps up to RAMP_MAX_S whatever the block spacing (None where RAMP_BLOCKS
    already reaches it): the exact null's (a busy start fills its cache over up to four minutes). A prior
    scaled down for windows of seconds (a demo, a test: ``tau_max`` under 20 minutes) scales them too, to a
    fifth of ``tau_max``: at 240 s they would hold a whole demo's creep."""
    span = float(t[-1] - t[0])
    spacing = float(np.median(np.diff(t)))
    longest = min(RAMP_MAX_S, tau_max / 5)
    ramps = int(longest / spacing) if spacing > 0 else 0
    if ramps <= RAMP_BLOCKS:
        return None
    return _fixed(np.round((t - t[0]) / span, 6), ramps)["step"]


#: The latest warm-up columns (:func:`warm_columns`): the creep's rate (:func:`creep_rate`) is fitted on the
#: blocks the statistic was computed on just before, with the same columns.
_WARM_LAST: list[tuple[bytes, np.ndarray]] = []


def warm_columns(t: np.ndarray, t0: float, tau_max: float) -> np.ndarray:
    """The null's centred warm-up columns (every shape and tau) at block times ``t`` of a series that started
    at ``t0``: K x n, or one row of zeros where the warm-up is over (the null and the alternative hold none)."""
    n = len(t)
    if t[0] - t0 > OLD * tau_max:
        return np.zeros((1, n))
    key = np.asarray(t, dtype=float).tobytes() + np.array([t0, tau_max]).tobytes()
    if _WARM_LAST and _WARM_LAST[0][0] == key:
        return _WARM_LAST[0][1]
    span = float(t[-1] - t[0]) or 1.0
    x = np.round((t - t[0]) / span, 6)
    age = x + (t[0] - t0) / span
    taus = (tau_max / span) * np.exp(np.linspace(math.log(TAU_MIN_SHARE), 0.0, TAU_GRID))
    warm = _centre(np.concatenate([_rise(sh, age[None, :] / taus[:, None]) for sh in SHAPES]))
    warm.setflags(write=False)  # shared by the callers on the same blocks
    _WARM_LAST[:] = [(key, warm)]
    return warm


def _fixed(x: np.ndarray, ramps: int = RAMP_BLOCKS) -> dict[str, np.ndarray]:
    n = len(x)
    us = np.unique(np.linspace(1, n - 1, min(n - 1, MAX_STEPS)).astype(np.int64))
    dx = float(np.median(np.diff(x)))
    steps = [(np.arange(n)[None, :] >= us[:, None]).astype(float)]
    if ramps:  # every ramp length at once (ramps x steps x n)
        lengths = np.arange(1, ramps + 1, dtype=float)[:, None, None] * dx
        steps.append(np.clip((x[None, None, :] - x[us - 1][None, :, None]) / lengths, 0.0, 1.0).reshape(-1, n))
    knots = x[: max(1, n - MIN_TAIL)]
    hinge = np.maximum(0.0, x[None, :] - knots[:, None])
    return {"step": _centre(np.concatenate(steps)), "hinge": _centre(hinge), "knots": knots}


def statistic_batch(t: np.ndarray, ys: np.ndarray, t0: float, tau_max: float, sigma: float,
                    d: dict[str, np.ndarray] | None = None, origins: tuple[float, ...] = (),
                    exact_above: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
    """(statistic, best knot time) for each row of ``ys`` (B x n) at block times ``t``.

    ``sigma``: the robust SD of a block's floor; the noise SD used is at least it. ``origins``: times of
    level shifts (loads) after which the null also holds a warm-up of their own (:func:`_load_warm_sse`).
    ``exact_above``: where the statistic exceeds it, the null's shift is fitted with every warm-up, not only
    the TOP_WARM that fit best alone, and with ramps up to RAMP_MAX_S whatever the block spacing, and both
    hypotheses refit their best warm-ups on a finer grid of taus (:func:`_refined`): a statistic under it
    is left as it is. Only while the warm-up prior is live: an older series' null (:func:`_no_warm`) keeps
    its RAMP_BLOCKS ramps.
    """
    b, n = ys.shape
    if n < 5 or t[-1] <= t[0]:
        return np.zeros(b), np.full(b, float(t[0]) if n else 0.0)
    d = d if d is not None else designs(t, t0, tau_max)
    if d["warm"].shape[0] == 1:
        return _no_warm(ys, sigma, d, lambda y: _load_warm_sse(t, y, None, origins, tau_max) if origins else None)
    y = _centre(ys / max(sigma, 1e-300))
    s0 = np.einsum("bn,bn->b", y, y)
    rows = np.arange(b)
    # The warm-up (a >= 0): its best curve per series.
    gw, bw = _fit1(d["warm"], y)
    gw = np.where(bw > 0, gw, 0.0)
    kw = np.argmax(gw, axis=1)
    w = d["warm"][kw]  # B x n (zero when no warm-up fits)
    have = gw[rows, kw] > 0
    w = np.where(have[:, None], w, 0.0)
    ww = np.einsum("bn,bn->b", w, w)
    ww_safe = np.where(ww > 0, ww, 1.0)
    sse_w = s0 - gw[rows, kw]
    # Residuals of the data and of the step and hinge columns on that warm-up (partialled out).
    yr = y - (np.einsum("bn,bn->b", y, w) / ww_safe)[:, None] * w
    # One shift alone, and one shift with the warm-up.
    gs, _ = _fit1(d["step"], y)
    sse_s = s0 - gs.max(axis=1)

    def on_warm(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # cols (K x n) residualised on each series' warm-up: K x n -> B x K x n, gains of yr on them.
        proj = np.einsum("bn,kn->bk", w, cols) / ww_safe[:, None]  # B x K
        cr = cols[None, :, :] - proj[:, :, None] * w[:, None, :]
        cc = np.einsum("bkn,bkn->bk", cr, cr)
        cy = np.einsum("bkn,bn->bk", cr, yr)
        ok = cc > FLAT * n
        with np.errstate(invalid="ignore", divide="ignore"):
            beta = np.where(ok, cy / np.where(ok, cc, 1.0), 0.0)
        return beta * cy, beta

    # A shift with the warm-up: the best warm-up's residuals, and every pair fitted jointly as the
    # alternative's are (a null fitted less well than the alternative would count its misfit as a creep).
    gsw, _ = on_warm(d["step"])
    # (The joint fit over the warm-ups that fit best alone, TOP_WARM per series: all of them with every
    # shift would cost the live detector ten times more.)
    top = np.unique(np.argsort(-gw, axis=1)[:, :TOP_WARM])
    sse_sw = np.minimum(sse_w - gsw.max(axis=1), s0 - _joint(d["warm"][top], d["step"], y, rising=False)[0])
    sse0 = np.minimum(np.minimum(s0, sse_w), np.minimum(sse_s, sse_sw))
    # Alternative: a rising hinge, alone or with a warm-up fitted jointly with it (the null's best warm-up,
    # bent by the creep at the end, would leave the hinge a knot hours early).
    gh, bh = _fit1(d["hinge"], y)
    gh = np.where(bh > 0, gh, -np.inf)
    ghw, khw = _joint(d["warm"], d["hinge"], y)
    sse1_h = s0 - gh.max(axis=1)
    sse1_hw = s0 - ghw
    use_w = sse1_hw < sse1_h
    sse1 = np.where(use_w, sse1_hw, sse1_h)
    k = np.where(use_w, khw, gh.argmax(axis=1))
    finite = np.isfinite(sse1)
    sse1 = np.where(finite, np.maximum(sse1, 0.0), s0)
    # Known block noise (1 in these units) unless the alternative's own residuals are wider: then the
    # noise is profiled out (an F-like ratio), so a floor that wanders is judged at its own scale.
    v = np.maximum(1.0, sse1 / max(1, n - 4))
    stat = np.where(finite, np.maximum(0.0, sse0 - sse1) / v, 0.0)
    high = np.flatnonzero(stat > exact_above)
    if high.size:
        sse0[high] = np.minimum(sse0[high], _exact_shift_sse(t, y[high], s0[high], d, t0, tau_max))
        # The creep's warm-up refitted on the finer grid too: the null's alone would count the grid's misfit
        # of the alternative as evidence against the creep.
        gf, kf = _refined(t, t0, tau_max, d["warm"], d["hinge"], y[high], True)
        better = finite[high] & (s0[high] - gf < sse1[high])
        sse1[high] = np.where(better, np.maximum(s0[high] - gf, 0.0), sse1[high])
        k[high] = np.where(better, kf, k[high])
        v = np.maximum(1.0, sse1 / max(1, n - 4))
        stat = np.where(finite, np.maximum(0.0, sse0 - sse1) / v, 0.0)
    if origins and (stat > 0).any():
        # The loads' own warm-ups only lower the null's SSE, so a statistic of 0 stays 0: they are fitted
        # only where the statistic is above it (most judgements are at 0, and these fits cost the most).
        sse0 = np.minimum(sse0, _load_warm_sse(t, y, w, origins, tau_max))
        stat = np.where(finite, np.maximum(0.0, sse0 - sse1) / v, 0.0)
    return stat, d["knots"][k]


def _exact_shift_sse(t: np.ndarray, y: np.ndarray, s0: np.ndarray, d: dict[str, np.ndarray], t0: float,
                     tau_max: float) -> np.ndarray:
    """The null's SSE (B) for the centred, scaled floors ``y`` (B x n, sums of squares ``s0``) with one shift,
    ramps up to RAMP_MAX_S and a fifth of ``tau_max`` included (:func:`_long_steps`), fitted alone and with
    every warm-up, the best of them refitted on a finer grid (:func:`_refined`).

    The warm-ups that fit best alone need not be those that fit best with a shift, and a busy start fills its
    cache over up to RAMP_MAX_S: seed 14's leak-free day 26 scored 415 against the top six and three-block
    ramps, 33 against every warm-up, under the threshold (5.5) with longer ramps too.
    """
    steps = _long_steps(t, tau_max)
    sse = s0 - _refined(t, t0, tau_max, d["warm"], d["step"] if steps is None else steps, y, False)[0]
    if steps is not None:
        sse = np.minimum(sse, s0 - _fit1(steps, y)[0].max(axis=1))
    return sse


def _refined(t: np.ndarray, t0: float, tau_max: float, warm: np.ndarray, cols: np.ndarray, y: np.ndarray,
             rising: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_joint` of ``y`` on the grid's warm-ups ``warm`` and ``cols``, with the TOP_FINE best warm-ups
    of each row refitted on a finer grid around them (:func:`_near`), each with the TOP_COLS columns that fit
    best with it on the grid: the best gain and its column, B each."""
    gain, idx, per = _joint(warm, cols, y, rising, per_warm=True)
    for r in range(len(y)):
        # One warm-up of each run of equal fits (a root whose plateau lies past the data fits alike at every
        # longer tau: its shortest is the one whose neighbours bend inside the data). In noise variances: equal
        # fits tie, and a stable sort keeps the shortest tau.
        fit = np.round(per[r].max(axis=1), 4)
        picks: list[int] = []
        for k in np.argsort(-fit, kind="stable"):
            if not np.isfinite(fit[k]) or len(picks) == TOP_FINE:
                break
            if not picks or fit[picks[-1]] > fit[k]:
                picks.append(int(k))
        if picks:
            sub = np.unique(np.argsort(-per[r, picks], axis=1)[:, :TOP_COLS])
            g, j = _joint(np.concatenate([_near(t, t0, tau_max, k) for k in picks]), cols[sub], y[r: r + 1], rising)
            if g[0] > gain[r]:
                gain[r], idx[r] = g[0], sub[j[0]]
    return gain, idx


def _near(t: np.ndarray, t0: float, tau_max: float, k: int) -> np.ndarray:
    """Centred warm-up columns of the shape of the grid's column ``k`` (:func:`warm_columns`), at 2 FINE + 1
    taus spanning its two neighbours on the grid's log scale (none over ``tau_max``)."""
    shape, j = SHAPES[k // TAU_GRID], k % TAU_GRID
    step = -math.log(TAU_MIN_SHARE) / (TAU_GRID - 1)
    logs = math.log(tau_max) + (j - (TAU_GRID - 1) + np.linspace(-1.0, 1.0, 2 * FINE + 1)) * step
    taus = np.exp(np.minimum(logs, math.log(tau_max)))
    return _centre(_rise(shape, np.maximum(0.0, t - t0)[None, :] / taus[:, None]))


def _joint(warm: np.ndarray, hinge: np.ndarray, y: np.ndarray, rising: bool = True, per_warm: bool = False
           ) -> tuple[np.ndarray, ...]:
    """The best gain in SS of ``y`` (B x n) on a warm-up column (a >= 0) and another column (a hinge
    with r > 0, or with ``rising`` False a shift of either sign) together, over every pair, and that
    column's index: B each (-inf where no pair qualifies); with ``per_warm`` also every pair's gain (B x K x J).
    Rows go in chunks (B x K x J arrays)."""
    if len(y) * warm.shape[0] * hinge.shape[0] > 4_000_000:
        step = max(1, 4_000_000 // (warm.shape[0] * hinge.shape[0]))
        parts = [_joint(warm, hinge, y[i: i + step], rising, per_warm) for i in range(0, len(y), step)]
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))
    cww = np.einsum("kn,kn->k", warm, warm)
    chh = np.einsum("jn,jn->j", hinge, hinge)
    cwh = np.einsum("kn,jn->kj", warm, hinge)  # K x J
    det = cww[:, None] * chh[None, :] - cwh * cwh
    ok = (cww[:, None] > FLAT * warm.shape[1]) & (det > 1e-9 * cww[:, None] * chh[None, :])
    det = np.where(ok, det, 1.0)
    cyw = np.einsum("bn,kn->bk", y, warm)[:, :, None]  # B x K x 1
    cyh = np.einsum("bn,jn->bj", y, hinge)[:, None, :]  # B x 1 x J
    bw = (cyw * chh[None, None, :] - cyh * cwh[None]) / det
    bh = (cyh * cww[None, :, None] - cyw * cwh[None]) / det
    fits = ok[None] & (bw >= 0) & ((bh > 0) if rising else True)
    gain = np.where(fits, bw * cyw + bh * cyh, -np.inf)
    flat = gain.reshape(len(y), -1)
    best = flat.argmax(axis=1)
    gains = flat[np.arange(len(y)), best]
    if per_warm:
        return gains, best % hinge.shape[0], gain
    return gains, best % hinge.shape[0]


def _no_warm(ys: np.ndarray, sigma: float, d: dict[str, np.ndarray],
             load_sse: Callable[[np.ndarray], np.ndarray | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The statistic once the warm-up is over: a rising hinge against a constant, one shift, or a load's
    own warm-up (``load_sse(y)``: the SSE of that null per row of the centred, scaled floors, or None)."""
    n = ys.shape[1]
    y = _centre(ys / max(sigma, 1e-300))
    s0 = np.einsum("bn,bn->b", y, y)
    gs, _ = _fit1(d["step"], y)
    sse0 = s0 - np.maximum(gs.max(axis=1), 0.0)
    gh, bh = _fit1(d["hinge"], y)
    gh = np.where(bh > 0, gh, -np.inf)
    k = gh.argmax(axis=1)
    best = gh.max(axis=1)
    finite = np.isfinite(best)
    sse1 = np.where(finite, np.maximum(s0 - best, 0.0), s0)
    v = np.maximum(1.0, sse1 / max(1, n - 4))
    stat = np.where(finite, np.maximum(0.0, sse0 - sse1) / v, 0.0)
    loads = load_sse(y) if load_sse is not None and (stat > 0).any() else None  # 0 stays 0, as above
    if loads is not None:
        stat = np.where(finite, np.maximum(0.0, np.minimum(sse0, loads) - sse1) / v, 0.0)
    return stat, d["knots"][k]


def statistic(t: np.ndarray, y: np.ndarray, t0: float, tau_max: float, sigma: float,
              cache: bool = True, origins: tuple[float, ...] = (), exact_above: float = math.inf
              ) -> tuple[float, float]:
    """(GLR statistic, best knot) of floors ``y`` at ``t`` for a series that started at ``t0``; ``origins``:
    the times of the loads whose own warm-ups the null holds too (``loadlog.origins``); ``exact_above``: as in
    :func:`statistic_batch`."""
    if len(t) < 5 or t[-1] <= t[0]:
        return 0.0, float(t[0]) if len(t) else 0.0
    ta = np.asarray(t, dtype=float)
    s, k = statistic_batch(ta, np.asarray(y, dtype=float)[None, :], t0, tau_max, sigma,
                           designs(ta, t0, tau_max, cache), origins, exact_above)
    return float(s[0]), float(k[0])


class Recent:
    """:func:`statistic` remembered for the last ``size`` inputs (one per detector).

    A detector judges its windows at every closed bin, and a window of release-aligned floors keeps the same
    blocks until the next release: of the 708 statistics the 3-hour series of ``bench/leak_callgrind.py
    --loads 2`` computes, 142 repeat one of the last eight exactly. The answer is a function of the inputs
    and of this module's constants only, so a repeat is served from here.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._memo: dict[tuple[object, ...], tuple[float, float]] = {}
        self.hits = 0

    def statistic(self, t: np.ndarray, y: np.ndarray, t0: float, tau_max: float, sigma: float,
                  cache: bool = True, origins: tuple[float, ...] = (), exact_above: float = math.inf
                  ) -> tuple[float, float]:
        ta, ya = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
        key = (ta.tobytes(), ya.tobytes(), float(t0), float(tau_max), float(sigma), cache, origins,
               float(exact_above))
        out = self._memo.pop(key, None)  # re-inserted below: the newest last, the oldest dropped first
        if out is None:
            out = statistic(ta, ya, t0, tau_max, sigma, cache, origins, exact_above)
        else:
            self.hits += 1
        self._memo[key] = out
        if len(self._memo) > self.size:
            self._memo.pop(next(iter(self._memo)))
        return out


def _load_warm_sse(t: np.ndarray, y: np.ndarray, w: np.ndarray | None, origins: tuple[float, ...],
                   tau_max: float) -> np.ndarray:
    """The null's SSE with a load at each of ``origins`` followed by a warm-up of its own (B).

    A model loaded into a running process (a second model, a swap) fills its own cache and buffers as the
    process's first one did: a shift at the load and a saturating warm-up from it, ``a >= 0`` and ``tau <=
    tau_max`` as the process's own, fitted jointly (on the residuals of the process's best warm-up ``w``, B x
    n, where one is given). De-stepping has taken most of the shift out; the fit takes what it left.
    ``y``: the centred, scaled floors (B x n). Rows with no usable origin get ``inf``.
    """
    b, n = y.shape
    out = np.full(b, np.inf)
    taus = tau_max * np.exp(np.linspace(math.log(TAU_MIN_SHARE), 0.0, TAU_GRID))
    for o in origins:
        if o >= t[-1] or o < t[0] - OLD * tau_max:
            continue
        age = np.maximum(0.0, t - o)[None, :] / taus[:, None]
        warm = _centre(np.concatenate([_rise(sh, age) for sh in SHAPES]))
        step = _centre((t >= o).astype(float))[None, :]
        for r in range(b):
            yr, wr, sr = y[r: r + 1], warm, step
            base = float(np.einsum("n,n->", y[r], y[r]))
            if w is not None and float(np.einsum("n,n->", w[r], w[r])) > FLAT * n:
                # Partial the process's own warm-up out of the data and of both columns.
                u = w[r] / math.sqrt(float(np.einsum("n,n->", w[r], w[r])))
                yr = yr - np.einsum("bn,n->b", yr, u)[:, None] * u
                wr = warm - np.einsum("kn,n->k", warm, u)[:, None] * u
                sr = step - np.einsum("kn,n->k", step, u)[:, None] * u
                base = float(np.einsum("bn,bn->", yr, yr))
            if float(np.einsum("kn,kn->", sr, sr)) > FLAT * n:
                gain = _joint(wr, sr, yr, rising=False)[0]
            else:  # the load lies before the data: its warm-up alone
                g1, b1 = _fit1(wr, yr)
                gain = np.where(b1 > 0, g1, -np.inf).max(axis=1)
            out[r] = min(out[r], base - float(gain[0])) if np.isfinite(gain[0]) else out[r]
    return out


def creep_rate(t: np.ndarray, y: np.ndarray, t0: float, tau_max: float, sigma: float,
               knot: float) -> tuple[float, float]:
    """The creep's rate after ``knot`` net of a warm-up, bytes/s, and its standard error for block noise ``sigma``.

    The floor ``y`` at ``t`` is fitted with a free level before the knot and a free line after it (the least-squares
    slope of the blocks after the knot, as alone), together with the best warm-up of the null's prior from the
    series' start ``t0`` (``a >= 0``, ``tau <= tau_max``; none where none improves the fit). The warm-up is fitted
    over every block, before the knot and after: a creep found while a warm-up still rises, or just after it, is
    not also credited with the warm-up's tail (the slope after the knot alone was 2-5 times the leak's rate there).
    The warm-up is kept only where it fits the blocks after the knot about as well as their own line
    (POST_MISFIT); a warm-up of another shape, extrapolated past the knot, would bias the rate more than it removes.
    """
    n = len(t)
    after = t >= knot
    m = int(after.sum())
    if m < 2:  # no block after the knot: the slope of all of them; one: none
        tc = t[after] - t[after].mean() if m else t - t.mean()
        sxx = float(np.einsum("n,n->", tc, tc))
        if sxx <= 0:
            return 0.0, math.inf
        return float(np.einsum("n,n->", tc, y - y.mean())) / sxx, sigma / math.sqrt(sxx)
    hinge = _centre(np.maximum(0.0, t - knot))
    yc = _centre(np.asarray(y, dtype=float))
    # The free level after the knot (a step) is partialled out of the data, the hinge and the warm-ups; with
    # no block before the knot (a creep from the window's start) there is none, and the line is over all.
    u = None
    if n - m >= 1:
        step = _centre(after.astype(float))
        u = step / math.sqrt(float(np.einsum("n,n->", step, step)))
        hinge = hinge - float(np.einsum("n,n->", hinge, u)) * u
        yc = yc - float(np.einsum("n,n->", yc, u)) * u
    chh = float(np.einsum("n,n->", hinge, hinge))
    if chh <= 0:
        return 0.0, math.inf
    cyh = float(np.einsum("n,n->", yc, hinge))
    rate, var = cyh / chh, sigma * sigma / chh
    warm = warm_columns(t, t0, tau_max)
    if warm.shape[0] > 1:
        if u is not None:
            warm = warm - np.einsum("kn,n->k", warm, u)[:, None] * u
        cww = np.einsum("kn,kn->k", warm, warm)
        cwh = np.einsum("kn,n->k", warm, hinge)
        cyw = np.einsum("kn,n->k", warm, yc)
        det = cww * chh - cwh * cwh
        ok = (cww > FLAT * n) & (det > 1e-9 * cww * chh)
        det = np.where(ok, det, 1.0)
        bw = (cyw * chh - cyh * cwh) / det
        bh = (cyh * cww - cyw * cwh) / det
        gain = np.where(ok & (bw >= 0), bw * cyw + bh * cyh, -np.inf)
        k = int(np.argmax(gain))
        if gain[k] > rate * cyh and _fits_after(t, y, after, yc - bw[k] * warm[k] - bh[k] * hinge, sigma):
            rate, var = float(bh[k]), sigma * sigma * float(cww[k]) / float(det[k])
    return rate, math.sqrt(var)


def _fits_after(t: np.ndarray, y: np.ndarray, after: np.ndarray, resid: np.ndarray, sigma: float) -> bool:
    """Whether the fit with a warm-up (its residuals ``resid``) explains the blocks ``after`` the knot about as
    well as their own least-squares line does (within POST_MISFIT noise variances): where it does not, the
    warm-up's shape is not the data's and its extrapolation past the knot would bias the rate."""
    ta, ya = t[after], np.asarray(y, dtype=float)[after]
    tc, yc = ta - ta.mean(), ya - ya.mean()
    sxy = float(np.einsum("n,n->", tc, yc))
    line = float(np.einsum("n,n->", yc, yc)) - sxy * sxy / float(np.einsum("n,n->", tc, tc))
    ra = resid[after]
    return float(np.einsum("n,n->", ra, ra)) <= line + POST_MISFIT * sigma * sigma

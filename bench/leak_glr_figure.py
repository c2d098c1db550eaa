"""The figure of docs/gpu.md's GLR test: a warm-up, a sawtooth and a leak through the default detector.

One process sampled every 5 s for four hours: an S-shaped warm-up of 2 GiB (tau 8 min), a 600 MiB cache
sawtooth every 60 s, 20 MiB of noise, a 1.5 GiB model load at 1 h 10 (a level shift), and a 1 GiB/h leak
from 2 h. The top panel shows what NVML reports, the floor the memory returns to (the truth, which the
detector does not see), the true onset, the detection and the detector's onset estimate; the bottom one, per
window, the GLR statistic over its threshold (the test fires above 1). The warm-up and the load stay below
it: both are in the null.

Usage::

    python bench/leak_glr_figure.py [--out docs/gpu-glr.png] [--seed 3]

Needs matplotlib (the ``plot`` extra). Prints the detection delay and the onset error.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402, F401  (puts the checkout on sys.path)
from inferwatch_sidecar.components.gpu.detector import LeakDetector  # noqa: E402

MiB = 2**20
GiB = 2**30
DT = 5.0
HOURS = 4.0
ONSET = 2 * 3600.0
RATE = GiB / 3600.0
LOAD_AT, LOAD = 70 * 60.0, 1.5 * GiB
WARM, TAU = 2 * GiB, 480.0
SAW, PERIOD = 600 * MiB, 60.0


def floor(t: np.ndarray) -> np.ndarray:
    """The level memory returns to after each release: base, warm-up, the load and the leak."""
    u = t / TAU
    return (6 * GiB + WARM * (1 - (1 + u) * np.exp(-u)) + LOAD * (t >= LOAD_AT)
            + RATE * np.clip(t - ONSET, 0, None))


def run(seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, HOURS * 3600, DT)
    fl = floor(t)
    used = fl + SAW * ((t % PERIOD) / PERIOD) + rng.normal(0, 20 * MiB, len(t))
    det = LeakDetector()
    ratios: dict[float, list[tuple[float, float]]] = {}
    detected = None
    for ti, v in zip(t, used, strict=True):
        det.update(float(ti), float(v))
        for r in det.results:
            if r is not None and r.glr is not None and r.glr_threshold:
                ratios.setdefault(r.window_s, []).append((float(ti), r.glr / r.glr_threshold))
        if detected is None and det.verdict == "leak":
            detected = float(ti)
    onset_est = det.episodes[0].onset_estimate if det.episodes else None
    return {"t": t, "used": used, "floor": fl, "ratios": ratios, "detected": detected, "onset": onset_est,
            "episodes": det.episodes}


def draw(res: dict[str, object], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.asarray(res["t"]) / 3600
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6.4), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    ax1.plot(t, np.asarray(res["used"]) / GiB, color="0.75", lw=0.6, label="NVML used (5 s samples)")
    ax1.plot(t, np.asarray(res["floor"]) / GiB, color="black", lw=1.2, label="release floor (truth)")
    ax1.axvline(ONSET / 3600, color="tab:red", ls=":", lw=1.2, label="leak onset (truth)")
    if res["onset"] is not None:
        ax1.axvline(float(res["onset"]) / 3600, color="tab:orange", ls="--", lw=1, label="onset estimate")
    if res["detected"] is not None:
        ax1.axvline(float(res["detected"]) / 3600, color="tab:blue", lw=1.2, label="detection")
    ax1.set_ylabel("GiB")
    ax1.set_title("S-shaped warm-up, 600 MiB sawtooth, a model load at 1:10, a 1 GiB/h leak from 2:00")
    ax1.legend(loc="upper left", fontsize=8)
    ratios = res["ratios"]
    assert isinstance(ratios, dict)
    for w, pts in sorted(ratios.items()):
        a = np.asarray(pts)
        ax2.plot(a[:, 0] / 3600, np.maximum(a[:, 1], 1e-3), lw=0.9, label=f"{w / 60:.0f}-min window")
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_yscale("log")
    ax2.set_ylim(1e-3, 1e5)  # room for the legend above the curves
    ax2.set_ylabel("GLR statistic / threshold")
    ax2.set_xlabel("hours since the process started")
    ax2.legend(loc="upper left", fontsize=8, ncol=5)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "gpu-glr.png"))
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    res = run(args.seed)
    det, onset = res["detected"], res["onset"]
    print(f"detected {'never' if det is None else f'{(float(det) - ONSET) / 60:.1f} min after the onset'}; "
          f"onset estimate {'-' if onset is None else f'{(float(onset) - ONSET) / 60:+.1f} min'}; "
          f"episodes {len(res['episodes'])}")  # type: ignore[arg-type]
    try:
        draw(res, args.out)
    except ImportError:
        print("matplotlib is missing: pip install 'inferwatch[plot]'", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0 if det is not None and not math.isnan(float(det)) else 1


if __name__ == "__main__":
    raise SystemExit(main())

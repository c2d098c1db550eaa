"""Synthetic memory traces for the detector tests (1 s samples, bytes)."""

from __future__ import annotations

import numpy as np

MiB = 2**20
GiB = 2**30


def quantised(y: np.ndarray) -> np.ndarray:
    """Round to the caching allocator's 2 MiB granules."""
    return np.round(y / (2 * MiB)) * 2 * MiB


def noise(rng: np.random.Generator, n: int, sigma_mib: float = 8.0) -> np.ndarray:
    return rng.normal(0.0, sigma_mib * MiB, n)


def creep(n: int, rate_gib_h: float, start: int, base: float = 20 * GiB, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return quantised(base + noise(rng, n) + rate_gib_h * GiB / 3600 * np.maximum(0, t - start))

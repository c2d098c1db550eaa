"""Joint (multivariate) drift: the PCA reconstruction error of the features, fitted on the reference.

When an upstream join attaches values to the wrong rows, every column keeps its
distribution and only the relations between columns break: no per-column test
can see it. A principal-component model of the reference rows reconstructs
rows that keep the reference's relations well and rows that break them badly,
so the window's reconstruction errors grow.

The model (:class:`JointModel`, stored in the profile under ``"multivariate"``,
bounded by :data:`MAX_DIMS` whatever the data size):

- encoding: each numeric feature standardized with the fit rows' mean and
  standard deviation; each categorical feature one-hot over its
  :data:`TOP_CATEGORIES` most frequent categories, each indicator standardized
  the same way; a missing value (or a category outside the list) encodes as
  the mean, 0; constant columns are left out; at most :data:`MAX_DIMS`
  dimensions (numeric features first, in profile order);
- the fewest principal components that explain ``variance`` (0.65, NannyML's
  default) of the fit rows' variance;
- a row's error is its residual, the part the principal components do not
  reconstruct, *whitened*: the sum over the remaining (minor) directions of
  the squared coordinate divided by that direction's fit variance (plus
  :data:`RIDGE` of the mean variance, so a direction of no variance cannot
  divide by 0). NannyML sums the squared residual unweighted; relations
  between columns live in the minor directions, where the reference varies
  least, and weighting them by their variance detects a column re-attached to
  the wrong rows with 2 to 4 times the effect on the scikit-learn data sets
  of ``bench/drift_quality.py`` (part d);
- ``errors``: the percentile bins (a numeric profile column) of the errors of
  the *held-out* reference rows.

A seeded permutation of the reference rows sends half of them to the fit and
half to the held-out errors. Window rows are not in the fit either, so under no
drift the window's errors and the held-out errors are samples of one
distribution and the test's null is exact; the fit rows' own errors are biased
low (PCA minimizes them) and would make every window look drifted.

The test (:func:`score`): one-sided Mann-Whitney of the window's errors against
the held-out errors on the error bins (:func:`stats.mann_whitney_binned`).
``statistic`` is the AUC, the probability that a window row reconstructs
worse than a reference row (0.5 under no drift); the effect is ``AUC - 0.5``.
It is one more test in the window's Benjamini-Hochberg family
(:func:`engine.decide`) and, like every column, needs an effect of at least
its floor: the larger of ``multivariate_effect_floor`` (0.02) and the AUC's
noise level, ``z(multivariate_noise_p) * sqrt((n + m + 1) / (12 n m))``
(``multivariate_noise_p`` 1e-5: about 1 window in 100 000 reaches it with no
drift). Being rank-based, its null holds whatever the features' distributions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inferwatch_sidecar.stats import hypothesis as stats
from inferwatch_sidecar.stats.columns import (
    NumericColumn,
    ProfileError,
    canon,
    column_from_json,
    numeric_column,
    to_float,
)

if TYPE_CHECKING:
    from inferwatch_sidecar.components.drift.engine import Settings, Summary

# scipy is imported in the functions that use it, not here: it is 26-72 MiB of modules that an idle sidecar
# need not hold (bench/idle_rss.py; tests/daemon/test_idle_imports.py).

METHOD = "pca_reconstruction_error"
#: Encoded dimensions at most (numeric features, then categorical indicators).
MAX_DIMS = 64
#: Added to every minor direction's variance, as a share of the mean variance of all directions.
RIDGE = 1e-3
#: One-hot indicators per categorical feature at most (its most frequent categories).
TOP_CATEGORIES = 8
#: Share of the fit rows' variance the components explain.
DEFAULT_VARIANCE = 0.65
#: Reference rows needed at least: half fit the model, half give the reference errors.
MIN_ROWS = 200
#: Name of the error column in results and metrics.
ERROR_COLUMN = "__reconstruction_error__"
#: Seed of the fit / held-out split (the profile is deterministic).
SPLIT_SEED = 0
#: Rows per block of the error computation.
BLOCK = 512


@dataclass
class Encoded:
    """One encoded input: a numeric feature, or one category of a categorical feature."""

    name: str
    kind: str
    #: fit-row mean and standard deviation (for an indicator: its rate and sqrt(rate (1 - rate)))
    mean: float
    std: float
    #: the category of an indicator
    category: str | None = None


@dataclass
class JointModel:
    """A fitted PCA model of the reference's features and its held-out errors (see the module docstring)."""

    inputs: list[Encoded]
    #: the minor directions (those the principal components leave out) x dimensions, orthonormal rows
    components: np.ndarray
    #: each minor direction's fit variance plus the ridge
    scales: np.ndarray
    #: principal components (the reconstruction)
    principal: int
    #: share of the fit variance they explain
    explained: float
    variance: float
    fit_rows: int
    errors: NumericColumn
    _numeric: dict[str, tuple[int, float, float]] = field(init=False, repr=False)
    _categorical: dict[str, dict[str, tuple[int, float, float]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._numeric = {}
        self._categorical = {}
        for j, e in enumerate(self.inputs):
            if e.kind == "numeric":
                self._numeric[e.name] = (j, e.mean, e.std)
            else:
                self._categorical.setdefault(e.name, {})[str(e.category)] = (j, e.mean, e.std)

    @property
    def dims(self) -> int:
        return len(self.inputs)

    @property
    def columns(self) -> list[str]:
        """The feature columns the model reads, in order."""
        return list(dict.fromkeys(e.name for e in self.inputs))

    @property
    def nbytes(self) -> int:
        e = self.errors
        return int(self.components.nbytes + self.scales.nbytes + 48 * self.dims + e.edges.nbytes + e.counts.nbytes
                   + e.bin_means.nbytes)

    # -- encoding -------------------------------------------------------------------------------------------------

    def encode(self, numeric: Mapping[str, np.ndarray], categorical: Mapping[str, Sequence[Any]],
               rows: int) -> np.ndarray:
        """Encode ``rows`` rows given as columns (numeric arrays, raw categorical values); absent columns are
        missing. A numeric model column given as raw values, or a categorical one given as numbers, is
        converted, as the per-column tests do.

        Returns:
            the encoded rows as a dimensions x rows matrix (one contiguous row per input).
        """
        z = np.zeros((self.dims, rows))
        for name, (j, mu, sd) in self._numeric.items():
            if name in numeric:
                v = np.asarray(numeric[name], dtype=np.float64)
            elif name in categorical:
                v = np.array([to_float(x) for x in categorical[name]], dtype=np.float64)
            else:
                continue
            col = z[j]
            np.subtract(v, mu, out=col)
            col /= sd
        # A missing (NaN) or infinite value is the mean, 0: one pass over the numbers.
        z[~np.isfinite(z)] = 0.0
        for name, cats in self._categorical.items():
            if name in categorical:
                vals = [x if type(x) is str else canon(x) for x in categorical[name]]
            elif name in numeric:
                vals = [canon(x) for x in np.asarray(numeric[name]).tolist()]
            else:
                continue
            # One pass in Python: each value's position in the category list, -1 for another, -2 missing.
            pos = {c: k for k, c in enumerate(cats)}
            idx = np.fromiter((-2 if v is None else pos.get(v, -1) for v in vals), dtype=np.int64, count=rows)
            for k, (j, rate, sd) in enumerate(cats.values()):
                z[j] = ((idx == k) - rate) / sd
            gone = idx == -2
            if gone.any():
                # A missing value is the mean (0), not "not this category".
                for j, _, _ in cats.values():
                    z[j, gone] = 0.0
        return z

    def reconstruction_errors(self, z: np.ndarray) -> np.ndarray:
        """The whitened residual of each encoded row (``z``: dimensions x rows, see the module docstring).

        In blocks of :data:`BLOCK` rows: a product this small runs on one thread, where one large product
        starts BLAS threads that, on a busy machine, cost 30 times the arithmetic.
        """
        w = 1.0 / self.scales
        out = np.empty(z.shape[1])
        for i in range(0, z.shape[1], BLOCK):
            res = self.components @ z[:, i:i + BLOCK]
            out[i:i + BLOCK] = w @ (res * res)
        return out

    def errors_of(self, numeric: Mapping[str, np.ndarray], categorical: Mapping[str, Sequence[Any]],
                  rows: int) -> np.ndarray:
        """Reconstruction errors of rows given as columns (:meth:`encode`)."""
        return self.reconstruction_errors(self.encode(numeric, categorical, rows))

    def errors_of_records(self, num_names: Sequence[str], nums: np.ndarray, cat_names: Sequence[str],
                          cats: Sequence[Sequence[Any]]) -> np.ndarray:
        """Reconstruction errors of records of one schema: a numbers matrix and categorical value tuples."""
        rows = nums.shape[0] if len(num_names) else len(cats)
        numeric = {n: nums[:, j] for j, n in enumerate(num_names) if n in self._numeric or n in self._categorical}
        categorical = {n: [c[j] for c in cats] for j, n in enumerate(cat_names)
                       if (n in self._numeric or n in self._categorical) and n not in numeric}
        return self.errors_of(numeric, categorical, rows)

    # -- JSON -------------------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "method": METHOD, "variance": self.variance, "principal_components": self.principal,
            "explained_variance": self.explained, "fit_rows": self.fit_rows,
            "inputs": [{"name": e.name, "kind": e.kind, "mean": e.mean, "std": e.std,
                        **({"category": e.category} if e.kind == "categorical" else {})} for e in self.inputs],
            "components": self.components.tolist(), "scales": self.scales.tolist(), "errors": self.errors.to_json(),
        }


def fit(numeric: Mapping[str, np.ndarray], categorical: Mapping[str, Sequence[Any]], features: Sequence[str],
        rows: int, variance: float = DEFAULT_VARIANCE) -> JointModel | None:
    """Fit the joint model on reference columns, or None when there is too little to fit.

    Args:
        numeric: numeric columns (NaN = missing).
        categorical: categorical columns (None = missing).
        features: the feature columns to model, in profile order (the prediction and the confidence are not).
        rows: rows in every column.
        variance: share of the variance the components explain.
    """
    if rows < MIN_ROWS or not 0.0 < variance < 1.0:
        return None
    if any(len(numeric[f]) != rows for f in features if f in numeric) or any(
            len(categorical[f]) != rows for f in features if f in categorical):
        return None
    perm = np.random.default_rng(SPLIT_SEED).permutation(rows)
    fit_idx, held = np.sort(perm[: rows // 2]), np.sort(perm[rows // 2:])
    inputs: list[Encoded] = []
    for name in (f for f in features if f in numeric):
        v = np.asarray(numeric[name], dtype=np.float64)[fit_idx]
        ok = v[np.isfinite(v)]
        sd = float(ok.std()) if ok.size > 1 else 0.0
        if sd > 0.0 and math.isfinite(sd) and len(inputs) < MAX_DIMS:
            inputs.append(Encoded(name, "numeric", float(ok.mean()), sd))
    for name in (f for f in features if f in categorical and f not in numeric):
        vals = [canon(categorical[name][i]) for i in fit_idx.tolist()]
        freq: dict[str, int] = {}
        for c in vals:
            if c is not None:
                freq[c] = freq.get(c, 0) + 1
        for cat, k in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_CATEGORIES]:
            rate = k / len(vals)
            if 0.0 < rate < 1.0 and len(inputs) < MAX_DIMS:
                inputs.append(Encoded(name, "categorical", rate, math.sqrt(rate * (1.0 - rate)), cat))
    if len(inputs) < 2:
        return None
    probe = JointModel(inputs, np.zeros((0, len(inputs))), np.zeros(0), 0, 0.0, variance, int(fit_idx.size),
                       numeric_column(ERROR_COLUMN, np.zeros(1)))

    def part(idx: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, list[Any]]]:
        num = {n: np.asarray(numeric[n], dtype=np.float64)[idx] for n in probe.columns if n in numeric}
        cat = {n: [categorical[n][i] for i in idx.tolist()] for n in probe.columns if n in categorical}
        return num, cat

    z = probe.encode(*part(fit_idx), int(fit_idx.size))
    z -= z.mean(axis=1, keepdims=True)  # exactly centred (the encoding centres on the fit mean up to missing values)
    # Eigenvectors of the d x d covariance, largest variance first.
    w, v = np.linalg.eigh(z @ z.T / z.shape[1])
    lam, vt = np.maximum(w[::-1], 0.0), v[:, ::-1].T
    share = lam / max(float(lam.sum()), 1e-300)
    k = int(np.searchsorted(np.cumsum(share), variance) + 1)
    k = max(1, min(k, len(inputs) - 1))
    scales = lam[k:] + RIDGE * max(float(lam.mean()), 1e-12)
    model = JointModel(inputs, vt[k:], scales, k, float(share[:k].sum()), variance, int(fit_idx.size),
                       numeric_column(ERROR_COLUMN, np.zeros(1)))
    model.errors = numeric_column(ERROR_COLUMN, model.errors_of(*part(held), int(held.size)))
    return model


def _finite(x: Any) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def from_json(d: Any, features: Sequence[str]) -> JointModel:
    """Validate the profile's ``"multivariate"`` entry; ``features`` are the profile's feature columns.

    Raises:
        ProfileError: a field is missing or inconsistent (the message names it).
    """
    where = "multivariate"
    if not isinstance(d, dict) or d.get("method") != METHOD:
        raise ProfileError(f"{where}: must be an object with \"method\": \"{METHOD}\"")
    raw = d.get("inputs")
    if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_DIMS:
        raise ProfileError(f"{where}: 'inputs' must list 2 to {MAX_DIMS} encoded inputs")
    inputs = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict) or e.get("name") not in features or e.get("kind") not in ("numeric", "categorical"):
            raise ProfileError(f"{where}: inputs[{i}] must name a feature column of the profile and its kind")
        mean, sd = _finite(e.get("mean")), _finite(e.get("std"))
        if mean is None or sd is None or not sd > 0:
            raise ProfileError(f"{where}: inputs[{i}] needs a finite 'mean' and a positive 'std'")
        cat = e.get("category")
        if e["kind"] == "categorical" and not isinstance(cat, str):
            raise ProfileError(f"{where}: inputs[{i}] is an indicator and needs its 'category'")
        inputs.append(Encoded(e["name"], e["kind"], mean, sd, cat if e["kind"] == "categorical" else None))
    comps = d.get("components")
    try:
        c = np.array(comps, dtype=np.float64)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: 'components' must be a matrix of numbers") from None
    if c.ndim != 2 or not 1 <= c.shape[0] < len(inputs) or c.shape[1] != len(inputs) or not np.all(np.isfinite(c)):
        raise ProfileError(f"{where}: 'components' must be 1 to {len(inputs) - 1} finite rows of {len(inputs)} numbers")
    if not np.allclose(c @ c.T, np.eye(c.shape[0]), atol=1e-6):
        raise ProfileError(f"{where}: 'components' must be orthonormal rows (rebuild the profile)")
    sc = d.get("scales")
    if not isinstance(sc, list) or len(sc) != c.shape[0] or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in sc):
        raise ProfileError(f"{where}: 'scales' must list one positive number per row of 'components'")
    principal = d.get("principal_components")
    if not isinstance(principal, int) or principal + c.shape[0] != len(inputs):
        raise ProfileError(f"{where}: 'principal_components' plus the rows of 'components' must equal the inputs")
    errors = column_from_json(d.get("errors"), f"{where}.errors")
    if not isinstance(errors, NumericColumn) or errors.count < MIN_ROWS // 2:
        raise ProfileError(f"{where}: 'errors' must be a numeric column of at least {MIN_ROWS // 2} held-out errors")
    variance, explained, fit_rows = d.get("variance"), d.get("explained_variance"), d.get("fit_rows")
    if not (isinstance(variance, (int, float)) and 0 < variance < 1 and isinstance(explained, (int, float))
            and isinstance(fit_rows, int) and fit_rows > 0):
        raise ProfileError(f"{where}: 'variance', 'explained_variance' and 'fit_rows' must be set")
    return JointModel(inputs, c, np.array(sc, dtype=np.float64), principal, float(explained), float(variance), fit_rows,
                      errors)


# -- the test ---------------------------------------------------------------------------------------------------------


@dataclass
class JointResult:
    """The joint test of one window. ``p_value`` is None when it was not tested (``status`` says why)."""

    statistic: float
    p_value: float | None
    effect: float
    n_reference: int
    n_current: int
    error_mean_reference: float
    error_mean_current: float | None
    components: int
    dims: int
    columns: list[str]
    status: str = "ok"
    test: str = "mann_whitney"
    effect_name: str = "auc_shift"
    effect_floor: float = 0.0
    p_adjusted: float | None = None
    alpha: float = 0.05
    drifted: bool = False

    @property
    def threshold(self) -> float:
        """The AUC a window must reach (with an adjusted p-value at most ``alpha``) to count as drifted."""
        return 0.5 + self.effect_floor

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        d["columns"] = list(self.columns)
        d["threshold"] = self.threshold
        d["method"] = METHOD
        return d


def effect_floor(n: int, m: int, settings: Settings) -> float:
    """The AUC shift the window must reach: the configured floor or the noise level at ``n`` and ``m``."""
    from scipy import special

    noise = float(special.ndtri(1.0 - settings.multivariate_noise_p)) * stats.auc_noise(n, m)
    return max(settings.multivariate_effect_floor, noise)


def score(model: JointModel, errors: NumericColumn, current: Summary, settings: Settings,
          status: str | None = None) -> JointResult:
    """The raw (uncorrected) joint test of a window's errors (binned on ``errors``'s bins) against ``errors``.

    ``errors`` is the model's held-out errors, or in rolling mode those of a past window.
    """
    n = current.n
    auc, _, p = stats.mann_whitney_binned(errors.counts, current.counts)
    sums = current.sums
    res = JointResult(
        statistic=auc, p_value=p, effect=auc - 0.5, n_reference=errors.count, n_current=n,
        error_mean_reference=float(np.dot(errors.counts, errors.bin_means) / errors.count) if errors.count else 0.0,
        error_mean_current=float(sums.sum() / n) if n and sums is not None else None,
        components=model.principal, dims=model.dims, columns=model.columns,
        alpha=settings.alpha,
    )
    if status is not None:
        res.status = status
    elif n < settings.min_samples:
        res.status = "insufficient_data"
    if res.status != "ok":
        res.p_value = None
    return res


__all__ = ["JointModel", "JointResult", "fit", "from_json", "score", "effect_floor", "ERROR_COLUMN"]

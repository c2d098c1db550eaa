"""Reference profiles: what the drift engine compares live windows against.

A profile is a versioned, human-readable JSON document with one entry per
column (input features, the prediction and the confidence):

- numeric: ``bins`` (default 100) reference-percentile bins given by their
  inner ``edges`` (plus one edge at the minimum and one just above the
  maximum, so out-of-range values get bins of their own), the reference ``counts`` and the ``bin_means`` (mean of the
  reference values in each bin, which is the bounded deterministic summary the
  Wasserstein distance needs), the coarser ``psi_edges`` (deciles) used by PSI
  and Jensen-Shannon, and the moments;
- categorical: the top-K ``categories`` by frequency with their ``counts`` and
  one trailing "other" count for everything else;
- both: ``count`` (present values) and ``missing`` (NaN/inf/empty).

A reference built with its labels also has a ``performance`` entry: its
realized accuracy and a bounded calibration of P(correct | confidence)
(:mod:`.performance`), for the label-free accuracy estimate.

Everything is bounded by ``bins`` and ``top_k``, not by the reference size.
Loading validates every field; a bad profile raises :class:`ProfileError`
with a message that says what to fix.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferwatch_sidecar.components.drift.multivariate import JointModel
from inferwatch_sidecar.components.drift.multivariate import fit as fit_joint
from inferwatch_sidecar.components.drift.multivariate import from_json as joint_from_json
from inferwatch_sidecar.components.drift.performance import Performance
from inferwatch_sidecar.stats.columns import (
    DEFAULT_BINS,
    DEFAULT_PSI_BINS,
    DEFAULT_TOP_K,
    Column,
    categorical_column,
    column_from_json,
    need_key,
    numeric_column,
)
from inferwatch_sidecar.stats.columns import (
    ProfileError as ProfileError,  # re-exported: callers catch prof.ProfileError
)

FORMAT = "inferwatch-drift-profile"
VERSION = 1


@dataclass
class Profile:
    """A reference profile: columns by name plus where it came from."""

    columns: dict[str, Column]
    rows: int
    source: str = ""
    created_unix: float = 0.0
    #: the joint (multivariate) drift model of the features (:mod:`.multivariate`), if fitted
    multivariate: JointModel | None = None
    #: the calibration of a labelled reference (:mod:`.performance`), if it had labels
    performance: Performance | None = None

    @property
    def prediction(self) -> Column | None:
        return next((c for c in self.columns.values() if c.role == "prediction"), None)

    @property
    def confidence(self) -> Column | None:
        return next((c for c in self.columns.values() if c.role == "confidence"), None)

    @property
    def features(self) -> list[Column]:
        return [c for c in self.columns.values() if c.role == "feature"]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "created_unix": self.created_unix, "source": self.source,
            "rows": self.rows, "columns": [c.to_json() for c in self.columns.values()],
            "multivariate": self.multivariate.to_json() if self.multivariate is not None else None,
            "performance": self.performance.to_json() if self.performance is not None else None,
        }

    def save(self, path: str) -> None:
        """Write the profile as indented JSON, atomically (temp file + rename)."""
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)


def from_json(doc: Any, source: str = "") -> Profile:
    """Validate a parsed profile document and build a :class:`Profile`."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProfileError(f"not an inferwatch drift profile (expected \"format\": \"{FORMAT}\"); "
                           "build one with `inferwatch reference build DATA -o PROFILE`")
    ver = doc.get("version")
    if ver != VERSION:
        raise ProfileError(f"profile version {ver!r} is not supported (this inferwatch reads version {VERSION}); "
                           "rebuild it with `inferwatch reference build`")
    cols_raw = need_key(doc, "columns", "profile")
    if not isinstance(cols_raw, list) or not cols_raw:
        raise ProfileError("profile: 'columns' must be a non-empty list")
    cols: dict[str, Column] = {}
    for i, d in enumerate(cols_raw):
        c = column_from_json(d, f"columns[{i}]")
        if c.name in cols:
            raise ProfileError(f"profile: column {c.name!r} appears twice")
        cols[c.name] = c
    for role in ("prediction", "confidence"):
        if sum(1 for c in cols.values() if c.role == role) > 1:
            raise ProfileError(f"profile: more than one column has role {role!r}")
    conf = next((c for c in cols.values() if c.role == "confidence"), None)
    if conf is not None and conf.kind != "numeric":
        raise ProfileError(f"column {conf.name!r}: the confidence column must be numeric")
    rows = doc.get("rows", 0)
    joint = None
    if doc.get("multivariate") is not None:
        joint = joint_from_json(doc["multivariate"], [c.name for c in cols.values() if c.role == "feature"])
    perf = None
    if doc.get("performance") is not None:
        perf = Performance.from_json(doc["performance"])
    return Profile(columns=cols, rows=int(rows) if isinstance(rows, (int, float)) else 0,
                   source=source or str(doc.get("source", "")), created_unix=float(doc.get("created_unix", 0) or 0),
                   multivariate=joint, performance=perf)


def load(path: str) -> Profile:
    """Read and validate a profile file.

    Raises:
        ProfileError: unreadable file, invalid JSON or invalid content, with the path in the message.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ProfileError(f"cannot read reference profile {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"reference profile {path} is not valid JSON ({e}); "
                           "rebuild it with `inferwatch reference build`") from None
    try:
        return from_json(doc, source=path)
    except ProfileError as e:
        raise ProfileError(f"reference profile {path}: {e}") from None


def build(numeric: dict[str, np.ndarray], categorical: dict[str, list[Any]], *, prediction: str | None = None,
          confidence: str | None = None, bins: int = DEFAULT_BINS, psi_bins: int = DEFAULT_PSI_BINS,
          top_k: int = DEFAULT_TOP_K, source: str = "", order: list[str] | None = None,
          joint: bool = True) -> Profile:
    """Build a profile from column data.

    Args:
        numeric: numeric columns (NaN = missing).
        categorical: categorical columns (None = missing).
        prediction: name of the prediction column, if any.
        confidence: name of the confidence column, if any (must be numeric).
        bins: percentile bins per numeric column.
        psi_bins: coarse bins for PSI / Jensen-Shannon.
        top_k: categories kept per categorical column.
        source: where the data came from (recorded in the profile).
        order: column order in the profile (default: numeric then categorical).
        joint: also fit the joint (multivariate) drift model of the features (:mod:`.multivariate`).
    """
    names = order or [*numeric, *categorical]
    if confidence is not None and confidence not in numeric:
        raise ProfileError(f"confidence column {confidence!r} must be a numeric column")
    for role_col in (prediction, confidence):
        if role_col is not None and role_col not in numeric and role_col not in categorical:
            raise ProfileError(f"column {role_col!r} not found")
    cols: dict[str, Column] = {}
    rows = 0
    for n in names:
        role = "prediction" if n == prediction else "confidence" if n == confidence else "feature"
        if n in numeric:
            cols[n] = numeric_column(n, numeric[n], role, bins, psi_bins)
            rows = max(rows, len(numeric[n]))
        else:
            cols[n] = categorical_column(n, categorical[n], role, top_k)
            rows = max(rows, len(categorical[n]))
    mv = None
    if joint:
        mv = fit_joint(numeric, categorical, [n for n, c in cols.items() if c.role == "feature"], rows)
    return Profile(columns=cols, rows=rows, source=source, created_unix=time.time(), multivariate=mv)

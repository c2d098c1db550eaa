"""A warm-up reference: a model version's first events, held raw until they become its profile.

Without a configured reference profile, each model version builds its own from
its first ``warmup_events`` records: every numeric and categorical feature
(up to ``max_features``), the prediction (categorical when it takes few
integral values, numeric otherwise) and the confidence. Those raw values are
the only state that grows with traffic, up to ``warmup_events`` rows and
``max_warmup_bytes / max_models`` estimated bytes (64 categorical features of
255 characters are ~20 KB a row: 16 versions x 5,000 such rows would be
1.5 GiB), and they are dropped once the profile is built. A warm-up whose
byte share is spent ends early, with the rows it has.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inferwatch_sidecar.components.drift import profile as prof
from inferwatch_sidecar.components.drift.config import DriftConfig
from inferwatch_sidecar.stats.columns import canon, to_float

#: Column names of the prediction and the confidence in a warm-up profile.
PRED = "__prediction__"
CONF = "__confidence__"
#: Distinct predicted values at most this many (and integral) make a warm-up prediction categorical.
MAX_WARMUP_CLASSES = 32
#: Distinct categorical strings shared per warm-up (the rest are kept as they come, and counted).
_MAX_DISTINCT = 100_000


class Warmup:
    """Raw values of the first ``cfg.warmup_events`` records of the model version ``key``."""

    def __init__(self, key: tuple[str, str], cfg: DriftConfig) -> None:
        self.key = key
        self.cfg = cfg
        #: records taken so far
        self.rows = 0
        self._num: dict[str, list[float]] = {}
        self._cat: dict[str, list[Any]] = {}
        self._pred: list[Any] = []
        self._conf: list[float] = []
        #: estimated bytes of the raw values held, and this version's share of max_warmup_bytes
        self.nbytes = 0
        self.max_bytes = max(1, cfg.max_warmup_bytes // cfg.max_models)
        #: the warm-up ended on its byte share before warmup_events rows
        self.cut = False
        self._strs: dict[str, str] = {}

    @property
    def done(self) -> bool:
        """Whether enough records were taken to build the profile."""
        return self.rows >= self.cfg.warmup_events or self.cut

    def feed(self, recs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Take records until the warm-up is complete; return the ones left over."""
        cfg = self.cfg
        need = cfg.warmup_events - self.rows
        take, rest = recs[:need], recs[need:]
        used = 0
        strs = self._strs
        for r in take:
            if self.nbytes >= self.max_bytes:
                self.cut = True
                break
            used += 1
            n = self.rows
            # Per row: a float slot per numeric column, a pointer and the string per categorical one.
            self.nbytes += 64 + 8 * (len(self._num) + len(self._cat))
            feats = r[7]
            if feats is not None:
                schema, nums, cats = feats
                for name, v in zip(schema.numeric, nums, strict=False):
                    col = self._num.get(name)
                    if col is None:
                        if name in self._cat or len(self._num) + len(self._cat) >= cfg.max_features:
                            continue
                        col = self._num[name] = [math.nan] * n
                    col.append(v)
                for name, v in zip(schema.categorical, cats, strict=False):
                    ccol = self._cat.get(name)
                    if ccol is None:
                        if name in self._num or len(self._num) + len(self._cat) >= cfg.max_features:
                            continue
                        ccol = self._cat[name] = [None] * n
                    if isinstance(v, str):
                        # One object per distinct value: repeated categories cost a pointer, new ones their size.
                        known = strs.get(v)
                        if known is None:
                            if len(strs) < _MAX_DISTINCT:
                                strs[v] = v
                            self.nbytes += 57 + len(v)
                        else:
                            v = known
                    ccol.append(v)
            self._pred.append(r[4])
            self._conf.append(to_float(r[5]))
            self.rows = n + 1
            # Features absent from this record are missing in it.
            for col in self._num.values():
                if len(col) < self.rows:
                    col.append(math.nan)
            for ccol in self._cat.values():
                if len(ccol) < self.rows:
                    ccol.append(None)
        if self.nbytes >= self.max_bytes and self.rows < cfg.warmup_events:
            self.cut = True
        return take[used:] + rest if used < len(take) else rest

    def build(self) -> prof.Profile:
        """The profile of the records taken."""
        cfg = self.cfg
        numeric = {k: np.array(v, dtype=np.float64) for k, v in self._num.items()}
        categorical: dict[str, list[Any]] = dict(self._cat)
        preds = [p for p in self._pred if p is not None]
        pred_name = conf_name = None
        if preds:
            pred_name = PRED
            fl = [p for p in preds if type(p) is float]
            if len(fl) == len(preds) and not (
                all(math.isfinite(x) and x.is_integer() for x in fl) and len(set(fl)) <= MAX_WARMUP_CLASSES
            ):
                numeric[PRED] = np.array([to_float(p) for p in self._pred], dtype=np.float64)
            else:
                categorical[PRED] = [canon(p) for p in self._pred]
        conf = np.array(self._conf, dtype=np.float64)
        if np.isfinite(conf).any():
            conf_name = CONF
            numeric[CONF] = conf
        order = [*self._num, *self._cat, *[n for n in (PRED, CONF) if n in numeric or n in categorical]]
        return prof.build(numeric, categorical, prediction=pred_name, confidence=conf_name, bins=cfg.bins,
                          top_k=cfg.top_k, source=f"warm-up of {self.key[0]}/{self.key[1]}", order=order,
                          joint=cfg.multivariate)

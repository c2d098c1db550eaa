"""Join served rows with offline rows on a key and name the kind of each feature's disagreement.

For every feature present in both tables, the rows joined on the key are compared value by value (floats
within ``atol + rtol * max(|served|, |offline|)``; two missing values agree). The rows that disagree are then
explained, if they can be, by one of these kinds, tried in this order (a later, less specific kind must
explain clearly more rows to win):

``offset``, ``scale``, ``affine``
    served = a x offline + b on the disagreeing rows (normalization parameters, units). ``a`` and ``b`` are
    found by sampling: candidates from random rows (pairs for ``affine``), scored on a subsample, refitted on
    the rows they explain, then counted on every row.
``lag``
    served equals the offline value of the row ``lag`` places earlier (``lag`` > 0) or later (< 0) of the
    same entity in the given order: a window edge (closed-closed in training, closed-open in serving) or a
    join on the wrong timestamp. Needs ``order`` (and ``entity`` for panel data).
``swapped``
    served holds another feature's offline value (``with``), and that feature holds this one's when the two
    were exchanged (``symmetric``).
``mapping``
    a consistent one-to-one relabelling of the offline values (categoricals, and numeric codes with few
    distinct values).
``default_filled``
    served holds one value (``default``) where offline has another.
``missing_in_served``
    served is missing where offline has a value.

A feature whose rows all agree is ``match``; one whose disagreement no kind explains for at least
``min_explained`` of its disagreeing rows is ``mismatch``. ``explained_ratio`` is the share of joined rows
the kind accounts for: the agreeing rows for ``match``, the disagreeing rows it explains otherwise (so
``match_ratio + explained_ratio <= 1``, the rest is unexplained), every disagreeing row for ``mismatch``.

Every feature also gets the distance between its served and offline distributions over the joined rows, as
TFDV measures it: the L-infinity distance of the category frequencies for a categorical, the Jensen-Shannon
divergence (base 2) of a common histogram for a numeric feature. A one-point lag in a smooth feature barely
moves it, which is why the per-row join is needed.

Everything is vectorized (numpy, and pyarrow for the hash join), so a million rows take seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inferwatch_sidecar.components.skew.distance import distance
from inferwatch_sidecar.components.skew.tables import SkewInputError

#: Kinds in order of preference: on a near tie the earlier one wins.
KINDS = ("match", "offset", "scale", "affine", "lag", "swapped", "mapping", "default_filled", "missing_in_served",
         "mismatch")
#: Rows of the disagreement used to generate and score candidate relations.
_SAMPLE = 2000
#: Candidate (a, b) relations tried per family.
_CANDIDATES = 48
#: Numeric features with at most this many distinct offline values are also tried as codes (``mapping``).
_MAX_CODES = 64
#: Examples of unexplained rows in a report.
_EXAMPLES = 5


@dataclass(frozen=True)
class Options:
    """How rows are compared and explained.

    Attributes:
        rtol: relative tolerance of a float comparison.
        atol: absolute tolerance of a float comparison.
        max_lag: lags tried, from ``-max_lag`` to ``max_lag``.
        min_explained: share of a feature's disagreeing rows a kind must explain to be named.
        seed: seed of the candidate sampling (results are reproducible).
    """

    rtol: float = 1e-6
    atol: float = 1e-9
    max_lag: int = 3
    min_explained: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.rtol >= 0 and self.atol >= 0):
            raise SkewInputError("tolerances must be >= 0")
        if not 0 <= self.max_lag <= 100:
            raise SkewInputError("max_lag must be between 0 and 100")
        if not 0 < self.min_explained <= 1:
            raise SkewInputError("min_explained must be in (0, 1]")


def _is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_decimal(t))


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)
                or pa.types.is_string_view(t))


def _is_temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t))


def _as_float(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Float64 values with NaN for nulls (times as their integer count)."""
    if _is_temporal(col.type):
        col = pc.cast(col, pa.int64()) if not pa.types.is_date32(col.type) else pc.cast(col, pa.int32())
    out = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    return np.asarray(out, dtype=np.float64)


def _as_text(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_dictionary(col.type):
        col = pc.cast(col, col.type.value_type)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        col = pc.cast(col, pa.string())
    return pc.cast(col, pa.large_string())


def _py(v: Any) -> Any:
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def _key_column(table: pa.Table, key: str, side: str) -> pa.ChunkedArray:
    if key not in table.column_names:
        cols = ", ".join(table.column_names[:20])
        raise SkewInputError(f"the {side} table has no key column {key!r} (its columns: {cols})")
    col = table.column(key)
    if pa.types.is_floating(col.type):
        raise SkewInputError(f"key column {key!r} is {col.type} in the {side} table: a key must be text or an integer")
    if pa.types.is_dictionary(col.type):
        col = pc.cast(col, col.type.value_type)
    return col


def _check_unique(col: pa.ChunkedArray, key: str, side: str) -> None:
    n_valid = len(col) - col.null_count
    distinct = pc.count_distinct(col, mode="only_valid").as_py()
    if distinct == n_valid:
        return
    counts = pc.value_counts(col.drop_null() if hasattr(col, "drop_null") else pc.drop_null(col))
    vals = counts.field("values").to_pylist()
    cnts = counts.field("counts").to_numpy()
    dup = [vals[i] for i in np.flatnonzero(cnts > 1)[:5]]
    raise SkewInputError(
        f"the {side} table has {n_valid - distinct} duplicate rows of key {key!r} (for example {dup}): the key "
        "must name one row; deduplicate it or join on a column that is unique"
    )


class _Join:
    """The joined rows: which served row goes with which offline row, and each offline row's neighbours."""

    def __init__(self, served: pa.Table, offline: pa.Table, key: str, entity: str | None, order: str | None,
                 max_lag: int) -> None:
        sk, ok = _key_column(served, key, "served"), _key_column(offline, key, "offline")
        if sk.type != ok.type:
            if pa.types.is_integer(sk.type) and pa.types.is_integer(ok.type):
                sk, ok = pc.cast(sk, pa.int64()), pc.cast(ok, pa.int64())
            elif _is_text(sk.type) and _is_text(ok.type):
                sk, ok = pc.cast(sk, pa.large_string()), pc.cast(ok, pa.large_string())
            else:
                raise SkewInputError(
                    f"key column {key!r} is {sk.type} in the served table but {ok.type} in the offline table: "
                    "write both the same way (text or integer)"
                )
        self.null_keys = {"served": sk.null_count, "offline": ok.null_count}
        _check_unique(sk, key, "served")
        _check_unique(ok, key, "offline")
        idx = pc.index_in(sk, value_set=pc.drop_null(ok))
        # index_in indexes the null-free value set: map back to the offline rows.
        off_valid = np.flatnonzero(~np.asarray(pc.is_null(ok).to_numpy(zero_copy_only=False)))
        iv = idx.to_numpy(zero_copy_only=False)
        valid = ~np.asarray(pc.is_null(idx).to_numpy(zero_copy_only=False))
        self.served_rows = np.flatnonzero(valid)
        self.offline_rows = off_valid[np.asarray(iv[valid], dtype=np.int64)]
        self.n = len(self.served_rows)
        self.rows_served, self.rows_offline = served.num_rows, offline.num_rows
        #: lag -> for each joined row, the offline row ``lag`` places before it in its entity (-1: none)
        self.neighbours: dict[int, np.ndarray] = {}
        if order is not None and max_lag > 0:
            self._neighbours(offline, entity, order, max_lag)

    def _neighbours(self, offline: pa.Table, entity: str | None, order: str, max_lag: int) -> None:
        for col, what in ((order, "--order"), (entity, "--entity")):
            if col is not None and col not in offline.column_names:
                raise SkewInputError(f"the offline table has no {what} column {col!r}")
        sort_keys = ([(entity, "ascending")] if entity else []) + [(order, "ascending")]
        perm = pc.sort_indices(offline, sort_keys=sort_keys).to_numpy()
        n = len(perm)
        rank = np.empty(n, dtype=np.int64)
        rank[perm] = np.arange(n)
        if entity is not None:
            ent = offline.column(entity)
            codes = pc.dictionary_encode(_as_text(ent).combine_chunks()).indices.to_numpy(zero_copy_only=False)
            codes = np.where(np.asarray(pc.is_null(ent).to_numpy(zero_copy_only=False)), -1, codes)
            ent_sorted = codes[perm]
        else:
            ent_sorted = np.zeros(n, dtype=np.int64)
        pos = rank[self.offline_rows]
        for lag in range(1, max_lag + 1):
            for sign in (1, -1):
                p = pos - sign * lag
                ok = (p >= 0) & (p < n)
                pc_ = np.clip(p, 0, n - 1)
                ok &= ent_sorted[pc_] == ent_sorted[pos]
                ok &= ent_sorted[pos] >= 0
                self.neighbours[sign * lag] = np.where(ok, perm[pc_], -1)


class _Feature:
    """One feature's joined values: float64 with NaN, or integer codes of a shared dictionary with -1."""

    __slots__ = ("name", "kind", "s", "o", "o_all", "labels", "served_type", "offline_type")

    def __init__(self, name: str, kind: str, s: np.ndarray, o: np.ndarray, o_all: np.ndarray,
                 labels: list[Any] | None, served_type: str, offline_type: str) -> None:
        self.name, self.kind = name, kind
        self.s, self.o, self.o_all = s, o, o_all
        self.labels = labels
        self.served_type, self.offline_type = served_type, offline_type


def _features(served: pa.Table, offline: pa.Table, join: _Join, skip: set[str],
              only: list[str] | None) -> tuple[list[_Feature], dict[str, Any]]:
    names = [c for c in served.column_names if c in offline.column_names and c not in skip]
    if only is not None:
        missing = [c for c in only if c not in names]
        if missing:
            raise SkewInputError(f"features not in both tables: {missing}")
        names = [c for c in names if c in only]
    notes: dict[str, Any] = {
        "only_in_served": [c for c in served.column_names if c not in offline.column_names and c not in skip],
        "only_in_offline": [c for c in offline.column_names if c not in served.column_names and c not in skip],
        "not_compared": {},
    }
    sr = pa.array(join.served_rows)
    numeric: list[_Feature] = []
    text_cols: list[tuple[str, pa.ChunkedArray, pa.ChunkedArray, str, str]] = []
    for name in names:
        scol, ocol = served.column(name), offline.column(name)
        st, ot = scol.type, ocol.type
        num_s, num_o = _is_numeric(st) or _is_temporal(st), _is_numeric(ot) or _is_temporal(ot)
        if num_s and num_o:
            o_all = _as_float(ocol)
            numeric.append(_Feature(name, "numeric", _as_float(scol.take(sr)), o_all[join.offline_rows], o_all,
                                    None, str(st), str(ot)))
        elif (num_s or _is_text(st)) and (num_o or _is_text(ot)):
            # Text on at least one side: both compared as text (a number written as "3" in one and 3 in the
            # other still agrees; the differing types are reported).
            text_cols.append((name, _as_text(scol), _as_text(ocol), str(st), str(ot)))
        else:
            notes["not_compared"][name] = f"unsupported types: served {st}, offline {ot}"
    cats: list[_Feature] = []
    if text_cols:
        # One dictionary over every text column of both sides, so codes compare across features (swapped).
        parts = [c[1].take(sr) for c in text_cols] + [c[2] for c in text_cols]
        merged = pa.chunked_array([ch for p in parts for ch in p.chunks], type=pa.large_string())
        enc = pc.dictionary_encode(merged.combine_chunks())
        codes = np.asarray(pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        labels = enc.dictionary.to_pylist()
        n, m = join.n, join.rows_offline
        k = len(text_cols)
        for i, (name, _s, _o, st, ot) in enumerate(text_cols):
            s = codes[i * n:(i + 1) * n]
            o_all = codes[k * n + i * m:k * n + (i + 1) * m]
            cats.append(_Feature(name, "categorical", s, o_all[join.offline_rows], o_all, labels, st, ot))
    return numeric + cats, notes


# -- comparison ----------------------------------------------------------------------------------------------------


def _close(x: np.ndarray, y: np.ndarray, opt: Options) -> np.ndarray:
    """Elementwise agreement of two float arrays (two NaNs agree)."""
    with np.errstate(invalid="ignore", over="ignore"):
        tol = opt.atol + opt.rtol * np.maximum(np.abs(x), np.abs(y))
        eq = np.abs(x - y) <= tol
    return eq | (np.isnan(x) & np.isnan(y))


def _agree(f: _Feature, s: np.ndarray, o: np.ndarray, opt: Options) -> np.ndarray:
    if f.kind == "numeric":
        return _close(s, o, opt)
    return s == o


class _Candidates:
    """The best explanation found so far; a later kind must beat it by ``margin`` rows."""

    def __init__(self, margin: int) -> None:
        self.margin = margin
        self.best: tuple[str, int, dict[str, Any]] | None = None

    def offer(self, kind: str, count: int, detail: dict[str, Any]) -> None:
        if count <= 0:
            return
        if self.best is None or count > self.best[1] + self.margin:
            self.best = (kind, count, detail)


def _affine_candidates(s: np.ndarray, o: np.ndarray, rng: np.random.Generator) -> dict[str, list[tuple[float, float]]]:
    n = len(s)
    i = rng.integers(0, n, _CANDIDATES)
    j = rng.integers(0, n, _CANDIDATES)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = o[i] - o[j]
        a_aff = (s[i] - s[j]) / d
        b_aff = s[i] - a_aff * o[i]
        a_sc = s[i] / o[i]
    offs = [(1.0, float(b)) for b in np.append(s[i] - o[i], np.median(s - o))]
    scales = [(float(a), 0.0) for a in np.append(a_sc, np.median(s[o != 0] / o[o != 0]) if np.any(o != 0) else 1.0)]
    affs = [(float(a), float(b)) for a, b, dd in zip(a_aff, b_aff, d, strict=True) if dd != 0]
    return {"offset": offs, "scale": scales, "affine": affs}


def _fit_affine(kind: str, cands: list[tuple[float, float]], s: np.ndarray, o: np.ndarray, opt: Options,
                ) -> tuple[float, float] | None:
    """The (a, b) of ``kind`` explaining most of the sample, refitted on the rows it explains."""
    best, best_n = None, 0
    for a, b in cands:
        if not (math.isfinite(a) and math.isfinite(b)) or abs(a) < 1e-12:
            continue
        k = int(np.count_nonzero(_close(s, a * o + b, opt)))
        if k > best_n:
            best, best_n = (a, b), k
    if best is None or best_n < 2:
        return None
    a, b = best
    inl = _close(s, a * o + b, opt)
    si, oi = s[inl], o[inl]
    if kind == "offset":
        b = float(np.median(si - oi))
    elif kind == "scale":
        nz = oi != 0
        a = float(np.median(si[nz] / oi[nz])) if np.any(nz) else a
    else:
        om, sm = oi.mean(), si.mean()
        var = float(np.dot(oi - om, oi - om))
        if var > 0:
            a = float(np.dot(oi - om, si - sm) / var)
            b = float(sm - a * om)
    if abs(a) < 1e-12:
        return None
    return a, b


def _mapping(f: _Feature, mis: np.ndarray, present: np.ndarray) -> tuple[int, dict[Any, Any]] | None:
    """A one-to-one relabelling of the offline values that explains disagreeing rows, and how many."""
    both = present
    if not np.any(both & mis):
        return None
    if f.kind == "numeric":
        ov, oc = np.unique(f.o[both], return_inverse=True)
        if len(ov) > _MAX_CODES:
            return None
        sv, scode = np.unique(f.s[both], return_inverse=True)
        labels_o: list[Any] = [_py(v) for v in ov]
        labels_s: list[Any] = [_py(v) for v in sv]
    else:
        ov, oc = np.unique(f.o[both], return_inverse=True)
        sv, scode = np.unique(f.s[both], return_inverse=True)
        assert f.labels is not None
        labels_o = [f.labels[int(v)] for v in ov]
        labels_s = [f.labels[int(v)] for v in sv]
    ko, ks = len(ov), len(sv)
    if ks > ko:  # more served values than offline ones: not a relabelling
        return None
    # The most frequent served value of each offline value, from the distinct (offline, served) pairs: memory
    # in the pairs seen, not ko x ks (a text column can have a million distinct values).
    pairs, counts = np.unique(oc.astype(np.int64) * ks + scode, return_counts=True)
    po, ps = pairs // ks, pairs % ks
    order = np.lexsort((-counts, po))
    first = order[np.r_[True, po[order][1:] != po[order][:-1]]]
    target = np.empty(ko, dtype=np.int64)
    target[po[first]] = ps[first]
    if len(np.unique(target)) != ko:  # not one-to-one: a many-to-one fill is default_filled, not a relabelling
        return None
    changed = {labels_o[i]: labels_s[t] for i, t in enumerate(target) if labels_o[i] != labels_s[t]}
    if not changed:
        return None
    mapped = target[oc] == scode
    count = int(np.count_nonzero(mapped & mis[both]))
    return count, dict(list(changed.items())[:20])


def _varied(s: np.ndarray, hit: np.ndarray) -> bool:
    """Whether the served values of the ``hit`` rows take more than one value.

    A lag or a swap that explains only rows holding one served value is a fill that happens to meet the
    neighbour's or the other feature's value (a default of 0 where the other feature is often 0).
    """
    v = s[hit]
    return bool(len(v) >= 2 and np.any(v != v[0]))


def _mode(x: np.ndarray) -> Any:
    vals, counts = np.unique(x, return_counts=True)
    return vals[int(np.argmax(counts))] if len(vals) else None


def _value(f: _Feature, v: Any) -> Any:
    if f.kind == "numeric":
        return _py(v)
    assert f.labels is not None
    return None if v < 0 else f.labels[int(v)]


def _diagnose_feature(f: _Feature, others: list[_Feature], join: _Join, keys: pa.ChunkedArray, opt: Options,
                      ) -> dict[str, Any]:
    n = join.n
    s, o = f.s, f.o
    agree = _agree(f, s, o, opt)
    n_match = int(np.count_nonzero(agree))
    detail: dict[str, Any] = {"type": f.kind, "distance": distance(f.kind, f.s, f.o)}
    if f.served_type != f.offline_type:
        detail["types"] = {"served": f.served_type, "offline": f.offline_type}
    if n_match == n:
        return {"match_ratio": 1.0, "kind": "match", "explained_ratio": 1.0, "detail": detail}
    mis = ~agree
    n_mis = n - n_match
    missing_s = np.isnan(s) if f.kind == "numeric" else s < 0
    missing_o = np.isnan(o) if f.kind == "numeric" else o < 0
    present = ~missing_s & ~missing_o
    rng = np.random.default_rng(opt.seed)
    cand = _Candidates(margin=max(1, int(0.002 * n_mis)))
    # The candidates are offered in this order, and the random draws happen in it: results stay deterministic.
    _offer_affine(cand, f, mis, present, rng, opt)
    sample_all = np.flatnonzero(mis)
    if len(sample_all) > _SAMPLE:
        sample_all = rng.choice(sample_all, _SAMPLE, replace=False)
    _offer_lag(cand, f, mis, join, sample_all, opt)
    _offer_swap(cand, f, others, mis, missing_s, missing_o, sample_all, opt)
    mp = _mapping(f, mis, present)
    if mp is not None:
        cand.offer("mapping", mp[0], {"mapping": {str(k): v for k, v in mp[1].items()}})
    filled = mis & ~missing_s & ~missing_o
    if np.any(filled):
        d = _mode(s[filled])
        count = int(np.count_nonzero(filled & (_agree(f, s, np.full_like(s, d), opt))))
        if count >= 2 or n_mis == 1:
            cand.offer("default_filled", count, {"default": _value(f, d)})
    cand.offer("missing_in_served", int(np.count_nonzero(mis & missing_s & ~missing_o)), {})
    kind, explained = _verdict(cand, detail, n, n_mis, opt)
    ex = np.flatnonzero(mis)[:_EXAMPLES]
    detail["examples"] = [
        {"key": keys[int(join.served_rows[i])].as_py(), "served": _value(f, s[i]), "offline": _value(f, o[i])}
        for i in ex
    ]
    return {"match_ratio": n_match / n, "kind": kind, "explained_ratio": explained / n, "detail": detail}


def _offer_affine(cand: _Candidates, f: _Feature, mis: np.ndarray, present: np.ndarray, rng: np.random.Generator,
                  opt: Options) -> None:
    """Offset, scale and affine relations fitted on a sample of the rows where both values are present."""
    s, o = f.s, f.o
    # Rows whose disagreement a relation between two present values could explain, and a sample of them.
    rel = np.flatnonzero(mis & present)
    sample = rel if len(rel) <= _SAMPLE else rng.choice(rel, _SAMPLE, replace=False)
    if f.kind != "numeric" or len(sample) < 2:
        return
    ss, so = s[sample], o[sample]
    families = _affine_candidates(ss, so, rng)
    for kind in ("offset", "scale", "affine"):
        fit = _fit_affine(kind, families[kind], ss, so, opt)
        if fit is None:
            continue
        a, b = fit
        count = int(np.count_nonzero(mis & _close(s, a * o + b, opt)))
        d = {"offset": {"offset": b}, "scale": {"scale": a}, "affine": {"scale": a, "offset": b}}[kind]
        cand.offer(kind, count, d)


def _offer_lag(cand: _Candidates, f: _Feature, mis: np.ndarray, join: _Join, sample_all: np.ndarray,
               opt: Options) -> None:
    """The served value is the offline value of a neighbouring row of the series (the best lag on the sample)."""
    if not join.neighbours:
        return
    s = f.s
    best_lag, best_k = 0, 0
    for lag, nb in join.neighbours.items():
        nbs = nb[sample_all]
        k = int(np.count_nonzero((nbs >= 0) & _agree(f, s[sample_all], f.o_all[np.maximum(nbs, 0)], opt)))
        if k > best_k:
            best_lag, best_k = lag, k
    if best_k:
        nb = join.neighbours[best_lag]
        hit = mis & (nb >= 0) & _agree(f, s, f.o_all[np.maximum(nb, 0)], opt)
        if _varied(s, hit):
            cand.offer("lag", int(np.count_nonzero(hit)), {"lag": best_lag})


def _offer_swap(cand: _Candidates, f: _Feature, others: list[_Feature], mis: np.ndarray, missing_s: np.ndarray,
                missing_o: np.ndarray, sample_all: np.ndarray, opt: Options) -> None:
    """The served value is another feature's offline value (the best one on the sample), swapped both ways or not."""
    s, o = f.s, f.o
    best_g, best_k = None, 0
    for g in others:
        if g is f or g.kind != f.kind:
            continue
        k = int(np.count_nonzero(_agree(f, s[sample_all], g.o[sample_all], opt) & ~missing_s[sample_all]))
        if k > best_k:
            best_g, best_k = g, k
    if best_g is not None:
        hit = mis & ~missing_s & _agree(f, s, best_g.o, opt)
        back = _agree(f, best_g.s, o, opt) & ~missing_o
        symmetric = bool(np.count_nonzero(back) >= 0.5 * max(1, int(np.count_nonzero(~missing_o))))
        if _varied(s, hit):
            cand.offer("swapped", int(np.count_nonzero(hit)), {"with": best_g.name, "symmetric": symmetric})


def _verdict(cand: _Candidates, detail: dict[str, Any], n: int, n_mis: int, opt: Options) -> tuple[str, int]:
    """The kind named (the best candidate when it explains enough, else ``mismatch``) and the rows it explains."""
    best = cand.best
    if best is None or best[1] < opt.min_explained * n_mis:
        kind, explained = "mismatch", n_mis
        if best is not None:
            detail["closest"] = {"kind": best[0], "explained_ratio": best[1] / n, **best[2]}
    else:
        kind, count, extra = best
        explained = count
        detail.update(extra)
    detail["unexplained_ratio"] = (n_mis - (explained if kind != "mismatch" else 0)) / n
    return kind, explained


def diagnose(served: pa.Table, offline: pa.Table, key: str, *, entity: str | None = None, order: str | None = None,
             features: list[str] | None = None, options: Options | None = None) -> dict[str, Any]:
    """Join ``served`` with ``offline`` on ``key`` and report every shared feature (see the module docstring).

    Args:
        served: the values the model was served, one row per request.
        offline: the values the training pipeline computes for the same requests.
        key: the column both tables identify a request by (unique on each side; rows without one are counted).
        entity: the offline column that names a series (panel data), for ``lag``.
        order: the offline column that orders a series (a time), for ``lag``.
        features: compare only these (default: every column in both tables but the key, entity and order).
        options: tolerances and search settings.

    Returns:
        ``{"rows_joined": N, "features": {name: {"match_ratio", "kind", "explained_ratio", "detail"}}, ...}``.

    Raises:
        SkewInputError: a missing key column, duplicate keys, key types that differ, or no joined row.
    """
    opt = options or Options()
    if entity is not None and order is None:
        raise SkewInputError("--entity needs --order: the lag is counted in rows of the entity in that order")
    join = _Join(served, offline, key, entity, order, opt.max_lag)
    if join.n == 0:
        raise SkewInputError(
            f"no served row has its key {key!r} in the offline table ({join.rows_served} served, "
            f"{join.rows_offline} offline rows): are they keyed the same way?"
        )
    skip = {key} | {c for c in (entity, order) if c is not None}
    feats, notes = _features(served, offline, join, skip, features)
    keys = _key_column(served, key, "served")
    out: dict[str, Any] = {}
    for f in feats:
        out[f.name] = _diagnose_feature(f, feats, join, keys, opt)
    return {
        "rows_joined": join.n,
        "features": out,
        "rows_served": join.rows_served,
        "rows_offline": join.rows_offline,
        "rows_without_key": join.null_keys,
        **notes,
    }


def skewed(report: dict[str, Any], min_match_ratio: float) -> list[str]:
    """Features whose match ratio is below ``min_match_ratio``."""
    return [n for n, f in report["features"].items() if f["match_ratio"] < min_match_ratio]

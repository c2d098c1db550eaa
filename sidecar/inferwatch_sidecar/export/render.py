"""``/metrics`` bodies built family by family, with the families of component snapshots rendered once.

Under the hostile mix of issue 28 a scrape of about 40,000 samples spent seconds building and
formatting families, most of them the drift component's (versions x features x bins), whose
numbers change only once per evaluation. Every component that evaluates on its own thread
exports through :func:`~inferwatch_sidecar.metrics.families.from_snapshot`, whose families carry
a ``snapshot_key`` and build their samples only when asked; :class:`FamilyRenderer` keeps the
bytes of such a family, per format, for as long as the component keeps the same snapshot, and
renders every other family (the aggregator's counters and histograms, which change with each
event) afresh. The bytes are those of prometheus_client's own encoders (and of
metrics/protobuf.py), one family at a time, so a body is byte for byte what rendering the whole
registry at once gives; tests/export/test_render_cache.py holds that.

Memory: one entry per family name (its latest snapshot key), the bytes of the formats asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, cast

from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString as _untyped_float_to_go
from prometheus_client.validation import _is_valid_legacy_labelname, _is_valid_legacy_metric_name

from inferwatch_sidecar.metrics import protobuf

_EOF = b"# EOF\n"

#: prometheus_client's value formatting (untyped there).
floatToGoString = cast(Callable[[float], str], _untyped_float_to_go)


class _One:
    """A collector of one family (what the whole-registry encoders take)."""

    __slots__ = ("fam",)

    def __init__(self, fam: Metric) -> None:
        self.fam = fam

    def collect(self) -> list[Metric]:
        return [self.fam]


Encoder = Callable[[Metric], bytes]

_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_TEXT_TYPES = {"counter": ("_total", "counter"), "gauge": ("", "gauge"), "histogram": ("", "histogram"),
               "info": ("_info", "gauge"), "unknown": ("", "untyped"), "summary": ("", "summary")}


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def text_family(fam: Metric) -> bytes:
    """One family in the text format 0.0.4, byte for byte what ``generate_latest`` writes for it, several times faster.

    prometheus_client's encoder validates and escapes every label name of every sample (a
    histogram's labels 33 times over); this one once per label name and per value. A family it
    does not cover the same way (timestamps, OpenMetrics-only samples, names needing escapes) goes
    to ``generate_latest``.
    """
    munge = _TEXT_TYPES.get(fam.type)
    mname = fam.name + munge[0] if munge else ""
    if munge is None or not _is_valid_legacy_metric_name(mname):
        return generate_latest(_One(fam))
    doc = fam.documentation.replace("\\", r"\\").replace("\n", r"\n")
    out = [f"# HELP {mname} {doc}\n# TYPE {mname} {munge[1]}\n"]
    names_ok: dict[str, bool] = {}
    label_ok: dict[str, bool] = {}
    values: dict[str, str] = {}
    for smp in fam.samples:
        name = smp.name
        ok = names_ok.get(name)
        if ok is None:
            ok = names_ok[name] = _is_valid_legacy_metric_name(name) and not any(
                name == fam.name + x for x in _OM_SUFFIXES)
        if not ok or smp.timestamp is not None:
            return generate_latest(_One(fam))
        labels = smp.labels
        if labels:
            parts = []
            for k in sorted(labels):
                good = label_ok.get(k)
                if good is None:
                    good = label_ok[k] = _is_valid_legacy_labelname(k)
                if not good:
                    return generate_latest(_One(fam))
                v = labels[k]
                e = values.get(v)
                if e is None:
                    e = values[v] = _escape_value(v)
                parts.append(f'{k}="{e}"')
            out.append(f"{name}{{{','.join(parts)}}} {floatToGoString(smp.value)}\n")
        else:
            out.append(f"{name} {floatToGoString(smp.value)}\n")
    return "".join(out).encode("utf-8")


def negotiate(accept: str, allow_protobuf: bool = True) -> tuple[str, Encoder]:
    """(content type, one-family encoder) for an ``Accept`` header, as :func:`~.routes.scrape_registry` chooses.

    The encoder of OpenMetrics leaves out the closing ``# EOF``, which :meth:`FamilyRenderer.body` adds.
    """
    if allow_protobuf and protobuf.wants_protobuf(accept):
        return protobuf.CONTENT_TYPE, lambda fam: protobuf.encode_families([fam], protobuf.SHARED_LABELS)
    whole, ctype = choose_encoder(accept)
    if ctype.startswith("application/openmetrics-text"):
        def one(fam: Metric) -> bytes:
            out = whole(_One(fam))
            return out[: -len(_EOF)] if out.endswith(_EOF) else out

        return ctype, one
    if whole is generate_latest:
        return ctype, text_family
    return ctype, lambda fam: whole(_One(fam))


class FamilyRenderer:
    """Renders families to exposition bytes, keeping those of snapshot families (module docstring)."""

    def __init__(self) -> None:
        #: family name -> (snapshot key, the snapshot values it pins, {format: bytes})
        self._cache: dict[str, tuple[Any, Any, dict[str, bytes]]] = {}
        self._lock = threading.Lock()
        #: Families rendered from the cache, and rendered afresh, since start (for tests and bench/).
        self.hits = 0
        self.misses = 0
        #: family name -> times a snapshot family of that name was rendered afresh
        self.rendered: dict[str, int] = {}

    def family(self, fam: Metric, fmt: str, encode: Encoder) -> bytes:
        """``fam`` by ``encode``, the encoder of content type ``fmt`` (:func:`negotiate`)."""
        key = getattr(fam, "snapshot_key", None)
        if key is None:
            return encode(fam)
        with self._lock:
            entry = self._cache.get(fam.name)
            if entry is not None and entry[0] == key:
                out = entry[2].get(fmt)
                if out is not None:
                    self.hits += 1
                    return out
        out = encode(fam)
        with self._lock:
            self.misses += 1
            self.rendered[fam.name] = self.rendered.get(fam.name, 0) + 1
            entry = self._cache.get(fam.name)
            if entry is None or entry[0] != key:
                entry = self._cache[fam.name] = (key, getattr(fam, "snapshot_values", None), {})
            entry[2][fmt] = out
        return out

    def body(self, fams: Iterable[Metric], accept: str, allow_protobuf: bool = True) -> tuple[bytes, str]:
        """The whole exposition of ``fams`` in the format ``accept`` asks for, and its content type."""
        ctype, encode = negotiate(accept, allow_protobuf)
        parts = [self.family(f, ctype, encode) for f in fams]
        if ctype.startswith("application/openmetrics-text"):
            parts.append(_EOF)
        return b"".join(parts), ctype

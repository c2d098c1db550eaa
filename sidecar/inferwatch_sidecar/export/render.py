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
registry at once gives; tests/sidecar/test_render_cache.py holds that.

Memory: one entry per family name (its latest snapshot key), the bytes of the formats asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from inferwatch_sidecar.metrics import protobuf

_EOF = b"# EOF\n"


class _One:
    """A collector of one family (what the whole-registry encoders take)."""

    __slots__ = ("fam",)

    def __init__(self, fam: Metric) -> None:
        self.fam = fam

    def collect(self) -> list[Metric]:
        return [self.fam]


Encoder = Callable[[Metric], bytes]


def negotiate(accept: str, allow_protobuf: bool = True) -> tuple[str, Encoder]:
    """(content type, one-family encoder) for an ``Accept`` header, as :func:`~.routes.scrape_registry` chooses.

    The encoder of OpenMetrics leaves out the closing ``# EOF``, which :meth:`FamilyRenderer.body` adds.
    """
    if allow_protobuf and protobuf.wants_protobuf(accept):
        return protobuf.CONTENT_TYPE, lambda fam: protobuf.encode_families([fam], protobuf.SHARED_LABELS)
    whole, ctype = choose_encoder(accept)
    if ctype.startswith("application/openmetrics-text"):
        def one(fam: Metric) -> bytes:
            out = whole(_One(fam))  # type: ignore[arg-type]
            return out[: -len(_EOF)] if out.endswith(_EOF) else out

        return ctype, one
    return ctype, lambda fam: whole(_One(fam))  # type: ignore[arg-type]


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

"""Which loop reads a frame's records: the compiled one (``_wirec.c``) when it was built, else the SDK's.

The compiled loop gives the generated Python loop's records and error reasons (it hands that loop every
record it does not read itself), at a fraction of the cost per event (bench/ingest.py). It is built by
``pip install`` where a C compiler is found (``setup.py``: an optional extension); without one the sidecar
runs the pure-Python loop and ``/v1/status`` says so (``ingest.wire_decoder``). ``INFERWATCH_WIRE_DECODER=python``
chooses the pure-Python loop even where the compiled one exists.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from inferwatch.wire.decoder import generated_loop

log = logging.getLogger("inferwatch.sidecar")

#: The environment variable that picks the loop: "auto" (the default: compiled when built) or "python".
ENV = "INFERWATCH_WIRE_DECODER"


def compiled() -> Any | None:
    """The compiled loop, configured with the generated one for the records it leaves; None when not built."""
    try:
        from inferwatch_sidecar.ingest import _wirec  # type: ignore[attr-defined]
    except ImportError:
        return None
    _wirec.configure(generated_loop())
    return _wirec.records


def choose() -> tuple[Any | None, str]:
    """The loop a sidecar's decoder runs (None: the SDK's generated one) and its name for ``/v1/status``.

    Raises:
        ValueError: ``INFERWATCH_WIRE_DECODER`` is neither "auto" nor "python".
    """
    want = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", "python"):
        raise ValueError(f"{ENV}={want!r}: use 'auto' (the compiled loop when it was built) or 'python'")
    if want == "python":
        return None, "python"
    loop = compiled()
    if loop is None:
        log.info("wire decoder: the compiled loop was not built (no C compiler at install?); decoding in Python")
        return None, "python (the compiled loop was not built)"
    return loop, "compiled"

"""The one code generator of the wire package: fast paths unrolled from the field table.

The general encoder and decoder (``encoder.py``, ``decoder.py``) walk
:data:`~inferwatch.wire.spec.RECORD_TYPES` field by field: they are the
reference. The fast paths are the same walk unrolled into Python source, as
``collections.namedtuple`` does, because straight-line code with one
``struct`` call per record is several times faster than a loop over fields.
Nothing here has a field order of its own: every layout comes from the table,
through :func:`_flat` (the encoders' ``struct`` items) and :func:`_decode_body`
(the decoders' reads). A generated function returns None, or raises, for
anything but the common case, and its caller then runs the general path, so
generated code never decides an outcome alone; the tests check that both
paths write and read the same bytes.

What is generated:

- :func:`encoder` (record type, stage count): packs one event with one
  ``Struct`` per shape (the lengths of its request ID, trace ID and features,
  and the tags of its values).
- :func:`runner` (stage count): packs a run of REQUESTs shaped like a template
  (same context object and stage names, no error type), one ``pack`` each,
  with the parts that stay the same within the run packed once beforehand.
- :func:`decoder`: the loop over a frame's records, with every record type's
  reads inlined; :func:`plain_stages` (stage count) builds the stage tuples
  of a request whose stages are plain.

The shared half (the flattened field table, compiling) is ``_codegen_common``, the encoders
``_codegen_encode`` and the decoder ``_codegen_decode``; the names the codecs use are importable here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferwatch.wire._codegen_common import MAX_FAST_STAGES, TooLarge, has_fast_encoder
from inferwatch.wire._codegen_encode import _ENCODERS, encoder, run_shape, run_template, runner

if TYPE_CHECKING:
    from inferwatch.wire._codegen_decode import ctx_of, decoder, plain_stages

__all__ = [
    "MAX_FAST_STAGES", "TooLarge", "_ENCODERS", "ctx_of", "decoder", "encoder", "has_fast_encoder", "plain_stages",
    "run_shape", "run_template", "runner",
]

#: The decoder's half loads on first use: a model server's sender imports this module for the encoders only.
_DECODE = frozenset({"ctx_of", "decoder", "plain_stages"})


def __getattr__(name: str) -> Any:
    if name not in _DECODE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from inferwatch.wire import _codegen_decode

    value = getattr(_codegen_decode, name)
    globals()[name] = value
    return value

"""What the generated encoders and decoders share: the flattened field table, compiling, limits.

See ``_codegen`` for what is generated and why.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from inferwatch.wire.spec import (
    BOOL,
    CONF,
    CTX,
    DEVICE,
    FEATURES,
    I64,
    N_STAGES,
    OUTCOME,
    RECORD_HEADER,
    RID,
    SCHEMA_ID,
    STAGE,
    STAGE_FIELDS,
    STAGES,
    STR,
    TRACE,
    U32,
    U64,
    VALUE,
    Field,
    Kind,
    RecordType,
)

#: Kinds packed as the event holds them, with the range ``struct`` accepts: it rejects every value
#: the general path would convert or clamp.
_RAW: dict[Kind, tuple[int, int]] = {
    I64: (-(2**63), 2**63 - 1),
    U64: (0, 2**64 - 1),
    U32: (0, 2**32 - 1),
    OUTCOME: (0, 255),
    DEVICE: (0, 255),
}
#: A *value*'s payload code by tag: none (no bytes), ``f64``, ``str`` ref.
_VALUE_CODES = ("0s", "d", "H")
#: Kinds whose bytes start with a ``u8`` (a length or a tag), which the fixed run before them reads too.
_LEAD_BYTE = (RID, TRACE, VALUE)
#: Bound of each cache of Structs.
_CACHE_MAX = 4096
#: Most stages a generated REQUEST encoder unrolls; longer requests take the general path.
MAX_FAST_STAGES = 32

_F64 = struct.Struct("<d")
_CTX = struct.Struct("<" + CTX.code)
_NAN = float("nan")


class TooLarge(Exception):
    """An event does not fit a frame (string table or record length limit)."""


def _compile(name: str, lines: list[str], env: dict[str, Any]) -> Any:
    """Compile generated source and return the function ``name`` it defines."""
    ns = dict(env)
    # Only field names from the table, ints and our own helpers' names go into the source.
    exec(compile("\n".join(lines) + "\n", f"<inferwatch.wire {name}>", "exec"), ns)
    return ns[name]


def _var(f: Field) -> str:
    return "v_" + f.name


def _stage_vars(i: int) -> tuple[str, str, str]:
    return f"s{i}_name", f"s{i}_dur", f"s{i}_stream"


class _Item:
    """One ``struct`` item of a flattened record.

    A plain class, not a NamedTuple: those cost more to create than the rest of
    this module, and it is imported with the SDK.

    Attributes:
        code: its ``struct`` code, or ``*s`` (bytes whose length is known per event) or ``*v``
            (a value's payload, whose code its tag gives).
        expr: the source expression of its value.
        const: whether it stays the same within a run of look-alike requests.
        digit: for ``*s`` and ``*v``, the expression of its length or tag: a digit of the shape key.
    """

    __slots__ = ("code", "expr", "const", "digit")

    def __init__(self, code: str, expr: str, const: bool, digit: str = "") -> None:
        self.code = code
        self.expr = expr
        self.const = const
        self.digit = digit


def _flat(rt: RecordType, n: int, upto: Kind | None = None) -> list[_Item]:
    """The record header and ``rt``'s fields as ``struct`` items, with ``n`` plain stages.

    With ``upto``, only the fields before the first of that kind.

    Raises:
        TypeError: ``rt`` has a field that only the general encoder writes (drop counts).
    """
    items = [_Item("B", str(rt.code), True), _Item("H", "plen", True)]
    for f in rt.fields:
        k, v = f.kind, _var(f)
        if k is upto:
            break
        if k is CTX:
            items += [_Item("H", f"{v}{j}", True) for j in range(3)]
        elif k is STR:
            items.append(_Item("H", f"{v}_r", True))  # a run requires None: its ref stays NONE_REF
        elif k in _RAW:
            items.append(_Item(k.code, v, False))
        elif k is BOOL:
            items.append(_Item("B", f"(1 if {v} else 0)", False))
        elif k is N_STAGES:
            items.append(_Item("B", str(n), True))
        elif k is SCHEMA_ID or k is CONF:
            items.append(_Item(k.code, v, False))
        elif k is RID or k is TRACE:
            items += [_Item("B", f"{v}_n", True), _Item("*s", f"{v}_b", False, f"{v}_n")]
        elif k is VALUE:
            items += [_Item("B", f"{v}_t", False), _Item("*v", f"{v}_p", False, f"{v}_t")]
        elif k is FEATURES:
            items.append(_Item("*s", f"{v}_b", False, f"{v}_n"))
        elif k is STAGES or k is STAGE:
            for i in range(n if k is STAGES else 1):
                name, dur, _ = _stage_vars(i)
                for sf in STAGE_FIELDS:
                    if sf.kind is STR:
                        items.append(_Item("H", f"{name}_r", True))
                    elif sf.kind is U64:
                        items.append(_Item("Q", dur, False))
                    else:  # the flags of a plain stage
                        items.append(_Item(sf.kind.code, "0", True))
        else:
            raise TypeError(f"{rt.name}.{f.name}: a {k.name} field has no fast encoder")
    return items


def has_fast_encoder(rt: RecordType) -> bool:
    """Whether :func:`encoder` makes a fast encoder for ``rt`` (every type but DROPS and SCHEMA)."""
    try:
        _flat(rt, 0)
    except TypeError:
        return False
    return bool(rt.event)


def _key(items: list[_Item]) -> str:
    """Source of the shape key: the variable items' digits, 16 bits each."""
    digits = [i.digit for i in items if i.digit]
    return " | ".join(f"{d} << {16 * j}" if j else d for j, d in enumerate(digits)) or "0"


def _digits(items: list[_Item], key: int) -> list[int]:
    return [(key >> (16 * j)) & 0xFFFF for j in range(sum(1 for i in items if i.digit))]


def _fmt(items: list[_Item], digits: list[int]) -> str:
    it = iter(digits)
    out = []
    for i in items:
        if i.code == "*s":
            out.append(f"{next(it)}s")
        elif i.code == "*v":
            out.append(_VALUE_CODES[next(it)])
        else:
            out.append(i.code)
    return "".join(out)


class _Shapes:
    """The packers of one flattened record, per shape key; bounded."""

    def __init__(self, items: list[_Item]) -> None:
        self.items = items
        self.cache: dict[int, tuple[Callable[..., bytes], int]] = {}

    def __call__(self, key: int) -> tuple[Callable[..., bytes], int]:
        st = struct.Struct("<" + _fmt(self.items, _digits(self.items, key)))
        got = (st.pack, st.size - RECORD_HEADER.size)
        if len(self.cache) >= _CACHE_MAX:
            self.cache.clear()
        self.cache[key] = got
        return got

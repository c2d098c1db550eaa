"""The generated decoder (:func:`decoder`) and plain-stage builders (:func:`plain_stages`).

See ``_codegen``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from inferwatch.wire._codegen_common import (
    _CTX,
    _F64,
    _LEAD_BYTE,
    _compile,
    _var,
)
from inferwatch.wire.spec import (
    BOOL,
    CONF,
    CTX,
    EV_SCHEMA,
    FEATURES,
    N_STAGES,
    NONE_REF,
    OUTCOME,
    OUTCOME_MAX,
    RECORD_HEADER,
    RECORD_TYPES,
    RID,
    SCHEMA_ID,
    STAGE,
    STAGE_FIELDS,
    STAGE_STRUCT,
    STAGES,
    STR,
    TRACE,
    U64,
    VALUE,
    Field,
    RecordType,
    fixed_format,
)

_PlainStages = tuple[struct.Struct, Callable[[tuple[int, ...], list[str]], "tuple[tuple[Any, ...], ...] | None"]]
_PLAIN_STAGES: list[_PlainStages | None] = [None] * 256


def plain_stages(n: int) -> _PlainStages:
    """The ``Struct`` of ``n`` plain stages back to back, and a function that makes their tuples.

    The function takes the unpacked stage fields and the string table, and
    returns the stage tuples, or None when any stage has a flag set (a stream,
    which the general stage reader reads). Unrolled code is about three times
    faster than a loop or ``zip`` (bench/ingest.py).
    """
    got = _PLAIN_STAGES[n]
    if got is None:
        w = len(STAGE_FIELDS)
        at = {sf.kind: j for j, sf in enumerate(STAGE_FIELDS)}
        flags = " or ".join(f"f[{w * i + w - 1}]" for i in range(n)) or "False"
        tuples = ", ".join(f"(s[f[{w * i + at[STR]}]], f[{w * i + at[U64]}], None)" for i in range(n))
        build = _compile("build", ["def build(f, s):", f"    return None if {flags} else ({tuples},)"], {})
        got = _PLAIN_STAGES[n] = (struct.Struct("<" + fixed_format(STAGE_FIELDS) * n), build)
    return got


def ctx_of(ck: bytes, strings: list[str]) -> tuple[str | None, str | None, str | None]:
    """A context tuple from its three packed refs."""
    a, b, c = _CTX.unpack(ck)
    return (
        None if a == NONE_REF else strings[a],
        None if b == NONE_REF else strings[b],
        None if c == NONE_REF else strings[c],
    )


class _Fallback(Exception):
    """Raised by a generated decoder for a record it leaves to the general decoder."""


def _decode_fixed(f: Field) -> list[str]:
    """Source that turns a fixed-size field's unpacked value into the event's value."""
    k, v = f.kind, _var(f)
    if k is CTX:  # unpacked as its 6 raw bytes: the key of the frame's context cache
        return [f"{v} = ctxs.get({v}_ck)", f"if {v} is None:", f"    {v} = ctxs[{v}_ck] = ctx_of({v}_ck, strings)"]
    if k is STR:
        return [f"{v} = None if {v} == {NONE_REF} else strings[{v}]"]
    if k is OUTCOME:
        return [f"if {v} > {OUTCOME_MAX}:", "    raise FALLBACK"]
    if k is BOOL:
        return [f"{v} = bool({v})"]
    if k is CONF:
        return [f"if {v} != {v}:", f"    {v} = None"]
    return []  # ints, counts and schema IDs as they are


def _at(k: int) -> str:
    return f"p + {k}" if k else "p"


def _advance(k: int, extra: str = "") -> list[str]:
    """Source that moves ``p`` past ``k`` more bytes (and ``extra``): one addition."""
    if extra:
        return [f"p += {k} + {extra}" if k else f"p += {extra}"]
    return [f"p += {k}"] if k else []


def _decode_var(rt: RecordType, f: Field, lead: str, k: int) -> list[str]:
    """Source that reads a variable-length field at ``p + k``, its leading byte already in ``lead``.

    It leaves ``p`` just after the field. Offsets are folded into as few
    additions as possible: the offsets are large ints, and each addition
    allocates one.
    """
    kind, v = f.kind, _var(f)
    if kind is RID or kind is TRACE:
        value = "buf[q:p].decode()" if kind is RID else "buf[q:p]"  # UTF-8; decode() without an argument is quicker
        return [f"if {lead}:", f"    q = {_at(k)}", f"    p = q + {lead}", f"    {v} = {value}", "else:",
                f"    {v} = None", *("    " + x for x in _advance(k) or ["pass"])]
    if kind is VALUE:
        return [
            f"if {lead} == 2:",
            f"    {v} = strings[buf[{_at(k)}] | buf[p + {k + 1}] << 8]",
            f"    p += {k + 2}",
            f"elif {lead} == 1:",
            f"    {v} = F64.unpack_from(buf, {_at(k)})[0]",
            f"    p += {k + 8}",
            f"elif {lead} == 0:",
            f"    {v} = None",
            *("    " + x for x in _advance(k)),
            "else:",
            "    raise FALLBACK",
        ]
    if kind is STAGES:
        count = _var(next(x for x in rt.fields if x.kind is N_STAGES))
        return [
            f"if {count}:",
            f"    sst, build = plain_stages({count})",
            f"    {v} = build(sst.unpack_from(buf, {_at(k)}), strings)",
            f"    if {v} is None:",  # a streamed stage: the general stage reader
            f"        {v}, p = read_stages(buf, {_at(k)}, end, {count}, strings)",
            "    else:",
            f"        p += {k} + sst.size" if k else "        p += sst.size",
            "else:",
            f"    {v} = ()",
            *("    " + x for x in _advance(k)),
        ]
    if kind is STAGE:
        return [
            f"s_name, s_dur, s_flags = STAGE.unpack_from(buf, {_at(k)})",
            "if s_flags:",
            "    raise FALLBACK",
            f"{v} = (strings[s_name], s_dur, None)",
            *_advance(k + STAGE_STRUCT.size),
        ]
    if kind is FEATURES:
        # A frame nearly always carries one producer's records of one schema: keep it in locals.
        sid = _var(next(x for x in rt.fields if x.kind is SCHEMA_ID))
        return [
            *_advance(k),
            f"if {sid}:",
            f"    if {sid} != last_sid:",
            # Only a known schema replaces the one in locals: an unknown one goes to the general
            # path, and the next record of the cached schema must still find it.
            f"        found = schemas.get(pkey | {sid})",
            "        if found is None:",
            "            raise FALLBACK",
            "        schema = found",
            f"        last_sid = {sid}",
            "        ns = schema.num_struct",
            "        nsz = ns.size",
            "        cs = schema.cat_struct",
            "        csz = cs.size",
            "    nums = ns.unpack_from(buf, p)",
            "    p += nsz",
            "    if csz:",
            f"        cats = tuple([None if r == {NONE_REF} else strings[r] for r in cs.unpack_from(buf, p)])",
            "        p += csz",
            "    else:",
            "        cats = ()",
            f"    {v} = (schema, nums, cats)",
            "else:",
            f"    {v} = None",
        ]
    raise AssertionError(f"no fast decoder for {kind.name}")


#: Kinds only the general decoder reads (a record type with one has no fast decoder).
_GENERAL_ONLY = frozenset(k for k in (f.kind for rt in RECORD_TYPES.values() for f in rt.fields)
                          if not k.code and k not in (RID, TRACE, VALUE, STAGES, STAGE, FEATURES))


def _decode_body(rt: RecordType, env: dict[str, Any]) -> list[str]:
    """Source that reads one record of type ``rt`` at ``p`` and appends its event tuple.

    Each run of fixed-size fields is one ``unpack_from``, which also reads the
    leading byte of the field after it (a length or a tag). ``k`` counts the
    bytes read since ``p`` last moved.
    """
    fields = rt.fields
    body: list[str] = []
    k = RECORD_HEADER.size
    i = 0
    while i < len(fields):
        f = fields[i]
        if f.kind.code:  # a run of fixed-size fields, read with one Struct
            j = i
            while j < len(fields) and fields[j].kind.code:
                j += 1
            run = fields[i:j]
            fmt = "".join("6s" if rf.kind is CTX else rf.kind.code for rf in run)
            if k and body == []:  # the record header: skipped by the Struct, not by an addition
                fmt = f"{k}x" + fmt
                k = 0
            names = [_var(rf) + ("_ck" if rf.kind is CTX else "") for rf in run]
            if j < len(fields) and fields[j].kind in _LEAD_BYTE:
                fmt += "B"
                names.append(_var(fields[j]) + "_lead")
            sname = f"S{rt.code}_{i}"
            st = env[sname] = struct.Struct("<" + fmt)
            body.append(f"{', '.join(names)}, = {sname}.unpack_from(buf, {_at(k)})")
            k += st.size
            for rf in run:
                body += _decode_fixed(rf)
            i = j
            continue
        lead = _var(f) + "_lead"
        if f.kind in _LEAD_BYTE and not (i and fields[i - 1].kind.code):
            body.append(f"{lead} = buf[{_at(k)}]")
            k += 1
        body += _decode_var(rt, f, lead, k)
        k = 0
        i += 1
    body += [f"if {_at(k)} != end:", "    raise FALLBACK",
             f"rec_append(({rt.code}, {', '.join('v_' + x for x in rt.event)}))", "continue"]
    return ["p = start", *body]


#: Record types tried first by the generated decoder (a speed hint, not a layout).
_HOT = (5, 2)


def decoder(helpers: dict[str, Any]) -> Callable[..., tuple[list[tuple[Any, ...]], list[str]]]:
    """The generated loop over a frame's records, every record type's fast reads inlined.

    It is called as ``decode(dec, buf, off, n_rec, strings, pkey)`` with
    ``off`` at the first record, and returns ``(records, errors)``. A record it
    does not read (a malformed one, a schema it does not know) goes to
    ``dec._general``, which gives the reference result or error. ``helpers``
    are the decoder module's: ``read_stages`` (the general stage reader),
    ``WireError``.
    """
    env: dict[str, Any] = dict(helpers, F64=_F64, STAGE=STAGE_STRUCT, plain_stages=plain_stages, ctx_of=ctx_of,
                               FALLBACK=_Fallback, struct=struct)
    fast = [c for c, rt in RECORD_TYPES.items() if rt.event and not any(f.kind in _GENERAL_ONLY for f in rt.fields)]
    codes = sorted(fast, key=lambda c: (c not in _HOT, _HOT.index(c) if c in _HOT else c))
    dispatch: list[str] = []
    for code in codes:
        dispatch.append(f"if rtype == {code}:")
        dispatch += ["    " + x for x in _decode_body(RECORD_TYPES[code], env)]
    body = [
        "records = []",
        "errors = []",
        "rec_append = records.append",
        "ctxs = {}",  # contexts by their 6 raw bytes, for this frame
        "schemas = dec._schemas",
        "general = dec._general",
        "last_sid = -1",
        "n = len(buf)",
        "for _ in range(n_rec):",
        "    try:",
        "        rtype = buf[off]",
        "        end = off + 3 + (buf[off + 1] | buf[off + 2] << 8)",
        "    except IndexError:",
        "        errors.append('truncated')",
        "        break",
        "    if end > n:",
        "        errors.append('truncated')",
        "        break",
        "    start = off",
        "    off = end  # the next record starts here, whatever happens to this one",
        "    try:",
        "        try:",
        *("            " + x for x in dispatch),
        "        except Exception:",
        "            pass",
        f"        if rtype == {EV_SCHEMA}:",
        "            dec._schema(buf, start + 3, end, strings, pkey)",
        "            last_sid = -1  # it may have replaced the cached schema",
        "        else:",
        "            rec_append(general(rtype, buf, start + 3, end, strings, pkey))",
        "    except WireError as e:",
        "        errors.append(e.reason)",
        "    except (struct.error, IndexError, UnicodeDecodeError, ValueError):",
        "        errors.append('bad_record')",
        "return records, errors",
    ]
    lines = ["def decode(dec, buf, off, n_rec, strings, pkey):", *("    " + x for x in body)]
    fn: Callable[..., tuple[list[tuple[Any, ...]], list[str]]] = _compile("decode", lines, env)
    return fn

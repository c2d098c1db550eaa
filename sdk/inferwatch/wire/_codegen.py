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
    EV_REQUEST,
    EV_SCHEMA,
    FEATURES,
    I64,
    KIND_CATEGORICAL,
    KIND_NUMERIC,
    MAX_REQUEST_ID,
    MAX_TRACE,
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
    U32,
    U64,
    VALUE,
    Field,
    Kind,
    RecordType,
    classify,
    fixed_format,
    rid_bytes,
    trace_bytes,
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


def _checks_and_effects(rt: RecordType, f: Field, n: int, careful: bool) -> tuple[list[str], list[str]]:
    """Source for one field of the one-event encoder: the checks, then the effects (string refs, features).

    Checks have no effect (``classify()`` has none) and return None for what
    only the general path encodes. ``careful``: the record has a field with effects beyond string
    refs (features), so values that ``struct`` would reject are checked here,
    before it, instead of by ``pack`` after it.
    """
    k, v = f.kind, _var(f)
    if k is CTX:  # consecutive events usually share the very same tuple: an `is` test skips hashing it
        return [], [
            f"if {v} is fb.ctx_obj:",
            f"    {v}0, {v}1, {v}2 = fb.ctx_refs",
            "else:",
            f"    {v}0, {v}1, {v}2 = fb.ctx_refs = fb.ctx({v})",
            f"    fb.ctx_obj = {v}",
        ]
    if k is STR:
        return [], [
            f"if {v} is None:",
            f"    {v}_r = {NONE_REF}",
            "else:",
            f"    {v}_r = strings.get({v})",
            f"    if {v}_r is None:",
            f"        {v}_r = fb.ref({v})",
        ]
    if k in _RAW:
        lo, hi = _RAW[k]
        return ([f"if type({v}) is not int or not {lo} <= {v} <= {hi}:", "    return None"] if careful else []), []
    if k is RID:
        return [f"{v}_b = rid_bytes({v})", f"{v}_n = len({v}_b)"], []
    if k is TRACE:
        return [f"{v}_b = trace_bytes({v})", f"{v}_n = len({v}_b)"], []
    if k is VALUE:  # classify() has no effects; a value it rejects the general path counts
        return [
            f"if {v} is None:",
            f"    {v}_t = 0",
            f"    {v}_p = b''",
            f"elif type({v}) is float and {v} - {v} == 0.0:",
            f"    {v}_t = 1",
            f"    {v}_p = {v}",
            f"elif type({v}) is str:",
            f"    {v}_t = 2",
            "else:",
            f"    c = classify({v})",
            "    if c is None:",
            "        return None",
            f"    if c[0] == {KIND_CATEGORICAL}:",
            f"        {v}_t = 2",
            f"        {v} = c[1]",
            "    elif c[1] != c[1]:",  # NaN: a missing value
            f"        {v}_t = 0",
            f"        {v}_p = b''",
            "    else:",
            f"        {v}_t = 1",
            f"        {v}_p = c[1]",
        ], [f"if {v}_t == 2:", f"    {v}_p = fb.ref({v})"]
    if k is CONF:
        return [
            f"if {v} is None:",
            f"    {v} = NAN",
            f"elif type({v}) is not float or {v} - {v} != 0.0:",
            f"    c = classify({v})",
            f"    if c is None or c[0] != {KIND_NUMERIC}:",
            "        return None",
            f"    {v} = c[1]",
        ], []
    if k is SCHEMA_ID:  # the features, and their SCHEMA record if it is due
        feats = _var(next(x for x in rt.fields if x.kind is FEATURES))
        return [], [
            f"if {feats}:",
            f"    {v}, {feats}_b = enc._features(fb, {feats}, now, pending)",
            "else:",
            f"    {v}, {feats}_b = 0, b''",
            f"{feats}_n = len({feats}_b)",
        ]
    if k is STAGES or k is STAGE:
        count = n if k is STAGES else 1
        if not count:
            return ["streamed = False"], []
        stages = [_stage_vars(i) for i in range(count)]
        target = "".join(f"({a}, {b}, {c}), " for a, b, c in stages)
        test = " or ".join(f"{c} is not None" for _, _, c in stages)
        checks = [f"{target}= {v}" if k is STAGES else f"{target}= ({v},)"]
        if k is STAGE:  # a streamed STAGE event: the general path
            checks += [f"if {test}:", "    return None"]
        else:  # a streamed stage: the general stage packer writes the stages (below)
            checks.append(f"streamed = {test}")
        # Names are nearly always in the table already; otherwise ref() adds them in stage order.
        refs = ["try:", *(f"    {a}_r = strings[{a}]" for a, _, _ in stages), "except KeyError:",
                *(f"    {a}_r = fb.ref({a})" for a, _, _ in stages)]
        return checks, (["if not streamed:", *("    " + x for x in refs)] if k is STAGES else refs)
    return [], []  # bools, counts and features (which the schema ID's effect packs)


#: Kinds whose effects can only raise TooLarge once their checks passed: they may follow the features.
_SAFE_AFTER_FEATURES = (VALUE, CONF, RID, TRACE, FEATURES, I64, U64, U32, OUTCOME, DEVICE, BOOL)

_ENCODERS: dict[tuple[int, int], Callable[..., bytes | None]] = {}


def encoder(code: int, n: int = 0) -> Callable[..., bytes | None]:
    """The fast encoder of one event of type ``code`` (``n`` stages for a REQUEST).

    It is called as ``encode(ev, fb, enc, now, pending)``: the event, the
    frame builder, the encoder (for its features and general stage packer)
    and the arguments of its features method. It
    returns the whole record, or None (or raises) before it has any effect but
    string refs when the event is not the simple case (an out-of-range value,
    a value to classify, a streamed STAGE event); the general path then
    encodes the event, taking the same refs in the same order. A REQUEST whose
    stages are all plain is left in ``fb.template``: a run may follow.
    """
    got = _ENCODERS.get((code, n))
    if got is not None:
        return got
    rt = RECORD_TYPES[code]
    items = _flat(rt, n)
    careful = any(f.kind is SCHEMA_ID for f in rt.fields)
    checks: list[str] = []
    before: list[str] = []  # effects of the fields before the features, in wire order
    after: list[str] = []  # the features' effect and the effects of the fields after them
    for f in rt.fields:
        c, e = _checks_and_effects(rt, f, n, careful)
        checks += c
        if after or f.kind is SCHEMA_ID:
            if f.kind not in _SAFE_AFTER_FEATURES and f.kind is not SCHEMA_ID:
                raise TypeError(f"{rt.name}.{f.name} cannot follow the features in a fast encoder")
            after += e
        else:
            before += e
    shapes = _Shapes(items)
    env: dict[str, Any] = {"cache": shapes.cache, "shapes": shapes, "rid_bytes": rid_bytes,
                           "trace_bytes": trace_bytes, "classify": classify, "NAN": _NAN, "TooLarge": TooLarge}
    body = ["strings = fb.strings", "_, " + ", ".join("v_" + x for x in rt.event) + " = ev", *checks, *before, *after]
    if any(f.kind is STAGES for f in rt.fields):
        # A streamed stage: one Struct for the fields before the stages, the general stage packer for them.
        head = _flat(rt, n, upto=STAGES)
        hshapes = _Shapes(head)
        env.update(hcache=hshapes.cache, hshapes=hshapes)
        body += [
            "if streamed:",
            "    body = b''.join(enc._stages(fb, " + _var(next(x for x in rt.fields if x.kind is STAGES)) + "))",
            f"    key = {_key(head)}",
            "    got = hcache.get(key)",
            "    if got is None:",
            "        got = hshapes(key)",
            "    pack, plen = got",
            "    plen += len(body)",
            "    if plen > 0xFFFF:",
            "        raise TooLarge('record too large')",
            f"    return pack({', '.join(i.expr for i in head)}) + body",
        ]
    body += [
        f"key = {_key(items)}",
        "got = cache.get(key)",
        "if got is None:",
        "    got = shapes(key)",
        "pack, plen = got",
        "if plen > 0xFFFF:",
        "    raise TooLarge('record too large')",
        f"rec = pack({', '.join(i.expr for i in items)})",
        *(["fb.template = ev"] if any(f.kind is STAGES for f in rt.fields) else []),
        # The SCHEMA records the features announced go first, in the same bytes.
        *(["if fb.pre:", "    return b''.join((*fb.pre, rec))"] if careful else []),
        "return rec",
    ]
    lines = ["def encode(ev, fb, enc, now, pending):", *("    " + x for x in body)]
    fn: Callable[..., bytes | None] = _compile("encode", lines, env)
    _ENCODERS[(code, n)] = fn  # bounded: one per record type and stage count
    return fn


# -- runs of look-alike REQUESTs -----------------------------------------------------------

def _run_checks(rt: RecordType, n: int) -> list[str]:
    """Source that binds the locals of :func:`_flat`'s variable items from the event ``ev`` of a run.

    It ``break``s where the event differs from the run's template in a
    constant part: another context object, an error type, other stage names,
    a streamed stage, a request ID or trace ID that would be clipped.
    """
    lines = ["_, " + ", ".join("v_" + x for x in rt.event) + " = ev"]
    same = []  # tests that the event's constant parts are the template's
    for f in rt.fields:
        k, v = f.kind, _var(f)
        if k is CTX:
            same.append(f"{v} is not ctx0")
        elif k is STR:
            same.append(f"{v} is not None")
        elif k is RID:  # a str that encodes strictly within the limit: rid_bytes() gives the same
            same.append(f"type({v}) is not str")
    lines += ["if " + " or ".join(same) + ":", "    break"]
    for f in rt.fields:
        k, v = f.kind, _var(f)
        if k is RID:
            lines += [f"{v}_b = {v}.encode()", f"{v}_n = len({v}_b)", f"if {v}_n > {MAX_REQUEST_ID}:", "    break"]
        elif k is TRACE:  # none, or a whole trace ID as bytes: trace_bytes() gives the same
            lines += [f"if {v} is None:", f"    {v}_b = b''", f"    {v}_n = 0",
                      f"elif type({v}) is bytes and len({v}) == {MAX_TRACE}:", f"    {v}_b = {v}",
                      f"    {v}_n = {MAX_TRACE}", "else:", "    break"]
        elif k is STAGES:
            if not n:
                lines += [f"if {v}:", "    break"]
                continue
            stages = [_stage_vars(i) for i in range(n)]
            lines.append("".join(f"({a}, {b}, {c}), " for a, b, c in stages) + f"= {v}")  # another count: raises
            tests = [f"{c} is not None" for _, _, c in stages] + [f"{a} != N{i}" for i, (a, _, _) in enumerate(stages)]
            lines += ["if " + " or ".join(tests) + ":", "    break"]
        elif k not in _RAW and k not in (N_STAGES, CTX, STR):
            raise TypeError(f"{rt.name}.{f.name}: a {k.name} field cannot be in a run")
    return lines


def _groups(items: list[_Item]) -> list[list[_Item]]:
    """Items split into alternating groups of constant and variable ones, constants first."""
    groups: list[list[_Item]] = [[]]
    for it in items:
        if it.const != (len(groups) % 2 == 1):
            groups.append([])
        groups[-1].append(it)
    return groups


class _RunPlan:
    """What :func:`run_shape` needs for one stage count, worked out once from :func:`_flat`.

    Attributes:
        items: the flattened record.
        consts: per constant group, its ``struct`` format and its values' names (or ints).
        variables: the variable groups.
        names: the names of the template's values, in :func:`run_template`'s order.
    """

    __slots__ = ("items", "consts", "variables", "names")

    def __init__(
        self, items: list[_Item], consts: list[tuple[str, list[str | int]]], variables: list[list[_Item]],
        names: list[str],
    ) -> None:
        self.items = items
        self.consts = consts
        self.variables = variables
        self.names = names


_RUN_PLANS: dict[int, _RunPlan] = {}


def _run_plan(n: int) -> _RunPlan:
    plan = _RUN_PLANS.get(n)
    if plan is None:
        rt = RECORD_TYPES[EV_REQUEST]
        items = _flat(rt, n)
        groups = _groups(items)
        consts: list[tuple[str, list[str | int]]] = [
            ("<" + _fmt(g, []), [int(i.expr) if i.expr.isdigit() else i.expr for i in g]) for g in groups[::2]
        ]
        names: list[str] = []
        for f in rt.fields:
            if f.kind is CTX:
                names += [f"{_var(f)}{j}" for j in range(3)]
            elif f.kind is STAGES:
                names += [f"{_stage_vars(i)[0]}_r" for i in range(n)]
        plan = _RUN_PLANS[n] = _RunPlan(items, consts, groups[1::2], names)
    return plan


#: ``(stage count, shape key, template)`` -> :func:`run_shape`'s result. The frames of one producer
#: usually add the same strings in the same order, so their templates repeat.
_RUN_SHAPES: dict[tuple[int, int, tuple[int, ...]], tuple[Any, ...]] = {}


def run_shape(n: int, key: int, template: tuple[int, ...]) -> tuple[Any, ...]:
    """The packer of a run's REQUESTs with this shape key, then its constant groups as bytes.

    ``template`` is the template's refs (:func:`run_template`); each group of
    consecutive constants becomes one ``s`` item of the Struct. A plain tuple,
    so the run unpacks it in one step.
    """
    got = _RUN_SHAPES.get((n, key, template))
    if got is not None:
        return got
    rt = RECORD_TYPES[EV_REQUEST]
    plan = _run_plan(n)
    digits = _digits(plan.items, key)
    values: dict[str, int] = dict(zip(plan.names, template, strict=True))
    values["plen"] = struct.calcsize("<" + _fmt(plan.items, digits)) - RECORD_HEADER.size
    values.update(zip([i.digit for i in plan.items if i.digit], digits, strict=True))
    for f in rt.fields:
        if f.kind is STR:  # a run requires None
            values[f"{_var(f)}_r"] = NONE_REF
    out: list[Any] = [None]
    fmt = ["<"]
    it = iter(digits)
    for (sub, names), group in zip(plan.consts, [*plan.variables, []], strict=True):
        b = struct.pack(sub, *[x if isinstance(x, int) else values[x] for x in names])
        out.append(b)
        fmt.append(f"{len(b)}s")
        fmt.append(_fmt(group, [next(it) for i in group if i.digit]))
    out[0] = struct.Struct("".join(fmt)).pack
    got = tuple(out)
    if len(_RUN_SHAPES) >= _CACHE_MAX:
        _RUN_SHAPES.clear()
    _RUN_SHAPES[(n, key, template)] = got
    return got


def run_template(ev: tuple[Any, ...], ctx_refs: tuple[int, int, int], strings: dict[str, int]) -> tuple[int, ...]:
    """The refs a run shaped like the REQUEST ``ev`` repeats: its context's, then its stage names'."""
    out: list[int] = []
    for f in RECORD_TYPES[EV_REQUEST].fields:
        if f.kind is CTX:
            out += ctx_refs
        elif f.kind is STAGES:
            out += [NONE_REF if name is None else strings[name] for name, _, _ in ev[f.slot]]
    return tuple(out)


_RUNNERS: dict[int, Callable[..., tuple[int, int]]] = {}


def runner(n: int) -> Callable[..., tuple[int, int]]:
    """The packer of a run of REQUESTs with ``n`` plain stages, shaped like a template.

    It is called as ``run(evs, i, end, records, room, ctx0, template, names)``:
    the events, where to start and stop, the frame's record list, the bytes
    left in the frame, the template's context object, its refs
    (:func:`run_template`) and its stage names. It appends one record per
    event until an event is shaped otherwise or the frame is full, and returns
    ``(next index, bytes appended)``. The bytes are those :func:`encoder`'s
    packer writes for the same event: the same items, some packed beforehand.
    """
    got = _RUNNERS.get(n)
    if got is not None:
        return got
    rt = RECORD_TYPES[EV_REQUEST]
    plan = _run_plan(n)
    groups = _groups(plan.items)
    n_const = len(plan.consts)
    args = []
    for gi, group in enumerate(groups):
        args += [f"K{gi // 2}"] if gi % 2 == 0 else [i.expr for i in group]
    body = [
        "used = 0",
        "append = records.append",
        "shapes = {}",
        "key = -1",
        *([", ".join(f"N{j}" for j in range(n)) + ", = names"] if n else []),
        "while i < end:",
        "    ev = evs[i]",
        "    try:",
        f"        if ev[0] != {rt.code}:",  # another type: the run ends
        "            break",
        *("        " + x for x in _run_checks(rt, n)),
        f"        k = {_key(plan.items)}",
        "        if k != key:",
        "            sh = shapes.get(k)",
        "            if sh is None:",
        f"                sh = shapes[k] = run_shape({n}, k, template)",
        "            pack, " + "".join(f"K{j}, " for j in range(n_const)) + "= sh",
        "            key = k",
        f"        rec = pack({', '.join(args)})",
        "    except Exception:",
        "        break",
        "    size = len(rec)",
        "    if used + size > room:",
        "        break",
        "    append(rec)",
        "    used += size",
        "    i += 1",
        "return i, used",
    ]
    lines = ["def run(evs, i, end, records, room, ctx0, template, names):", *("    " + x for x in body)]
    fn: Callable[..., tuple[int, int]] = _compile("run", lines, {"run_shape": run_shape})
    _RUNNERS[n] = fn  # bounded by MAX_FAST_STAGES
    return fn


# -- decoding ------------------------------------------------------------------------------

_PlainStages = tuple[struct.Struct, Callable[[tuple[int, ...], list[str]], "list[tuple[Any, ...]] | None"]]
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
        build = _compile("build", ["def build(f, s):", f"    return None if {flags} else [{tuples}]"], {})
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
            f"    {v} = []",
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

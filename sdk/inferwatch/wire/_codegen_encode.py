"""Generated encoders: one event (:func:`encoder`) and runs of look-alike REQUESTs (:func:`runner`).

See ``_codegen``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from inferwatch.wire._codegen_common import (
    _CACHE_MAX,
    _NAN,
    _RAW,
    TooLarge,
    _compile,
    _digits,
    _flat,
    _fmt,
    _Item,
    _key,
    _Shapes,
    _stage_vars,
    _var,
)
from inferwatch.wire.spec import (
    BOOL,
    CONF,
    CTX,
    DEVICE,
    EV_REQUEST,
    FEATURES,
    I64,
    KIND_CATEGORICAL,
    KIND_NUMERIC,
    MAX_REQUEST_ID,
    MAX_TRACE,
    N_STAGES,
    NONE_REF,
    OUTCOME,
    RECORD_HEADER,
    RECORD_TYPES,
    RID,
    SCHEMA_ID,
    STAGE,
    STAGES,
    STR,
    TRACE,
    U32,
    U64,
    VALUE,
    Field,
    RecordType,
    classify,
    rid_bytes,
    trace_bytes,
)


def _checks_and_effects(rt: RecordType, f: Field, n: int, careful: bool) -> tuple[list[str], list[str]]:
    """Source for one field of the one-event encoder: the checks, then the effects (string refs, features).

    Checks have no effect (``classify()`` has none) and return None for what
    only the general path encodes. ``careful``: the record has a field with effects beyond string
    refs (features), so values that ``struct`` would reject are checked here,
    before it, instead of by ``pack`` after it.
    """
    k, v = f.kind, _var(f)
    if k is CTX:
        return [], _ctx_effects(v)
    if k is STR:
        return [], _str_effects(v)
    if k in _RAW:
        lo, hi = _RAW[k]
        return ([f"if type({v}) is not int or not {lo} <= {v} <= {hi}:", "    return None"] if careful else []), []
    if k is RID:
        return [f"{v}_b = rid_bytes({v})", f"{v}_n = len({v}_b)"], []
    if k is TRACE:
        return [f"{v}_b = trace_bytes({v})", f"{v}_n = len({v}_b)"], []
    if k is VALUE:  # classify() has no effects; a value it rejects the general path counts
        return _value_checks(v), [f"if {v}_t == 2:", f"    {v}_p = fb.ref({v})"]
    if k is CONF:
        return _conf_checks(v), []
    if k is SCHEMA_ID:  # the features, and their SCHEMA record if it is due
        return [], _schema_effects(v, _var(next(x for x in rt.fields if x.kind is FEATURES)))
    if k is STAGES or k is STAGE:
        return _stages_source(v, n if k is STAGES else 1, k is STAGES)
    return [], []  # bools, counts and features (which the schema ID's effect packs)


def _ctx_effects(v: str) -> list[str]:
    # Consecutive events usually share the very same tuple: an `is` test skips hashing it.
    return [
        f"if {v} is fb.ctx_obj:",
        f"    {v}0, {v}1, {v}2 = fb.ctx_refs",
        "else:",
        f"    {v}0, {v}1, {v}2 = fb.ctx_refs = fb.ctx({v})",
        f"    fb.ctx_obj = {v}",
    ]


def _str_effects(v: str) -> list[str]:
    return [
        f"if {v} is None:",
        f"    {v}_r = {NONE_REF}",
        "else:",
        f"    {v}_r = strings.get({v})",
        f"    if {v}_r is None:",
        f"        {v}_r = fb.ref({v})",
    ]


def _value_checks(v: str) -> list[str]:
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
    ]


def _conf_checks(v: str) -> list[str]:
    return [
        f"if {v} is None:",
        f"    {v} = NAN",
        f"elif type({v}) is not float or {v} - {v} != 0.0:",
        f"    c = classify({v})",
        f"    if c is None or c[0] != {KIND_NUMERIC}:",
        "        return None",
        f"    {v} = c[1]",
    ]


def _schema_effects(v: str, feats: str) -> list[str]:
    return [
        f"if {feats}:",
        f"    {v}, {feats}_b = enc._features(fb, {feats}, now, pending)",
        "else:",
        f"    {v}, {feats}_b = 0, b''",
        f"{feats}_n = len({feats}_b)",
    ]


def _stages_source(v: str, count: int, many: bool) -> tuple[list[str], list[str]]:
    """A REQUEST's ``count`` stages (``many``), or a STAGE event's one."""
    if not count:
        return ["streamed = False"], []
    stages = [_stage_vars(i) for i in range(count)]
    target = "".join(f"({a}, {b}, {c}), " for a, b, c in stages)
    test = " or ".join(f"{c} is not None" for _, _, c in stages)
    checks = [f"{target}= {v}" if many else f"{target}= ({v},)"]
    if not many:  # a streamed STAGE event: the general path
        checks += [f"if {test}:", "    return None"]
    else:  # a streamed stage: the general stage packer writes the stages (below)
        checks.append(f"streamed = {test}")
    # Names are nearly always in the table already; otherwise ref() adds them in stage order.
    refs = ["try:", *(f"    {a}_r = strings[{a}]" for a, _, _ in stages), "except KeyError:",
            *(f"    {a}_r = fb.ref({a})" for a, _, _ in stages)]
    return checks, (["if not streamed:", *("    " + x for x in refs)] if many else refs)


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

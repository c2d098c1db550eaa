"""The config reference of docs/config.md, generated from the config models, and the check that it can be.

Every field has a description, taken from, in order:

1. its ``Field(description=...)`` (the daemon's own sections, :mod:`.sections`);
2. its entry under ``Attributes:`` in its model's Google-style docstring (the components' config models),
   where one entry may name several fields (``rtol / atol:``, ``ttft_shift, itl_shift:``) and continues on
   the lines indented below it;
3. a ``#:`` comment on the lines just above it in the model's source (the Sphinx convention);
4. for a field whose type is itself a model (a section), the first sentence of that model's docstring.

:func:`undocumented` lists the fields with none of them (``tests/config/test_config_reference.py`` fails
on any), and :func:`reference_yaml` writes every field of every section, the components' included, with
its default and description as commented YAML: ``python -m inferwatch_sidecar.config --reference``.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import typing
from collections.abc import Iterator
from functools import cache
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from inferwatch_sidecar.config.root import SidecarConfig

__all__ = ["docstring_attributes", "field_docs", "reference_yaml", "source_comments", "undocumented"]

#: One ``Attributes:`` entry: names (``a``, ``a / b``, ``a, b``), a colon, the text.
_ENTRY = re.compile(r"^(?P<names>[A-Za-z_]\w*(?:\s*[/,]\s*[A-Za-z_]\w*)*):(?:\s+(?P<text>.*))?$")
#: A field declaration in a class body.
_DECL = re.compile(r"^(?P<indent>\s+)(?P<name>[A-Za-z_]\w*)\s*:")
#: reStructuredText roles and literals, shown as plain code in YAML comments.
_ROLE = re.compile(r":[a-z]+:`~?\.?([^`]+)`")


def _own_doc(cls: type) -> str:
    """The class's own docstring, dedented ('' when it has none: never a base class's)."""
    doc = cls.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def docstring_attributes(cls: type) -> dict[str, str]:
    """Field name -> description from the ``Attributes:`` section of ``cls``'s own docstring."""
    lines = _own_doc(cls).splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    base = len(lines[start]) - len(lines[start].lstrip())
    out: dict[str, str] = {}
    names: list[str] = []
    entry_indent: int | None = None
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= base:
            break  # the next section (Raises:, Example:, ...)
        if entry_indent is None:
            entry_indent = indent
        m = _ENTRY.match(line.strip()) if indent == entry_indent else None
        if m is not None:
            names = re.split(r"\s*[/,]\s*", m.group("names"))
            for n in names:
                out[n] = (m.group("text") or "").strip()
        elif names:
            for n in names:
                out[n] = f"{out[n]} {line.strip()}".strip()
    return out


def source_comments(cls: type) -> dict[str, str]:
    """Field name -> the ``#:`` comment lines just above its declaration in ``cls``'s source."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}  # a model built at run time (the root) has no source
    out: dict[str, str] = {}
    pending: list[str] = []
    body_indent: int | None = None
    for line in src.splitlines()[1:]:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        m = _DECL.match(line)
        if m is not None and (body_indent is None or indent == body_indent):
            body_indent = len(m.group("indent"))
            if pending:
                out[m.group("name")] = " ".join(pending)
        pending = []
    return out


def _first_sentence(text: str) -> str:
    para = " ".join(text.split("\n\n", 1)[0].split())
    m = re.match(r"(.+?[.:])(\s|$)", para)
    return m.group(1) if m else para


@cache
def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """The description of every documented field of ``model`` (the sources are in the module docstring)."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):  # a subclass's words win over its base's
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            found.update({k: v for k, v in source_comments(cls).items() if v})
            found.update({k: v for k, v in docstring_attributes(cls).items() if v})
    out: dict[str, str] = {}
    for name, f in model.model_fields.items():
        sub = _section_model(f)
        text = f.description or found.get(name) or (_first_sentence(_own_doc(sub)) if sub else "")
        if text:
            text = _ROLE.sub(r"`\1`", text).replace("``", "`")
            out[name] = text[0].upper() + text[1:]
    return out


def _section_model(f: FieldInfo) -> type[BaseModel] | None:
    """The model a field holds as a nested section (``detector: DetectorConfig``), or None."""
    ann = f.annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _item_model(f: FieldInfo) -> type[BaseModel] | None:
    """The model of a list of models (``targets: list[EngineTarget]``), or None."""
    if typing.get_origin(f.annotation) is list:
        (arg,) = typing.get_args(f.annotation) or (None,)
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _models_in(ann: Any) -> Iterator[type[BaseModel]]:
    """Every model an annotation mentions (``X``, ``list[X]``, ``X | None``, ``dict[str, X]``)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        yield ann
    for arg in typing.get_args(ann):
        if arg is not type(None):
            yield from _models_in(arg)


def undocumented(root: type[BaseModel] = SidecarConfig) -> list[str]:
    """Dotted paths of the fields without a description, in every model reachable from ``root``."""
    out: list[str] = []
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], path: str) -> None:
        if model in seen:
            return
        seen.add(model)
        docs = field_docs(model)
        for name, f in model.model_fields.items():
            if name not in docs:
                out.append(f"{path}{name} ({model.__module__}.{model.__qualname__})")
            for sub in _models_in(f.annotation):
                walk(sub, f"{path}{name}{'[]' if sub is not f.annotation else ''}.")

    walk(root, "")
    return out


def _shown(name: str, f: FieldInfo) -> str:
    if f.is_required():
        return "(required)"
    default = f.get_default(call_default_factory=True)
    if default is PydanticUndefined:
        return "(required)"
    if isinstance(default, SecretStr):
        return '"***"'
    if name == "socket_mode":
        return f'"{default:04o}"'
    return _flow(to_jsonable_python(default))


def _flow(v: Any) -> str:
    """``v`` as JSON, which is YAML flow style, but with floats that YAML reads back as floats (``1.0e-09``)."""
    if isinstance(v, float) and math.isfinite(v):
        mantissa, e, exponent = repr(v).partition("e")
        return f"{mantissa}{'' if '.' in mantissa or not e else '.0'}{e}{exponent}"
    if isinstance(v, list):
        return "[" + ", ".join(_flow(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_flow(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def _items(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    """A list item's fields, as comment lines under ``prefix`` (``  #   ``)."""
    docs = field_docs(model)
    for name, f in model.model_fields.items():
        sub = _section_model(f) or _item_model(f)
        shown = "" if sub is not None else f" (default {_shown(name, f)})" if not f.is_required() else " (required)"
        lines.append(f"{prefix}{name}: {docs.get(name, '')}{shown}")
        if sub is not None:
            _items(sub, prefix + "  ", lines)


def _walk(model: type[BaseModel], indent: str, lines: list[str]) -> None:
    docs = field_docs(model)
    for name, f in model.model_fields.items():
        if name in docs:
            lines.append(f"{indent}# {docs[name]}")
        sub = _section_model(f)
        if sub is not None:
            lines.append(f"{indent}{name}:")
            _walk(sub, indent + "  ", lines)
            continue
        item = _item_model(f)
        if item is not None:
            lines.append(f"{indent}# Each item:")
            _items(item, f"{indent}#   ", lines)
        lines.append(f"{indent}{name}: {_shown(name, f)}")


def reference_yaml(root: type[BaseModel] = SidecarConfig) -> str:
    """Every field of every section with its default and description, as commented YAML (docs/config.md)."""
    lines: list[str] = []
    _walk(root, "", lines)
    return "\n".join(lines) + "\n"


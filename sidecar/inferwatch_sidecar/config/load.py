"""Building the configuration from its sources, lowest precedence first: defaults, YAML, environment, flags.

Validation happens once, in :func:`load_config`; every error names the field, what is wrong and where the
value came from (:func:`_format_errors`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from inferwatch_sidecar.config.root import SidecarConfig

__all__ = ["ENV_PREFIX", "ConfigError", "env_overrides", "load_config", "merge", "parse_set", "read_yaml"]

ENV_PREFIX = "INFERWATCH_"


class ConfigError(Exception):
    """A configuration that cannot be used; the message says what to fix."""


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for k in path[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = node[k] = {}
        node = nxt
    node[path[-1]] = value


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML config file into a dict.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or not a mapping.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"config file {p}: cannot read it ({e.strerror or e})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {p}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The config tree set by ``INFERWATCH_*`` variables, and each key's source."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):]
        if rest == "ADMIN_TOKEN":
            path = ["http", "admin_token"]
            value: Any = environ[name]
        elif "__" in rest:
            path = [p.lower() for p in rest.split("__")]
            if any(not p for p in path):
                raise ConfigError(f"environment variable {name}: empty name part between '__'")
            value = _parse_scalar(environ[name])
            if path[-1] == "admin_token":
                value = environ[name]
        else:
            continue  # an SDK variable such as INFERWATCH_SIDECAR or INFERWATCH_SERVICE
        _set_path(tree, path, value)
        sources[".".join(path)] = f"environment variable {name}"
    return tree, sources


def parse_set(items: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The config tree set by ``--set a.b=value`` flags."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. --set http.port=9464")
        path = key.split(".")
        _set_path(tree, path, text if path[-1] == "admin_token" else _parse_scalar(text))
        sources[key] = f"--set {key}"
    return tree, sources


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, nested mappings merged key by key (neither is modified)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def _flatten_keys(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k, v in tree.items():
        p = f"{prefix}{k}"
        keys.append(p)
        if isinstance(v, Mapping):
            keys += _flatten_keys(v, p + ".")
    return keys


def _format_errors(err: ValidationError, sources: dict[str, str]) -> str:
    lines = [f"invalid configuration ({err.error_count()} error{'s' if err.error_count() != 1 else ''}):"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/config.md)"
        src = None
        parts = loc.split(".")
        for i in range(len(parts), 0, -1):
            src = sources.get(".".join(parts[:i]))
            if src:
                break
        got = ""
        if "input" in e and e["type"] != "extra_forbidden" and not isinstance(e["input"], (dict, list)):
            shown = "***" if "token" in loc else repr(e["input"])
            got = f" (got {shown})"
        lines.append(f"  {loc}: {msg}{got}" + (f" [from {src}]" if src else ""))
    return "\n".join(lines)


def load_config(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    override_sources: dict[str, str] | None = None,
) -> SidecarConfig:
    """Build and validate the configuration from all sources.

    Args:
        path: YAML file, or None for defaults only.
        environ: environment to read ``INFERWATCH_*`` from (``os.environ`` by default).
        overrides: a config tree from command-line flags (highest precedence).
        override_sources: where each overridden key came from, for error messages.

    Raises:
        ConfigError: with one line per problem, naming field, issue and source.
    """
    sources: dict[str, str] = {}
    tree: dict[str, Any] = {}
    if path is not None:
        tree = read_yaml(path)
        for k in _flatten_keys(tree):
            sources[k] = f"config file {path}"
    env_tree, env_src = env_overrides(os.environ if environ is None else environ)
    tree = merge(tree, env_tree)
    sources.update(env_src)
    if overrides:
        tree = merge(tree, overrides)
        for k in _flatten_keys(overrides):
            sources[k] = (override_sources or {}).get(k, "command line")
    try:
        return SidecarConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, sources)) from None

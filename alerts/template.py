"""The small template language of the rules' expressions and annotations (see :mod:`alerts.source`).

:func:`render` fills the ``{window:5m}``, ``{labels.NAME}``, ``{value:FUNCTION}``, ``{NAME}`` and
``{NAME:le}`` fields for a :class:`~alerts.model.Profile` and an alert's thresholds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from alerts.model import SERVING, SIDECAR_JOB_SELECTOR, STAGE, Alert, Profile, Threshold

_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _fmt_number(v: float | str) -> str:
    if isinstance(v, str):
        return v
    return f"{v:g}" if not float(v).is_integer() else str(int(v))


def _le(value: float) -> str:
    """A label matcher for the bucket whose upper bound is ``value``.

    prometheus_client writes ``1.0`` while other exporters write ``1``; match both.
    """
    text = repr(float(value))
    if float(value).is_integer():
        return f'le=~"{int(value)}|{text}"'
    return f'le="{text}"'


class _Window:
    """``{window:5m}``: the duration in the format spec, scaled by the profile."""

    def __init__(self, profile: Profile) -> None:
        self._profile = profile

    def __format__(self, spec: str) -> str:
        m = _DURATION.fullmatch(spec)
        if m is None:
            raise ValueError(f"{{window:{spec}}}: not a duration such as 5m, 1h or 1d")
        return self._profile.duration(int(m.group(1)) * _UNIT_SECONDS[m.group(2)])


class _Labels:
    """``{labels.NAME}``: Go template text for the alert's label NAME."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        return f"{{{{ $labels.{name} }}}}"


class _Value:
    """``{value:FUNCTION}``: Go template text for the alert's value piped through FUNCTION."""

    def __format__(self, spec: str) -> str:
        return f"{{{{ $value | {spec} }}}}" if spec else "{{ $value }}"


class _ThresholdField:
    """``{NAME}`` or ``{NAME:le}`` for one threshold."""

    def __init__(self, threshold: Threshold, profile: Profile) -> None:
        self._t = threshold
        self._profile = profile

    def __format__(self, spec: str) -> str:
        v = self._t.value
        if spec == "le":
            return _le(float(v))
        if spec:
            raise ValueError(f"{{{self._t.name}:{spec}}}: the only threshold format is 'le'")
        if self._t.duration:
            return _fmt_number(self._profile.seconds(float(v)))
        return _fmt_number(v)


class _Fields(dict[str, Any]):
    """The fields of one rule's templates; a missing one names the rule."""

    def __init__(self, owner: str, fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self._owner = owner

    def __missing__(self, key: str) -> Any:
        raise KeyError(f"{self._owner}: no threshold or field {key!r}")


def render(text: str, profile: Profile, alert: Alert | None = None) -> str:
    """Fill a template's fields (see the module docstring) for ``profile`` and ``alert``'s thresholds."""
    fields: dict[str, Any] = {
        "window": _Window(profile), "labels": _Labels(), "value": _Value(),
        "by_version": SERVING, "by_stage": STAGE, "sidecar_job": SIDECAR_JOB_SELECTOR,
    }
    if alert is not None:
        fields.update((t.name, _ThresholdField(t, profile)) for t in alert.thresholds)
    return text.format_map(_Fields(alert.name if alert else "template", fields))

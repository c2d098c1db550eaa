"""Template pieces several domains' annotations share."""

from __future__ import annotations

_WHERE = "{labels.model} {labels.model_version} ({labels.service})"
_MV = "{labels.model} version {labels.model_version}"


def _version_query(metric: str, condition: str = "") -> str:
    """The Go template pipeline that queries ``metric`` of the alert's model version, for ``{{ with ... }}``."""
    return (f'printf "{metric}{{{{model=\'%s\',model_version=\'%s\'}}}}{condition}" $labels.model '
            "$labels.model_version | query")


#: ``{service, model, model_version}`` of the alert's series, as a PromQL matcher built by printf in a Go template.
_VERSION_MATCH = "service='%s',model='%s',model_version='%s'"
_VERSION_ARGS = "$labels.service $labels.model $labels.model_version"

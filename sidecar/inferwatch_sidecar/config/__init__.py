"""The sidecar's configuration: one validated object, built once at start-up.

Sources, lowest precedence first:

1. built-in defaults (the field defaults of the models);
2. a YAML file (``--config``), read with ``yaml.safe_load``;
3. environment variables ``INFERWATCH_<SECTION>__<FIELD>`` (a double
   underscore separates nesting levels, e.g. ``INFERWATCH_HTTP__PORT=9464``,
   ``INFERWATCH_GPU__ENABLED=false``), plus ``INFERWATCH_ADMIN_TOKEN`` for
   ``http.admin_token``. Values are parsed as YAML scalars/lists. Variables
   without a double underscore belong to the SDK and are ignored here;
4. command-line flags (``--set section.field=value`` and the named flags).

Validation happens once, in :func:`load_config`; every error names the
field, what is wrong and where the value came from, and start-up stops.

The package: :mod:`.sections` (the daemon's own sections), :mod:`.root` (the whole configuration: those
sections and one per registered component), :mod:`.load` (the sources and their validation) and
:mod:`.reference` (the reference of docs/config.md, generated from the models' field descriptions:
``python -m inferwatch_sidecar.config --reference``).
"""

from __future__ import annotations

from inferwatch_sidecar.config.load import (
    ENV_PREFIX,
    ConfigError,
    env_overrides,
    load_config,
    merge,
    parse_set,
    read_yaml,
)
from inferwatch_sidecar.config.reference import reference_yaml, undocumented
from inferwatch_sidecar.config.root import CoreConfig, SidecarConfig
from inferwatch_sidecar.config.sections import (
    DEFAULT_LABEL_BUDGETS,
    MAX_BUCKET_BOUNDS,
    TRACE_PRESETS,
    AggregateConfig,
    BucketsConfig,
    HttpConfig,
    IngestConfig,
    LabelsConfig,
    NativeConfig,
    TracesConfig,
)

__all__ = [
    "DEFAULT_LABEL_BUDGETS", "ENV_PREFIX", "MAX_BUCKET_BOUNDS", "TRACE_PRESETS", "AggregateConfig", "BucketsConfig",
    "ConfigError", "CoreConfig", "HttpConfig", "IngestConfig", "LabelsConfig", "NativeConfig", "SidecarConfig",
    "TracesConfig", "env_overrides", "load_config", "merge", "parse_set", "read_yaml", "reference_yaml",
    "undocumented",
]

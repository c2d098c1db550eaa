"""The ``inferwatch`` command: a thin launcher for the sidecar's CLI.

The CLI lives in the sidecar package because its commands need the sidecar
extra. This launcher is part of the SDK so the console script exists on every
install, and it explains what to install when the extra is missing.
"""

from __future__ import annotations

import sys

#: Third-party modules the sidecar extra provides. An ImportError naming one of
#: these means the extra is missing; any other ImportError is a real bug.
_EXTRA_MODULES = frozenset(
    {"prometheus_client", "numpy", "scipy", "pydantic", "yaml", "pynvml", "opentelemetry", "rich", "pyarrow"}
)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status."""
    try:
        from inferwatch_sidecar.cli import main as cli_main
    except ImportError as e:
        root = (e.name or "").split(".")[0]
        if root in _EXTRA_MODULES or root == "inferwatch_sidecar":
            print(
                f"inferwatch: this command needs the sidecar extra ({e.name or 'a module'} is not installed).\n"
                '  pip install "inferwatch[sidecar]"',
                file=sys.stderr,
            )
            return 2
        raise
    return int(cli_main(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

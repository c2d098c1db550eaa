"""``python -m inferwatch_sidecar.config --reference``: the config reference of docs/config.md."""

from __future__ import annotations

import sys

from inferwatch_sidecar.config.reference import reference_yaml


def main(argv: list[str]) -> int:
    if argv != ["--reference"]:
        print("usage: python -m inferwatch_sidecar.config --reference", file=sys.stderr)
        return 2
    sys.stdout.write(reference_yaml())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))

"""Regenerate the docs that are generated from code.

Usage: python scripts/gen_docs.py [--check]

- docs/metrics.md from the metric catalog;
- the Reference block of docs/config.md from the config model.

Tests fail when these files are stale; run this after changing a metric or a
config field. With --check it only reports what is stale (exit 1).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.config import reference_yaml

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    metrics = ROOT / "docs" / "metrics.md"
    if metrics.read_text() != CATALOG.markdown():
        stale.append(metrics)
        if not check:
            metrics.write_text(CATALOG.markdown())
    config = ROOT / "docs" / "config.md"
    text = config.read_text()
    new = re.sub(r"```yaml\n.*?```", lambda _: "```yaml\n" + reference_yaml() + "```", text, count=1, flags=re.S)
    if new != text:
        stale.append(config)
        if not check:
            config.write_text(new)
    for p in stale:
        print(f"{'stale' if check else 'rewrote'}: {p.relative_to(ROOT)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""docs/architecture.md names only modules that exist, and names every sidecar room."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PKG = ROOT / "sidecar" / "inferwatch_sidecar"


def _named_paths() -> set[str]:
    return set(re.findall(r"`((?:sdk|sidecar|dashboards|alerts)/[A-Za-z0-9_/.]+\.py)`", DOC.read_text()))


def test_every_module_the_architecture_page_names_exists() -> None:
    named = _named_paths()
    assert len(named) > 20, "the page should walk the whole path"
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_sidecar_package_appears_on_the_architecture_page() -> None:
    text = DOC.read_text()
    rooms = sorted(p.parent.relative_to(ROOT).as_posix() for p in PKG.rglob("__init__.py"))
    absent = [r for r in rooms if r != "sidecar/inferwatch_sidecar" and f"`{r}/" not in text]
    assert not absent, f"packages missing from docs/architecture.md: {absent}"

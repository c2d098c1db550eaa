"""tests/ mirrors the source tree (issue 23): every folder is a source package's or one tests/README.md names.

A folder ``tests/<path>`` is a mirror when ``sidecar/inferwatch_sidecar/<path>`` is a package, or, under
``tests/sdk``, when ``sdk/inferwatch/<rest>`` is. Any other folder must be in the README's table of folders
that stay outside the mirror, and such a folder may not take a source package's name (``tests/gpu`` beside
``tests/components/gpu`` is how a catch-all starts again).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.paths import REPO, TESTS

SIDECAR = REPO / "sidecar" / "inferwatch_sidecar"
SDK = REPO / "sdk" / "inferwatch"
#: Data only: recorded fixtures, no Python.
DATA = {"fixtures"}


def _outside() -> set[str]:
    """The folders tests/README.md lists as staying outside the mirror."""
    text = (TESTS / "README.md").read_text()
    section = text[text.index("| folder | why"):]
    table = section[:section.index("\n\n")]
    names = set(re.findall(r"^\| `([a-z_0-9]+)/` \|", table, re.M))
    assert len(names) > 3, "tests/README.md: the table of folders outside the mirror is missing"
    return names


def _source_of(rel: Path) -> Path:
    """The source package ``tests/<rel>`` mirrors (which may not exist)."""
    if rel.parts[0] == "sdk":
        return SDK.joinpath(*rel.parts[1:])
    return SIDECAR.joinpath(*rel.parts)


def _is_package(p: Path) -> bool:
    return p.is_dir() and (p / "__init__.py").is_file()


def _test_dirs() -> list[Path]:
    return sorted(d for d in TESTS.rglob("*") if d.is_dir() and d.name != "__pycache__"
                  and not d.name.startswith(".") and d.relative_to(TESTS).parts[0] not in DATA)


def _source_package_names() -> set[str]:
    return {d.name for root in (SIDECAR, SDK) for d in root.rglob("*") if _is_package(d)}


def misplaced(test_dirs: list[Path], outside: set[str]) -> list[str]:
    """Folders that neither mirror a source package nor sit, by name, outside the mirror."""
    out = []
    for d in test_dirs:
        rel = d.relative_to(TESTS)
        if rel.parts[0] in outside:
            continue
        if not _is_package(_source_of(rel)):
            out.append(f"tests/{rel.as_posix()}: no source package {_source_of(rel).relative_to(REPO)}")
    return out


def test_every_test_folder_mirrors_a_source_package_or_is_listed_outside_the_mirror() -> None:
    assert misplaced(_test_dirs(), _outside()) == []


def test_no_folder_outside_the_mirror_takes_a_source_package_name() -> None:
    shadows = sorted(_outside() & (_source_package_names() - {"sdk"}))
    assert shadows == [], f"tests/README.md lists {shadows} outside the mirror; their tests go to the package's folder"


def test_every_listed_folder_exists_and_every_test_folder_is_a_package() -> None:
    """Every folder an ``__init__.py``: two ``test_component.py`` in two folders are two modules, not a clash."""
    assert sorted(n for n in _outside() if not (TESTS / n).is_dir()) == []
    missing = [d.relative_to(REPO).as_posix() for d in _test_dirs() if not (d / "__init__.py").is_file()]
    assert missing == []


def test_the_check_catches_a_catch_all_folder(tmp_path: Path) -> None:
    fake = [TESTS / "gpu", TESTS / "components" / "gpu", TESTS / "components" / "nosuch", TESTS / "sdk" / "wire"]
    assert misplaced(fake, {"helpers"}) == [
        "tests/gpu: no source package sidecar/inferwatch_sidecar/gpu",
        "tests/components/nosuch: no source package sidecar/inferwatch_sidecar/components/nosuch",
    ]

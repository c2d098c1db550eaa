"""Plan (and, with --apply, make) the move of tests/ into a tree that mirrors the source tree (issue 23, item 9).

Usage: python scripts/mirror_tests.py [--apply]

Run it once every branch of the wave is merged: it prints the plan (``git mv`` of each test module, with
the package it was placed by) and with ``--apply`` moves the files, adds the ``__init__.py`` files and
rewrites every ``tests.<old>`` import. Then run the whole suite.

Where a test module goes: the sidecar package it imports most (``inferwatch_sidecar.components.<name>``
counts as ``components/<name>``; the SDK's ``inferwatch`` as ``sdk``), so tests/drift/test_window.py
becomes tests/components/drift/test_window.py and tests/sidecar/test_config.py tests/config/test_config.py.
Modules that test no package (a tie, or none imported) stay; the SDK counts only for a module that imports
no sidecar package. These folders stay as they are, since they
test trees other than the sidecar's or hold shared parts: alerts, bench, dashboards, deploy, e2e, fixtures,
helpers, sdk. A folder's conftest.py and helper modules follow its test modules when all of them go to the
same place; otherwise they stay, and the plan says so.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
KEEP = {"alerts", "bench", "dashboards", "deploy", "e2e", "fixtures", "helpers", "sdk"}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "inferwatch":
        return "sdk"
    if parts[0] != "inferwatch_sidecar" or len(parts) < 2:
        return None
    if parts[1] == "components" and len(parts) > 2 and (ROOT / "sidecar" / "inferwatch_sidecar" / "components"
                                                          / parts[2]).is_dir():
        return f"components/{parts[2]}"
    return parts[1]


def target_dir(path: Path) -> str | None:
    """The folder (relative to tests/) a test module belongs in, or None to leave it."""
    rooms: Counter[str] = Counter()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        for n in names:
            r = _room(n)
            if r is not None:
                rooms[r] += 1
    if len(rooms) > 1:
        rooms.pop("sdk", None)  # sidecar tests feed it the SDK's wire records: the sidecar package is the subject
    top = rooms.most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def plan() -> tuple[dict[Path, Path], list[str]]:
    """``{old: new}`` for every file that moves, and notes on what stays and why."""
    moves: dict[Path, Path] = {}
    notes: list[str] = []
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in KEEP and p.name != "__pycache__"):
        targets = {}
        for f in sorted(folder.rglob("test_*.py")):
            t = target_dir(f)
            rel = f.relative_to(folder)
            if t is not None and Path(t) / rel != f.relative_to(TESTS):
                targets[f] = TESTS / t / rel
            elif t is None:
                notes.append(f"stays: {f.relative_to(ROOT)} (no single package it tests)")
        moves.update(targets)
        others = [f for f in folder.rglob("*.py") if not f.name.startswith("test_") and f.name != "__init__.py"]
        dests = {v.parent for k, v in targets.items()}
        tests_here = list(folder.rglob("test_*.py"))
        if others and len(dests) == 1 and len(targets) == len(tests_here):
            (dest,) = dests
            moves.update({f: dest / f.relative_to(folder) for f in others})
        elif others:
            notes.append(f"stay in {folder.relative_to(ROOT)}: {', '.join(sorted(f.name for f in others))} "
                         f"(its tests go to {len(dests)} folders, or some stay)")
    return moves, notes


def _dotted(p: Path) -> str:
    return ".".join(p.relative_to(ROOT).with_suffix("").parts)


def apply(moves: dict[Path, Path]) -> None:
    for old, new in moves.items():
        new.parent.mkdir(parents=True, exist_ok=True)
        for d in [new.parent, *new.parent.parents]:
            if d == TESTS.parent:
                break
            (d / "__init__.py").touch()
        subprocess.run(["git", "mv", str(old), str(new)], cwd=ROOT, check=True)
    renames = {_dotted(o): _dotted(n) for o, n in moves.items()}
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(renames, key=len, reverse=True)) + r")\b")
    for f in [*TESTS.rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        text = f.read_text(encoding="utf-8")
        new_text = pattern.sub(lambda m: renames[m.group(1)], text)
        if new_text != text:
            f.write_text(new_text, encoding="utf-8")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--apply", action="store_true", help="move the files and rewrite the imports")
    args = ap.parse_args(argv)
    moves, notes = plan()
    for old, new in sorted(moves.items()):
        print(f"git mv {old.relative_to(ROOT)} {new.relative_to(ROOT)}")
    for n in notes:
        print(f"# {n}")
    print(f"# {len(moves)} files move", file=sys.stderr)
    if args.apply:
        apply(moves)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

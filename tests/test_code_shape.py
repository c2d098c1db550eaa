"""Size ceilings of the code: no function over 80 lines, no module over 600 (issue 23).

Ruff has no rule for a function's length in lines (C901 and PLR0915 count branches and statements), so
this walks the syntax trees. A function's length runs from its ``def`` line to its last line, comments
included, its docstring and decorators not (a long argument reference is documentation, not logic). The
allow-lists name what was over the ceiling when the check came in; they only shrink: an entry that is
back under its ceiling, or gone, fails the test too, so whoever splits a function deletes its line here.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The trees checked (tests/ is not: a test's setup and its asserts read best in one place).
TREES = ("sdk", "sidecar", "alerts", "dashboards", "scripts", "bench", "examples", "deploy")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600

#: ``path::qualified name`` of the functions allowed over the ceiling, with the reason they are.
LONG_FUNCTIONS: dict[str, str] = {
    # Hot paths: one frame per event or request is the measured cost (bench/ingest.py,
    # bench/fastapi_overhead.py); a helper call per branch would add to it.
    "sidecar/inferwatch_sidecar/aggregate/aggregator.py::Aggregator.process": "hot path (i23c)",
    "sdk/inferwatch/_asgi.py::InferwatchMiddleware.__call__": "hot path, counted in instructions",
    # To split by their owners.
    "bench/soak.py::main": "benchmark driver, to split",
}

#: Modules allowed over the ceiling.
LONG_MODULES: dict[str, str] = {
}


def _sources() -> Iterator[Path]:
    for tree in TREES:
        yield from sorted((ROOT / tree).rglob("*.py"))


def _functions(path: Path) -> Iterator[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method in ``path``, nested ones included."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                first = child.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):
                    lines -= (first.end_lineno or first.lineno) - first.lineno + 1
                yield name, lines
                yield from visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, prefix + child.name + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_function_is_over_the_ceiling_unless_allowed() -> None:
    lengths = {f"{_rel(p)}::{name}": n for p in _sources() for name, n in _functions(p)}
    assert len(lengths) > 1000, "the walk found too few functions: is TREES right?"
    over = {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES and k not in LONG_FUNCTIONS}
    assert not over, (f"functions over {MAX_FUNCTION_LINES} lines (split them; the allow-list only shrinks): "
                      + ", ".join(f"{k} ({n})" for k, n in sorted(over.items())))
    stale = sorted(k for k in LONG_FUNCTIONS if lengths.get(k, 0) <= MAX_FUNCTION_LINES)
    assert not stale, f"remove from LONG_FUNCTIONS, now within {MAX_FUNCTION_LINES} lines or gone: {stale}"


def test_no_module_is_over_the_ceiling_unless_allowed() -> None:
    lengths = {_rel(p): len(p.read_text(encoding="utf-8").splitlines()) for p in _sources()}
    over = {k: n for k, n in lengths.items() if n > MAX_MODULE_LINES and k not in LONG_MODULES}
    assert not over, (f"modules over {MAX_MODULE_LINES} lines (split them; the allow-list only shrinks): "
                      + ", ".join(f"{k} ({n})" for k, n in sorted(over.items())))
    stale = sorted(k for k in LONG_MODULES if lengths.get(k, 0) <= MAX_MODULE_LINES)
    assert not stale, f"remove from LONG_MODULES, now within {MAX_MODULE_LINES} lines or gone: {stale}"


def test_the_walk_measures_what_it_claims(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("@dec\ndef f():\n    def g():\n        pass\n    return 1\n\n\nclass C:\n    async def h(self):\n"
                   "        '''doc\n\n        more'''\n        return 2\n")
    assert dict(_functions(src)) == {"f": 4, "f.<locals>.g": 2, "C.h": 2}


def test_the_complexity_exemptions_only_shrink() -> None:
    """Every file pyproject.toml exempts from ruff's C901 still holds a function over the ceiling."""
    import shutil
    import subprocess

    tomllib = pytest.importorskip("tomllib")
    # scripts/test runs the venv's python without activating it: ruff sits beside the interpreter there.
    beside = Path(sys.executable).with_name("ruff")
    ruff = str(beside) if beside.exists() else shutil.which("ruff")
    if ruff is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("ruff is neither beside the interpreter nor on PATH (scripts/test installs it)")
        pytest.skip("ruff is not on PATH")
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    limit = lint["mccabe"]["max-complexity"]
    exempt = sorted(p for p, rules in lint["per-file-ignores"].items() if "C901" in rules)
    assert exempt, "pyproject.toml exempts no file from C901: drop this test's premise, or the section moved"
    out = subprocess.run([ruff, "check", "--isolated", "--select", "C901", "--output-format", "concise",
                          "--config", f"lint.mccabe.max-complexity={limit}", *exempt],
                         cwd=ROOT, capture_output=True, text=True, check=False).stdout
    stale = [p for p in exempt if f"{p}:" not in out]
    assert not stale, f"no function over complexity {limit} left: remove their C901 exemption: {stale}"

"""The sidecar's imports follow the layering table of docs/architecture.md.

Every import of ``inferwatch_sidecar.*`` in every sidecar module, at module level or inside a function
(not under ``if TYPE_CHECKING:``), must point into its own package or a package in a lower row of the
table. A package missing from the table fails too, so a new package is placed on purpose.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PKG = ROOT / "sidecar" / "inferwatch_sidecar"
SDK = ROOT / "sdk" / "inferwatch"


def _layers() -> dict[str, int]:
    text = DOC.read_text()
    section = text[text.index("## Layering"):]
    out: dict[str, int] = {}
    for row in re.finditer(r"^\| (\d+) \| ([^|]+) \|", section, re.M):
        for name in re.findall(r"`([a-z_]+)`", row.group(2)):
            out[name] = int(row.group(1))
    assert len(out) > 5, "docs/architecture.md: the layering table is missing"
    return out


def _unit(module: str) -> str | None:
    """``inferwatch_sidecar.<unit>...`` -> unit (a package or a top-level module); None for the root and others."""
    parts = module.split(".")
    if parts[0] != "inferwatch_sidecar" or len(parts) < 2:
        return None
    return parts[1]


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for b in node.body for n in ast.walk(b)}
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_blocks(tree)
    package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    package = package.removesuffix(".__init__") if path.name == "__init__.py" else package.rsplit(".", 1)[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            if mod == "inferwatch_sidecar":  # from inferwatch_sidecar import daemon (not __version__)
                out += [(node.lineno, f"inferwatch_sidecar.{a.name}") for a in node.names
                        if (PKG / a.name).is_dir() or (PKG / f"{a.name}.py").is_file()]
    return out


def test_every_sidecar_package_has_a_layer() -> None:
    layers = _layers()
    units = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    missing = sorted(units - set(layers))
    assert not missing, f"docs/architecture.md's layering table does not place: {missing}"
    assert not sorted(set(layers) - units), "the layering table names packages that do not exist"


def test_imports_point_down_the_documented_layers() -> None:
    layers = _layers()
    bad: list[str] = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        src = rel.parts[0].removesuffix(".py")
        if src == "__init__":
            continue
        for line, mod in _imports(path):
            dst = _unit(mod)
            if dst is None or dst == src or dst == "__init__":
                continue
            if layers[dst] <= layers[src]:
                bad.append(f"{rel}:{line} imports {mod} ({src} is layer {layers[src]}, {dst} layer {layers[dst]})")
    assert not bad, "imports against docs/architecture.md's layering:\n" + "\n".join(bad)


def test_the_sdk_never_imports_the_sidecar_except_to_launch_its_cli() -> None:
    bad = []
    for path in sorted(SDK.rglob("*.py")):
        for line, mod in _imports_any(path):
            if mod.startswith("inferwatch_sidecar") and path.name != "_cli.py":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def _imports_any(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node.lineno, node.module))
    return out


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an aggregate module importing components is reported (the cycle issue 23 removed)."""
    layers = _layers()
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from inferwatch_sidecar.components.base import ComponentContext\n")
    (line, mod), = [(n, m) for n, m in _imports_any(probe) if m.startswith("inferwatch_sidecar")]
    dst = _unit(mod)
    assert dst == "components" and layers[dst] <= layers["aggregate"] and line == 2

"""README command 1 installs ``.[demo]`` only: every module the demo, the sidecar and ``top`` import at start
must come from the standard library or from the ``demo`` extra's dependencies (and theirs).

A fresh interpreter blocks every top-level module of an installed distribution outside that closure
(pandas, scikit-learn, Evidently, matplotlib, pytest, httpx, ...), then imports every module of the
sidecar package the demo runs; one that imported a package only the ``all`` or ``test`` extras bring
fails here rather than on a new user's first run. The install itself is measured on a fresh venv
(docs/demo.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
#: Modules that import an engine's own packages by design and run only in its venv (Triton, vLLM), or only
#: with another extra (report: Evidently; plot: matplotlib), lazily.
OTHER_ENGINES = ("inferwatch_sidecar.demo.triton_server", "inferwatch_sidecar.demo.vllm_engine")
#: The skew component reads and writes Parquet (pyarrow, the sidecar extra); it is off by default, the demo
#: never enables it, and the daemon imports a component only when its section is enabled.
SIDECAR_EXTRA_ONLY = "inferwatch_sidecar.components.skew"


def _closure(extra: str) -> set[str]:
    """Canonical names of every distribution ``inferwatch[extra]`` installs (as installed here)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    todo = [Requirement(r) for r in extras[extra]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name == "inferwatch":
            todo += [Requirement(r) for e in req.extras for r in extras[e]]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for r in map(Requirement, requires):
            env_extras = req.extras or {""}
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in env_extras):
                todo.append(r)
    return seen


def test_the_demo_extra_is_the_sidecar_extra_less_pyarrow_and_imports_everything_the_demo_runs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["demo"]) >= set(extras["sidecar"]) - {r for r in extras["sidecar"] if r.startswith("pyarrow")}
    allowed = _closure("demo")
    assert "pyarrow" not in allowed
    assert {"fastapi", "uvicorn", "rich", "numpy", "scipy", "prometheus-client"} <= allowed
    blocked = sorted({mod for mod, dists in metadata.packages_distributions().items()
                      if mod.isidentifier() and not mod.startswith("_")
                      and not any(re.sub(r"[-_.]+", "-", d).lower() in allowed for d in dists)
                      and mod not in sys.stdlib_module_names and mod not in ("inferwatch", "inferwatch_sidecar")})
    assert {"pandas", "sklearn", "evidently", "pytest", "matplotlib", "httpx"} <= set(blocked)
    modules = sorted(
        ".".join(p.relative_to(ROOT / "sidecar").with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "sidecar" / "inferwatch_sidecar").rglob("*.py"))
    modules = [m for m in modules if m not in OTHER_ENGINES and not m.endswith("__main__")
               and not m.startswith(SIDECAR_EXTRA_ONLY)]
    code = f"""
import importlib, importlib.abc, sys
BLOCKED = set({blocked!r})
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{{name}} is outside the demo extra", name=name)
        return None
sys.meta_path.insert(0, Block())
for m in {modules!r}:
    importlib.import_module(m)
from inferwatch_sidecar.cli import main
for cmd in ("demo", "top"):
    try:
        main([cmd, "--help"])
    except SystemExit as e:
        assert e.code == 0, e.code
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "usage: inferwatch top" in p.stdout

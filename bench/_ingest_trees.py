"""bench/ingest.py's baseline runner: another revision's SDK and sidecar in a tree of their own, and frames on disk.

A child process runs with a tree first on its path (:func:`tree_env`), so every module it imports
is that revision's own; :func:`tree_api` finds the decoder, aggregator and pipeline in whatever
layout the tree has. Split out of ``ingest.py`` (issue 23).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]



def baseline_tree(rev: str) -> Path | None:
    """The SDK and sidecar as they were at ``rev`` (``git archive``), in a temporary directory, or None.

    The whole tree, not single files: the layout moved since (``inferwatch._wire`` became
    ``inferwatch.wire``, ``pipeline.py`` went under ``ingest/``), and an old module imported
    next to today's packages picked up today's neighbours. A child process runs with the tree
    first on its path, so every module it imports is the revision's own.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f"iw-baseline-{rev}-"))
    try:
        arch = subprocess.run(["git", "archive", rev, "sdk", "sidecar"], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=arch.stdout, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        print(f"  (baseline {rev} not available from git: {err.decode(errors='replace').strip() or e}; "
              f"skipping the side-by-side columns)")
        return None
    build_compiled(rev, tmp)
    return tmp


def build_compiled(rev: str, tmp: Path) -> None:
    """Build the C parts the revision has (its ``setup.py``, issue 23 item 8) in place, so its columns time what its
    sidecar ran; a revision without them, or where the build fails, runs its Python loops (said when it fails)."""
    arch = subprocess.run(["git", "archive", rev, "setup.py", "pyproject.toml", "README.md"], cwd=REPO,
                          capture_output=True)
    if arch.returncode != 0:  # before setup.py: nothing to build
        return
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=arch.stdout, check=True)
    got = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp, capture_output=True,
                         text=True)
    if got.returncode != 0 or not any(tmp.glob("sidecar/**/*.so")):
        print(f"  (baseline {rev}: its C parts did not build, so it runs its Python loops: "
              f"{(got.stderr or got.stdout).strip()[-300:]})")


def tree_env(tree: Path | None) -> dict[str, str]:
    """The environment of a child that imports the SDK and sidecar from ``tree`` (None: this checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERWATCH_", "OTEL_"))}
    root = tree if tree is not None else REPO
    env["PYTHONPATH"] = os.pathsep.join([str(root / "sdk"), str(root / "sidecar")])
    return env


def tree_api() -> dict[str, Any]:
    """Decoder, aggregator, pipeline and component context of whatever tree is on the path (old layouts too)."""
    import importlib

    def first(*names: str) -> Any:
        for name in names:
            try:
                return importlib.import_module(name)
            except ImportError:
                continue
        raise ImportError(f"none of {names}")

    wire = first("inferwatch.wire", "inferwatch._wire")
    try:  # the sidecar's compiled wire loop (issue 23), where the tree has it and it was built
        from inferwatch_sidecar.ingest import fastwire

        loop = fastwire.compiled()
    except ImportError:
        loop = None
    return {
        "loop": loop,
        "Decoder": wire.Decoder,
        "Aggregator": first("inferwatch_sidecar.aggregate.aggregator", "inferwatch_sidecar.aggregate").Aggregator,
        "Pipeline": first("inferwatch_sidecar.ingest.pipeline", "inferwatch_sidecar.pipeline").Pipeline,
        "ComponentContext": first("inferwatch_sidecar.components.base", "inferwatch_sidecar.component").ComponentContext,
    }


def write_frames(frames: list[bytes]) -> str:
    fd, path = tempfile.mkstemp(prefix="iw-frames-")
    with os.fdopen(fd, "wb") as f:
        for fr in frames:
            f.write(len(fr).to_bytes(4, "little") + fr)
    return path


def read_frames(path: str) -> list[bytes]:
    data = Path(path).read_bytes()
    out, off = [], 0
    while off < len(data):
        n = int.from_bytes(data[off:off + 4], "little")
        out.append(data[off + 4:off + 4 + n])
        off += 4 + n
    return out

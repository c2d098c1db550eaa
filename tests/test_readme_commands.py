"""The README's command table lists every command the CLI has, and nothing it does not have."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _commands(parser: argparse.ArgumentParser, prefix: str = "inferwatch") -> set[str]:
    """Every leaf command, as typed (``inferwatch gpu analyze``)."""
    out: set[str] = set()
    for action in parser._actions:  # argparse keeps its sub-parsers here only
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out |= _commands(sub, f"{prefix} {name}") or {f"{prefix} {name}"}
    return out


def test_the_readme_table_lists_every_command() -> None:
    from inferwatch_sidecar.cli import build_parser

    commands = _commands(build_parser())
    assert len(commands) >= 9, commands
    rows = re.findall(r"^\| `(inferwatch [a-z][a-z -]*?)(?: [A-Z-]|`)", README.read_text(), re.M)
    listed = {r.strip() for r in rows}
    missing = {c for c in commands if not any(c == r or r.startswith(c + " ") or c.startswith(r + " ")
                                              for r in listed)}
    assert not missing, f"commands the README's table does not list: {sorted(missing)}"
    unknown = {r for r in listed if not any(r == c or c.startswith(r + " ") or r.startswith(c + " ")
                                            for c in commands)}
    assert not unknown, f"README rows naming no command: {sorted(unknown)}"

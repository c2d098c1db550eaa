"""docs/skew.md's worked example (the window edge on the Grunfeld panel) runs and prints what the page shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from inferwatch_sidecar.cli import main
from tests.helpers.paths import REPO

DOC = REPO / "docs" / "skew.md"


def test_the_worked_example_prints_what_the_page_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    text = DOC.read_text()
    example = text[text.index("## Worked example"):text.index("## Live")]
    (code,) = re.findall(r"```python\n(.*?)```", example, re.S)
    sessions = re.findall(r"^```\n(\$ inferwatch skew.*?)^```", example, re.S | re.M)
    assert len(sessions) == 2
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/skew.md", "exec"), {})
    for block in sessions:
        lines = block.rstrip("\n").split("\n")
        argv = shlex.split(lines[0][2:])[1:]
        want_rc = int(lines[lines.index("$ echo $?") + 1]) if "$ echo $?" in lines else 0
        shown = [ln for ln in lines[1:] if not ln.startswith("$ ") and not ln.startswith("inferwatch skew:")
                 and not ln.isdigit()]
        assert main(argv) == want_rc
        out, err = capsys.readouterr()
        assert [ln.rstrip() for ln in out.rstrip("\n").split("\n")] == shown
        for ln in lines:
            if ln.startswith("inferwatch skew:"):
                assert ln in err.splitlines()

"""Headless Chromium for the tests that load the sidecar's HTML (Debian's ``chromium``; scripts/test installs it)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        msg = "chromium is not on PATH (install Debian's 'chromium' package; scripts/test does)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


class Dom(HTMLParser):
    """The page's tables (``data-table``) as rows of ``{field: (raw, text)}``, and every element's tag."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[dict[str, tuple[str | None, str]]]] = {}
        self.tags: list[str] = []
        self.ids: dict[str, str] = {}
        self.title = ""
        self._table: str | None = None
        self._cell: tuple[str, str | None] | None = None
        self._text: list[str] = []
        self._id: str | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "title":
            self._in_title = True
        if tag == "table" and a.get("data-table"):
            self._table = a["data-table"]
            self.tables.setdefault(self._table, [])
        elif tag == "tr" and self._table and a.get("data-row"):
            self.tables[self._table].append({})
        elif tag == "td" and self._table and a.get("data-field"):
            self._cell = (a["data-field"] or "", a.get("data-raw"))
            self._text = []
        if a.get("id", "").startswith("h-"):
            self._id, self._text = a["id"], []

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag == "td" and self._cell is not None and self._table:
            field, raw = self._cell
            self.tables[self._table][-1][field] = (raw, "".join(self._text))
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "b" and self._id:
            self.ids[self._id] = "".join(self._text)
            self._id = None

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        self._text.append(data)


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120,
    )


class SummaryBand(HTMLParser):
    """The summary band's verdicts (their data attributes, text and runbook link) and the stats line."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.verdicts: list[dict[str, Any]] = []
        self.stats: dict[str, str] = {}
        self.probe = ""
        self._stat: str | None = None
        self._in_probe = False
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "li" and "verdict" in (a.get("class") or "").split():
            self.verdicts.append({"attrs": a, "text": "", "runbook": None, "since": None, "since_source": None})
            self._depth = 1
        elif self._depth:
            self._depth += 1
            if tag == "a":
                self.verdicts[-1]["runbook"] = a.get("href")
            if a.get("data-since"):
                self.verdicts[-1]["since"] = a["data-since"]
                self.verdicts[-1]["since_source"] = a.get("data-since-source")
        if tag == "li" and a.get("data-stat"):
            self._stat = a["data-stat"]
            self.stats[self._stat] = ""
        if tag == "pre" and a.get("id") == "probe":
            self._in_probe = True

    def handle_endtag(self, tag: str) -> None:
        if self._depth:
            self._depth -= 1
        if tag == "li":
            self._stat = None
        if tag == "pre":
            self._in_probe = False

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.verdicts[-1]["text"] += data
        if self._stat:
            self.stats[self._stat] += data
        if self._in_probe:
            self.probe += data

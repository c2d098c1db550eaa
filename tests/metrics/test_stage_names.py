"""One name for the ingress stage everywhere: the SDK's, in the catalog, the docs, the dashboards and the alerts."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from inferwatch import InferwatchMiddleware
from inferwatch_sidecar.components.registry import CATALOG
from inferwatch_sidecar.metrics.core import STAGE_DURATION_SECONDS

REPO = Path(__file__).resolve().parents[2]
#: The usual stage list ("ingress, queue, preprocess, ..."), with or without backticks: its first name.
_STAGE_LIST = re.compile(r"[`'\"]?(\w+)[`'\"]?,\s*[`'\"]?queue[`'\"]?,\s*[`'\"]?preprocess\b")


def _ingress() -> str:
    default = inspect.signature(InferwatchMiddleware).parameters["ingress_stage"].default
    assert isinstance(default, str)
    return default


def _texts() -> dict[str, str]:
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "dashboards").glob("*.json"),
             *(REPO / "dashboards" / "src").glob("*.py"), *(REPO / "alerts").glob("*.yml"),
             *(REPO / "alerts").glob("*.py")]
    out = {str(f.relative_to(REPO)): f.read_text() for f in files}
    out["metrics catalog"] = "\n".join(m.help for m in CATALOG.all_metrics())
    return out


def test_the_stage_metric_help_names_the_sdk_ingress_stage() -> None:
    assert _ingress() == "ingress"
    assert STAGE_DURATION_SECONDS.help.startswith(f"Latency of one stage ({_ingress()}, queue, preprocess, ")


def test_every_listing_of_the_stages_starts_with_the_sdk_ingress_stage() -> None:
    texts = _texts()
    listings = {(where, m.group(1)) for where, text in texts.items() for m in _STAGE_LIST.finditer(text)}
    # The catalog, the metrics reference generated from it and the runbooks list the stages.
    assert {"metrics catalog", "docs/metrics.md", "docs/runbooks.md"} <= {where for where, _ in listings}
    assert {(where, name) for where, name in listings if name != _ingress()} == set()


def test_no_text_names_an_access_stage() -> None:
    found = {where for where, text in _texts().items() if re.search(r"`access`|stage[s]? \W?access\b", text)}
    assert found == set()

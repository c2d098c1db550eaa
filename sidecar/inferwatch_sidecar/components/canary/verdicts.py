"""The canary judge's bad-now rows for the status summary (``export/summary.py``), from its ``/v1/status`` section.

Declared in ``components/registry.py``. Since when: the time the judgement's verdict turned to what it is
(``verdict_since_unix``), the judge's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from inferwatch_sidecar.export.summary import num, verdict


def verdicts(c: Mapping[str, Any], now: float) -> Iterator[dict[str, Any]]:
    """Each canary judged ``fail`` (bad) or ``marginal`` (warn), naming the metrics that fail and why it may mislead."""
    for j in c.get("judgements") or []:
        v = j.get("verdict")
        if v not in ("fail", "marginal"):
            continue
        failed = [m.get("name", "?") + (f"[{m['stage']}]" if m.get("stage") else "")
                  for m in j.get("metrics") or [] if m.get("result") == "fail"]
        detail = f"score {(num(j.get('score')) or 0):.0f}/100; failing: {', '.join(failed) or '-'}"
        if j.get("warnings"):
            detail += "; " + "; ".join(str(w) for w in j["warnings"])
        yield verdict("canary", f"{j.get('model')} {j.get('canary_version')} vs {j.get('baseline_version')}", v,
                      "bad" if v == "fail" else "warn", detail, "InferwatchCanaryFailing",
                      j.get("verdict_since_unix"))

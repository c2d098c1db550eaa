"""``inferwatch canary --sidecar URL``: print the canary judge's verdicts from a running sidecar.

It reads ``components.canary`` of the sidecar's ``/v1/status`` (no token needed)
and prints, per canary version, the verdict, the score and every judged metric.
Exit status: 0 when no canary fails, 1 when one does (so a deploy pipeline can
gate on it), 2 when the sidecar cannot be read or runs no canary judge.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``canary`` to the ``inferwatch`` CLI."""
    p = subparsers.add_parser(
        "canary", help="print the canary judge's verdicts from a running sidecar",
        description="Read /v1/status of a sidecar and print each canary version's judgement against the stable "
                    "version: verdict (pass, marginal, fail), score, and every metric with its tolerance. Exit "
                    "status 1 when a canary fails.",
    )
    p.add_argument("--sidecar", required=True, metavar="URL", help="the sidecar's HTTP address, e.g. http://pod:9464")
    p.add_argument("--model", help="only this model")
    p.add_argument("--json", action="store_true", help="print the judgements as JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the sidecar (default 5)")
    p.set_defaults(func=_cmd_canary)


def _fetch(url: str, timeout: float) -> dict[str, Any]:
    with urllib.request.urlopen(url.rstrip("/") + "/v1/status", timeout=timeout) as r:  # noqa: S310 - an operator's URL
        doc = json.load(r)
    if not isinstance(doc, dict):
        raise ValueError("/v1/status is not a JSON object")
    return doc


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


def _print(judgements: list[dict[str, Any]], out: Any) -> None:
    for j in judgements:
        out.write(f"{j['model']} ({j['service']}): {j['canary_version']} against stable {j['baseline_version']}: "
                  f"{j['verdict'].upper()}, score {j['score']:.0f}/100 "
                  f"({j['canary_requests']} vs {j['baseline_requests']} requests)\n")
        rows = [("metric", "statistic", "unit", "direction", "stable", "canary", "effect", "tolerance", "adj. p",
                 "result")]
        for m in j["metrics"]:
            label = m["name"] if m["stage"] is None else f"{m['name']}[{m['stage']}]"
            if m["critical"]:
                label += " *"
            rows.append((label, m.get("statistic", ""), m.get("unit", ""), m["direction"], _num(m["baseline"]),
                         _num(m["canary"]),
                         f"{m['effect_name']} {_num(m['effect'])}", _num(m["tolerance"]), _num(m["p_adjusted"]),
                         m["result"]))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            out.write("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
        for reason in j["reasons"]:
            out.write(f"  why: {reason}\n")
        for warning in j.get("warnings", []):
            out.write(f"  warning: {warning}\n")
        out.write("\n")
    out.write("* critical: its failure fails the canary whatever the score\n" if judgements else
              "no canary to judge: every model has one version with enough requests in the window\n")


def _cmd_canary(args: argparse.Namespace) -> int:
    try:
        doc = _fetch(args.sidecar, args.timeout)
    except (OSError, urllib.error.URLError, ValueError) as e:
        print(f"inferwatch canary: cannot read {args.sidecar}/v1/status: {e}", file=sys.stderr)
        return 2
    comp = doc.get("components", {}).get("canary")
    if not isinstance(comp, dict) or comp.get("state") != "running":
        state = comp.get("state") if isinstance(comp, dict) else "absent"
        print(f"inferwatch canary: the sidecar's canary judge is {state} (enable it with canary.enabled: true)",
              file=sys.stderr)
        return 2
    judgements = [j for j in comp.get("judgements", []) if args.model in (None, j["model"])]
    if args.json:
        json.dump(judgements, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        _print(judgements, sys.stdout)
    return 1 if any(j["verdict"] == "fail" for j in judgements) else 0

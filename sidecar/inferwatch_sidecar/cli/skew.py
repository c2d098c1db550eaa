"""``inferwatch skew``: join served feature rows with the offline pipeline's rows and name each feature's skew.

Registering is cheap; numpy and pyarrow are imported inside the handler.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: Exit status for input the command cannot use (missing key column, duplicate keys, ...).
EXIT_BAD_INPUT = 2


def _ratio(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {v}")
    return v


def register(subparsers: Any) -> None:
    """Add ``skew`` to the ``inferwatch`` CLI."""
    p = subparsers.add_parser(
        "skew", help="training-serving skew: served features against the offline pipeline's, row by row",
        description="Join the served feature rows with the rows the training pipeline computes for the same "
                    "requests (on --key), and report for every feature in both the share of rows that match and "
                    "the kind of disagreement: offset, scale, affine, lag (with --order, and --entity for panel "
                    "data), swapped, mapping, default_filled, missing_in_served or mismatch, each with the share "
                    "of rows it explains, plus the distribution distance. See docs/skew.md. Exit status 0; 1 "
                    "with --fail-on-skew when a feature's match ratio is below the threshold; 2 on input it "
                    "cannot use.",
    )
    p.add_argument("--served", required=True, metavar="PATH",
                   help="served rows: a CSV or Parquet file, or a folder of them (the sidecar's skew.served_dir)")
    p.add_argument("--offline", required=True, metavar="PATH",
                   help="the offline pipeline's rows for the same requests: CSV or Parquet, file or folder")
    p.add_argument("--key", required=True, metavar="COL", help="the column both identify a request by (unique)")
    p.add_argument("--entity", metavar="COL", help="the offline column naming a series, for lag (needs --order)")
    p.add_argument("--order", metavar="COL", help="the offline column ordering a series (a time), for lag")
    p.add_argument("--features", action="append", metavar="COLS",
                   help="compare only these features (comma-separated, repeatable; default: every shared column)")
    p.add_argument("--rtol", type=float, default=1e-6, help="relative tolerance of a float match (default 1e-6)")
    p.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance of a float match (default 1e-9)")
    p.add_argument("--max-lag", type=int, default=3, metavar="N", help="lags tried, -N..N rows (default 3)")
    p.add_argument("--fail-on-skew", nargs="?", type=_ratio, const=0.99, default=None, metavar="MIN_MATCH",
                   help="exit 1 when a feature's match ratio is below MIN_MATCH (default 0.99)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the JSON report to FILE")
    p.set_defaults(func=_cmd_skew)


def _fmt_detail(f: dict[str, Any]) -> str:
    d = f["detail"]
    kind = f["kind"]
    if kind == "offset":
        return f"served = offline {d['offset']:+.6g}"
    if kind == "scale":
        return f"served = {d['scale']:.6g} x offline"
    if kind == "affine":
        return f"served = {d['scale']:.6g} x offline {d['offset']:+.6g}"
    if kind == "lag":
        return f"served = offline {abs(d['lag'])} row(s) {'earlier' if d['lag'] > 0 else 'later'}"
    if kind == "swapped":
        return f"served holds {d['with']}" + (" (exchanged)" if d["symmetric"] else "")
    if kind == "mapping":
        items = list(d["mapping"].items())
        return ", ".join(f"{k}->{v}" for k, v in items[:4]) + (" ..." if len(items) > 4 else "")
    if kind == "default_filled":
        return f"served holds {d['default']!r}"
    if kind == "mismatch" and "closest" in d:
        return f"closest: {d['closest']['kind']} ({d['closest']['explained_ratio']:.1%})"
    return ""


def _print_table(report: dict[str, Any]) -> None:
    print(f"rows joined: {report['rows_joined']} (served {report['rows_served']}, offline {report['rows_offline']})")
    feats = report["features"]
    width = max([len(n) for n in feats] + [7])
    print(f"{'feature':<{width}}  {'match':>7}  {'kind':<17}  {'explains':>8}  {'distance':>9}  detail")
    for name, f in feats.items():
        dist = next(iter(f["detail"]["distance"].values()))
        dist_s = "-" if dist is None else f"{dist:.4f}"
        print(f"{name:<{width}}  {f['match_ratio']:>7.2%}  {f['kind']:<17}  {f['explained_ratio']:>8.2%}  "
              f"{dist_s:>9}  {_fmt_detail(f)}")
    for what in ("only_in_served", "only_in_offline"):
        if report.get(what):
            print(f"{what.replace('_', ' ')}: {', '.join(report[what])}")
    for name, why in report.get("not_compared", {}).items():
        print(f"not compared: {name}: {why}")


def _cmd_skew(args: argparse.Namespace) -> int:
    from inferwatch_sidecar.components.skew.diagnose import Options, diagnose, skewed
    from inferwatch_sidecar.components.skew.tables import SkewInputError, read_table

    feats = [x.strip() for v in args.features or [] for x in v.split(",") if x.strip()] or None
    text_cols = [args.key] + [c for c in (args.entity,) if c]
    try:
        opt = Options(rtol=args.rtol, atol=args.atol, max_lag=args.max_lag)
        served = read_table(args.served, text_cols)
        offline = read_table(args.offline, text_cols)
        report = diagnose(served, offline, args.key, entity=args.entity, order=args.order, features=feats,
                          options=opt)
    except SkewInputError as e:
        print(f"inferwatch skew: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    text = json.dumps(report, indent=1, allow_nan=False)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    if args.json:
        print(text)
    else:
        _print_table(report)
    if args.fail_on_skew is not None:
        bad = skewed(report, args.fail_on_skew)
        if bad:
            print(f"inferwatch skew: match ratio below {args.fail_on_skew} for: {', '.join(bad)}", file=sys.stderr)
            return 1
    return 0

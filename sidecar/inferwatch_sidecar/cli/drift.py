"""``inferwatch reference build``, ``inferwatch drift compare`` and ``inferwatch report``.

Registering is cheap; numpy, scipy and the readers are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _csv_list(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


def _add_typing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--categorical", action="append", metavar="COLS",
                   help="treat these columns as categorical (comma-separated, repeatable)")
    p.add_argument("--numeric", action="append", metavar="COLS",
                   help="treat these columns as numeric (comma-separated, repeatable)")
    p.add_argument("--max-discrete", type=int, default=10, metavar="N",
                   help="integer columns with at most N distinct values are categorical (default 10)")


def _add_decision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=float, default=0.05, help="false-discovery rate across tests (default 0.05)")
    p.add_argument("--correction", choices=["bh", "none"], default="bh",
                   help="multiple-testing correction (default bh: Benjamini-Hochberg)")
    p.add_argument("--numeric-effect-floor", type=float, default=0.1,
                   help="minimum normalized Wasserstein distance to flag a numeric column (default 0.1)")
    p.add_argument("--categorical-effect-floor", type=float, default=0.1,
                   help="minimum PSI to flag a categorical column (default 0.1)")
    p.add_argument("--min-samples", type=int, default=100, help="fewer current values: reported, never flagged")


def register(subparsers: Any) -> None:
    """Add ``reference``, ``drift`` and ``report`` to the ``inferwatch`` CLI."""
    ref = subparsers.add_parser("reference", help="build drift reference profiles")
    ref_sub = ref.add_subparsers(dest="reference_command", metavar="ACTION")
    b = ref_sub.add_parser(
        "build", help="build a reference profile from a data file",
        description="Summarize a CSV, Parquet or .npz file into a versioned JSON reference profile: percentile "
                    "bins for numeric columns, top-K categories for categorical ones, missing rates.",
    )
    b.add_argument("data", metavar="DATA", help="CSV, Parquet or .npz file")
    b.add_argument("-o", "--output", required=True, metavar="PROFILE", help="where to write the profile (JSON)")
    b.add_argument("--features", action="append", metavar="COLS",
                   help="only these feature columns (comma-separated; default: every column)")
    b.add_argument("--prediction", metavar="COL", help="the model's prediction column")
    b.add_argument("--confidence", metavar="COL", help="the model's confidence column (numeric)")
    b.add_argument("--bins", type=int, default=100, help="percentile bins per numeric column (default 100)")
    b.add_argument("--top-k", type=int, default=32, help="categories kept per categorical column (default 32)")
    _add_typing(b)
    b.set_defaults(func=_cmd_reference_build)
    ref.set_defaults(func=lambda a: (ref.print_help(), 2)[1])

    d = subparsers.add_parser("drift", help="offline drift comparison")
    d_sub = d.add_subparsers(dest="drift_command", metavar="ACTION")
    c = d_sub.add_parser(
        "compare", help="compare two data files with the sidecar's drift engine",
        description="Run the streaming engine's tests on a current data file against a reference file (or a "
                    "profile). Exit status 0, or 1 with --fail-on-drift when the dataset drifted.",
    )
    c.add_argument("--reference", metavar="FILE", help="reference data (CSV, Parquet, .npz)")
    c.add_argument("--current", required=True, metavar="FILE", help="current data (CSV, Parquet, .npz)")
    c.add_argument("--profile", metavar="PROFILE", help="use this reference profile instead of --reference")
    c.add_argument("--features", action="append", metavar="COLS", help="only these columns (comma-separated)")
    c.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    c.add_argument("--fail-on-drift", action="store_true", help="exit 1 when dataset_drift is true")
    _add_typing(c)
    _add_decision(c)
    c.set_defaults(func=_cmd_compare)
    d.set_defaults(func=lambda a: (d.print_help(), 2)[1])

    r = subparsers.add_parser(
        "report", help="write an Evidently HTML drift report (needs the 'report' extra)",
        description="Deep-dive HTML report by Evidently, of two files or of a running sidecar's window "
                    "(from its admin endpoint). Needs: pip install \"inferwatch[report]\".",
    )
    r.add_argument("--reference", metavar="FILE", help="reference data file")
    r.add_argument("--current", metavar="FILE", help="current data file")
    r.add_argument("--sidecar", metavar="URL", help="fetch the report from a sidecar (e.g. http://127.0.0.1:9464)")
    r.add_argument("--token", metavar="TOKEN", help="admin token for --sidecar (default: $INFERWATCH_ADMIN_TOKEN)")
    r.add_argument("--model", help="with --sidecar: model to report on")
    r.add_argument("--model-version", "--version", dest="model_version",
                   help="with --sidecar: model version (the model_version label)")
    r.add_argument("-o", "--output", required=True, metavar="HTML", help="where to write the report")
    r.add_argument("--max-rows", type=int, default=50000, help="rows sampled from each file (default 50000)")
    _add_typing(r)
    r.set_defaults(func=_cmd_report)


def _settings(args: argparse.Namespace) -> Any:
    from inferwatch_sidecar.components.drift.engine import Settings

    return Settings(alpha=args.alpha, correction=args.correction, numeric_effect_floor=args.numeric_effect_floor,
                    categorical_effect_floor=args.categorical_effect_floor, min_samples=args.min_samples)


def _err(msg: str) -> int:
    print(f"inferwatch: error: {msg}", file=sys.stderr)
    return 2


def _cmd_reference_build(args: argparse.Namespace) -> int:
    from inferwatch_sidecar.components.drift import profile as prof
    from inferwatch_sidecar.components.drift.dataio import DataError, read_table

    feats = _csv_list(args.features)
    wanted = None
    if feats:
        wanted = [*feats, *[c for c in (args.prediction, args.confidence) if c and c not in feats]]
    try:
        t = read_table(args.data, categorical=_csv_list(args.categorical), numeric=_csv_list(args.numeric),
                       columns=wanted, max_discrete=args.max_discrete)
        for col in (args.prediction, args.confidence):
            if col and col not in t.order:
                raise DataError(f"{args.data}: column {col!r} not found (columns: {', '.join(t.order)})")
        if args.confidence and args.confidence not in t.numeric:
            raise DataError(f"{args.data}: confidence column {args.confidence!r} is not numeric")
        p = prof.build(t.numeric, t.categorical, prediction=args.prediction, confidence=args.confidence,
                       bins=args.bins, top_k=args.top_k, source=args.data, order=t.order)
        p.save(args.output)
    except (DataError, prof.ProfileError) as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"cannot write {args.output}: {e.strerror or e}")
    n_num = sum(1 for c in p.columns.values() if c.kind == "numeric")
    print(f"wrote {args.output}: {len(p.columns)} columns ({n_num} numeric, {len(p.columns) - n_num} categorical) "
          f"from {t.rows} rows", file=sys.stderr)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from inferwatch_sidecar.components.drift import engine
    from inferwatch_sidecar.components.drift import profile as prof
    from inferwatch_sidecar.components.drift.dataio import DataError, read_table

    if not args.reference and not args.profile:
        return _err("give --reference FILE or --profile PROFILE")
    feats = _csv_list(args.features) or None
    cats, nums = _csv_list(args.categorical), _csv_list(args.numeric)
    try:
        if args.profile:
            p = prof.load(args.profile)
            if feats:
                p.columns = {k: v for k, v in p.columns.items() if k in feats}
        else:
            rt = read_table(args.reference, categorical=cats, numeric=nums, columns=feats,
                            max_discrete=args.max_discrete)
            p = prof.build(rt.numeric, rt.categorical, source=args.reference, order=rt.order)
        # The current file's inferred kinds do not matter: each column is converted to its
        # reference kind (compare_columns), so inference cannot disagree with the reference.
        ct = read_table(args.current, max_discrete=args.max_discrete)
        absent = [n for n in p.columns if n not in ct.order]
        if len(absent) == len(p.columns):
            raise DataError(f"{args.current}: none of the reference columns are present")
        ev = engine.compare_columns(p, ct.numeric, ct.categorical, _settings(args))
    except (DataError, prof.ProfileError) as e:
        return _err(str(e))
    out = ev.to_json()
    out["missing_columns"] = absent
    if args.json:
        json.dump(out, sys.stdout, indent=1, allow_nan=False, default=_json_default)
        sys.stdout.write("\n")
    else:
        _print_table(ev, absent)
    return 1 if args.fail_on_drift and ev.dataset_drift else 0


def _json_default(o: Any) -> Any:
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}"


def _print_table(ev: Any, absent: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="drift", show_lines=False)
    for h in ("feature", "test", "statistic", "p (adj.)", "effect", "missing ref/cur", "n", "drifted"):
        t.add_column(h)
    for r in ev.results:
        t.add_row(
            r.feature + ("" if r.role == "feature" else f" ({r.role})"), r.test, _fmt(r.statistic),
            f"{_fmt(r.p_value)} ({_fmt(r.p_adjusted)})", f"{r.effect_name}={_fmt(r.effect)}",
            f"{r.missing_reference:.1%}/{r.missing_current:.1%}", str(r.n_current),
            "[bold red]yes[/]" if r.drifted else ("too few" if r.status != "ok" else "no"),
        )
    con = Console()
    con.print(t)
    for r in ev.results:
        if r.unseen:
            con.print(f"{r.feature}: unseen categories {dict(sorted(r.unseen.items()))}")
    if absent:
        con.print(f"not in the current data: {', '.join(absent)}")
    con.print(f"dataset drift: {'yes' if ev.dataset_drift else 'no'} "
              f"({ev.n_drifted} of {ev.n_features} features drifted)")


def _cmd_report(args: argparse.Namespace) -> int:
    from inferwatch_sidecar.components.drift import report

    try:
        if args.sidecar:
            body = report.fetch_from_sidecar(args.sidecar, args.token, args.model, args.model_version)
        else:
            if not (args.reference and args.current):
                return _err("give --reference and --current files, or --sidecar URL")
            body = report.report_for_files(args.reference, args.current, categorical=_csv_list(args.categorical),
                                           numeric=_csv_list(args.numeric), max_rows=args.max_rows)
    except report.ReportError as e:
        return _err(str(e))
    try:
        with open(args.output, "wb") as f:
            f.write(body)
    except OSError as e:
        return _err(f"cannot write {args.output}: {e.strerror or e}")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0

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


def _add_performance(p: argparse.ArgumentParser, where: str) -> None:
    p.add_argument("--label", metavar="COL",
                   help=f"the ground-truth column of {where}: calibrates the label-free accuracy estimate "
                        "(needs --prediction and --confidence; the column is not profiled as a feature)")
    p.add_argument("--positive-class", metavar="VALUE",
                   help="with --label on a binary model: the positive class (default 1 or true, else the last class)")


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
    _add_performance(b, "DATA")
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
    c.add_argument("--prediction", metavar="COL", help="the model's prediction column (in both files)")
    c.add_argument("--confidence", metavar="COL", help="the model's confidence column (in both files)")
    _add_performance(c, "the reference")
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
    r.add_argument("--token", metavar="TOKEN",
                   help="admin token for --sidecar; visible to every user in ps, so prefer $INFERWATCH_ADMIN_TOKEN "
                   "or --token-file")
    r.add_argument("--token-file", metavar="FILE",
                   help="read the admin token for --sidecar from FILE (first line), instead of the command line")
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
    from inferwatch_sidecar.offline.drift.dataio import DataError, read_table

    if args.label and not (args.prediction and args.confidence):
        return _err("--label needs --prediction and --confidence: the calibration relates them to the label")
    feats = _csv_list(args.features)
    wanted = None
    if feats:
        wanted = [*feats, *[c for c in (args.prediction, args.confidence, args.label) if c and c not in feats]]
    try:
        t = read_table(args.data, categorical=_csv_list(args.categorical), numeric=_csv_list(args.numeric),
                       columns=wanted, max_discrete=args.max_discrete)
        for col in (args.prediction, args.confidence, args.label):
            if col and col not in t.order:
                raise DataError(f"{args.data}: column {col!r} not found (columns: {', '.join(t.order)})")
        if args.confidence and args.confidence not in t.numeric:
            raise DataError(f"{args.data}: confidence column {args.confidence!r} is not numeric")
        labels = _pop_column(t, args.label) if args.label else None
        p = prof.build(t.numeric, t.categorical, prediction=args.prediction, confidence=args.confidence,
                       bins=args.bins, top_k=args.top_k, source=args.data, order=t.order)
        if labels is not None:
            p.performance = _fit_performance(t, args, labels)
        p.save(args.output)
    except (DataError, prof.ProfileError) as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"cannot write {args.output}: {e.strerror or e}")
    n_num = sum(1 for c in p.columns.values() if c.kind == "numeric")
    print(f"wrote {args.output}: {len(p.columns)} columns ({n_num} numeric, {len(p.columns) - n_num} categorical) "
          f"from {t.rows} rows", file=sys.stderr)
    mv = p.multivariate
    print(f"joint drift model: {mv.dims} encoded inputs of {len(mv.columns)} features, {mv.principal} principal "
          f"components ({mv.explained:.0%} of the variance), {mv.errors.count} held-out errors" if mv is not None
          else "no joint drift model (it needs 2 usable feature dimensions and 200 rows)", file=sys.stderr)
    if p.performance is not None:
        perf = p.performance
        print(f"calibration: {perf.calibration.method} ({perf.calibration.score}) on {perf.rows} labelled rows, "
              f"reference accuracy {perf.reference_accuracy:.4f}", file=sys.stderr)
    elif args.confidence:
        print("no --label: the accuracy estimate will be the uncalibrated mean confidence", file=sys.stderr)
    return 0


def _pop_column(t: Any, name: str) -> list[Any]:
    """Take the label column out of the table (it is not a feature: live traffic has none)."""
    t.order.remove(name)
    if name in t.numeric:
        return list(t.numeric.pop(name))
    return t.categorical.pop(name)


def _column(t: Any, name: str) -> Any:
    return t.numeric[name] if name in t.numeric else t.categorical[name]


def _fit_performance(t: Any, args: argparse.Namespace, labels: list[Any]) -> Any:
    from inferwatch_sidecar.components.drift import performance

    return performance.fit(_column(t, args.prediction), t.numeric[args.confidence], labels, label=args.label,
                           positive=args.positive_class)


def _cmd_compare(args: argparse.Namespace) -> int:
    from inferwatch_sidecar.components.drift import engine
    from inferwatch_sidecar.components.drift import profile as prof
    from inferwatch_sidecar.offline.drift.dataio import DataError, read_table

    if not args.reference and not args.profile:
        return _err("give --reference FILE or --profile PROFILE")
    if args.label and (args.profile or not (args.prediction and args.confidence)):
        return _err("--label calibrates a --reference file and needs --prediction and --confidence "
                    "(a --profile carries its calibration)")
    feats = _csv_list(args.features) or None
    roles = [c for c in (args.prediction, args.confidence) if c]
    cats, nums = _csv_list(args.categorical), _csv_list(args.numeric)
    try:
        if args.profile:
            p = prof.load(args.profile)
            if feats:
                p.columns = {k: v for k, v in p.columns.items() if k in feats or k in roles}
                if p.multivariate is not None and not set(p.multivariate.columns) <= set(p.columns):
                    p.multivariate = None  # the joint model reads columns left out: no joint test
        else:
            wanted = [*feats, *[c for c in (*roles, args.label) if c and c not in feats]] if feats else None
            rt = read_table(args.reference, categorical=cats, numeric=nums, columns=wanted,
                            max_discrete=args.max_discrete)
            for col in (*roles, args.label):
                if col and col not in rt.order:
                    raise DataError(f"{args.reference}: column {col!r} not found (columns: {', '.join(rt.order)})")
            if args.confidence and args.confidence not in rt.numeric:
                raise DataError(f"{args.reference}: confidence column {args.confidence!r} is not numeric")
            labels = _pop_column(rt, args.label) if args.label else None
            p = prof.build(rt.numeric, rt.categorical, prediction=args.prediction, confidence=args.confidence,
                           source=args.reference, order=rt.order)
            if labels is not None:
                p.performance = _fit_performance(rt, args, labels)
        # The current file's inferred kinds do not matter: each column is converted to its
        # reference kind (compare_columns), so inference cannot disagree with the reference.
        ct = read_table(args.current, max_discrete=args.max_discrete)
        absent = [n for n in p.columns if n not in ct.order]
        if len(absent) == len(p.columns):
            raise DataError(f"{args.current}: none of the reference columns are present")
        ev = engine.compare_columns(p, ct.numeric, ct.categorical, _settings(args))
        perf = _performance(p, ct, args.current, required=bool(args.label))
    except (DataError, prof.ProfileError) as e:
        return _err(str(e))
    out = ev.to_json()
    out["missing_columns"] = absent
    if perf is not None:
        out["performance"] = perf
    if args.json:
        json.dump(out, sys.stdout, indent=1, allow_nan=False, default=_json_default)
        sys.stdout.write("\n")
    else:
        _print_table(ev, absent, args.alpha)
        if perf is not None:
            _print_performance(perf)
    return 1 if args.fail_on_drift and ev.dataset_drift else 0


def _performance(p: Any, ct: Any, path: str, required: bool) -> dict[str, Any] | None:
    """The ``performance`` object of the current file: calibrated when the profile has labels.

    None when the profile has no confidence column, or the current file lacks the columns (an error when
    ``required``: the user asked for the calibrated estimate with ``--label``).
    """
    import numpy as np

    from inferwatch_sidecar.components.drift import performance
    from inferwatch_sidecar.offline.drift.dataio import DataError
    from inferwatch_sidecar.stats.columns import to_float

    conf_col, pred_col = p.confidence, p.prediction
    if conf_col is None:
        return None
    needed = [conf_col.name, *([pred_col.name if pred_col else "--prediction"] if p.performance else [])]
    if any(c not in ct.order for c in needed):
        if not required:
            return None
        raise DataError(f"{path}: the prediction and confidence columns are needed for the accuracy estimate")
    conf = _column(ct, conf_col.name)
    conf = conf if isinstance(conf, np.ndarray) else np.array([to_float(v) for v in conf], dtype=np.float64)
    ok = np.isfinite(conf)
    if p.performance is None:
        return performance.report(None, float(conf[ok].mean()) if ok.any() else None, int(ok.sum()))
    win = performance.PerformanceWindow(p.performance, 1)
    win.update(list(_column(ct, pred_col.name)), conf)
    return performance.report(win, None, 0)


def _print_performance(perf: dict[str, Any]) -> None:
    from rich.console import Console

    con = Console()
    acc = perf["estimated_accuracy"]
    if not perf["calibrated"]:
        con.print(f"estimated accuracy {_fmt(acc)} (uncalibrated: mean confidence); {perf['note']}")
        return
    lo, hi = perf["estimated_accuracy_interval"] or (None, None)
    con.print(f"estimated accuracy {_fmt(acc)} (95% {_fmt(lo)} to {_fmt(hi)}, {perf['method']} calibration on "
              f"{perf['reference_rows']} labelled rows); reference accuracy {_fmt(perf['reference_accuracy'])}")
    if "positive_class" in perf:
        con.print("  ".join(f"{k} {_fmt(perf[f'estimated_{k}'])} (reference {_fmt(perf[f'reference_{k}'])})"
                            for k in ("precision", "recall", "f1", "roc_auc")))


def _json_default(o: Any) -> Any:
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}"


def _print_table(ev: Any, absent: list[str], alpha: float) -> None:
    """The verdict of every column and why, then the joint test and the dataset verdict.

    Fits the terminal (``COLUMNS``; 80 when it is not a terminal): the "why" column wraps, the
    feature names fold, and below 60 columns the sample size is dropped.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from inferwatch_sidecar.components.drift import explain

    con = Console()
    t = Table(title="drift", box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    t.add_column("column", overflow="fold", min_width=8)
    t.add_column("drifted", no_wrap=True)
    t.add_column(f"p_adj vs {alpha:g}", overflow="fold", min_width=9)
    t.add_column("effect vs floor", overflow="fold", min_width=9)
    show_n = con.width >= 60
    if show_n:
        t.add_column("n", justify="right", no_wrap=True)
    notes = []
    for r in ev.results:
        name = r.feature + ("" if r.role == "feature" else f" ({r.role})")
        verdict = explain.verdict(r)
        if r.missing_drifted:
            verdict += " *"
            notes.append(f"* {name}: missing rate {r.missing_reference:.1%} -> {r.missing_current:.1%} "
                         f"(p_adj {explain.fmt(r.missing_p_adjusted)})")
        elif r.status not in ("ok", "insufficient_data"):
            notes.append(f"{name}: {explain.why(r, alpha)}")
        row = [name, f"[bold red]{verdict}[/]" if r.drifted else verdict,
               explain.p_part(r, alpha) or "-", explain.effect_part(r) or "-"]
        t.add_row(*row, *([str(r.n_current)] if show_n else []))
    con.print(t)
    for note in notes:
        con.print(note)
    con.print(explain.LEGEND, style="dim")
    for r in ev.results:
        if r.unseen:
            con.print(f"{r.feature}: unseen categories {dict(sorted(r.unseen.items()))}")
    if absent:
        con.print(f"not in the current data: {', '.join(absent)}")
    j = ev.multivariate
    if j is not None:
        con.print(f"joint drift (PCA reconstruction error of {len(j.columns)} features, {j.components} components, "
                  f"{j.n_current} rows): {'[bold red]yes[/]' if j.drifted else explain.verdict(j)}: "
                  f"{explain.why_joint(j)}")
    joint_note = " or the joint test drifted" if j is not None else ""
    con.print(f"dataset drift: {'yes' if ev.dataset_drift else 'no'} "
              f"({ev.n_drifted} of {ev.n_features} features drifted; drifted when at least half do{joint_note})")


def _cmd_report(args: argparse.Namespace) -> int:
    from inferwatch_sidecar.export.htmlsafe import UnsafeHTML, harden
    from inferwatch_sidecar.offline.drift import report

    try:
        if args.sidecar:
            token = args.token
            if args.token_file:
                try:
                    with open(args.token_file, encoding="utf-8") as tf:
                        token = tf.readline().strip()
                except OSError as e:
                    return _err(f"cannot read --token-file {args.token_file}: {e.strerror or e}")
                if not token:
                    return _err(f"--token-file {args.token_file} is empty")
            elif token:
                print("note: --token is visible to other users in ps; use $INFERWATCH_ADMIN_TOKEN or --token-file",
                      file=sys.stderr)
            body = report.fetch_from_sidecar(args.sidecar, token, args.model, args.model_version)
            try:
                # The file written carries its own policy, whatever the sidecar that served it.
                body = harden(body)[0]
            except UnsafeHTML as e:
                return _err(f"the sidecar's report is not safe to write: {e}")
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

"""``inferwatch loadtest URL``: find the knee of a model server, or push it until it fails."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

EPILOG = """\
modes (one of):
  default            a closed-loop concurrency sweep, doubling 1, 2, 4, ... up to --max-concurrency, that
                     stops two steps after throughput stopped growing (--full-sweep runs every level)
  --concurrency LIST the levels to step through (1,2,4,8 ...)
  --rate LIST        open loop: requests per second, Poisson arrivals (--burstiness K: gamma, K<1 burstier)
  --until-failure    double the concurrency until errors, timeouts or the engine's out-of-memory, then
                     recommend a limit 30% below the concurrency that failed

payloads: --api completions|chat (OpenAI-compatible; --stream measures TTFT and inter-token latency) with
prompts from --prompts FILE or lengths from --prompt-tokens/--output-tokens MEAN[,STDDEV] (lognormal);
--api json POSTs --body or the lines of --body-file, cycled.

examples:
  inferwatch loadtest http://127.0.0.1:8000/predict --body '{"features": [1, 2]}'
  inferwatch loadtest http://127.0.0.1:8000 --api chat --model m --stream --slo ttft=0.5,itl=0.05 \\
      --sidecar http://127.0.0.1:9108 --plot knee.html
  inferwatch loadtest http://127.0.0.1:8000 --api completions --until-failure --json

exit status: 0; 1 when --until-failure found no failure or every request of a step failed; 2 for bad options,
an unreachable URL or an answer that is not JSON.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "loadtest",
        help="load-test a model server: a concurrency sweep, fixed rates or until failure; finds the knee",
        description="Drive HTTP/1.1 keep-alive load at URL and report per step throughput, latency (p50, p99),\n"
                    "TTFT and inter-token latency for streamed answers, errors and goodput, then the knee: the\n"
                    "concurrency beyond which throughput stops growing while latency climbs (docs/capacity.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", metavar="URL", help="http://host:port[/path]; the path defaults from --api")
    g = p.add_argument_group("mode")
    g.add_argument("--concurrency", metavar="LIST", help="concurrency levels, comma-separated (default: doubling)")
    g.add_argument("--rate", metavar="LIST", help="open loop at these requests/s, comma-separated")
    g.add_argument("--burstiness", type=float, default=1.0, metavar="K",
                   help="--rate arrivals: gamma shape K (1 = Poisson, the default; below 1 burstier)")
    g.add_argument("--until-failure", action="store_true", help="double the concurrency until a step fails")
    g.add_argument("--max-error-ratio", type=float, default=0.01, metavar="R",
                   help="--until-failure: a step with more errors than this share failed (default 0.01)")
    g.add_argument("--max-concurrency", type=int, default=256, metavar="N",
                   help="highest level of the default sweep and of --until-failure (default 256)")
    g.add_argument("--full-sweep", action="store_true", help="run every level, even past the knee")
    b = p.add_argument_group("bounds")
    b.add_argument("--duration", type=float, default=10.0, metavar="S", help="seconds per step (default 10)")
    b.add_argument("--requests", type=int, default=100_000, metavar="N", help="most requests per step (default 100000)")
    b.add_argument("--max-time", type=float, default=600.0, metavar="S", help="most seconds in all (default 600)")
    b.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per request (default 60)")
    b.add_argument("--max-connections", type=int, default=1024, metavar="N",
                   help="--rate: most connections open at once (default 1024)")
    q = p.add_argument_group("payload")
    q.add_argument("--api", choices=("completions", "chat", "json"), default=None,
                   help="OpenAI-compatible completions or chat, or a generic JSON POST (default: json with "
                        "--body/--body-file, else completions)")
    q.add_argument("--model", help="the model name to send (OpenAI APIs)")
    q.add_argument("--stream", action="store_true", help="stream the answers (OpenAI APIs): TTFT and ITL")
    q.add_argument("--prompts", metavar="FILE", help="real prompts: one per line, text or JSON with prompt/messages")
    q.add_argument("--prompt-tokens", default="128", metavar="MEAN[,STD]",
                   help="synthetic prompt length, lognormal (default 128)")
    q.add_argument("--output-tokens", default="64", metavar="MEAN[,STD]",
                   help="max_tokens per request, lognormal (default 64)")
    q.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM's ignore_eos)")
    q.add_argument("--body", metavar="JSON", help="--api json: the body to POST")
    q.add_argument("--body-file", metavar="FILE", help="--api json: one JSON body per line, cycled")
    q.add_argument("--header", action="append", default=[], metavar="K:V", help="an extra request header (repeat)")
    o = p.add_argument_group("output")
    o.add_argument("--slo", metavar="ttft=S,itl=S,e2e=S", help="per-request objectives for goodput (seconds)")
    o.add_argument("--sidecar", metavar="URL", help="join each step with this sidecar's view of the server")
    o.add_argument("--json", action="store_true", help="print the JSON document on stdout (tables go to stderr)")
    o.add_argument("--plot", metavar="FILE", help="throughput and latency against concurrency: FILE.png or FILE.html")
    o.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    o.add_argument("--seed", type=int, default=0, help="seed of lengths and arrivals (default 0)")
    p.set_defaults(func=run)


class OptionError(ValueError):
    pass


def _list(text: str, what: str, integer: bool) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OptionError(f"{what} {text!r}: expected numbers separated by commas") from None
    if not vals or any(v <= 0 for v in vals) or (integer and any(v != int(v) for v in vals)):
        raise OptionError(f"{what} {text!r}: expected {'whole ' if integer else ''}numbers above 0")
    return sorted(set(vals))


def _target(args: argparse.Namespace) -> tuple[str, int, str]:
    raw = args.url if "://" in args.url else "http://" + args.url
    u = urllib.parse.urlsplit(raw)
    if u.scheme == "https":
        raise OptionError(f"URL {args.url!r}: https is not supported; point it at the server's plain-HTTP port")
    if u.scheme != "http" or not u.hostname:
        raise OptionError(f"URL {args.url!r}: expected http://host:port[/path]")
    try:
        port = u.port or 80
    except ValueError:
        raise OptionError(f"URL {args.url!r}: the port is not a number") from None
    path = u.path if u.path not in ("", "/") else ""
    if u.query:
        path = (path or "/") + "?" + u.query
    return u.hostname, port, path


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    from inferwatch_sidecar.loadtest import payloads as pl
    from inferwatch_sidecar.loadtest.runner import Objectives, Target
    from inferwatch_sidecar.loadtest.sweep import Plan, doubling

    host, port, path = _target(args)
    api = args.api or ("json" if (args.body or args.body_file) else "completions")
    if api == "json" and args.stream:
        raise OptionError("--stream needs --api completions or chat")
    if api != "json" and (args.body or args.body_file):
        raise OptionError("--body/--body-file go with --api json")
    modes = sum(bool(x) for x in (args.concurrency, args.rate, args.until_failure))
    if modes > 1:
        raise OptionError("choose one of --concurrency, --rate, --until-failure")
    for name in ("duration", "timeout", "max_time"):
        if not getattr(args, name) > 0:
            raise OptionError(f"--{name.replace('_', '-')} must be above 0 seconds")
    if args.requests < 1 or args.max_concurrency < 1 or args.max_connections < 1:
        raise OptionError("--requests, --max-concurrency and --max-connections must be at least 1")
    if not args.burstiness > 0:
        raise OptionError("--burstiness must be above 0")
    headers = {}
    for h in args.header:
        k, sep, v = h.partition(":")
        if not sep or not k.strip():
            raise OptionError(f"--header {h!r}: expected NAME:VALUE")
        headers[k.strip()] = v.strip()
    try:
        slo = Objectives.parse(args.slo)
        prompts = pl.read_prompts(args.prompts) if args.prompts else None
        bodies = pl.read_bodies(args.body, args.body_file) if api == "json" else None
        prepared = pl.build(api, f"{host}:{port}", path or pl.default_path(api), model=args.model, stream=args.stream,
                            prompts=prompts, prompt_len=pl.Length.parse(args.prompt_tokens, "--prompt-tokens"),
                            output_len=pl.Length.parse(args.output_tokens, "--output-tokens"), bodies=bodies,
                            headers=headers, ignore_eos=args.ignore_eos, count=len(prompts) if prompts else 512,
                            seed=args.seed)
    except ValueError as e:
        raise OptionError(str(e)) from None
    if args.rate:
        mode, levels = "rate", _list(args.rate, "--rate", False)
    elif args.concurrency:
        mode, levels = "concurrency", _list(args.concurrency, "--concurrency", True)
    elif args.until_failure:
        mode, levels = "until-failure", [1.0]
    else:
        mode, levels = "concurrency", doubling(args.max_concurrency)
    target = Target(host, port, api, args.stream, prepared, args.timeout)
    plan = Plan(mode, levels, args.duration, args.requests, args.max_time, slo, full=args.full_sweep,
                burstiness=args.burstiness, max_error_ratio=args.max_error_ratio,
                max_concurrency=args.max_concurrency, seed=args.seed)
    return target, plan


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from inferwatch_sidecar.loadtest import report
    from inferwatch_sidecar.loadtest.runner import LoadTestError, Step
    from inferwatch_sidecar.loadtest.sidecar_view import SidecarView
    from inferwatch_sidecar.loadtest.sweep import run as sweep

    def fail(msg: str) -> int:
        print(f"inferwatch loadtest: {msg}", file=sys.stderr)
        return 2

    try:
        target, plan = build(args)
        if args.plot:
            report.check_plot(args.plot)
    except (OptionError, ValueError) as e:
        return fail(str(e))
    table = sys.stderr if args.json else sys.stdout
    tty = sys.stderr.isatty() and not args.no_progress
    view = SidecarView(args.sidecar) if args.sidecar else None
    n_steps = len(plan.levels)
    done = {"n": 0}

    def progress(s: Step, elapsed: float) -> None:
        if tty:
            frac = min(elapsed / plan.duration, 1.0)
            bar = "#" * int(frac * 20)
            level = f"rate {s.rate:g}/s" if s.rate else f"c={s.concurrency:g}"
            sys.stderr.write(f"\r step {done['n'] + 1}/{n_steps} {level} [{bar:<20}] {s.requests} req, "
                             f"{s.error_count} errors ")
            sys.stderr.flush()

    def on_step(s: Step) -> None:
        if tty:
            sys.stderr.write("\r" + " " * 70 + "\r")
        if done["n"] == 0:
            print(report.header(), file=table)
        done["n"] += 1
        print(report.row(s), file=table, flush=True)

    async def main() -> Any:
        if view:
            await view.check()
        return await sweep(target, plan, on_step, progress, view.around if view else None)

    try:
        out = asyncio.run(main())
    except (LoadTestError, ValueError) as e:
        return fail(str(e))
    print(report.knee_line(out.knee), file=table)
    if out.stopped:
        print(f"stopped: {out.stopped}", file=table)
    if plan.mode == "until-failure" and out.failed_at is not None:
        print(f"failed at concurrency {out.failed_at:g}: {out.failure}\nrecommended limit: {out.recommended_limit} "
              f"in flight (30% below the concurrency that failed)", file=table)
    if args.json:
        print(json.dumps(report.document(out.steps, out.knee), indent=2))
    if args.plot:
        report.plot(args.plot, out.steps, out.knee)
        print(f"plot written to {args.plot}", file=table)
    if plan.mode == "until-failure" and out.failed_at is None:
        return 1
    if any(s.ok == 0 for s in out.steps):
        return 1
    return 0

"""``inferwatch sidecar``: run the daemon, or check a config file.

Configuration precedence, lowest first: built-in defaults, the YAML file
(``--config``), ``INFERWATCH_<SECTION>__<FIELD>`` environment variables,
then flags. See docs/config.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXAMPLES = """\
examples:
  inferwatch sidecar                                  # defaults: socket /tmp/inferwatch/ingest.sock, http 127.0.0.1:9464
  inferwatch sidecar --config sidecar.yaml --http-host 0.0.0.0
  inferwatch sidecar --check-config sidecar.yaml      # validate, run start-up's checks, exit (0 = valid)
  inferwatch sidecar --print-config                   # every field with its default
  INFERWATCH_HTTP__PORT=9500 inferwatch sidecar --set drift.enabled=false
  inferwatch sidecar --engine-metrics http://127.0.0.1:8000/metrics   # read vLLM's own state, judge saturation
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sidecar",
        help="run the sidecar daemon (ingest, aggregation, /metrics, OTLP)",
        description="Run the inferwatch sidecar: receive SDK events on a Unix datagram socket (and optionally UDP "
        "or HTTP JSON), aggregate them, and export them on /metrics and over OTLP.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file")
    p.add_argument(
        "--check-config", metavar="FILE",
        help="validate FILE (with env and flags applied), run start-up's checks without binding anything "
        "(reference files, GPU settings, socket directory, OTLP settings) and exit (0 = start-up would pass them)",
    )
    p.add_argument("--print-config", action="store_true", help="print the effective config as YAML and exit")
    p.add_argument("--socket", metavar="PATH", help="Unix datagram socket path (ingest.socket; '' disables it)")
    p.add_argument("--udp-port", type=int, metavar="PORT", help="also receive UDP on this port (ingest.udp_port)")
    p.add_argument("--http-host", metavar="HOST", help="HTTP bind address (http.host); 0.0.0.0 to be scraped in a pod")
    p.add_argument("--http-port", type=int, metavar="PORT", help="HTTP port (http.port)")
    p.add_argument("--no-gpu", action="store_true", help="disable the GPU monitor (gpu.enabled=false)")
    p.add_argument("--no-drift", action="store_true", help="disable the drift engine (drift.enabled=false)")
    p.add_argument(
        "--engine-metrics", action="append", default=[], metavar="URL",
        help="scrape an inference engine's Prometheus endpoint (vLLM, SGLang, Triton, TensorRT-LLM; recognised "
        "from its series), e.g. http://127.0.0.1:8000/metrics; repeatable, added to engines.targets",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="set any field, e.g. --set labels.max_values.model=20 (repeatable; highest precedence)",
    )
    p.set_defaults(func=run)


def _flag_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The config tree the named flags set, and each key's flag."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(path: str, value: Any, flag: str) -> None:
        node = tree
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
        sources[path] = flag

    if args.socket is not None:
        put("ingest.socket", args.socket, "--socket")
    if args.udp_port is not None:
        put("ingest.udp_port", args.udp_port, "--udp-port")
    if args.http_host is not None:
        put("http.host", args.http_host, "--http-host")
    if args.http_port is not None:
        put("http.port", args.http_port, "--http-port")
    if args.no_gpu:
        put("gpu.enabled", False, "--no-gpu")
    if args.no_drift:
        put("drift.enabled", False, "--no-drift")
    return tree, sources


def _with_engine_urls(cfg: Any, urls: list[str]) -> Any:
    """``cfg`` with one engines target per ``--engine-metrics`` URL added to the configured ones."""
    from pydantic import ValidationError

    from inferwatch_sidecar.components.engines.config import EnginesConfig
    from inferwatch_sidecar.config import ConfigError

    data = cfg.engines.model_dump()
    data["targets"] = [*data["targets"], *({"url": u} for u in urls)]
    try:
        engines = EnginesConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid configuration:\n  engines (from --engine-metrics): {problems}") from None
    return cfg.model_copy(update={"engines": engines})


def _check(cfg: Any, path: str) -> int:
    """Run every check start-up runs, short of binding sockets; 0 when start-up would pass them."""
    from inferwatch_sidecar.daemon import Sidecar, StartupError
    from inferwatch_sidecar.ingest.sockets import IngestError

    try:
        Sidecar(cfg).check()
    except (StartupError, IngestError) as e:
        print(f"inferwatch sidecar: {path}: start-up would fail: {e}", file=sys.stderr)
        return 1
    print(f"{path}: configuration is valid")
    return 0


def run(args: argparse.Namespace) -> int:
    # Imported when the command runs, not when it registers, so that ``inferwatch --help``
    # never loads pydantic, yaml or prometheus_client.
    from inferwatch_sidecar.config import ConfigError, load_config, merge, parse_set

    path = args.check_config or args.config
    flags, sources = _flag_overrides(args)
    try:
        set_tree, set_sources = parse_set(args.set)
        cfg = load_config(path, overrides=merge(flags, set_tree), override_sources={**sources, **set_sources})
        if args.engine_metrics:
            cfg = _with_engine_urls(cfg, args.engine_metrics)
    except ConfigError as e:
        print(f"inferwatch sidecar: {e}", file=sys.stderr)
        return 2
    if args.check_config:
        return _check(cfg, args.check_config)
    if args.print_config:
        import yaml

        data = cfg.model_dump(mode="json")
        if data["http"].get("admin_token"):
            data["http"]["admin_token"] = "***"
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
        return 0
    from inferwatch_sidecar.daemon import Sidecar, StartupError
    from inferwatch_sidecar.ingest.sockets import IngestError

    try:
        return Sidecar(cfg).run()
    except (StartupError, IngestError) as e:
        print(f"inferwatch sidecar: cannot start: {e}", file=sys.stderr)
        return 1

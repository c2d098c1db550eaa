"""The ``inferwatch`` command-line interface.

One module per command (``sidecar``, ``gpu``, ``drift``, ``skew``, ``canary``, ``demo``, ``top``, ``loadtest``) registers itself here
through a ``register(subparsers)`` function. Registering must stay cheap:
heavy imports happen inside each command's handler, so ``inferwatch --help``
is fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from inferwatch_sidecar import __version__

#: Modules whose ``register(subparsers)`` adds subcommands, in help order.
COMMAND_MODULES = (
    "inferwatch_sidecar.cli.sidecar",
    "inferwatch_sidecar.cli.gpu",
    "inferwatch_sidecar.cli.drift",
    "inferwatch_sidecar.cli.skew",
    "inferwatch_sidecar.cli.canary",
    "inferwatch_sidecar.cli.demo",
    "inferwatch_sidecar.cli.top",
    "inferwatch_sidecar.cli.loadtest",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferwatch",
        description="Observability and drift monitoring for ML inference services.",
    )
    parser.add_argument("--version", action="version", version=f"inferwatch {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        rc = int(func(args) or 0)
        sys.stdout.flush()
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``inferwatch ... | head``): stop quietly, as a
        # shell tool killed by SIGPIPE does, and point stdout at /dev/null so
        # the interpreter's final flush does not print a second traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE

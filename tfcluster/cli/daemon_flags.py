"""What the two daemons' commands share: their logging flags and the check of their trust flags."""

from __future__ import annotations

import faulthandler
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import fail

LogLevelOpt = typer.Option("info", help="debug, info, warning or error.")
LogFormatOpt = typer.Option("text", metavar="text|json",
                            help="text: one line per event (under journald with its priority, without a "
                                 "timestamp); json: one object per line for log collectors.")


def setup_logging(level: str, fmt: str) -> None:
    from tfcluster.daemon import logformat  # the daemons' own imports are paid by the daemons alone

    try:
        logformat.setup(level, fmt)
    except ValueError as e:
        fail(str(e), 2)
    # A daemon that systemd's watchdog kills (SIGABRT) leaves the stack of every thread in its log: where it hung.
    faulthandler.enable()


def check_trust_flags(tls_dir: Optional[Path], insecure: bool, token: Optional[str]) -> None:
    if insecure and tls_dir is not None:
        fail("--insecure and --tls-dir contradict each other: give one", 2)
    if not insecure and tls_dir is None:
        fail("give --tls-dir DIR (made by `tfcluster ca init --dir DIR`) to serve mutual TLS, or --insecure to "
             "serve plain text to anyone who reaches the port", 2)
    if token and not insecure:
        fail("--token-file goes with --insecure; with TLS certificates take its place", 2)

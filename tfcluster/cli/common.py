"""What every `tfcluster` command shares: the app, output, errors, options, and the connection to a cluster (the
Python API's Cluster: the commands are built on it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from tfcluster.auth import TokenError, load_token
from tfcluster.cli import quickparams
from tfcluster.cluster import Cluster
from tfcluster.errors import ClusterError

quickparams.install()
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="TensorFlow distributed training on bare-metal machines.")


@app.callback()
def _group() -> None:
    """Nothing to do before a command: the callback keeps `tfcluster` a group of commands when a run loads the
    module of one command alone."""


class LazyConsole:
    """A rich Console made at its first use: importing rich costs a command that prints nothing through it
    (`tfcluster start` prints its job id and one plain line) a good part of its start-up."""

    def __init__(self, **options) -> None:
        self._options = options
        self._console = None

    @property
    def console(self):
        """The Console itself, for rich's own classes (Live)."""
        if self._console is None:
            from rich.console import Console
            options = dict(self._options)
            if options.pop("tty_width", False):
                options["width"] = None if sys.stdout.isatty() else 160
            self._console = Console(**options)
        return self._console

    def __getattr__(self, name: str):
        return getattr(self.console, name)


out = LazyConsole(highlight=False, tty_width=True)
err = LazyConsole(stderr=True, highlight=False, soft_wrap=True)

MAX_INT32 = 2**31 - 1
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Spec keys as `tfcluster start` flags, so an error names what the user typed.
FLAG_FOR_KEY = {"name": "--name", "strategy": "--strategy", "roles.worker.count": "--workers",
                "roles.chief.count": "--chief", "roles.ps.count": "--ps", "roles.ps": "--ps",
                "roles.evaluator.count": "--evaluator", "gpus": "--gpus-per-task", "roles.chief.gpus": "--gpus-per-task",
                "command": "COMMAND", "roles.worker.command": "COMMAND", "roles.chief.command": "COMMAND",
                "roles.evaluator.command": "COMMAND", "checkpoint_dir": "--checkpoint-dir",
                "restart.max_restarts": "--max-restarts", "roles": "--workers/--chief", "memory": "--memory"}
CoordinatorOpt = typer.Option(None, "--coordinator", "-c", metavar="HOST:PORT",
                              help="Coordinator address [default: $TFCLUSTER_COORDINATOR or localhost:7070].")


def fail(message: str, code: int = 1) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def default_state_dir(role: str) -> Path:
    base = Path("/var/lib/tfcluster") if os.geteuid() == 0 else \
        Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "tfcluster"
    return base / role


def parse_duration(text: str, flag: str) -> float:
    """`90`, `90s`, `30m`, `12h`, `7d` -> seconds."""
    number, unit = (text[:-1], text[-1]) if text[-1:] in DURATION_UNITS else (text, "s")
    try:
        seconds = float(number) * DURATION_UNITS[unit]
    except ValueError:
        seconds = -1
    if not 0 <= seconds < float("inf"):
        fail(f"{flag}: expected a duration such as 90s, 30m, 12h or 7d, got {text!r}", 2)
    return seconds


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, flag: str) -> int:
    """`500M`, `64G`, `2T`, `1048576` -> bytes (powers of 1024)."""
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in SIZE_UNITS else (text, "")
    try:
        size = float(number) * SIZE_UNITS[unit]
    except ValueError:
        size = -1
    if not 0 < size < 2**63:
        fail(f"{flag}: expected a size such as 500M, 64G or 2T, got {text!r}", 2)
    return int(size)


TlsDirOpt = typer.Option(None, "--tls-dir", envvar="TFCLUSTER_TLS_DIR", metavar="DIR",
                         help="Credentials to call the coordinator with: ca.crt, client.crt, client.key "
                              "[env: TFCLUSTER_TLS_DIR]; none: plain text (a coordinator run with --insecure).")


def connect(coordinator: Optional[str], tls_dir: Optional[Path]) -> Cluster:
    try:
        return Cluster(coordinator, tls_dir)
    except ClusterError as e:
        fail(str(e), e.exit_code)


def read_token(path: Optional[str]) -> Optional[str]:
    try:
        return load_token(path)
    except TokenError as e:
        fail(f"--token-file: {e}", 2)


def ask(coordinator: Optional[str], tls_dir: Optional[Path], call):
    """One call to the cluster (call takes the Cluster): its answer, or its error as the command's, in one line."""
    with connect(coordinator, tls_dir) as cluster:
        try:
            return call(cluster)
        except ClusterError as e:
            fail(str(e), e.exit_code)

"""The `tfcluster` command: parses, calls the coordinator (or runs a daemon), renders. Thin by design.

Errors are one line on stderr and a non-zero exit (2 for bad input, 1 otherwise), never a traceback.
"""

from __future__ import annotations

import os
import sys

# gRPC's core logs a failed TLS handshake on stderr by itself; the error a command prints says it in one line.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import typer  # noqa: E402

from tfcluster import __version__  # noqa: E402
from tfcluster.cli import cluster, daemons, jobs, node  # noqa: E402,F401  (each module adds its commands to the app)
from tfcluster.cli.common import app, err, out  # noqa: E402


@app.command()
def demo(
    epochs: int = typer.Option(5, min=1, help="Training epochs."),
    keep: bool = typer.Option(False, help="Keep the temporary state dirs (logs, checkpoints) and print where."),
) -> None:
    """Run a local cluster (a coordinator and three agents) and a real 2-worker training job on it."""
    from tfcluster.demo import run_demo

    raise typer.Exit(run_demo(epochs=epochs, keep=keep, console=out))


@app.command()
def version() -> None:
    """Print the version."""
    print(__version__)


def main() -> None:
    try:
        sys.exit(app(standalone_mode=False))
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.TyperException as e:  # a flag or an argument that does not parse: one line, like every error
        context = getattr(e, "ctx", None)
        if context is not None and e.format_message() == context.get_help():  # no arguments at all
            print(e.format_message())
            sys.exit(e.exit_code)
        where = f"{context.command_path}: " if context is not None else ""
        err.print(f"error: {where}{e.format_message()} (see --help)", markup=False)
        sys.exit(e.exit_code)

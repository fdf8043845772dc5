"""The commands about tfcluster itself: `tfcluster demo` and `tfcluster version`."""

from __future__ import annotations

import typer

from tfcluster import __version__
from tfcluster.cli.common import app, out


@app.command()
def demo(
    epochs: int = typer.Option(5, min=1, help="Training epochs."),
    keep: bool = typer.Option(False, help="Keep the temporary state dirs (logs, checkpoints) and print where."),
) -> None:
    """Run a local cluster (a coordinator and three agents) and a real 2-worker training job on it."""
    from tfcluster.demo import run_demo

    raise typer.Exit(run_demo(epochs=epochs, keep=keep, console=out.console))


@app.command()
def version() -> None:
    """Print the version."""
    print(__version__)

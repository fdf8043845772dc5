"""`tfcluster usage`: what each user and each group used, from the coordinator's usage ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tfcluster.cli.common import CoordinatorOpt, TlsDirOpt, app, ask, parse_duration


@app.command()
def usage(
    since: str = typer.Option("7d", metavar="DURATION",
                              help="The window: the last 12h, 7d, 30d...; 0: everything the coordinator keeps "
                                   "(its --keep-usage-for)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {\"users\": [...], \"groups\": "
                                                       "[...], \"since\": ..., \"until\": ...}."),
    coordinator: Optional[str] = CoordinatorOpt,
    tls_dir: Optional[Path] = TlsDirOpt,
) -> None:
    """GPU-hours, CPU-hours, peak memory and jobs per user and per group over a window (running jobs up to
    now). Anyone who may read the cluster sees every user's totals."""
    window = parse_duration(since, "--since")
    report = ask(coordinator, tls_dir, lambda cluster: cluster.usage(window).wire)
    if as_json:
        from tfcluster import views

        print(json.dumps(views.usage_doc(report), indent=2))
    else:
        from tfcluster.render import render_usage

        print(render_usage(report))
